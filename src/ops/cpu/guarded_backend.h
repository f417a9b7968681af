// guarded_backend.h — the CPU backend with its memory locked: a test backend
// ("cpu-guarded") whose allocations the host cannot read or write except
// inside an op or an explicit transfer.
//
// Every allocation is mapped PROT_NONE.  Each op and each upload/download
// unlocks all of this backend's allocations for the call (PROT_READ|WRITE)
// and locks them again when it returns, and map() … unmap() keeps them open
// between (a counter lets an op call another, and views nest).
// And every pointer an op is given (the arrays inside a KeyValues, a Weight,
// a RouteRebuild and the routing source lists included) must lie inside one
// of the allocations: a host array passed to an op is an internal error
// naming the op.  The kernels are a CpuBackend's, so results are its bits;
// what changes is that a host access that bypasses the interface — reading
// an arena in place, handing an op a host array, as a GPU backend would not
// allow — fails in a test (SIGSEGV, or the error) instead of waiting for a
// GPU to find it.  `--device cpu-guarded` runs any command on it (slow:
// two mprotect sweeps per op).
#pragma once

#include <array>
#include <vector>

#include "ops/cpu/cpu_backend.h"

namespace attnres {

class GuardedCpuBackend final : public Backend {
 public:
  // cpu: the kernels it runs (make_cpu_backend), at any level.  unsupported:
  // ops it declares it does not run (supports() says no), so that a
  // PartialBackend gives them to the CPU — the seam exercised on every
  // machine (`--device cpu-guarded:unsupported=OP,...`).
  GuardedCpuBackend(Context& ctx, std::unique_ptr<CpuBackend> cpu, std::vector<Op> unsupported = {});
  bool supports(Op op, Precision) const override { return !unsupported_[static_cast<size_t>(op)]; }
  void host_access(bool open) override;  // opens the memory until host_access(false)
  const char* name() const override { return "cpu-guarded"; }
  const char* kernels() const override { return cpu_->kernels(); }
  const char* attention_tiles() const override { return cpu_->attention_tiles(); }
  std::string unsupported(Precision p) const override { return cpu_->unsupported(p); }
  double peak_gflops(Precision p) const override { return cpu_->peak_gflops(p); }
  const char* peak_name(Precision p) const override { return cpu_->peak_name(p); }
  int64_t matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const override {
    return cpu_->matmul_workspace(N, I, O, p);
  }
  int64_t attention_workspace(int64_t max_keys, int64_t hd, Precision p) const override {
    return cpu_->attention_workspace(max_keys, hd, p);
  }
  int64_t lm_head_workspace(int64_t C, int64_t V, Precision p) const override {
    return cpu_->lm_head_workspace(C, V, p);
  }
  int64_t route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const override {
    return cpu_->route_workspace(N, d, S, H);
  }

  Buffer alloc(size_t bytes, bool lazy) override;
  void synchronize() override {}
  void* map(void* p, size_t bytes) override;   // opens the memory until unmap
  void unmap(void* p, size_t bytes) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
#define ATTNRES_DECLARE(fam, ret, name, params, args) ret name##_impl params override;
  ATTNRES_BACKEND_OPS(ATTNRES_DECLARE)
#undef ATTNRES_DECLARE

 private:
  std::unique_ptr<CpuBackend> cpu_;
  std::array<bool, kOps> unsupported_{};
};

}  // namespace attnres
