// elementwise.cpp — SwiGLU, embedding lookup and small vector ops.
#include <cmath>
#include <cstring>

#include "ops/ops.h"

namespace attnres {

void swiglu_forward(float* h, const float* g, const float* u, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

// h = g·σ(g)·u.  ∂h/∂u = g·σ(g) = silu(g);  ∂h/∂g = u·σ(g)·(1 + g·(1 − σ(g))).
void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    const float dhi = dh[i];
    du[i] = dhi * g[i] * s;
    dg[i] = dhi * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    std::memcpy(out + i * C, wte + static_cast<int64_t>(tokens[i]) * C, static_cast<size_t>(C) * sizeof(float));
}

// Serial: tokens repeat, and N·C adds are cheap next to the matmuls.
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t N, int64_t C) {
  for (int64_t i = 0; i < N; ++i) {
    float* row = dwte + static_cast<int64_t>(tokens[i]) * C;
    const float* d = dout + i * C;
    for (int64_t c = 0; c < C; ++c) row[c] += d[c];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace attnres
