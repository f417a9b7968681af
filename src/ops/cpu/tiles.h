// tiles.h — the tile interface of attention's bf16 products, and the tiled
// product written once over it (attention.cpp runs its six products through
// tile_product).  Included by a kernel file after isa_begin.h, so each level's
// copy gets its own (cpu_level.h); what is not a product is not here.
//
// The machine model is Intel's AMX with palette 1: eight tile registers, each
// up to 16 rows of 64 bytes, and one product instruction, TDPBF16PS:
//
//   C[m, n] += Σ_p ( A[m, 2p]·B[p, n, 0] + A[m, 2p+1]·B[p, n, 1] )
//
//   C  16 rows × 16 float32                    (one tile)
//   A  16 rows × 16 pairs of bf16: a row's reduction pairs adjacent
//   B  16 pair-rows × 16 columns × 2 bf16: 16 consecutive columns of one pair
//      are one 64-byte row ("VNNI" packing, attention.cpp's pack_* helpers)
//
// The interface is the instructions, nothing more — configure (the
// constructor), zero, load, dp, store, release (the destructor) — and three
// implementations of it hold the same semantics:
//   AmxTiles     the AMX instructions (avx512 copy only; chosen where the CPU
//                reports AMX-BF16 and the kernel grants the tile permission,
//                cpu_level.h choose_tile_path);
//   Dpbf16Tiles  each tile product as 16 × 16 VDPBF16PS, a C tile's rows in
//                registers while its products run (avx512 copy, CPUs with
//                AVX512-BF16);
//   FloatTiles   the same in float arithmetic (every level; the pair's two
//                products are exact in float, as in both instructions).
// So the blocking, the padding and the edge masks of tile_product run and are
// tested on every machine; only AmxTiles' instructions need an AMX CPU.
// The sums are float32 in all three; their order within one tile product is
// the hardware's (TDPBF16PS's internal order is not specified beyond the
// pseudocode), so the paths agree to float32's rounding of the sums, not bit
// for bit (docs/DESIGN.md §6, "Which results depend on the CPU family").
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/bf16.h"

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

// Tile registers of tile_product: 0–3 the C block (2 × 2 tiles), 4–5 two row
// tiles of A, 6–7 two column tiles of B.
constexpr int kTileRows = 16;      // rows of a tile
constexpr int kTileBytes = 64;     // bytes of a tile row
constexpr int kTilePairs = 16;     // bf16 pairs in a row of A (= pair-rows of B)
constexpr int64_t kTileK = 32;     // reduction elements of one tile product (K is padded to this)

// The A and B tiles of the implementations without tile registers: views (a
// load records where the rows are; nothing writes an operand between its load
// and its products).
struct TileViews {
  const uint8_t* rows[8] = {};
  int64_t stride[8] = {};
  template <int t>
  void load(const void* p, int64_t stride_bytes) {
    rows[t] = static_cast<const uint8_t*>(p);
    stride[t] = stride_bytes;
  }
};

// ---- FloatTiles: the semantics in float arithmetic ----------------------------
//
// C tiles are 16 × 16 floats; A and B are views.
struct FloatTiles : TileViews {
  alignas(64) float c[4][kTileRows][16];

  template <int t>
  void zero() {
    std::memset(c[t], 0, sizeof(c[t]));
  }
  template <int ct, int at, int bt>
  void dp() {
    for (int m = 0; m < kTileRows; ++m) {
      const bf16* a = reinterpret_cast<const bf16*>(rows[at] + m * stride[at]);
      float* cm = c[ct][m];
      for (int p = 0; p < kTilePairs; ++p) {
        const float a0 = bf16_to_float(a[2 * p]), a1 = bf16_to_float(a[2 * p + 1]);
        const bf16* b = reinterpret_cast<const bf16*>(rows[bt] + p * stride[bt]);
#pragma omp simd
        for (int n = 0; n < 16; ++n) cm[n] += a0 * bf16_to_float(b[2 * n]) + a1 * bf16_to_float(b[2 * n + 1]);
      }
    }
  }
  template <int t>
  void store(float* p, int64_t stride_bytes) {
    for (int m = 0; m < kTileRows; ++m)
      std::memcpy(reinterpret_cast<uint8_t*>(p) + m * stride_bytes, c[t][m], sizeof(c[t][m]));
  }
};

#if defined(ATTNRES_ISA_AVX512) && !defined(__clang__)
#define ATTNRES_TILES_DPBF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// ---- Dpbf16Tiles: each tile product as VDPBF16PS -----------------------------
//
// One TDPBF16PS is 16 rows × 16 pairs of VDPBF16PS: a row of C is one zmm of
// 16 float lanes, a pair-row of B one zmm of 16 column pairs, and a pair of a
// row of A is broadcast to every lane; the 16 rows are 16 independent chains,
// enough to hide the instruction's latency.  The products of a C tile are
// done when the tile is stored or written (or after kPending of them): they
// run then one after the other with the tile's 16 rows held in registers, so
// C goes through memory once per kPending tile products instead of once per
// product (16: a reduction of 512 keys never waits) — the same sums in the
// same order as one instruction at a time.  (So an
// operand must not change between its dp and the store of its C tile, which
// tile_product never does.)
// acc += the 16 column pairs of b, each times the pair of A at `pair` (one
// VDPBF16PS, the pair broadcast from memory by the instruction itself: no
// separate broadcast).  The instruction sums a lane's two products in the
// same order whichever operand is broadcast.
ATTNRES_TILES_DPBF16 inline __m512 dp_broadcast(__m512 acc, __m512bh b, const uint8_t* pair) {
  asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(b), "m"(*reinterpret_cast<const int32_t*>(pair)));
  return acc;
}

struct Dpbf16Tiles : TileViews {
  static constexpr int kPending = 16;
  struct Pending {
    const uint8_t *a, *b;
    int64_t sa, sb;
  };
  alignas(64) float c[4][kTileRows][16];
  bool zeroed[4] = {};               // the tile is zero and c[t] not yet written
  Pending pending[4][kPending];      // products of C tile t not done yet
  int n_pending[4] = {};

  template <int t>
  void zero() {
    zeroed[t] = true;
    n_pending[t] = 0;
  }
  template <int ct, int at, int bt>
  void dp() {
    if (n_pending[ct] == kPending) flush(ct, c[ct][0], 64);  // (an even tile whose partner did not come)
    pending[ct][n_pending[ct]++] = Pending{rows[at], rows[bt], stride[at], stride[bt]};
    if constexpr (ct % 2 == 1) {  // the pair's second: both done together where they share A
      if (n_pending[ct] == kPending) {
        if (same_a(ct - 1, ct))
          flush_pair(ct - 1);
        else
          flush(ct, c[ct][0], 64);
      }
    }
  }
  template <int t>
  void store(float* p, int64_t stride_bytes) {
    flush(t, p, stride_bytes);
  }
  // tile_product's epilogue from the registers (no staging tile): C's first
  // `rows` rows and `cols` columns = α·tile (+ C).  Ends the tile's use (the
  // next starts with zero()).  Tiles 0 and 1 (2 and 3) of a 2 × 2 block read
  // the same A: given the columns of tile t+1 (next_cols > 0, at C + 16) and
  // their products pending over the same A rows, both are done together, 8
  // rows at a time, so that a broadcast pair of A feeds two VDPBF16PS, and
  // both are written.  Returns the tiles written (1 or 2).
  template <int t>
  ATTNRES_TILES_DPBF16 int write(float* C, int64_t ldc, int64_t rows, int64_t cols, float alpha, bool accumulate,
                                 int64_t next_cols) {
    const __m512 al = _mm512_set1_ps(alpha);
    auto put_row = [&](float* o, __mmask16 mask, __m512 v) {
      const __m512 x = accumulate ? _mm512_fmadd_ps(v, al, _mm512_maskz_loadu_ps(mask, o)) : _mm512_mul_ps(v, al);
      _mm512_mask_storeu_ps(o, mask, x);
    };
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
    if constexpr (t % 2 == 0) {
      if (next_cols > 0 && same_a(t, t + 1)) {
        const __mmask16 mask1 = static_cast<__mmask16>((1u << next_cols) - 1u);
        for (int half = 0; half < kTileRows; half += 8) {
          __m512 a0[8], a1[8];
          products_pair(t, half, a0, a1);
#pragma GCC unroll 8
          for (int r = 0; r < 8; ++r) {
            if (half + r >= rows) break;
            put_row(C + (half + r) * ldc, mask, a0[r]);
            put_row(C + (half + r) * ldc + 16, mask1, a1[r]);
          }
        }
        n_pending[t] = n_pending[t + 1] = 0;
        zeroed[t] = zeroed[t + 1] = false;
        return 2;
      }
    }
    __m512 acc[kTileRows];
    products(t, acc);
    for (int64_t m = 0; m < rows; ++m) put_row(C + m * ldc, mask, acc[m]);
    n_pending[t] = 0;
    zeroed[t] = false;
    return 1;
  }

  // C tiles t and t+1 plus their pending products (same_a), into their memory.
  ATTNRES_TILES_DPBF16 void flush_pair(int t) {
    for (int half = 0; half < kTileRows; half += 8) {
      __m512 a0[8], a1[8];
      products_pair(t, half, a0, a1);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        _mm512_store_ps(c[t][half + r], a0[r]);
        _mm512_store_ps(c[t + 1][half + r], a1[r]);
      }
    }
    zeroed[t] = zeroed[t + 1] = false;
    n_pending[t] = n_pending[t + 1] = 0;
  }

  // Whether C tiles t and u have the same pending products' A operands (and
  // some: a tile outside the block has none).
  bool same_a(int t, int u) const {
    if (n_pending[t] == 0 || n_pending[t] != n_pending[u] || zeroed[t] != zeroed[u]) return false;
    for (int i = 0; i < n_pending[t]; ++i)
      if (pending[t][i].a != pending[u][i].a || pending[t][i].sa != pending[u][i].sa) return false;
    return true;
  }

  // Rows half … half+7 of C tiles t and t+1 plus their pending products
  // (same_a), into a0 and a1.
  ATTNRES_TILES_DPBF16 __attribute__((always_inline)) inline void products_pair(int t, int half, __m512* a0,
                                                                                 __m512* a1) {
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      a0[r] = zeroed[t] ? _mm512_setzero_ps() : _mm512_load_ps(c[t][half + r]);
      a1[r] = zeroed[t + 1] ? _mm512_setzero_ps() : _mm512_load_ps(c[t + 1][half + r]);
    }
    for (int i = 0; i < n_pending[t]; ++i) {
      const Pending &q0 = pending[t][i], &q1 = pending[t + 1][i];
      const uint8_t* a = q0.a + half * q0.sa;
#pragma GCC unroll 2
      for (int p = 0; p < kTilePairs; ++p) {
        const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q0.b + p * q0.sb));
        const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q1.b + p * q1.sb));
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
          const uint8_t* pair = a + r * q0.sa + 4 * p;
          a0[r] = dp_broadcast(a0[r], b0, pair);
          a1[r] = dp_broadcast(a1[r], b1, pair);
        }
      }
    }
  }

  // C tile t (its memory, or zero) plus its pending products, written to c[t]
  // and to out (rows at out_stride bytes) when that is elsewhere.
  ATTNRES_TILES_DPBF16 void flush(int t, float* out, int64_t out_stride) {
    __m512 acc[kTileRows];
    products(t, acc);
#pragma GCC unroll 16
    for (int m = 0; m < kTileRows; ++m) _mm512_store_ps(c[t][m], acc[m]);
    zeroed[t] = false;
    n_pending[t] = 0;
    if (out == c[t][0]) return;
    auto* o = reinterpret_cast<uint8_t*>(out);
#pragma GCC unroll 16
    for (int m = 0; m < kTileRows; ++m) _mm512_storeu_ps(o + m * out_stride, acc[m]);
  }

  // acc = C tile t (its memory, or zero) plus its pending products.
  ATTNRES_TILES_DPBF16 __attribute__((always_inline)) inline void products(int t, __m512* acc) {
#pragma GCC unroll 16
    for (int m = 0; m < kTileRows; ++m) acc[m] = zeroed[t] ? _mm512_setzero_ps() : _mm512_load_ps(c[t][m]);
    for (int i = 0; i < n_pending[t]; ++i) {
      const Pending& q = pending[t][i];
#pragma GCC unroll 2
      for (int p = 0; p < kTilePairs; ++p) {
        const __m512bh bv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q.b + p * q.sb));
#pragma GCC unroll 16
        for (int m = 0; m < kTileRows; ++m) acc[m] = dp_broadcast(acc[m], bv, q.a + m * q.sa + 4 * p);
      }
    }
  }
};
#undef ATTNRES_TILES_DPBF16

// ---- AmxTiles: the instructions ---------------------------------------------
//
// Written as inline assembly with the tile number an immediate ("%c"), so
// that the tile register can be a template argument (the compilers' _tile_*
// macros paste it as a token) and no target flag is needed: the assembler
// knows the instructions, and only a CPU that granted the tile permission
// runs them (choose_tile_path).  AT&T order: sources first, destination last.
// Every tile instruction is volatile with a memory clobber: the packings
// written just before a load must not move past it.
struct AmxTiles {
  // LDTILECFG's 64 bytes, palette 1: every tile 16 rows of 64 bytes.
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  };
  AmxTiles() {
    Config cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.colsb[t] = kTileBytes;
      cfg.rows[t] = kTileRows;
    }
    asm volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  }
  ~AmxTiles() { asm volatile("tilerelease" ::: "memory"); }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;

  template <int t>
  void zero() {
    asm volatile("tilezero %%tmm%c0" ::"i"(t) : "memory");
  }
  template <int t>
  void load(const void* p, int64_t stride_bytes) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride_bytes), "i"(t) : "memory");
  }
  template <int ct, int at, int bt>
  void dp() {
    asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(ct), "i"(at), "i"(bt) : "memory");
  }
  template <int t>
  void store(float* p, int64_t stride_bytes) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(stride_bytes), "i"(t) : "memory");
  }
};
#endif

// ---- the tiled product --------------------------------------------------------
//
//   C[M, N] (+)= α · A[M, K] · B[K, N]          K = 2·Kp, Kp a multiple of 16
//
// A: bf16 rows at stride lda elements, the reduction's pairs adjacent; rows
//    M … round_up(M, 16) − 1 and elements K … must be readable (their values
//    reach only C rows that are not written; the K padding must be zeros in
//    A or B — here both, so nothing finite or not leaks in).
// B: packed [Kp][ldb][2] bf16, ldb a multiple of 16 ≥ N.
// C: float32 at stride ldc; written as α·(A·B), or added to with accumulate.
// The C block is 2 × 2 tiles (32 × 32) where M and N leave them, 1 at the
// edges; partial tiles, and tiles scaled or added to C, are written through
// a 16 × 16 staging tile with a mask of the rows and columns that are C's.
namespace tiles_detail {

template <class Tiles, int MT, int NT>
inline void block(Tiles& t, float* C, int64_t ldc, const bf16* A, int64_t lda, const bf16* B, int64_t ldb,
                  int64_t m_rows, int64_t n_cols, int64_t Kp, float alpha, bool accumulate, float* stage) {
  t.template zero<0>();
  if constexpr (NT == 2) t.template zero<1>();
  if constexpr (MT == 2) t.template zero<2>();
  if constexpr (MT == 2 && NT == 2) t.template zero<3>();
  const int64_t sa = lda * 2, sb = ldb * 4;  // bytes between rows of A, between pair-rows of B
  for (int64_t p = 0; p < Kp; p += kTilePairs) {
    t.template load<4>(A + 2 * p, sa);
    if constexpr (MT == 2) t.template load<5>(A + kTileRows * lda + 2 * p, sa);
    t.template load<6>(B + p * ldb * 2, sb);
    if constexpr (NT == 2) t.template load<7>(B + (p * ldb + 16) * 2, sb);
    t.template dp<0, 4, 6>();
    if constexpr (NT == 2) t.template dp<1, 4, 7>();
    if constexpr (MT == 2) t.template dp<2, 5, 6>();
    if constexpr (MT == 2 && NT == 2) t.template dp<3, 5, 7>();
  }
  // The C tiles, α·tile (+ C) with the rows and columns that are C's: by the
  // implementation's own epilogue where it has one (write: a row's two tiles
  // at once where it can), else through the stage.
  auto through_stage = [&](auto store_tile, int64_t i, int64_t j) {
    const int64_t r1 = std::min<int64_t>(kTileRows, m_rows - i * kTileRows);
    const int64_t c1 = std::min<int64_t>(16, n_cols - j * 16);
    if (alpha == 1.0f && !accumulate && r1 == kTileRows && c1 == 16) {  // a whole tile, as it is: straight to C
      store_tile(C + i * kTileRows * ldc + j * 16, ldc * 4);
      return;
    }
    store_tile(stage, 64);
    for (int64_t r = 0; r < r1; ++r) {
      float* c = C + (i * kTileRows + r) * ldc + j * 16;
      const float* s = stage + r * 16;
      if (accumulate) {
#pragma omp simd
        for (int64_t n = 0; n < c1; ++n) c[n] += alpha * s[n];
      } else {
#pragma omp simd
        for (int64_t n = 0; n < c1; ++n) c[n] = alpha * s[n];
      }
    }
  };
  constexpr bool own = requires { t.template write<0>(C, ldc, m_rows, n_cols, alpha, accumulate, 0); };
  auto row_of_tiles = [&](auto first, int64_t i) {  // C tiles (i, 0) and, with NT = 2, (i, 1): 2i and 2i + 1
    constexpr int ct = decltype(first)::value;
    if constexpr (own) {
      const int64_t r1 = std::min<int64_t>(kTileRows, m_rows - i * kTileRows);
      const int64_t c0 = std::min<int64_t>(16, n_cols), c1 = NT == 2 ? n_cols - 16 : 0;
      float* c = C + i * kTileRows * ldc;
      const int written = t.template write<ct>(c, ldc, r1, c0, alpha, accumulate, c1);
      if constexpr (NT == 2) {
        if (written == 1) t.template write<ct + 1>(c + 16, ldc, r1, c1, alpha, accumulate, 0);
      }
    } else {
      through_stage([&](float* p, int64_t stride) { t.template store<ct>(p, stride); }, i, 0);
      if constexpr (NT == 2) through_stage([&](float* p, int64_t stride) { t.template store<ct + 1>(p, stride); }, i, 1);
    }
  };
  row_of_tiles(std::integral_constant<int, 0>{}, 0);
  if constexpr (MT == 2) row_of_tiles(std::integral_constant<int, 2>{}, 1);  // C tile (i, j) is 2i + j
}

}  // namespace tiles_detail

// stage: 16 × 16 floats, 64-byte aligned (the thread's own).
template <class Tiles>
void tile_product(Tiles& t, float* C, int64_t ldc, const bf16* A, int64_t lda, const bf16* B, int64_t ldb, int64_t M,
                  int64_t N, int64_t Kp, float alpha, bool accumulate, float* stage) {
  using tiles_detail::block;
  for (int64_t m0 = 0; m0 < M; m0 += 2 * kTileRows) {
    const int64_t mr = std::min<int64_t>(2 * kTileRows, M - m0);
    const bf16* a = A + m0 * lda;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const int64_t nc = std::min<int64_t>(32, N - n0);
      float* c = C + m0 * ldc + n0;
      const bf16* b = B + n0 * 2;
      if (mr > kTileRows) {
        if (nc > 16)
          block<Tiles, 2, 2>(t, c, ldc, a, lda, b, ldb, mr, nc, Kp, alpha, accumulate, stage);
        else
          block<Tiles, 2, 1>(t, c, ldc, a, lda, b, ldb, mr, nc, Kp, alpha, accumulate, stage);
      } else if (nc > 16) {
        block<Tiles, 1, 2>(t, c, ldc, a, lda, b, ldb, mr, nc, Kp, alpha, accumulate, stage);
      } else {
        block<Tiles, 1, 1>(t, c, ldc, a, lda, b, ldb, mr, nc, Kp, alpha, accumulate, stage);
      }
    }
  }
}

}  // namespace attnres::ATTNRES_ISA
