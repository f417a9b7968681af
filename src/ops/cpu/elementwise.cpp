// elementwise.cpp — copy and fill, SwiGLU, embedding lookup, small vector ops and the
// AdamW update: one pass over the elements each, threaded over ranges.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/fast_exp.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)
#include "ops/cpu/side_sums.h"

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

void CpuKernels::copy_impl(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void CpuKernels::fill_impl(float* dst, float value, int64_t n) {
  if (value == 0.0f) {
    if (n > 0) std::memset(dst, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

// Chunks of elements for the threads, each a vector loop in a function of
// its own: inside the parallel region GCC reloaded the shared pointers on
// every element ("no vectype") and left the loop scalar, bound by the
// exponential rather than by memory.
constexpr int64_t kSwigluChunk = 8192;
constexpr int64_t kRoundPiece = 1024;  // bf16 outputs: floats made on the stack, in L1, then rounded

namespace {
void swiglu_forward_range(float* h, const float* g, const float* u, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + fast_exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}
void round_range(bf16* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}
void swiglu_backward_range(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + fast_exp(-g[i]));
    const float dhi = dh[i];
    du[i] = dhi * g[i] * s;
    dg[i] = dhi * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}
}  // namespace

// σ(g) = 1/(1 + e^−g) with the vectorised exponential (fast_exp.h): libm's
// expf is a call per element here (no vector variant without -ffast-math),
// which made SwiGLU bound by it rather than by memory.  For g < −88 the
// exponential stops at e^88 and σ is 6e−39 instead of 0 (h and its
// gradients are 0 to float precision either way).
// In bf16 a chunk's floats are made by the same range function into a
// buffer on the stack (in L1) and rounded from there: the values are those of
// the float32 op to the bit, whatever the compiler does with the expression.
void CpuKernels::swiglu_forward_impl(RowsOut h, const float* g, const float* u, int64_t n) {
  const int64_t nc = (n + kSwigluChunk - 1) / kSwigluChunk;
#pragma omp parallel for schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t i0 = c * kSwigluChunk, m = std::min(kSwigluChunk, n - i0);
    if (h.f32) {
      swiglu_forward_range(h.f32 + i0, g + i0, u + i0, m);
      continue;
    }
    alignas(64) float hc[kRoundPiece];
    for (int64_t j = i0; j < i0 + m; j += kRoundPiece) {
      const int64_t k = std::min(kRoundPiece, i0 + m - j);
      swiglu_forward_range(hc, g + j, u + j, k);
      round_range(h.b16 + j, hc, k);
    }
  }
}

// h = g·σ(g)·u.  ∂h/∂u = g·σ(g) = silu(g);  ∂h/∂g = u·σ(g)·(1 + g·(1 − σ(g))).
void CpuKernels::swiglu_backward_impl(RowsOut dg, RowsOut du, const float* dh, const float* g, const float* u, int64_t n) {
  const int64_t nc = (n + kSwigluChunk - 1) / kSwigluChunk;
#pragma omp parallel for schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t i0 = c * kSwigluChunk, m = std::min(kSwigluChunk, n - i0);
    if (dg.f32) {
      swiglu_backward_range(dg.f32 + i0, du.f32 + i0, dh + i0, g + i0, u + i0, m);
      continue;
    }
    alignas(64) float dgc[kRoundPiece], duc[kRoundPiece];
    for (int64_t j = i0; j < i0 + m; j += kRoundPiece) {
      const int64_t k = std::min(kRoundPiece, i0 + m - j);
      swiglu_backward_range(dgc, duc, dh + j, g + j, u + j, k);
      round_range(dg.b16 + j, dgc, k);
      round_range(du.b16 + j, duc, k);
    }
  }
}

void CpuKernels::embedding_forward_impl(float* out, const int32_t* tokens, Weight table, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) num_threads(threads()) if (N * C >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = static_cast<int64_t>(tokens[i]) * C;
    if (table.f32) {
      std::memcpy(out + i * C, table.f32 + row, static_cast<size_t>(C) * sizeof(float));
    } else {
      for (int64_t c = 0; c < C; ++c) out[i * C + c] = bf16_to_float(table.b16[row + c]);
    }
  }
}

// Serial: tokens repeat, and N·C adds are cheap next to the matmuls.
void CpuKernels::embedding_backward_impl(float* dtable, const float* dout, const int32_t* tokens, int64_t N, int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    float* row = dtable + static_cast<int64_t>(tokens[i]) * C;
    const float* d = dout + i * C;
    for (int64_t c = 0; c < C; ++c) row[c] += d[c];
  }
}

void CpuKernels::add_inplace_impl(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuKernels::add_impl(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void CpuKernels::sub_impl(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
}

void CpuKernels::scale_impl(float* x, float c, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= c;
}

// Fixed chunks of 2^16 elements, each summed in double in element order, the
// chunk sums added in chunk order: the result is the same whatever the
// thread count (a resume on another machine or with another --threads stays
// bit-identical).  Eight chunks are summed side by side (side_sums.h).
double CpuKernels::sum_squares_impl(const float* x, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t nc = (n + kChunk - 1) / kChunk, groups = (nc + kSideSums - 1) / kSideSums;
  std::vector<double> partial(static_cast<size_t>(nc));
#pragma omp parallel for schedule(static) num_threads(threads()) if (groups > 1)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * kSideSums, cs = std::min(kSideSums, nc - c0);
    const int64_t whole = std::min(cs, n / kChunk - c0);  // chunks of the group with kChunk elements
    double s[kSideSums] = {};
    side_dots(s, x + c0 * kChunk, x + c0 * kChunk, kChunk, whole, kChunk);
    if (whole < cs) {  // the last, short chunk
      const float* last = x + (c0 + whole) * kChunk;
      side_dots(s + whole, last, last, 0, 1, n - (c0 + whole) * kChunk);
    }
    for (int64_t l = 0; l < cs; ++l) partial[static_cast<size_t>(c0 + l)] = s[l];
  }
  double total = 0.0;
  for (const double s : partial) total += s;
  return total;
}

namespace {
// The AdamW update of n elements; with kCopy also p16 = bf16(p), in the same pass.
template <bool kCopy>
void adamw_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate& u, bf16* p16,
                int threads) {
  const float b1 = u.beta1, b2 = u.beta2;
#pragma omp parallel for simd schedule(static) num_threads(threads) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    const float denom = std::sqrt(v[i]) * u.inv_sqrt_bc2 + u.eps;
    p[i] = p[i] * u.decay - u.step_size * m[i] / denom;
    if constexpr (kCopy) p16[i] = float_to_bf16(p[i]);
  }
}
}  // namespace

void CpuKernels::adamw_update_impl(float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate& u,
                              bf16* p16) {
  if (p16) adamw_loop<true>(p, g, m, v, n, u, p16, threads());
  else adamw_loop<false>(p, g, m, v, n, u, nullptr, threads());
}

// σ(x) = 1/(1 + e^−x) in double (a gate is one value per router, or one
// per token and dimension: the exponential's cost is not what limits it).
void CpuKernels::sigmoid_forward_impl(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[i]))));
}

// dx += dy·y·(1 − y), the sigmoid's derivative from its output.
void CpuKernels::sigmoid_backward_impl(float* dx, const float* dy, const float* y, int64_t n) {
#pragma omp parallel for schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    dx[i] += static_cast<float>(static_cast<double>(dy[i]) * y[i] * (1.0 - static_cast<double>(y[i])));
}

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"
