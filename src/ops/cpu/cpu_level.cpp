// cpu_level.cpp — see cpu_level.h.
#include "ops/cpu/cpu_level.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace attnres {

const char* cpu_level_name(CpuLevel l) {
  switch (l) {
    case CpuLevel::kX86_64: return "x86-64";
    case CpuLevel::kAvx2: return "avx2";
    case CpuLevel::kAvx512: return "avx512";
  }
  return "?";
}

// __builtin_cpu_supports reads CPUID and, for AVX and AVX-512, whether the
// operating system saves the wide registers (XGETBV), as libgcc's resolver does.
CpuLevel cpu_level_detected() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return avx512 ? CpuLevel::kAvx512 : avx2 ? CpuLevel::kAvx2 : CpuLevel::kX86_64;
}

std::vector<CpuLevel> cpu_levels_here() {
  std::vector<CpuLevel> levels;
  for (int l = 0; l <= static_cast<int>(cpu_level_detected()); ++l) levels.push_back(static_cast<CpuLevel>(l));
  return levels;
}

CpuLevel choose_cpu_level(const std::string& request) {
  const char* env = std::getenv("ATTNRES_CPU_LEVEL");
  const bool from_env = request.empty() && env && *env;
  const std::string want = !request.empty() ? request : from_env ? std::string(env) : std::string();
  const CpuLevel best = cpu_level_detected();
  if (want.empty()) return best;
  const char* where = from_env ? "ATTNRES_CPU_LEVEL" : "cpu level";
  for (int l = 0; l <= static_cast<int>(CpuLevel::kAvx512); ++l) {
    const CpuLevel level = static_cast<CpuLevel>(l);
    if (want != cpu_level_name(level)) continue;
    if (level > best)
      fail(where, " ", want, ": this CPU runs at most ", cpu_level_name(best), " (levels: x86-64, avx2, avx512)");
    return level;
  }
  fail(where, " '", want, "' is not a level (x86-64, avx2, avx512)");
}

const char* tile_path_name(TilePath p) {
  switch (p) {
    case TilePath::kFloat: return "float";
    case TilePath::kAvx512Bf16: return "avx512-bf16";
    case TilePath::kAmx: return "amx";
  }
  return "?";
}

namespace {

// CPUID.(7,0):EDX bit 24 AMX-TILE, bit 22 AMX-BF16; OSXSAVE with XCR0's tile
// bits 17 (TILECFG) and 18 (TILEDATA) set by the operating system.
bool cpu_reports_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  if (!__get_cpuid(1, &a1, &b1, &c1, &d1) || !(c1 & (1u << 27))) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}

// Linux gives a process the AMX tile data (8 KiB of register state per
// thread) only when asked: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
// Asked once; the answer holds for every thread of the process.
constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
bool amx_granted() {
  static const bool granted = [] {
    if (!cpu_reports_amx_bf16()) return false;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return true;
    std::fprintf(stderr,
                 "attnres: this CPU has AMX-BF16 but the kernel refused the tile state (arch_prctl "
                 "ARCH_REQ_XCOMP_PERM: %s); attention's bf16 products run on avx512-bf16\n",
                 std::strerror(errno));
    return false;
  }();
  return granted;
}

}  // namespace

bool cpu_has_dpbf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}

TilePath tile_path_detected(CpuLevel level) {
#if defined(__clang__)
  (void)level;
  return TilePath::kFloat;  // the avx512 copy's tile kernels are GCC's (attention.cpp)
#else
  if (level != CpuLevel::kAvx512 || !cpu_has_dpbf16()) return TilePath::kFloat;
  return amx_granted() ? TilePath::kAmx : TilePath::kAvx512Bf16;
#endif
}

std::vector<TilePath> tile_paths_here(CpuLevel level) {
  std::vector<TilePath> paths;
  for (int p = 0; p <= static_cast<int>(tile_path_detected(level)); ++p) paths.push_back(static_cast<TilePath>(p));
  return paths;
}

TilePath choose_tile_path(CpuLevel level) {
  const char* env = std::getenv("ATTNRES_ATTENTION_TILES");
  const TilePath best = tile_path_detected(level);
  if (!env || !*env) return best;
  const std::string want(env);
  for (int p = 0; p <= static_cast<int>(TilePath::kAmx); ++p) {
    const TilePath path = static_cast<TilePath>(p);
    if (want != tile_path_name(path)) continue;
    if (path > best)
      fail("ATTNRES_ATTENTION_TILES ", want, ": kernels of level ", cpu_level_name(level), " on this CPU run at most ",
           tile_path_name(best), " (paths: float, avx512-bf16, amx)");
    return path;
  }
  fail("ATTNRES_ATTENTION_TILES '", want, "' is not a path (float, avx512-bf16, amx)");
}

}  // namespace attnres
