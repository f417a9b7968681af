// rope.cpp — rotary position embedding, HF rotate_half convention.
#include <cmath>

#include "ops/cpu/cpu_backend.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

void CpuKernels::rope_tables_impl(float* cos_t, float* sin_t, int64_t P, int64_t hd, double theta) {
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int64_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < half; ++j) {
      // inv_freq[j] = theta^(-2j/hd); computed in double, rounded once.
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(j) / hd);
      cos_t[p * half + j] = static_cast<float>(std::cos(angle));
      sin_t[p * half + j] = static_cast<float>(std::sin(angle));
    }
}

namespace {

// sign = +1: forward rotation by the angle; −1: its transpose (the backward).
// Row (b, t) is at position pos[b] + t (pos null: t).
void rotate(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads, int64_t hd,
            const int64_t* pos, float sign, int threads) {
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (B * T * heads * hd >= kParallelMin)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t p = bt % T + (pos ? pos[bt / T] : 0);
    const float* c = cos_t + p * half;
    const float* s = sin_t + p * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (bt * heads + h) * hd;
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half], sj = sign * s[j];
        v[j] = a * c[j] - b * sj;
        v[j + half] = b * c[j] + a * sj;
      }
    }
  }
}

}  // namespace

void CpuKernels::rope_forward_impl(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T,
                              int64_t heads, int64_t hd, const int64_t* pos) {
  rotate(x, cos_t, sin_t, B, T, heads, hd, pos, 1.0f, threads());
}

void CpuKernels::rope_backward_impl(float* dx, const float* cos_t, const float* sin_t, int64_t B, int64_t T,
                               int64_t heads, int64_t hd) {
  rotate(dx, cos_t, sin_t, B, T, heads, hd, nullptr, -1.0f, threads());
}

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"
