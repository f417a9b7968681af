// attention.cpp — causal grouped-query attention, tiled over query rows so the
// T×T score matrix is never stored: the forward keeps only the log-sum-exp of
// each row, and the backward rebuilds P tile by tile (as FlashAttention does,
// but with SGEMM on tiles instead of a fused register kernel).
//
// Layout: q[B,T,H,hd], y[B,T,H,hd], lse[B,H,T]; keys and values are rows of
// KV·hd floats (KeyValues: the block's own k,v[B,T,KV,hd] in training, a KV
// cache at inference).  Query head h reads KV head h / (H/KV).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/fast_exp.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

namespace {
constexpr int64_t kTile = 64;  // query rows per tile
}

void CpuKernels::kv_cache_store(float* cache, const float* x, const int64_t* slot, const int64_t* pos, int64_t B,
                                int64_t T, int64_t P, int64_t w) {
  for (int64_t b = 0; b < B; ++b) {
    ATTNRES_CHECK(slot[b] >= 0 && pos[b] >= 0 && pos[b] + T <= P, "cache row ", slot[b], " at ", pos[b], "+", T,
                  " is outside a cache of ", P, " positions");
    std::memcpy(cache + (slot[b] * P + pos[b]) * w, x + b * T * w, static_cast<size_t>(T * w) * sizeof(float));
  }
}

// Per thread: S (or P) and dP, each (kTile, max_keys).
int64_t CpuKernels::attention_workspace(int64_t max_keys) const { return threads() * 2 * kTile * max_keys; }

void CpuKernels::attention_forward(float* y, float* lse, const float* q, const KeyValues& kv, int64_t B,
                                   int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t ldq = H * hd, ldk = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int64_t max_keys = 0;
  for (int64_t b = 0; b < B; ++b) max_keys = std::max(max_keys, (kv.pos ? kv.pos[b] : 0) + T);
  float* scratch = ctx_.workspace(attention_workspace(max_keys));
  const int64_t per_thread = 2 * kTile * max_keys;
#pragma omp parallel num_threads(threads())
  {
    float* S = scratch + omp_get_thread_num() * per_thread;  // (kTile, max_keys), row stride max_keys
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / group;
      const int64_t p0 = kv.pos ? kv.pos[b] : 0, seq = kv.slot ? kv.slot[b] : b;
      const float* Q = q + b * T * ldq + h * hd;
      const float* K = kv.k + seq * kv.stride + g * hd;
      const float* Vv = kv.v + seq * kv.stride + g * hd;
      float* Y = y + b * T * ldq + h * hd;
      float* L = lse ? lse + (b * H + h) * T : nullptr;
      for (int64_t t0 = 0; t0 < T; t0 += kTile) {
        const int64_t t1 = t0 + kTile < T ? t0 + kTile : T, tq = t1 - t0;
        const int64_t nk = p0 + t1;  // keys the tile's last query sees
        // S[tq, nk] = scale · Q[t0:t1] · K[0:nk]ᵀ
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, nk, hd, scale, Q + t0 * ldq, ldq, K, ldk, 0.0f,
                    S, max_keys);
        for (int64_t r = 0; r < tq; ++r) {
          float* s = S + r * max_keys;
          const int64_t n = p0 + t0 + r + 1;  // keys 0..p0+t (causal)
          float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
          for (int64_t c = 0; c < n; ++c) mx = s[c] > mx ? s[c] : mx;
          float sum = 0.0f;  // n terms in (0, 1]: float is exact enough, and vectorises
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < n; ++c) {
            s[c] = fast_exp(s[c] - mx);
            sum += s[c];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) s[c] *= inv;
          for (int64_t c = n; c < nk; ++c) s[c] = 0.0f;
          if (L) L[t0 + r] = mx + std::log(sum);
        }
        // Y[t0:t1] = P[tq, nk] · V[0:nk]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, hd, nk, 1.0f, S, max_keys, Vv, ldk, 0.0f,
                    Y + t0 * ldq, ldq);
      }
    }
  }
}

void CpuKernels::attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* q,
                                    const float* k, const float* v, const float* y, const float* lse, int64_t B,
                                    int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t ldq = H * hd, ldk = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One work item per (b, KV head): it owns dK, dV of that head, so the heads
  // of a group accumulate into them without races.
  float* scratch = ctx_.workspace(attention_workspace(T));
#pragma omp parallel num_threads(threads())
  {
    float* P = scratch + omp_get_thread_num() * attention_workspace(T) / threads();  // (kTile, T)
    float* dP = P + kTile * T;                                                // (kTile, T)
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * KV; ++bg) {
      const int64_t b = bg / KV, g = bg % KV;
      const float* K = k + b * T * ldk + g * hd;
      const float* Vv = v + b * T * ldk + g * hd;
      float* dK = dk + b * T * ldk + g * hd;
      float* dV = dv + b * T * ldk + g * hd;
      for (int64_t t = 0; t < T; ++t) {
        std::memset(dK + t * ldk, 0, hd * sizeof(float));
        std::memset(dV + t * ldk, 0, hd * sizeof(float));
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* Q = q + b * T * ldq + h * hd;
        const float* Y = y + b * T * ldq + h * hd;
        const float* dY = dy + b * T * ldq + h * hd;
        float* dQ = dq + b * T * ldq + h * hd;
        const float* L = lse + (b * H + h) * T;
        for (int64_t t0 = 0; t0 < T; t0 += kTile) {
          const int64_t t1 = t0 + kTile < T ? t0 + kTile : T, tq = t1 - t0;
          // Rebuild P = exp(s·QKᵀ − lse) on the causal part.
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, t1, hd, scale, Q + t0 * ldq, ldq, K, ldk,
                      0.0f, P, T);
          // dP[tq, t1] = dY[t0:t1] · V[0:t1]ᵀ
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, t1, hd, 1.0f, dY + t0 * ldq, ldq, Vv, ldk,
                      0.0f, dP, T);
          for (int64_t r = 0; r < tq; ++r) {
            const int64_t t = t0 + r, n = t + 1;
            float* p = P + r * T;
            float* dp = dP + r * T;
            const float* yr = Y + t * ldq;
            const float* dyr = dY + t * ldq;
            double D = 0.0;  // rowsum(dY∘Y) = Σ_c P_c dP_c
            for (int64_t j = 0; j < hd; ++j) D += static_cast<double>(dyr[j]) * yr[j];
            const float Df = static_cast<float>(D), l = L[t];
#pragma omp simd
            for (int64_t c = 0; c < n; ++c) {
              p[c] = fast_exp(p[c] - l);
              dp[c] = p[c] * (dp[c] - Df);  // dS
            }
            for (int64_t c = n; c < t1; ++c) p[c] = dp[c] = 0.0f;
          }
          // dQ[t0:t1] = scale · dS · K[0:t1]
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, hd, t1, scale, dP, T, K, ldk, 0.0f,
                      dQ + t0 * ldq, ldq);
          // dK[0:t1] += scale · dSᵀ · Q[t0:t1]
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hd, tq, scale, dP, T, Q + t0 * ldq, ldq, 1.0f,
                      dK, ldk);
          // dV[0:t1] += Pᵀ · dY[t0:t1]
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t1, hd, tq, 1.0f, P, T, dY + t0 * ldq, ldq, 1.0f,
                      dV, ldk);
        }
      }
    }
  }
}

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"
