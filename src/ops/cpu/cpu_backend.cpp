// cpu_backend.cpp — what the CPU backend's levels share (cpu_backend.h):
// transfers, the routing ops' check of their source lists, and the choice of
// the kernels' level.  Compiled once, for the baseline.
#include "ops/cpu/cpu_backend.h"

#include <cstring>

#include "core/error.h"

namespace attnres {

void CpuBackend::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}
void CpuBackend::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}

void CpuBackend::check_sources(const RouteSource* src, int64_t S, float* const* dsrc) const {
  for (int64_t i = 0; i < S; ++i) {
    ATTNRES_CHECK(i == 0 || !src[i].broadcast, "only source 0 may be broadcast");
    ATTNRES_CHECK(owns(src[i].v) && owns(src[i].rstd) && (!dsrc || !dsrc[i] || owns(dsrc[i])),
                  "routing source ", i, " is not memory of this backend");
  }
}

std::unique_ptr<CpuBackend> make_cpu_backend(Context& ctx, CpuLevel level) {
  ATTNRES_CHECK(level <= cpu_level_detected(), "kernels for ", cpu_level_name(level), " on a CPU that runs at most ",
                cpu_level_name(cpu_level_detected()));
  switch (level) {
    case CpuLevel::kAvx512: return isa_avx512::make_cpu_kernels(ctx);
    case CpuLevel::kAvx2: return isa_avx2::make_cpu_kernels(ctx);
    case CpuLevel::kX86_64: break;
  }
  return isa_x86_64::make_cpu_kernels(ctx);
}

}  // namespace attnres
