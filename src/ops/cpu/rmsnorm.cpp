// rmsnorm.cpp — RMSNorm forward and backward (also used per head for q/k norm).
#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "ops/cpu/cpu_backend.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

namespace {
// Σ_c x[c]² in double, over 8 lanes (lane l sums the c ≡ l mod 8, in
// order) added as a tree, 4 + 4, 2 + 2, 1 + 1: one order, written here, that
// vectorises (a single running double sum did not: a chain of dependent adds
// per row).
inline double sum_squares_lanes(const float* x, int64_t n) {
  double lane[8] = {};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
#pragma omp simd
    for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[c + l]) * x[c + l];
  for (int l = 0; c < n; ++c, ++l) lane[l] += static_cast<double>(x[c]) * x[c];
  for (int w = 4; w > 0; w /= 2)
#pragma omp simd
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}
}  // namespace

// y = x·r·w per row; in bf16 the same floats rounded as they are written
// (the operand of the products that follow, which then round nothing).
template <class Y>
inline void rmsnorm_rows(Y* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps,
                         int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    Y* y = out + i * C;
    const double ss = sum_squares_lanes(x, C);
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    if constexpr (std::is_same_v<Y, float>) {
      for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[c] = float_to_bf16(x[c] * r * weight[c]);
    }
    if (rstd) rstd[i] = r;
  }
}

void CpuKernels::rmsnorm_forward_impl(RowsOut out, float* rstd, const float* inp, const float* weight, int64_t N,
                                 int64_t C, float eps) {
  if (out.b16) rmsnorm_rows(out.b16, rstd, inp, weight, N, C, eps, threads());
  else rmsnorm_rows(out.f32, rstd, inp, weight, N, C, eps, threads());
}

// y = x·r·w with r = (Σx²/C + eps)^-½.  Let g = dy∘w, x̂ = x·r.
//   ∂r/∂x = −r³·x/C  ⇒  dx = r·g − r³·x·(g·x)/C = r·(g − x̂·(g·x̂)/C)
//   dw = Σ_rows dy∘x̂
// dweight is reduced first, so dinp may alias dout (in-place backward).
void CpuKernels::rmsnorm_backward_impl(float* dinp, float* dweight, const float* dout, const float* inp,
                                  const float* weight, const float* rstd, int64_t N, int64_t C,
                                  bool accumulate_dinp) {
  if (dweight) {
    // Each thread owns a range of columns and walks all rows: deterministic,
    // no scratch, contiguous reads within a row.
#pragma omp parallel num_threads(threads())
    {
      const auto [c0, c1] = thread_range(C);
      if (c1 > c0) {
        double acc[64];
        for (int64_t cb = c0; cb < c1; cb += 64) {
          const int64_t ce = cb + 64 < c1 ? cb + 64 : c1;
          for (int64_t c = cb; c < ce; ++c) acc[c - cb] = 0.0;
          for (int64_t i = 0; i < N; ++i) {
            const float r = rstd[i];
            const float* x = inp + i * C;
            const float* dy = dout + i * C;
            for (int64_t c = cb; c < ce; ++c) acc[c - cb] += static_cast<double>(dy[c]) * x[c] * r;
          }
          for (int64_t c = cb; c < ce; ++c) dweight[c] += static_cast<float>(acc[c - cb]);
        }
      }
    }
  }
  if (dinp) {
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      float* dx = dinp + i * C;
      const float r = rstd[i];
      // g · x̂ = Σ dy·w·x·r in double, over 8 lanes added as a tree (as above)
      double dot = 0.0;
      {
        double lane[8] = {};
        int64_t c = 0;
        for (; c + 8 <= C; c += 8)
#pragma omp simd
          for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(dy[c + l]) * weight[c + l] * x[c + l] * r;
        for (int l = 0; c < C; ++c, ++l) lane[l] += static_cast<double>(dy[c]) * weight[c] * x[c] * r;
        for (int w = 4; w > 0; w /= 2)
          for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
        dot = lane[0];
      }
      const float m = static_cast<float>(dot / static_cast<double>(C));
      if (accumulate_dinp) {
        for (int64_t c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - x[c] * r * m);
      } else {
        for (int64_t c = 0; c < C; ++c) dx[c] = r * (dy[c] * weight[c] - x[c] * r * m);
      }
    }
  }
}

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"
