// matmul.cpp — linear layers.  Weights are [out, in] (PyTorch).
//
// Many rows (training, prefill): float32 weights through CBLAS SGEMM, bf16
// weights through oneDNN's bf16 matmul (the input rows rounded to bf16 first),
// both as fixed tiles of the output, one single-threaded call per tile.  Few
// rows (decoding one token per sequence): the product is bound by reading the
// weights, so each weight row is streamed once and dotted with every input row
// while it sits in L1 (`skinny`): no packing copy of the weights, which a GEMM
// would make.  With bf16 weights the input rows are rounded to bf16 there too,
// so a product has one meaning whatever its number of rows.
#include <cblas.h>

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "ops/cpu/blas_kernels.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/dnnl_matmul.h"

namespace attnres {

namespace {

constexpr int64_t kSkinnyRows = 16;  // at most this many input rows: the streaming kernel


// 16 floats as one value (GCC vector extensions): one zmm register in the
// AVX-512 clone below, two ymm in the AVX2 one, four xmm in the portable one.
// These helpers are inlined into the clones and never cross a call: the
// warning that passing them would change with the ISA does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef uint16_t v16h __attribute__((vector_size(32), aligned(2)));
typedef uint32_t v16u __attribute__((vector_size(64)));

#define ATTNRES_INLINE inline __attribute__((always_inline))  // into each ISA clone
ATTNRES_INLINE v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
ATTNRES_INLINE v16f load16(const bf16* p) {  // bf16 → float: the 16 bits become the upper half
  v16h h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<v16f>(__builtin_convertvector(h, v16u) << 16);
}
ATTNRES_INLINE float widen1(float x) { return x; }
ATTNRES_INLINE float widen1(bf16 x) { return bf16_to_float(x); }
ATTNRES_INLINE float hsum(v16f a) {
  const v8f b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4f c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// Σ_i w[i]·x[i] with four independent 16-lane partial sums: the loop runs at
// load bandwidth rather than at the latency of one chain of fused
// multiply-adds; the lanes are then added as a tree.
template <class WT>
ATTNRES_INLINE float dot_stream(const WT* w, const float* x, int64_t n) {
  v16f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 += load16(w + i) * load16(x + i);
    a1 += load16(w + i + 16) * load16(x + i + 16);
    a2 += load16(w + i + 32) * load16(x + i + 32);
    a3 += load16(w + i + 48) * load16(x + i + 48);
  }
  for (; i + 16 <= n; i += 16) a0 += load16(w + i) * load16(x + i);
  float s = hsum((a0 + a1) + (a2 + a3));
  for (; i < n; ++i) s += widen1(w[i]) * x[i];
  return s;
}

// The same for two weight rows at once: twice the loads in flight, and the
// two trees of the final sums overlap.
template <class WT>
ATTNRES_INLINE void dot_stream2(const WT* w0, const WT* w1, const float* x, int64_t n, float* s0, float* s1) {
  v16f a0 = {}, a1 = {}, b0 = {}, b1 = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const v16f x0 = load16(x + i), x1 = load16(x + i + 16);
    a0 += load16(w0 + i) * x0;
    a1 += load16(w0 + i + 16) * x1;
    b0 += load16(w1 + i) * x0;
    b1 += load16(w1 + i + 16) * x1;
  }
  for (; i + 16 <= n; i += 16) {
    const v16f x0 = load16(x + i);
    a0 += load16(w0 + i) * x0;
    b0 += load16(w1 + i) * x0;
  }
  float r0 = hsum(a0 + a1), r1 = hsum(b0 + b1);
  for (; i < n; ++i) r0 += widen1(w0[i]) * x[i], r1 += widen1(w1[i]) * x[i];
  *s0 = r0;
  *s1 = r1;
}

// bf16 weights two at a time: 32 bits hold w[2k] (low half) and w[2k+1]
// (high half), so one load gives both as floats with a shift and a mask — no
// widening shuffles, which would bound the loop below memory speed — against
// the input split into its even (xe) and odd (xo) elements.  pairs = I/2.
ATTNRES_INLINE v16u load16u(const bf16* p) {
  v16u v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
ATTNRES_INLINE float dot_bf16_pairs(const bf16* w, const float* xe, const float* xo, int64_t pairs) {
  v16f a0 = {}, a1 = {}, b0 = {}, b1 = {};
  int64_t k = 0;
  for (; k + 32 <= pairs; k += 32) {
    const v16u u0 = load16u(w + 2 * k), u1 = load16u(w + 2 * k + 32);
    a0 += reinterpret_cast<v16f>(u0 << 16) * load16(xe + k);
    b0 += reinterpret_cast<v16f>(u0 & 0xFFFF0000u) * load16(xo + k);
    a1 += reinterpret_cast<v16f>(u1 << 16) * load16(xe + k + 16);
    b1 += reinterpret_cast<v16f>(u1 & 0xFFFF0000u) * load16(xo + k + 16);
  }
  float s = hsum((a0 + a1) + (b0 + b1));
  for (; k < pairs; ++k) s += bf16_to_float(w[2 * k]) * xe[k] + bf16_to_float(w[2 * k + 1]) * xo[k];
  return s;
}

// out[n, o] = Σ_i inp[n, i] W[o, i] for the output rows [o0, o1), N ≤ kSkinnyRows:
// each weight row is read from memory once.  Compiled for AVX-512, AVX2 and
// the portable baseline; the loader picks one for this CPU.
template <class WT>
ATTNRES_INLINE void skinny_rows(float* out, const float* inp, const WT* W, int64_t N, int64_t I, int64_t O, int64_t o0,
                                int64_t o1) {
  int64_t o = o0;
  for (; o + 2 <= o1; o += 2)
    for (int64_t n = 0; n < N; ++n) dot_stream2(W + o * I, W + (o + 1) * I, inp + n * I, I, &out[n * O + o], &out[n * O + o + 1]);
  for (; o < o1; ++o)
    for (int64_t n = 0; n < N; ++n) out[n * O + o] = dot_stream(W + o * I, inp + n * I, I);
}
#define ATTNRES_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
ATTNRES_CLONES void skinny_rows_f32(float* out, const float* inp, const float* W, int64_t N, int64_t I, int64_t O,
                                    int64_t o0, int64_t o1) {
  skinny_rows(out, inp, W, N, I, O, o0, o1);
}
// For an odd I (no pairs): the widening loads.
ATTNRES_CLONES void skinny_rows_bf16_odd(float* out, const float* inp, const bf16* W, int64_t N, int64_t I, int64_t O,
                                         int64_t o0, int64_t o1) {
  skinny_rows(out, inp, W, N, I, O, o0, o1);
}
// split: (N, I) the input rows as [even elements | odd elements] (I even).
ATTNRES_CLONES void skinny_rows_bf16(float* out, const float* split, const bf16* W, int64_t N, int64_t I, int64_t O,
                                     int64_t o0, int64_t o1) {
  const int64_t pairs = I / 2;
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t n = 0; n < N; ++n)
      out[n * O + o] = dot_bf16_pairs(W + o * I, split + n * I, split + n * I + pairs, pairs);
}
#undef ATTNRES_CLONES

// With AVX512-BF16 (every CPU bf16 products run on): VDPBF16PS multiplies 16
// pairs of bf16 and adds both products of a pair to a float lane — one
// instruction for 32 multiply-adds, no widening — on the input rounded to
// bf16 once (x16: (N, I)).  Two weight rows at a time, each read once.
#define ATTNRES_BF16_ISA __attribute__((target("avx512f,avx512bf16")))
ATTNRES_BF16_ISA ATTNRES_INLINE __m512bh bf16x32(const bf16* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}
// The 16 lanes added as a tree (GCC 12's _mm512_reduce_add_ps trips -Wmaybe-uninitialized).
ATTNRES_BF16_ISA ATTNRES_INLINE float hsum512(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  for (int w = 8; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}
ATTNRES_BF16_ISA void skinny_rows_dpbf16(float* out, const bf16* x16, const bf16* W, int64_t N, int64_t I, int64_t O,
                                         int64_t o0, int64_t o1) {
  const int64_t I32 = I / 32 * 32;
  auto tail = [&](const bf16* w, const bf16* x) {
    float t = 0.0f;
    for (int64_t i = I32; i < I; ++i) t += bf16_to_float(w[i]) * bf16_to_float(x[i]);
    return t;
  };
  int64_t o = o0;
  for (; o + 2 <= o1; o += 2) {
    const bf16 *w0 = W + o * I, *w1 = w0 + I;
    for (int64_t n = 0; n < N; ++n) {
      const bf16* x = x16 + n * I;
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
      int64_t i = 0;
      for (; i + 64 <= I32; i += 64) {
        const __m512bh xa = bf16x32(x + i), xb = bf16x32(x + i + 32);
        a0 = _mm512_dpbf16_ps(a0, bf16x32(w0 + i), xa);
        a1 = _mm512_dpbf16_ps(a1, bf16x32(w0 + i + 32), xb);
        b0 = _mm512_dpbf16_ps(b0, bf16x32(w1 + i), xa);
        b1 = _mm512_dpbf16_ps(b1, bf16x32(w1 + i + 32), xb);
      }
      for (; i < I32; i += 32) {
        const __m512bh xa = bf16x32(x + i);
        a0 = _mm512_dpbf16_ps(a0, bf16x32(w0 + i), xa);
        b0 = _mm512_dpbf16_ps(b0, bf16x32(w1 + i), xa);
      }
      out[n * O + o] = hsum512(_mm512_add_ps(a0, a1)) + tail(w0, x);
      out[n * O + o + 1] = hsum512(_mm512_add_ps(b0, b1)) + tail(w1, x);
    }
  }
  for (; o < o1; ++o) {
    const bf16* w = W + o * I;
    for (int64_t n = 0; n < N; ++n) {
      const bf16* x = x16 + n * I;
      __m512 a = _mm512_setzero_ps();
      for (int64_t i = 0; i < I32; i += 32) a = _mm512_dpbf16_ps(a, bf16x32(w + i), bf16x32(x + i));
      out[n * O + o] = hsum512(a) + tail(w, x);
    }
  }
}
#undef ATTNRES_BF16_ISA

#define ATTNRES_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
ATTNRES_CLONES void round_to_bf16(bf16* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}
#undef ATTNRES_CLONES
#undef ATTNRES_INLINE

// Threads split the output rows in blocks of 16 (a cache line of outputs per row).
template <class WT>
void skinny(float* out, const float* inp, const WT* W, int64_t N, int64_t I, int64_t O, int threads) {
  // bf16: `inp` is the input rounded to bf16 (N, I) with VDPBF16PS; without
  // it, with an even I, the rounded input split into even and odd elements.
  const int64_t blocks = (O + 15) / 16;
  const bool dp = sizeof(WT) == 2 && cpu_has_dpbf16();
#pragma omp parallel for schedule(static) num_threads(threads) if (O * I >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t o0 = 16 * b, o1 = o0 + 16 < O ? o0 + 16 : O;
    if constexpr (sizeof(WT) == 2) {
      if (dp) skinny_rows_dpbf16(out, reinterpret_cast<const bf16*>(inp), W, N, I, O, o0, o1);
      else if (I % 2 == 0) skinny_rows_bf16(out, inp, W, N, I, O, o0, o1);
      else skinny_rows_bf16_odd(out, inp, W, N, I, O, o0, o1);
    } else {
      skinny_rows_f32(out, inp, W, N, I, O, o0, o1);
    }
  }
}

// The tiles of an [M, N] output: they start at 512 × 512 and the larger side
// is halved, down to 64, until there are `want` of them — enough to share
// out, big enough that packing the operands stays cheap.  They depend on the
// shape alone: every output element is summed in the same order whatever the
// thread count, so a run, and a resume, give the same bits on 1 thread or 64.
struct Tiling {
  int64_t mb, nb;  // tile rows, columns (the last row / column of tiles may be smaller)
  int64_t tm, tn;  // tiles down, across
};
Tiling tiling(int64_t M, int64_t N, int64_t want) {
  auto up64 = [](int64_t x) { return (x + 63) / 64 * 64; };
  Tiling t{std::min<int64_t>(512, up64(M)), std::min<int64_t>(512, up64(N)), 0, 0};
  auto count = [&] { return ((M + t.mb - 1) / t.mb) * ((N + t.nb - 1) / t.nb); };
  while (count() < want && (t.mb > 64 || t.nb > 64)) (t.mb >= t.nb ? t.mb : t.nb) /= 2;
  t.tm = (M + t.mb - 1) / t.mb;
  t.tn = (N + t.nb - 1) / t.nb;
  return t;
}

// bf16: whole rows of the output where it is at most kWholeRows wide (every
// projection, MLP, input-gradient and weight-gradient product), `want` tiles
// of a multiple of 16 rows, at least kMinRows (or all of M) and at most 512:
// a tile's output is then one dense block, for which oneDNN 2.6 takes its
// brgemm kernels (AMX where the CPU has it; a strided tile gets its older
// gemm kernel).  Every tile packs the whole of B for the matrix unit (pairs
// of K rows interleaved), so a tile of few rows spends its time packing: a
// weight gradient's B is every token's input.  128 rows took a bench-small
// bf16 step's products from 2.6–2.9× their forward to 2.0–2.1× on the Intel
// Xeon with AMX, against 16 (docs/performance.md).  The price: a product of
// fewer than 128 · threads rows leaves threads idle on a larger machine.
// Wider outputs (the LM head's logits) are cut both ways, as tiling() does.
constexpr int64_t kWholeRows = 4096;
constexpr int64_t kMinRows = 128;
Tiling tiling_bf16(int64_t M, int64_t N, int64_t want) {
  if (N > kWholeRows) return tiling(M, N, want);
  const int64_t rows16 = (M + 15) / 16 * 16;
  const int64_t mb = std::min(rows16, std::clamp<int64_t>(((M + want - 1) / want + 15) / 16 * 16, kMinRows, 512));
  return {mb, N, (M + mb - 1) / mb, 1};
}

// C[M,N] (+)= op(A)·op(B) as the tiles of t through oneDNN, one plan per tile
// shape — at most four (full, the last row of tiles, the last column, the
// corner), planned before the parallel region on one thread — and one tile
// per call.  `s` holds what every tile shares (ta, tb, K, strides,
// accumulate, f32, alpha); its M and N are the whole product's.
//
// bf16 tiles that are not whole rows of C (the LM head's logits, wider than
// kWholeRows) go through a dense block of the thread's, copied in (when
// accumulating) and out: oneDNN 2.6 runs a dense output through its brgemm
// kernels and a strided one through an older AMX kernel, 1.2–1.8× slower on
// the LM head's shapes (docs/performance.md).  The block holds the same
// floats C would, so the bits are the same.
template <class T>
void onednn_tiles(const Tiling& t, onednn::Shape s, const T* A, const T* B, float* C, int threads) {
  const int64_t m_last = s.M - (t.tm - 1) * t.mb, n_last = s.N - (t.tn - 1) * t.nb;
  const bool via_block = std::is_same_v<T, bf16> && t.tn > 1;
  const onednn::Plan* plans[2][2] = {};  // [last row of tiles][last column]
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c)
      if ((r || t.tm > 1) && (c || t.tn > 1)) {
        onednn::Shape tile = s;
        tile.M = r ? m_last : t.mb;
        tile.N = c ? n_last : t.nb;
        if (via_block) tile.ldc = tile.N;
        plans[r][c] = &onednn::plan(tile);
      }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (t.tm * t.tn > 1)
  for (int64_t i = 0; i < t.tm * t.tn; ++i) {
    const int64_t ti = i / t.tn, tj = i % t.tn, i0 = ti * t.mb, j0 = tj * t.nb;
    const T* a = s.ta ? A + i0 : A + i0 * s.lda;
    const T* b = s.tb ? B + j0 * s.ldb : B + j0;
    const onednn::Plan& plan = *plans[ti == t.tm - 1][tj == t.tn - 1];
    float* c = C + i0 * s.ldc + j0;
    if (!via_block) {
      onednn::run(plan, a, b, c);
      continue;
    }
    // block[rows, cols] (dense) ⇄ C's tile (rows of s.ldc)
    const int64_t rows = ti == t.tm - 1 ? m_last : t.mb, cols = tj == t.tn - 1 ? n_last : t.nb;
    thread_local std::vector<float> block;
    if (block.size() < static_cast<size_t>(t.mb * t.nb)) block.resize(static_cast<size_t>(t.mb * t.nb));
    const size_t row_bytes = static_cast<size_t>(cols) * sizeof(float);
    if (s.accumulate)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(block.data() + r * cols, c + r * s.ldc, row_bytes);
    onednn::run(plan, a, b, block.data());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * s.ldc, block.data() + r * cols, row_bytes);
  }
}

}  // namespace

const char* fp32_gemm_name(Fp32Gemm g) { return g == Fp32Gemm::kOneDnn ? "onednn" : "openblas"; }

Fp32Gemm choose_fp32_gemm() {
  const char* env = std::getenv("ATTNRES_FP32_GEMM");
  const std::string want = env ? env : "";
  // oneDNN where this build has it: `bench --gemm` measured it 1.13-1.19x
  // OpenBLAS's best kernels over a step's shapes, and 1.8-2x the kernels an
  // OPENBLAS_CORETYPE may force (docs/performance.md).  Its float32 kernels
  // run with signals blocked (dnnl_matmul.cpp: SignalsBlocked says why).
  if (want.empty()) return onednn::available() ? Fp32Gemm::kOneDnn : Fp32Gemm::kOpenBlas;
  if (want == "openblas") return Fp32Gemm::kOpenBlas;
  if (want == "onednn") {
    if (!onednn::available()) fail("ATTNRES_FP32_GEMM onednn: this attnres was built without oneDNN (libdnnl-dev)");
    return Fp32Gemm::kOneDnn;
  }
  fail("ATTNRES_FP32_GEMM '", want, "' is not a library (openblas, onednn)");
}

std::string CpuBackend::unsupported(Precision p) const {
  return p == Precision::kBF16 ? onednn::unsupported() : std::string();
}

double CpuBackend::peak_gflops(Precision p) const { return measure_peak_gflops(p, threads()); }
const char* CpuBackend::peak_name(Precision p) const { return attnres::peak_name(p); }

void CpuBackend::to_bf16_impl(bf16* dst, const float* src, int64_t n) {
  constexpr int64_t kPiece = 1 << 16;
  const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t i0 = p * kPiece;
    round_to_bf16(dst + i0, src + i0, std::min(kPiece, n - i0));
  }
}

void CpuBackend::blas_single_thread() const {
  if (!omp_in_parallel() && omp_get_max_threads() != 1) omp_set_num_threads(1);
}

// C[M,N] = α·op(A)[M,K]·op(B)[K,N] + β·C, as the tiles of tiling(), each one
// single-threaded BLAS call inside one OpenMP thread.  (OpenBLAS's own
// threading splits the work by thread count, and some of its kernels then
// round differently.)
void CpuBackend::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
  if (fp32_gemm_ == Fp32Gemm::kOneDnn) {
    gemm_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const Tiling t = tiling(M, N, kGemmTiles);
  blas_single_thread();  // a lone tile runs outside a parallel region
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads()) if (t.tm * t.tn > 1)
  for (int64_t i = 0; i < t.tm * t.tn; ++i) {
    const int64_t i0 = i / t.tn * t.mb, j0 = i % t.tn * t.nb;
    const int64_t m = std::min(t.mb, M - i0), n = std::min(t.nb, N - j0);
    const float* a = ta ? A + i0 : A + i0 * lda;  // op(A) rows i0..: A's columns when transposed
    const float* b = tb ? B + j0 * ldb : B + j0;  // op(B) columns j0..: B's rows when transposed
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, K, alpha, a,
                lda, b, ldb, beta, C + i0 * ldc + j0, ldc);
  }
}

// The tiles of gemm() through oneDNN's float32 matmul (beta 0 or 1: the
// product, or its sum into C).
void CpuBackend::gemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                             int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
  ATTNRES_CHECK(beta == 0.0f || beta == 1.0f, "gemm through oneDNN takes beta 0 or 1, not ", beta);
  blas_single_thread();  // plans are made for one thread
  onednn_tiles(tiling(M, N, kGemmTiles), {ta, tb, M, N, K, lda, ldb, ldc, beta == 1.0f, /*f32=*/true, alpha}, A, B,
               C, threads());
}

namespace {
// bench --gemm's operands: n floats of a fixed pattern (no random state).
std::vector<float> gemm_operand(int64_t n, int period, float offset) {
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1e-3f * static_cast<float>(i % period) - offset;
  return x;
}
// Seconds of run(), the fastest of `reps` after one call that plans and warms up.
template <class F>
double fastest_of(int reps, F&& run) {
  double best = 1e30;
  for (int rep = 0; rep <= reps; ++rep) {
    const double t0 = omp_get_wtime();
    run();
    if (rep > 0) best = std::min(best, omp_get_wtime() - t0);
  }
  return best;
}
}  // namespace

double CpuBackend::time_gemm(Fp32Gemm g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool accumulate,
                             int reps) {
  // Operands as the products store them: A [M,K] (or [K,M]), B [K,N] (or [N,K]), C [M,N].
  const std::vector<float> a = gemm_operand(M * K, 97, 0.05f), b = gemm_operand(K * N, 89, 0.04f);
  std::vector<float> c(static_cast<size_t>(M * N));
  const Fp32Gemm was = fp32_gemm_;
  fp32_gemm_ = g;
  const double best = fastest_of(reps, [&] {
    gemm(ta, tb, M, N, K, 1.0f, a.data(), ta ? M : K, b.data(), tb ? K : N, accumulate ? 1.0f : 0.0f, c.data(), N);
  });
  fp32_gemm_ = was;
  return best;
}

double CpuBackend::time_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool accumulate, int reps) {
  std::vector<bf16> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
  to_bf16(a.data(), gemm_operand(M * K, 97, 0.05f).data(), M * K);
  to_bf16(b.data(), gemm_operand(K * N, 89, 0.04f).data(), K * N);
  std::vector<float> c(static_cast<size_t>(M * N));
  return fastest_of(reps, [&] {
    gemm_bf16(ta, tb, M, N, K, a.data(), ta ? M : K, b.data(), tb ? K : N, accumulate, c.data(), N);
  });
}

// bf16 tiles through oneDNN (tiling_bf16).
void CpuBackend::gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda,
                           const bf16* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) const {
  blas_single_thread();  // plans are made for one thread
  onednn_tiles(tiling_bf16(M, N, kGemmTiles), {ta, tb, M, N, K, lda, ldb, ldc, accumulate}, A, B, C, threads());
}

// Scratch of bf16 products: the bf16 copies of the input (N, I) and, in the
// backward, of dout (N, O); for few rows, the rounded input.  fp32 products
// need none.
int64_t CpuBackend::matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const {
  if (p == Precision::kF32) return 0;
  return std::max(bf16_floats(N * I) + bf16_floats(N * O), std::min(N, kSkinnyRows) * I);
}

void CpuBackend::matmul_forward_impl(float* out, Rows inp, Weight W, int64_t N, int64_t I, int64_t O) {
  if (W.b16) {
    matmul_bf16(out, inp, W.b16, N, I, O, ctx_.workspace(matmul_workspace(N, I, O, Precision::kBF16)));
    return;
  }
  // (Rows in bf16 come only with a bf16 weight: the entry checked it, op_checks.cpp.)
  if (N <= kSkinnyRows) {
    skinny(out, inp.f32, W.f32, N, I, O, threads());
    return;
  }
  // out[N,O] = inp[N,I] · W[O,I]ᵀ
  gemm(false, true, N, O, I, 1.0f, inp.f32, I, W.f32, I, 0.0f, out, O);
}

// Rows as a bf16 product reads them: as given when they are bf16 already,
// else rounded into `scratch` (n elements).
const bf16* CpuBackend::bf16_rows(Rows r, bf16* scratch, int64_t n) {
  if (r.b16) return r.b16;
  to_bf16(scratch, r.f32, n);
  return scratch;
}

void CpuBackend::matmul_bf16(float* out, Rows inp, const bf16* W, int64_t N, int64_t I, int64_t O, float* scratch) {
  if (N <= kSkinnyRows) {
    if (cpu_has_dpbf16()) {  // the input in bf16, for VDPBF16PS
      const bf16* x16 = bf16_rows(inp, reinterpret_cast<bf16*>(scratch), N * I);
      skinny(out, reinterpret_cast<const float*>(x16), W, N, I, O, threads());
      return;
    }
    // The rounded inputs as floats (bf16 · bf16 products are exact in float32):
    // each row as [even elements | odd elements] when I is even.
    auto rounded = [&](int64_t i) { return inp.b16 ? bf16_to_float(inp.b16[i]) : round_bf16(inp.f32[i]); };
    if (I % 2 == 0) {
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < I; ++i) scratch[n * I + (i % 2) * (I / 2) + i / 2] = rounded(n * I + i);
    } else {
      for (int64_t i = 0; i < N * I; ++i) scratch[i] = rounded(i);
    }
    skinny(out, scratch, W, N, I, O, threads());
    return;
  }
  const bf16* x16 = bf16_rows(inp, reinterpret_cast<bf16*>(scratch), N * I);  // (N, I)
  // out[N,O] = x16[N,I] · W[O,I]ᵀ
  gemm_bf16(false, true, N, O, I, x16, I, W, I, /*accumulate=*/false, out, O);
}

void CpuBackend::matmul_backward_impl(float* dinp, float* dW, Rows dout, Rows inp, Weight W, int64_t N, int64_t I,
                                 int64_t O, bool accumulate_dinp) {
  if (W.b16) {
    float* scratch = ctx_.workspace(matmul_workspace(N, I, O, Precision::kBF16));
    bf16* dy_scratch = reinterpret_cast<bf16*>(scratch);                     // (N, O)
    bf16* x_scratch = reinterpret_cast<bf16*>(scratch + bf16_floats(N * O));  // (N, I)
    const bf16* dy16 = bf16_rows(dout, dy_scratch, N * O);
    // dinp[N,I] = dy16[N,O] · W[O,I]
    if (dinp) gemm_bf16(false, false, N, I, O, dy16, O, W.b16, I, accumulate_dinp, dinp, I);
    // dW[O,I] += dy16ᵀ[O,N] · x16[N,I], dy16 read transposed: on both CPUs
    // faster than a dense transposed copy first (docs/performance.md).
    if (dW) gemm_bf16(true, false, O, I, N, dy16, O, bf16_rows(inp, x_scratch, N * I), I, /*accumulate=*/true, dW, I);
    return;
  }
  // dinp[N,I] = dout[N,O] · W[O,I]
  if (dinp) gemm(false, false, N, I, O, 1.0f, dout.f32, O, W.f32, I, accumulate_dinp ? 1.0f : 0.0f, dinp, I);
  // dW[O,I] += dout[N,O]ᵀ · inp[N,I]
  if (dW) gemm(true, false, O, I, N, 1.0f, dout.f32, O, inp.f32, I, 1.0f, dW, I);
}

}  // namespace attnres
