// attention.cpp — causal grouped-query attention, tiled over query rows so the
// T×T score matrix is never stored: a tile of kTile queries holds its scores
// against the keys it sees (kTile × keys, linear in T), the forward keeps only
// the log-sum-exp of each row, and the backward rebuilds P tile by tile.
//
//   fp32: the tiles' products through CBLAS (SGEMM), bits as before.
//   bf16: the products take bf16 operands with float32 sums (docs/DESIGN.md §6)
//         as tile products of our own (tiles.h tile_product): on AMX tiles
//         where the CPU has AMX-BF16, as VDPBF16PS where it has AVX512-BF16
//         and this is the avx512 copy, in float arithmetic otherwise — one
//         blocking, one packing, three implementations of the tile
//         interface (cpu_level.h TilePath).  The softmax and everything
//         else is float32 as in fp32.
//
// Layout: q[B,T,H,hd], y[B,T,H,hd], lse[B,H,T]; keys and values are rows of
// KV·hd floats (KeyValues: the block's own k,v[B,T,KV,hd] in training, a KV
// cache at inference).  Query head h reads KV head h / (H/KV), in place: no
// key or value is copied per query head.
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/fast_exp.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)
#include "ops/cpu/tiles.h"      // the tile interface and tile_product (this level's copy)
#include "ops/cpu/side_sums.h"

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

namespace {
constexpr int64_t kTile = 64;  // query rows per tile
}  // namespace

void CpuKernels::kv_cache_store_impl(float* cache, const float* x, const int64_t* slot, const int64_t* pos, int64_t B,
                                int64_t T, int64_t P, int64_t w) {
  for (int64_t b = 0; b < B; ++b) {
    ATTNRES_CHECK(slot[b] >= 0 && pos[b] >= 0 && pos[b] + T <= P, "cache row ", slot[b], " at ", pos[b], "+", T,
                  " is outside a cache of ", P, " positions");
    std::memcpy(cache + (slot[b] * P + pos[b]) * w, x + b * T * w, static_cast<size_t>(T * w) * sizeof(float));
  }
}

// ---- fp32: tiles through SGEMM ----------------------------------------------

namespace {

// The most keys one sequence of the call has (its cache position + T).
int64_t most_keys(const KeyValues& kv, int64_t B, int64_t T) {
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b) n = std::max(n, (kv.pos ? kv.pos[b] : 0) + T);
  return n;
}

// D of the softmax backward for `rows` query rows at stride ld:
// D[r] = rowsum(dY∘Y) of row r, in double in element order, eight rows side
// by side (side_sums.h).
void row_dots(float* D, const float* dy, const float* y, int64_t ld, int64_t rows, int64_t hd) {
  for (int64_t r0 = 0; r0 < rows; r0 += kSideSums) {
    const int64_t n = std::min(kSideSums, rows - r0);
    double acc[kSideSums] = {};
    side_dots(acc, dy + r0 * ld, y + r0 * ld, ld, n, hd);
    for (int64_t l = 0; l < n; ++l) D[r0 + l] = static_cast<float>(acc[l]);
  }
}

// Per thread: S (or P) and dP, each (kTile, max_keys).
int64_t f32_floats(int64_t max_keys) { return 2 * kTile * max_keys; }

// Row r of a score tile: the causal softmax of its first n entries in place,
// zeros up to `width`; returns the row's log-sum-exp.
float softmax_row(float* s, int64_t n, int64_t width) {
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
  for (int64_t c = n; c < width; ++c) s[c] = 0.0f;
  return mx + std::log(sum);
}

void forward_f32(float* y, float* lse, const float* q, const KeyValues& kv, int64_t B, int64_t T, int64_t H,
                 int64_t KV, int64_t hd, float* scratch, int threads) {
  const int64_t ldq = H * hd, ldk = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t max_keys = most_keys(kv, B, T);
  const int64_t per_thread = f32_floats(max_keys);
#pragma omp parallel num_threads(threads)
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
          const float l = softmax_row(S + r * max_keys, p0 + t0 + r + 1, nk);  // keys 0 … p0+t (causal)
          if (L) L[t0 + r] = l;
        }
        // Y[t0:t1] = P[tq, nk] · V[0:nk]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, hd, nk, 1.0f, S, max_keys, Vv, ldk, 0.0f,
                    Y + t0 * ldq, ldq);
      }
    }
  }
}

void backward_f32(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k, const float* v,
                  const float* y, const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                  float* scratch, int threads) {
  const int64_t ldq = H * hd, ldk = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One work item per (b, KV head): it owns dK, dV of that head, so the heads
  // of a group accumulate into them without races.
#pragma omp parallel num_threads(threads)
  {
    float* P = scratch + omp_get_thread_num() * f32_floats(T);  // (kTile, T)
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
          float D[kTile];  // D = Σ_c P_c dP_c = rowsum(dY∘Y) of the tile's rows
          row_dots(D, dY + t0 * ldq, Y + t0 * ldq, ldq, tq, hd);
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
            const float Df = D[r], l = L[t];
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

// ---- bf16: products of bf16 pairs with float32 sums ------------------------
//
// Every product of the bf16 path has one shape:
//
//   C[m, n] (+)= α · Σ_p ( A[m, 2p]·B[p, n, 0] + A[m, 2p+1]·B[p, n, 1] )
//
// A: M rows of bf16 at stride lda, the reduction's pairs adjacent in a row;
// B: packed as [Pn][ldb][2] bf16 (ldb ≥ N rounded up to 16, zeros past N), so
// that 16 consecutive n of one pair are one 64-byte row of a B tile (tiles.h:
// TDPBF16PS's layout, and VDPBF16PS's vector).  The six products of
// attention, with the packings that give them:
//
//   S  = s·Q Kᵀ     A = Q rows (pairs along hd)       B = K by hd pairs   [hd/2][keys][2]
//   Y  = P V        A = P rows (pairs along keys)     B = V by key pairs  [keys/2][hd][2]
//   dP = dY Vᵀ      A = dY rows                       B = V by hd pairs
//   dQ = s·dS K     A = dS rows                       B = K by key pairs
//   dKᵀ += s·Qᵀ dS  A = Qᵀ rows (pairs along queries) B = dS by query pairs [queries/2][keys][2]
//   dVᵀ += dYᵀ P    A = dYᵀ rows                      B = P by query pairs
//
// (dK and dV are summed transposed, (hd, keys), so that the large operand, dS
// or P, is packed from its rows as they are computed; one transpose of each
// at the end.)
//
// Every reduction is padded with zeros on both sides to a multiple of 32
// elements (16 pairs: one tile product), and every A has rows up to a
// multiple of 16 in its buffer (rows past M reach only C rows not written).

constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// src: n rows of w floats at stride s  →  dst[n][ld] bf16 (ld ≥ w even), zeros past w.
void rows_to_bf16(bf16* dst, int64_t ld, const float* src, int64_t s, int64_t n, int64_t w) {
  for (int64_t r = 0; r < n; ++r) {
    bf16* o = dst + r * ld;
    const float* x = src + r * s;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) o[j] = float_to_bf16(x[j]);
    for (int64_t j = w; j < ld; ++j) o[j] = 0;
  }
}

// Pair-rows from … to−1 of a [pairs][ld][2] packing set to zero: a reduction
// padded to whole tile products (one contiguous run).
void zero_pair_rows(bf16* dst, int64_t ld, int64_t from, int64_t to) {
  if (to > from) std::memset(dst + from * ld * 2, 0, static_cast<size_t>((to - from) * ld * 2) * sizeof(bf16));
}

#if defined(ATTNRES_ISA_AVX512)
// (GCC 12's unmasked shuffle intrinsics start from _mm512_undefined_ps, a
// self-initialised vector its -W[maybe-]uninitialized reports once inlined.)
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The 16 × 16 floats at src (rows at stride ls) transposed into dst (rows
// at stride ld), in four rounds of shuffles; the bits are only moved, so
// words that are not floats go through it unchanged.
inline void transpose16(float* dst, int64_t ld, const float* src, int64_t ls) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ls);
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane k: rows i, i+1 interleaved, columns 4k, 4k+1 / 4k+2, 4k+3
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // lane k of r[i + c]: column 4k + c of rows i … i+3
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int h = 0; h < 16; h += 8)  // rows h … h+7: columns c and c+8 (0x88), c+4 and c+12 (0xDD)
    for (int c = 0; c < 4; ++c) {
      t[h + c] = _mm512_shuffle_f32x4(r[h + c], r[h + 4 + c], 0x88);
      t[h + 4 + c] = _mm512_shuffle_f32x4(r[h + c], r[h + 4 + c], 0xDD);
    }
  for (int c = 0; c < 8; ++c) {  // column c from rows 0 … 15, and column c + 8
    _mm512_storeu_ps(dst + c * ld, _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88));
    _mm512_storeu_ps(dst + (c + 8) * ld, _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD));
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// A pair of bf16 as the 32-bit word a tile row holds: lo the pair's first
// element (the lower address), hi its second.
inline uint32_t pair_word(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | static_cast<uint32_t>(float_to_bf16(hi)) << 16;
}

// src: n rows of w floats at stride s  →  dst[pairs][ld][2] (pairs along the
// row, the rows as the vector index), ld ≥ n; zeros for rows n … ld−1, for
// the odd row element w, and for the pair-rows past the row's, up to `pairs`.
// A transposition of 32-bit words: on the avx512 copy, blocks of 16 rows ×
// 16 pairs made as words from the rows' contiguous floats and transposed
// through registers (where the buffer has room for whole blocks, as every
// caller's has); else a word at a time.
void pack_by_row_pairs(bf16* dst, int64_t ld, const float* src, int64_t s, int64_t n, int64_t w, int64_t pairs) {
  const int64_t wp = (w + 1) / 2;
  auto* o = reinterpret_cast<uint32_t*>(dst);  // word (p, r) at o[p·ld + r]
#if defined(ATTNRES_ISA_AVX512)
  const int64_t wp16 = round_up(wp, 16), n16 = round_up(n, 16);
  if (wp16 <= pairs && n16 <= ld) {
    alignas(64) uint32_t block[16][16];  // [row][pair]
    for (int64_t r0 = 0; r0 < n; r0 += 16)
      for (int64_t p0 = 0; p0 < wp; p0 += 16) {
        for (int64_t i = 0; i < 16; ++i) {
          const float* x = src + (r0 + i) * s + 2 * p0;
          if (r0 + i >= n) {
            std::memset(block[i], 0, sizeof(block[i]));
          } else if (2 * p0 + 32 <= w) {
#pragma omp simd
            for (int64_t k = 0; k < 16; ++k) block[i][k] = pair_word(x[2 * k], x[2 * k + 1]);
          } else {
            for (int64_t k = 0; k < 16; ++k) {
              const int64_t e = 2 * (p0 + k);  // the pair's first element in the row
              block[i][k] = e + 1 < w ? pair_word(x[2 * k], x[2 * k + 1]) : e < w ? pair_word(x[2 * k], 0.0f) : 0u;
            }
          }
        }
        transpose16(reinterpret_cast<float*>(o + p0 * ld + r0), ld, reinterpret_cast<const float*>(block[0]), 16);
      }
    for (int64_t p = 0; p < wp16; ++p)
      std::memset(o + p * ld + n16, 0, static_cast<size_t>(ld - n16) * sizeof(uint32_t));
    zero_pair_rows(dst, ld, wp16, pairs);
    return;
  }
#endif
  for (int64_t p = 0; p < wp; ++p) {
    const bool odd = 2 * p + 1 == w;
    for (int64_t r = 0; r < n; ++r) {
      const float* x = src + r * s + 2 * p;
      o[p * ld + r] = pair_word(x[0], odd ? 0.0f : x[1]);
    }
    std::memset(o + p * ld + n, 0, static_cast<size_t>(ld - n) * sizeof(uint32_t));
  }
  zero_pair_rows(dst, ld, wp, pairs);
}

// src: n rows of w floats at stride s  →  dst[pairs][ld][2] (pairs of rows,
// the row's elements as the vector index), ld ≥ w; zeros past w, for the odd
// last row, and for the pair-rows past the rows', up to `pairs`.
void pack_by_col_pairs(bf16* dst, int64_t ld, const float* src, int64_t s, int64_t n, int64_t w, int64_t pairs) {
  for (int64_t p = 0; p < (n + 1) / 2; ++p) {
    auto* o = reinterpret_cast<uint32_t*>(dst) + p * ld;
    const float* x0 = src + 2 * p * s;
    if (2 * p + 1 < n) {
      const float* x1 = x0 + s;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) o[j] = pair_word(x0[j], x1[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) o[j] = pair_word(x0[j], 0.0f);
    }
    std::memset(o + w, 0, static_cast<size_t>(ld - w) * sizeof(uint32_t));
  }
  zero_pair_rows(dst, ld, (n + 1) / 2, pairs);
}

// dst[t][j] (stride ld) = src[j][t] (stride ls) for t < n, j < w: the
// summed-transposed dKᵀ and dVᵀ back to the layout of K and V.  On the
// avx512 copy, 16 × 16 blocks through registers (transpose16); the edges,
// and the other levels, an element at a time.
void transpose_out(float* dst, int64_t ld, const float* src, int64_t ls, int64_t n, int64_t w) {
  int64_t t0 = 0, j0 = 0;
#if defined(ATTNRES_ISA_AVX512)
  for (; t0 + 16 <= n; t0 += 16)
    for (int64_t j = 0; j + 16 <= w; j += 16) transpose16(dst + t0 * ld + j, ld, src + j * ls + t0, ls);
  j0 = w / 16 * 16;
#endif
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = t < t0 ? j0 : 0; j < w; ++j) dst[t * ld + j] = src[j * ls + t];
}

// src (n, w) float at stride s → dst[w][ld] bf16 = its transpose (ld ≥ n even), zeros past n.
void transpose_to_bf16(bf16* dst, int64_t ld, const float* src, int64_t s, int64_t n, int64_t w) {
  for (int64_t j = 0; j < w; ++j) {
    bf16* o = dst + j * ld;
    for (int64_t r = 0; r < n; ++r) o[r] = float_to_bf16(src[r * s + j]);
    for (int64_t r = n; r < ld; ++r) o[r] = 0;
  }
}

// A thread's buffers for the bf16 path, carved from its share of the
// workspace.  keys: the most keys of the call (forward) or T (backward).
// Every reduction is padded with zeros to a multiple of kTileK (32) and every
// A operand has rows up to a multiple of 16 (tiles.h tile_product).
struct Bf16Tiles {
  int64_t ldk;   // keys rounded up to 32: a row of S, P, dP; B's row of K and V by hd pairs
  int64_t hdk;   // hd rounded up to 32: a row of Q and dY in bf16, the pair-rows of K and V by hd pairs
  int64_t hdv;   // hd rounded up to 16: B's row of V, K by key pairs; the rows of Qᵀ and dYᵀ
  bf16 *k_hd, *v_hd;      // [hdk/2][ldk][2]: S's and dP's B
  bf16 *k_rows, *v_rows;  // [ldk/2][hdv][2]: dQ's and Y's B
  bf16 *q16, *dy16;       // [kTile][hdk]: S's and dP's A
  bf16 *qt16, *dyt16;     // [hdv][kTile]: dKᵀ's and dVᵀ's A
  float *s, *dp;          // [kTile][ldk]
  bf16 *p16, *ds16;       // [kTile][ldk]: Y's and dQ's A
  bf16 *p_pairs, *ds_pairs;  // [kTile/2][ldk][2]: dVᵀ's and dKᵀ's B
  float *dkt, *dvt;       // [hd][ldk]: dKᵀ, dVᵀ of the work item
  float* stage;           // [16][16]: a C tile on its way out (tile_product)
  int64_t floats = 0;     // the share's size

  Bf16Tiles(int64_t keys, int64_t hd, float* base) {
    ldk = round_up(std::max<int64_t>(keys, 1), kTileK);
    hdk = round_up(hd, kTileK);
    hdv = round_up(hd, 16);
    auto take = [&](int64_t n_bf16) {  // 64-byte aligned pieces
      bf16* p = base ? reinterpret_cast<bf16*>(base + floats) : nullptr;
      floats += round_up((n_bf16 + 1) / 2, 16);
      return p;
    };
    k_hd = take(hdk * ldk);
    v_hd = take(hdk * ldk);
    k_rows = take(ldk * hdv);
    v_rows = take(ldk * hdv);
    q16 = take(kTile * hdk);
    dy16 = take(kTile * hdk);
    qt16 = take(hdv * kTile);
    dyt16 = take(hdv * kTile);
    s = reinterpret_cast<float*>(take(2 * kTile * ldk));
    dp = reinterpret_cast<float*>(take(2 * kTile * ldk));
    p16 = take(kTile * ldk);
    ds16 = take(kTile * ldk);
    p_pairs = take(kTile * ldk);
    ds_pairs = take(kTile * ldk);
    dkt = reinterpret_cast<float*>(take(2 * hd * ldk));
    dvt = reinterpret_cast<float*>(take(2 * hd * ldk));
    stage = reinterpret_cast<float*>(take(2 * 16 * 16));
  }
};

int64_t bf16_floats(int64_t keys, int64_t hd) { return Bf16Tiles(keys, hd, nullptr).floats + 16; }

// The thread's share, aligned to 64 bytes.
float* thread_share(float* scratch, int64_t floats) {
  float* p = scratch + omp_get_thread_num() * floats;
  const auto u = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<float*>(round_up(static_cast<int64_t>(u), 64));
}

// Pairs of a reduction of n elements, padded to whole tile products.
int64_t tile_pairs(int64_t n) { return round_up(n, kTileK) / 2; }

template <class Tiles>
void forward_bf16(float* y, float* lse, const float* q, const KeyValues& kv, int64_t B, int64_t T, int64_t H,
                  int64_t KV, int64_t hd, float* scratch, int threads) {
  const int64_t ldq = H * hd, ldkv = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t max_keys = most_keys(kv, B, T), share = bf16_floats(max_keys, hd);
#pragma omp parallel num_threads(threads)
  {
    const Bf16Tiles w(max_keys, hd, thread_share(scratch, share));
    Tiles tiles;       // the tile registers (AMX: configured for this thread)
    int64_t packed = -1;  // the (b, KV head) whose keys and values w holds
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / group;
      const int64_t p0 = kv.pos ? kv.pos[b] : 0, seq = kv.slot ? kv.slot[b] : b, keys = p0 + T;
      if (packed != b * KV + g) {  // the heads of a group share one packing
        const float* K = kv.k + seq * kv.stride + g * hd;
        const float* V = kv.v + seq * kv.stride + g * hd;
        pack_by_row_pairs(w.k_hd, w.ldk, K, ldkv, keys, hd, w.hdk / 2);
        pack_by_col_pairs(w.v_rows, w.hdv, V, ldkv, keys, hd, tile_pairs(keys));
        packed = b * KV + g;
      }
      const float* Q = q + b * T * ldq + h * hd;
      float* Y = y + b * T * ldq + h * hd;
      float* L = lse ? lse + (b * H + h) * T : nullptr;
      for (int64_t t0 = 0; t0 < T; t0 += kTile) {
        const int64_t t1 = std::min(t0 + kTile, T), tq = t1 - t0;
        const int64_t nk = p0 + t1, nkp = round_up(nk, kTileK);  // keys the tile's last query sees
        rows_to_bf16(w.q16, w.hdk, Q + t0 * ldq, ldq, tq, hd);
        // S[tq, nk] = s · r(Q) r(K)ᵀ
        tile_product(tiles, w.s, w.ldk, w.q16, w.hdk, w.k_hd, w.ldk, tq, nk, w.hdk / 2, scale, false, w.stage);
        for (int64_t r = 0; r < tq; ++r) {
          float* s = w.s + r * w.ldk;
          const float l = softmax_row(s, p0 + t0 + r + 1, nk);  // keys 0 … p0+t (causal)
          if (L) L[t0 + r] = l;
          bf16* p = w.p16 + r * w.ldk;
#pragma omp simd
          for (int64_t c = 0; c < nk; ++c) p[c] = float_to_bf16(s[c]);
          for (int64_t c = nk; c < nkp; ++c) p[c] = 0;
        }
        // Y[tq, hd] = r(P) r(V)
        tile_product(tiles, Y + t0 * ldq, ldq, w.p16, w.ldk, w.v_rows, w.hdv, tq, hd, nkp / 2, 1.0f, false, w.stage);
      }
    }
  }
}

template <class Tiles>
void backward_bf16(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k, const float* v,
                   const float* y, const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                   float* scratch, int threads) {
  const int64_t ldq = H * hd, ldkv = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t share = bf16_floats(T, hd);
  // One work item per (b, KV head): it owns dK, dV of that head, so the heads
  // of a group accumulate into them without races.
#pragma omp parallel num_threads(threads)
  {
    const Bf16Tiles w(T, hd, thread_share(scratch, share));
    Tiles tiles;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * KV; ++bg) {
      const int64_t b = bg / KV, g = bg % KV;
      const float* K = k + b * T * ldkv + g * hd;
      const float* V = v + b * T * ldkv + g * hd;
      float* dK = dk + b * T * ldkv + g * hd;
      float* dV = dv + b * T * ldkv + g * hd;
      pack_by_row_pairs(w.k_hd, w.ldk, K, ldkv, T, hd, w.hdk / 2);
      pack_by_row_pairs(w.v_hd, w.ldk, V, ldkv, T, hd, w.hdk / 2);
      pack_by_col_pairs(w.k_rows, w.hdv, K, ldkv, T, hd, tile_pairs(T));
      std::memset(w.dkt, 0, static_cast<size_t>(hd * w.ldk) * sizeof(float));
      std::memset(w.dvt, 0, static_cast<size_t>(hd * w.ldk) * sizeof(float));
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* Q = q + b * T * ldq + h * hd;
        const float* Y = y + b * T * ldq + h * hd;
        const float* dY = dy + b * T * ldq + h * hd;
        float* dQ = dq + b * T * ldq + h * hd;
        const float* L = lse + (b * H + h) * T;
        for (int64_t t0 = 0; t0 < T; t0 += kTile) {
          const int64_t t1 = std::min(t0 + kTile, T), tq = t1 - t0, t1p = round_up(t1, kTileK);
          rows_to_bf16(w.q16, w.hdk, Q + t0 * ldq, ldq, tq, hd);
          rows_to_bf16(w.dy16, w.hdk, dY + t0 * ldq, ldq, tq, hd);
          transpose_to_bf16(w.qt16, kTile, Q + t0 * ldq, ldq, tq, hd);
          transpose_to_bf16(w.dyt16, kTile, dY + t0 * ldq, ldq, tq, hd);
          // P = exp(s · r(Q) r(K)ᵀ − lse) on the causal part; dP = r(dY) r(V)ᵀ.
          tile_product(tiles, w.s, w.ldk, w.q16, w.hdk, w.k_hd, w.ldk, tq, t1, w.hdk / 2, scale, false, w.stage);
          tile_product(tiles, w.dp, w.ldk, w.dy16, w.hdk, w.v_hd, w.ldk, tq, t1, w.hdk / 2, 1.0f, false, w.stage);
          alignas(64) float D[kTile];  // D = Σ_c P_c dP_c = rowsum(dY∘Y)
          row_dots(D, dY + t0 * ldq, Y + t0 * ldq, ldq, tq, hd);
          // dS = P∘(dP − D), rounded three ways as it is made, two query rows
          // at a time: rows of r(dS) (dQ's A), and r(P) and r(dS) by query
          // pairs (the B of dVᵀ and dKᵀ), a pair's two rows in one word.
          // Zeros past each row's causal end, up to t1p.  (S and dP are read
          // up to t1p: columns past t1, and a row past tq, hold what an
          // earlier tile left; they are masked, never used.)
          auto* p_words = reinterpret_cast<uint32_t*>(w.p_pairs);
          auto* ds_words = reinterpret_cast<uint32_t*>(w.ds_pairs);
          for (int64_t r = 0; r < tq; r += 2) {
            const bool two = r + 1 < tq;
            const int64_t n0 = t0 + r + 1, n1 = two ? n0 + 1 : 0;  // keys each row sees
            const float *s0 = w.s + r * w.ldk, *s1 = s0 + w.ldk;
            const float *dp0 = w.dp + r * w.ldk, *dp1 = dp0 + w.ldk;
            const float D0 = D[r], D1 = two ? D[r + 1] : 0.0f, l0 = L[t0 + r], l1 = two ? L[t0 + r + 1] : 0.0f;
            bf16 *ds0 = w.ds16 + r * w.ldk, *ds1 = ds0 + w.ldk;  // row tq (odd tq) is in the buffer: A rows past M
            uint32_t* pw = p_words + r / 2 * w.ldk;
            uint32_t* dw = ds_words + r / 2 * w.ldk;
#pragma omp simd
            for (int64_t c = 0; c < t1p; ++c) {
              const float p0 = c < n0 ? fast_exp(s0[c] - l0) : 0.0f;
              const float p1 = c < n1 ? fast_exp(s1[c] - l1) : 0.0f;
              const float g0 = c < n0 ? p0 * (dp0[c] - D0) : 0.0f;  // dS
              const float g1 = c < n1 ? p1 * (dp1[c] - D1) : 0.0f;
              ds0[c] = float_to_bf16(g0);
              ds1[c] = float_to_bf16(g1);
              pw[c] = pair_word(p0, p1);
              dw[c] = pair_word(g0, g1);
            }
          }
          zero_pair_rows(w.p_pairs, w.ldk, (tq + 1) / 2, tile_pairs(tq));  // the reduction over queries, padded
          zero_pair_rows(w.ds_pairs, w.ldk, (tq + 1) / 2, tile_pairs(tq));
          // dQ[t0:t1] = s · r(dS) r(K)[0:t1]
          tile_product(tiles, dQ + t0 * ldq, ldq, w.ds16, w.ldk, w.k_rows, w.hdv, tq, hd, t1p / 2, scale, false,
                       w.stage);
          // dKᵀ[:, 0:t1] += s · r(Q)ᵀ[:, t0:t1] r(dS);  dVᵀ[:, 0:t1] += r(dY)ᵀ[:, t0:t1] r(P)
          tile_product(tiles, w.dkt, w.ldk, w.qt16, kTile, w.ds_pairs, w.ldk, hd, t1, tile_pairs(tq), scale, true,
                       w.stage);
          tile_product(tiles, w.dvt, w.ldk, w.dyt16, kTile, w.p_pairs, w.ldk, hd, t1, tile_pairs(tq), 1.0f, true,
                       w.stage);
        }
      }
      transpose_out(dK, ldkv, w.dkt, w.ldk, T, hd);
      transpose_out(dV, ldkv, w.dvt, w.ldk, T, hd);
    }
  }
}

// The tile implementation this copy of the kernels runs for `path` (tiles.h):
// a path this copy was not compiled with (below avx512, or clang) is float.
template <class F>
void with_tiles(TilePath path, F&& run) {
#if defined(ATTNRES_ISA_AVX512) && !defined(__clang__)
  if (path == TilePath::kAmx) return run(static_cast<AmxTiles*>(nullptr));
  if (path == TilePath::kAvx512Bf16) return run(static_cast<Dpbf16Tiles*>(nullptr));
#endif
  (void)path;
  run(static_cast<FloatTiles*>(nullptr));
}

}  // namespace

// Per thread, the larger of the forward's and the backward's buffers.
int64_t CpuKernels::attention_workspace(int64_t max_keys, int64_t hd, Precision p) const {
  const int64_t per_thread = p == Precision::kBF16 ? bf16_floats(max_keys, hd) : f32_floats(max_keys);
  return threads() * per_thread;
}

void CpuKernels::attention_forward_impl(float* y, float* lse, const float* q, const KeyValues& kv, int64_t B, int64_t T,
                                   int64_t H, int64_t KV, int64_t hd, Precision p) {
  float* scratch = ctx_.workspace(attention_workspace(most_keys(kv, B, T), hd, p));
  if (p == Precision::kBF16)
    with_tiles(tile_path(), [&](auto* tiles) {
      forward_bf16<std::remove_pointer_t<decltype(tiles)>>(y, lse, q, kv, B, T, H, KV, hd, scratch, threads());
    });
  else
    forward_f32(y, lse, q, kv, B, T, H, KV, hd, scratch, threads());
}

void CpuKernels::attention_backward_impl(float* dq, float* dk, float* dv, const float* dy, const float* q,
                                    const float* k, const float* v, const float* y, const float* lse, int64_t B,
                                    int64_t T, int64_t H, int64_t KV, int64_t hd, Precision p) {
  float* scratch = ctx_.workspace(attention_workspace(T, hd, p));
  if (p == Precision::kBF16)
    with_tiles(tile_path(), [&](auto* tiles) {
      backward_bf16<std::remove_pointer_t<decltype(tiles)>>(dq, dk, dv, dy, q, k, v, y, lse, B, T, H, KV, hd, scratch,
                                                            threads());
    });
  else
    backward_f32(dq, dk, dv, dy, q, k, v, y, lse, B, T, H, KV, hd, scratch, threads());
}

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"
