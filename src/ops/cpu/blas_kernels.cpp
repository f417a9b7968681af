// blas_kernels.cpp — see blas_kernels.h.
#include "ops/cpu/blas_kernels.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <utility>

#include "core/buffer.h"
#include "core/timer.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/dnnl_matmul.h"
#include <cstring>
#include <initializer_list>
#include <strings.h>

namespace attnres {

void use_best_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice
  const char* have = openblas_get_corename();
  // The generic fallbacks of OpenBLAS's x86-64 detection.
  bool generic = false;
  for (const char* g : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Northwood"})
    generic |= have && strcasecmp(have, g) == 0;
  if (!generic) return;
  __builtin_cpu_init();
  const char* best = nullptr;
  if (__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl")) best = "Cooperlake";
  else if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    best = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = "Haswell";
  if (!best) return;
  ::setenv("OPENBLAS_CORETYPE", best, 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on with the generic kernels
}

std::string openblas_core() {
  const char* core = openblas_get_corename();
  return core ? core : "unknown";
}

double measure_sgemm_gflops(int threads) {
  static std::map<int, double> measured;  // once per thread count and process
  if (auto it = measured.find(threads); it != measured.end()) return it->second;
  omp_set_num_threads(threads);  // OpenBLAS (OpenMP build) runs this many
  const int64_t n = 2048;
  Buffer a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) a.data()[i] = b.data()[i] = 1e-3f * static_cast<float>(i % 97);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = now_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
    const double g = 2.0 * n * n * n / (now_seconds() - t0) / 1e9;
    best = g > best ? g : best;
  }
  return measured[threads] = best;
}

double measure_peak_gflops(Precision p, int threads) {
  const bool onednn_f32 = p == Precision::kF32 && choose_fp32_gemm() == Fp32Gemm::kOneDnn;
  if (p == Precision::kF32 && !onednn_f32) return measure_sgemm_gflops(threads);
  static std::map<std::pair<int, bool>, double> measured;
  if (auto it = measured.find({threads, onednn_f32}); it != measured.end()) return it->second;
  return measured[{threads, onednn_f32}] = onednn::measure_gflops(threads, onednn_f32);
}

const char* peak_name(Precision p) {
  if (p == Precision::kBF16) return "bf16 matmul (oneDNN)";
  return choose_fp32_gemm() == Fp32Gemm::kOneDnn ? "float32 matmul (oneDNN)" : "SGEMM (OpenBLAS)";
}

}  // namespace attnres
