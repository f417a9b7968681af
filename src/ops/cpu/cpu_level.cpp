// cpu_level.cpp — see cpu_level.h.
#include "ops/cpu/cpu_level.h"

#include <cstdlib>

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

}  // namespace attnres
