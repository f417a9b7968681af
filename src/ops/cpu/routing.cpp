// routing.cpp — the depth-routing kernel (see ops/backend.h for the math and
// the conventions).  Tokens are cut into fixed chunks of kChunk rows; OpenMP
// threads take whole chunks, and every token-sum is first a per-chunk partial
// (double) added in chunk order afterwards, so a result never depends on how
// many threads ran or which chunk each took.
#include "ops/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/cpu/fast_exp.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)
#include "ops/cpu/side_sums.h"

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

namespace {

constexpr int64_t kChunk = 64;
constexpr double kEntropyEps = 1e-8;  // the entropy term's ε: −Σ α ln(α + ε), as the reference code writes it

int64_t num_chunks(int64_t N) { return (N + kChunk - 1) / kChunk; }
int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }  // floats; keeps every region 64-byte aligned

// The scratch, in floats:  q (d doubles) | q (d floats) | q2 (d floats) | per chunk:
//   dq (d doubles) | dnull (d doubles) | alpha (H·S doubles) | da (H·S doubles) |
//   stats (S + 3 + kMaxWeightBins + route_head_stats_size doubles) | dg (1 double) | tmp (d floats) | tq (d floats) |
//   z (H·S floats)
// Each region is used with one type only.
struct Scratch {
  int64_t d, S, hs, stats_doubles, chunk_floats;
  float* base;
  Scratch(float* p, int64_t d_, int64_t S_, int64_t H)
      : d(d_), S(S_), hs(H * S_), stats_doubles(S_ + 3 + kMaxWeightBins + route_head_stats_size(S_, H)),
        chunk_floats(2 * pad16(2 * d_) + 2 * pad16(2 * hs) + pad16(2 * stats_doubles) + 16 + 2 * pad16(d_) + pad16(hs)),
        base(p) {}
  static int64_t head_floats(int64_t d) { return pad16(2 * d) + 2 * pad16(d); }
  double* qd() const { return reinterpret_cast<double*>(base); }
  float* qf() const { return base + pad16(2 * d); }
  float* q2f() const { return qf() + pad16(d); }  // a rebuilt router's query (route_backward)
  float* chunk(int64_t ch) const { return base + head_floats(d) + ch * chunk_floats; }
  double* dq(int64_t ch) const { return reinterpret_cast<double*>(chunk(ch)); }
  double* dnull(int64_t ch) const { return reinterpret_cast<double*>(chunk(ch) + pad16(2 * d)); }
  double* alpha(int64_t ch) const { return reinterpret_cast<double*>(chunk(ch) + 2 * pad16(2 * d)); }
  double* da(int64_t ch) const { return alpha(ch) + pad16(2 * hs) / 2; }
  double* stats(int64_t ch) const { return da(ch) + pad16(2 * hs) / 2; }
  double* dg(int64_t ch) const { return stats(ch) + pad16(2 * stats_doubles) / 2; }
  float* tmp(int64_t ch) const { return reinterpret_cast<float*>(dg(ch) + 8); }
  float* tq(int64_t ch) const { return tmp(ch) + pad16(d); }
  float* z(int64_t ch) const { return tq(ch) + pad16(d); }  // one token's logits, computed again
};

inline const float* row(const RouteSource& s, int64_t n, int64_t d) { return s.broadcast ? s.v : s.v + n * d; }
inline float rstd_at(const RouteSource& s, int64_t n) { return s.broadcast ? s.rstd[0] : s.rstd[n]; }

// (a, c) of out = a·base + c·R; see the table in ops/backend.h.
struct Mix {
  float a, c;
};
Mix mix_coefficients(Combine combine, const float* gate) {
  const float g = gate ? *gate : 1.0f;
  if (combine == Combine::kAdd) return {1.0f, g};
  return {gate ? 1.0f - g : 0.0f, g};
}

void fold_query(const Scratch& sc, const float* w, const float* gamma) {
  for (int64_t c = 0; c < sc.d; ++c) {
    sc.qd()[c] = static_cast<double>(w[c]) * gamma[c];
    sc.qf()[c] = static_cast<float>(sc.qd()[c]);
  }
}

// α = softmax of one token's stored logits (S), in double.  Every user of the
// stored logits goes through this, so forward, mix and backward agree bit for bit.
// The exponentials are vectorised (exp_nonpositive); their sum stays in source order.
inline void softmax_row(double* alpha, const float* z, int64_t S) {
  float zmax = z[0];
  for (int64_t i = 1; i < S; ++i) zmax = z[i] > zmax ? z[i] : zmax;
#pragma omp simd
  for (int64_t i = 0; i < S; ++i) alpha[i] = exp_nonpositive(static_cast<double>(z[i]) - zmax);
  double sum = 0.0;
  for (int64_t i = 0; i < S; ++i) sum += alpha[i];
#pragma omp simd
  for (int64_t i = 0; i < S; ++i) alpha[i] /= sum;
}

// One token's combination: tmp[slice h] = Σ_i α_hi v_i[slice h] for each of
// the H heads (alpha: (H, S)), out = a·base + c·tmp.  The sum over sources is
// a float axpy per source (S terms per element, SIMD over the slice).
// Shared by route_forward and route_mix so both give the same bits.
//
// Sources outer, heads inner: each source row is read once, front to back
// (the hardware prefetcher's pattern), and every element still sums its S
// terms in source order.
inline void mix_row(float* out, float* tmp, const double* alpha, const RouteSource* src, int64_t S, int64_t H,
                    int64_t n, const float* base_row, Mix m, int64_t d) {
  const int64_t dh = d / H;
  for (int64_t i = 0; i < S; ++i) {
    const float* vi = row(src[i], n, d);
    for (int64_t h = 0; h < H; ++h) {
      const float* v = vi + h * dh;
      float* t = tmp + h * dh;
      const float al = static_cast<float>(alpha[h * S + i]);
      if (i == 0) {
#pragma omp simd
        for (int64_t c = 0; c < dh; ++c) t[c] = al * v[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < dh; ++c) t[c] += al * v[c];
      }
    }
  }
  if (m.a == 0.0f) {
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) out[c] = m.c * tmp[c];
  } else {
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) out[c] = m.a * base_row[c] + m.c * tmp[c];
  }
}

// a·b for one row: float sums within blocks of 64 elements, the blocks summed
// in double — near double accuracy at float speed.  Within a block, 16 lanes
// (lane l takes the elements ≡ l mod 16) are added as a tree, 8 + 8, 4 + 4, …:
// one order written here, which every level's vectors follow (a compiler's
// reduction epilogue added the 16 lanes one after the other: a chain that
// cost more than the products with routing heads of 32 channels).
inline double dot_row(const float* a, const float* b, int64_t d) {
  double acc = 0.0;
  for (int64_t c0 = 0; c0 < d; c0 += 64) {
    const int64_t c1 = c0 + 64 < d ? c0 + 64 : d;
    float lane[16] = {};
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16)
#pragma omp simd
      for (int l = 0; l < 16; ++l) lane[l] += a[c + l] * b[c + l];
    for (int l = 0; c < c1; ++c, ++l) lane[l] += a[c] * b[c];
    for (int w = 8; w > 0; w /= 2)
#pragma omp simd
      for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
    acc += lane[0];
  }
  return acc;
}

// One token's logits z[h·S + i] = r_i·(q_h·v_hi), as route_forward computes
// and stores them (the same expression, so the same bits).
inline void token_logits(float* z, const float* q, const RouteSource* src, int64_t S, int64_t H, int64_t n,
                         int64_t d) {
  const int64_t dh = d / H;
  for (int64_t i = 0; i < S; ++i) {  // each source row once, front to back
    const float* v = row(src[i], n, d);
    const float r = rstd_at(src[i], n);
    for (int64_t h = 0; h < H; ++h) z[h * S + i] = static_cast<float>(r * dot_row(q + h * dh, v + h * dh, dh));
  }
}

}  // namespace

void CpuKernels::source_rstd_impl(float* rstd, const float* v, int64_t N, int64_t d, float eps) {
#pragma omp parallel for schedule(static) num_threads(threads()) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = v + n * d;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < d; ++c) ss += static_cast<double>(x[c]) * x[c];
    rstd[n] = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
  }
}

int64_t CpuKernels::route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const {
  return Scratch::head_floats(d) + num_chunks(N) * Scratch(nullptr, d, S, H).chunk_floats;
}

// (The heads, the base a combination needs, and a rebuild's arguments are
// checked by each op's entry, op_checks.cpp; what reads the source lists is
// checked here.)

// ---- forward ------------------------------------------------------------------
//
// Per token and head h:  z_hi = r_i·(q_h·v_hi)  (dot_row over the head's
// slice, stored as float), α_h = softmax(z_h),  out = a·base + c·R with
// R[slice h] = Σ α_hi v_hi.  The source rows of one token (S·d floats) stay
// in cache between the two passes.
void CpuKernels::route_forward_impl(float* out, float* logits, const RouteSource* src, int64_t S, int64_t H,
                               const float* w, const float* gamma, const float* base, const float* gate,
                               Combine combine, int64_t N, int64_t d, double* stats) {
  check_sources(src, S);
  const Mix m = mix_coefficients(combine, gate);
  const Scratch sc(ctx_.workspace(route_workspace(N, d, S, H)), d, S, H);
  const double inv_h = 1.0 / static_cast<double>(H);
  fold_query(sc, w, gamma);
  const float* q = sc.qf();
  const int64_t nc = num_chunks(N);

#pragma omp parallel for schedule(static) num_threads(threads()) if (nc > 1)
  for (int64_t ch = 0; ch < nc; ++ch) {
    float* tmp = sc.tmp(ch);
    double* alpha = sc.alpha(ch);
    // weight_sum (S) | token_max | entropy | cosine | token_max bins | the heads' own (H > 1)
    double* st = sc.stats(ch);
    double* sth = st + S + 3 + kMaxWeightBins;
    if (stats)
      for (int64_t i = 0; i < sc.stats_doubles; ++i) st[i] = 0.0;
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n) {
      float* z = logits + n * H * S;
      token_logits(z, q, src, S, H, n, d);
      for (int64_t h = 0; h < H; ++h) softmax_row(alpha + h * S, z + h * S, S);
      mix_row(out + n * d, tmp, alpha, src, S, H, n, base ? base + n * d : nullptr, m, d);

      if (stats) {  // each head's terms, averaged over the heads (route_types.h)
        double amax_sum = 0.0, ent_sum = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          const double* ah = alpha + h * S;
          double amax = 0.0, ent = 0.0;
          for (int64_t i = 0; i < S; ++i) {
            const double a = ah[i];
            st[i] += a * inv_h;
            amax = a > amax ? a : amax;
            if (a > 0) ent -= a * std::log(a);
          }
          amax_sum += amax;
          ent_sum += ent;
          st[S + 3 + std::min<int64_t>(static_cast<int64_t>(amax * kMaxWeightBins), kMaxWeightBins - 1)] += inv_h;
          if (H > 1) {
            for (int64_t i = 0; i < S; ++i) sth[h * S + i] += ah[i];
            sth[H * S + h] += amax;
            sth[H * S + H + h] += ent;
          }
        }
        st[S] += amax_sum * inv_h;
        st[S + 1] += ent_sum * inv_h;
        if (H > 1) {  // mean_{h,i} |α_hi − ᾱ_i|
          double dev = 0.0;
          for (int64_t i = 0; i < S; ++i) {
            double mean = 0.0;
            for (int64_t h = 0; h < H; ++h) mean += alpha[h * S + i];
            mean *= inv_h;
            for (int64_t h = 0; h < H; ++h) dev += std::fabs(alpha[h * S + i] - mean);
          }
          sth[H * S + 2 * H] += dev / static_cast<double>(H * S);
        }
        if (S >= 2) {
          double* nrm = sc.da(ch);  // |v_i|, the Gram matrix's diagonal
          for (int64_t i = 0; i < S; ++i) {
            const float* v = row(src[i], n, d);
            double ss = 0.0;
#pragma omp simd reduction(+ : ss)
            for (int64_t c = 0; c < d; ++c) ss += static_cast<double>(v[c]) * v[c];
            nrm[i] = std::sqrt(ss);
          }
          double cs_sum = 0.0;
          for (int64_t i = 0; i < S; ++i) {
            const float* vi = row(src[i], n, d);
            for (int64_t j = i + 1; j < S; ++j) {
              const float* vj = row(src[j], n, d);
              double dot = 0.0;
#pragma omp simd reduction(+ : dot)
              for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(vi[c]) * vj[c];
              const double den = nrm[i] * nrm[j];
              cs_sum += den > 0 ? dot / den : 0.0;
            }
          }
          st[S + 2] += cs_sum / static_cast<double>(S * (S - 1) / 2);
        }
      }
    }
  }
  if (stats) {  // the chunks' partials in chunk order, into the layout of route_stats_size
    const int64_t heads = route_head_stats_size(S, H);
    for (int64_t ch = 0; ch < nc; ++ch) {
      const double* st = sc.stats(ch);
      for (int64_t i = 0; i < S + 3; ++i) stats[i] += st[i];
      for (int b = 0; b < kMaxWeightBins; ++b) stats[S + 4 + b] += st[S + 3 + b];
      for (int64_t i = 0; i < heads; ++i) stats[S + 4 + kMaxWeightBins + i] += st[S + 3 + kMaxWeightBins + i];
    }
    stats[S + 3] += static_cast<double>(N);
  }
}

namespace {
// out = a·base + c·R per token, α from alpha_of(n, scratch) (H, S): what
// route_mix and route_mix_weights share.  mix_row reads base[c] after the
// whole tmp is built, so out may alias base.
template <class AlphaOf>
void mix_tokens(const Scratch& sc, int threads, float* out, const RouteSource* src, int64_t S, int64_t H,
                const float* base, Mix m, int64_t N, int64_t d, AlphaOf alpha_of) {
  const int64_t nc = num_chunks(N);
#pragma omp parallel for schedule(static) num_threads(threads) if (nc > 1)
  for (int64_t ch = 0; ch < nc; ++ch) {
    float* tmp = sc.tmp(ch);
    double* alpha = sc.alpha(ch);
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n)
      mix_row(out + n * d, tmp, alpha_of(n, alpha), src, S, H, n, base ? base + n * d : nullptr, m, d);
  }
}
}  // namespace

void CpuKernels::route_mix_impl(float* out, const float* logits, const RouteSource* src, int64_t S, int64_t H,
                           const float* base, const float* gate, Combine combine, int64_t N, int64_t d) {
  check_sources(src, S);
  const Mix m = mix_coefficients(combine, gate);
  const Scratch sc(ctx_.workspace(route_workspace(N, d, S, H)), d, S, H);
  mix_tokens(sc, threads(), out, src, S, H, base, m, N, d, [&](int64_t n, double* alpha) {
    for (int64_t h = 0; h < H; ++h) softmax_row(alpha + h * S, logits + (n * H + h) * S, S);
    return static_cast<const double*>(alpha);
  });
}

void CpuKernels::route_mix_weights_impl(float* out, const double* weights, const RouteSource* src, int64_t S, int64_t H,
                                   const float* base, const float* gate, Combine combine, int64_t N, int64_t d) {
  check_sources(src, S);
  const Mix m = mix_coefficients(combine, gate);
  const Scratch sc(ctx_.workspace(route_workspace(N, d, S, H)), d, S, H);
  mix_tokens(sc, threads(), out, src, S, H, base, m, N, d, [&](int64_t, double*) { return weights; });
}

void CpuKernels::route_mix_stream_impl(float* out, const float* logits, const RouteSource* src, int64_t S, int64_t H,
                                  const float* gate, int64_t N, int64_t d) {
  check_sources(src, S);
  const int64_t first = src[0].broadcast ? 1 : 0;
  ATTNRES_CHECK(first < S, "route_mix_stream: no stream sources");
  const Mix m = mix_coefficients(Combine::kAdd, gate);
  const Scratch sc(ctx_.workspace(route_workspace(N, d, S, H)), d, S, H);
  const int64_t nc = num_chunks(N);
#pragma omp parallel for schedule(static) num_threads(threads()) if (nc > 1)
  for (int64_t ch = 0; ch < nc; ++ch) {
    float* tmp = sc.tmp(ch);
    float* x = sc.tq(ch);
    double* alpha = sc.alpha(ch);
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n) {
      // The stream as the forward built it (x = v_first, then x += v_i), then
      // exactly the forward's combination; the rows are in cache the second time.
      std::memcpy(x, src[first].v + n * d, static_cast<size_t>(d) * sizeof(float));
      for (int64_t i = first + 1; i < S; ++i) {
        const float* v = src[i].v + n * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) x[c] += v[c];
      }
      for (int64_t h = 0; h < H; ++h) softmax_row(alpha + h * S, logits + (n * H + h) * S, S);
      mix_row(out + n * d, tmp, alpha, src, S, H, n, x, m, d);
    }
  }
}

// ---- backward -------------------------------------------------------------------
//
// out = a·base + c·R, R_h = Σ_i α_hi v_hi, α_h = softmax(z_h), z_hi = r_i (q_h·v_hi)
// for each head h (x_h: slice h of a d-vector x; one head: the whole of it),
// r_i = (|v_i|²/d + eps)^(-1/2) over the full d, q = w∘γ.   Given dout:
//
//   dbase  = a·dout                       dR = c·dout
//   dg     = dout·(R − base)  (kReplace)  or  dout·R  (kAdd)        [gate only]
//   dα_hi  = dR_h·v_hi
//   dz_hi  = α_hi (dα_hi − Σ_j α_hj dα_hj)                         (softmax Jacobian, per head)
//   ∂z_hi/∂v_i = r_i q_h (on slice h) + (q_h·v_hi) ∂r_i/∂v_i,  ∂r_i/∂v_i = −r_i³ v_i / d (all of v_i)
//   dv_hi += α_hi c dout_h + (dz_hi r_i) q_h                          (on slice h)
//   dv_i  −= (Σ_h dz_hi z_hi) (r_i² / d) v_i                         (q_h·v_hi = z_hi / r_i; full d)
//   dq_h  += Σ_tokens Σ_i dz_hi r_i v_hi ;   q = w∘γ ⇒ dw += dq∘γ,  dγ += dq∘w
//
// Per token: pass 1 computes dα_hi (dot_row; and R when gated), pass 2 the
// source gradients (float) and this token's share of dq (float over the
// sources, then double into the chunk's partial).
void CpuKernels::route_backward_impl(float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate,
                                const float* dout, const float* logits, const RouteSource* src, int64_t S,
                                int64_t H, const float* w, const float* gamma, const float* base, const float* gate,
                                Combine combine, int64_t N, int64_t d, const RouteRebuild* rebuild,
                                bool accumulate_src, float entropy_scale) {
  check_sources(src, S, dsrc);
  Mix m2{0.0f, 1.0f};
  int64_t first2 = 0;
  if (rebuild) {
    check_sources(rebuild->src, rebuild->S);
    m2 = mix_coefficients(rebuild->combine, rebuild->gate);
    first2 = rebuild->src[0].broadcast ? 1 : 0;
    ATTNRES_CHECK(!rebuild->stream || first2 < rebuild->S, "rebuild: no stream sources");
  }
  const Mix m = mix_coefficients(combine, gate);
  const bool replace_gate = gate && combine == Combine::kReplace;
  const int64_t H2 = rebuild ? std::max(H, rebuild->H) : H;  // the scratch holds either router's α
  const Scratch sc(ctx_.workspace(route_workspace(N, d, S, H2)), d, S, H2);
  fold_query(sc, w, gamma);
  const float* qf = sc.qf();
  // Logits not stored (null): each token's computed again from q and its
  // source rows, which the backward reads anyway.  The rebuilt router's too.
  const bool rebuild_logits = rebuild && !rebuild->logits;
  if (rebuild_logits) {
    for (int64_t c = 0; c < d; ++c)
      sc.q2f()[c] = static_cast<float>(static_cast<double>(rebuild->w[c]) * rebuild->gamma[c]);  // as fold_query
  }
  const int64_t dh = d / H;
  const int64_t nc = num_chunks(N);
  const bool null0 = src[0].broadcast;
  const double inv_d = 1.0 / static_cast<double>(d);

#pragma omp parallel for schedule(static) num_threads(threads()) if (nc > 1)
  for (int64_t ch = 0; ch < nc; ++ch) {
    double* dq = sc.dq(ch);
    double* dnull = sc.dnull(ch);
    double* alpha = sc.alpha(ch);
    double* da = sc.da(ch);
    float* tmp = sc.tmp(ch);
    float* tq = sc.tq(ch);
    for (int64_t c = 0; c < d; ++c) dq[c] = dnull[c] = 0.0;
    double dg = 0.0;
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n) {
      const float* go = dout + n * d;
      // Pass 1: dα_hi = c·(dout_h·v_hi) (and z_hi where not stored), then α
      // and s_h = Σ_i α_hi dα_hi; R for the gate.
      if (!logits) token_logits(sc.z(ch), qf, src, S, H, n, d);
      const float* z = logits ? logits + n * H * S : sc.z(ch);
      double s[kMaxRoutingHeads];
      for (int64_t i = 0; i < S; ++i) {  // each source row once, front to back (in cache when just read)
        const float* v = row(src[i], n, d);
        for (int64_t h = 0; h < H; ++h) da[h * S + i] = m.c * dot_row(go + h * dh, v + h * dh, dh);
      }
      for (int64_t h = 0; h < H; ++h) softmax_row(alpha + h * S, z + h * S, S);
      if (entropy_scale != 0.0f) {  // the entropy term's dα (backend.h)
        const double k = entropy_scale;
        for (int64_t i = 0; i < H * S; ++i)
          da[i] += k * (std::log(alpha[i] + kEntropyEps) + alpha[i] / (alpha[i] + kEntropyEps));
      }
      for (int64_t h = 0; h < H; ++h) {
        s[h] = 0.0;
        for (int64_t i = 0; i < S; ++i) s[h] += alpha[h * S + i] * da[h * S + i];
      }
      if (gate) mix_row(tmp, tmp, alpha, src, S, H, n, nullptr, {0.0f, 1.0f}, d);  // tmp = R
      // Pass 2: source gradients and this token's dq.
      for (int64_t c = 0; c < d; ++c) tq[c] = 0.0f;
      for (int64_t i = 0; i < S; ++i) {
        const float* v = row(src[i], n, d);
        const double r = rstd_at(src[i], n);
        float* dv = i == 0 && null0 ? nullptr : dsrc[i] + n * d;
        // dz_hi = α_hi (dα_hi − s_h), and the full-d term of r_i's gradient
        // from every head's dz_hi z_hi.
        double dz[kMaxRoutingHeads];
        for (int64_t h = 0; h < H; ++h) dz[h] = alpha[h * S + i] * (da[h * S + i] - s[h]);
        double dzz = -dz[0] * z[i];  // head 0, then the others
        for (int64_t h = 1; h < H; ++h) dzz += -dz[h] * z[h * S + i];
        const float kv = static_cast<float>(dzz * r * r * inv_d);
        for (int64_t h = 0; h < H; ++h) {
          const float ka = static_cast<float>(m.c * alpha[h * S + i]), kq = static_cast<float>(dz[h] * r);
          const int64_t c0 = h * dh, c1 = c0 + dh;
          if (!dv) {
#pragma omp simd
            for (int64_t c = c0; c < c1; ++c) {
              dnull[c] += ka * go[c] + kq * qf[c] + kv * v[c];
              tq[c] += kq * v[c];
            }
          } else if (accumulate_src) {
#pragma omp simd
            for (int64_t c = c0; c < c1; ++c) {
              dv[c] += ka * go[c] + kq * qf[c] + kv * v[c];
              tq[c] += kq * v[c];
            }
          } else {
#pragma omp simd
            for (int64_t c = c0; c < c1; ++c) {
              dv[c] = ka * go[c] + kq * qf[c] + kv * v[c];
              tq[c] += kq * v[c];
            }
          }
        }
      }
      for (int64_t c = 0; c < d; ++c) dq[c] += tq[c];
      if (dbase && m.a != 0.0f) {
        float* db = dbase + n * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) db[c] += m.a * go[c];
      }
      if (gate) {
        double t = 0.0;
        if (replace_gate) {
          const float* b = base + n * d;
#pragma omp simd reduction(+ : t)
          for (int64_t c = 0; c < d; ++c) t += static_cast<double>(go[c]) * (tmp[c] - b[c]);
        } else {
#pragma omp simd reduction(+ : t)
          for (int64_t c = 0; c < d; ++c) t += static_cast<double>(go[c]) * tmp[c];
        }
        dg += t;
      }
      // The next input to rebuild, from this token's rows (mostly in cache);
      // tq and da are free again.
      if (rebuild) {
        const RouteRebuild& rb = *rebuild;
        double* alpha2 = da;
        const float* base2 = rb.base ? rb.base + n * d : nullptr;
        if (rb.stream) {  // x = v_first, then x += v_i: the forward's stream
          std::memcpy(tq, rb.src[first2].v + n * d, static_cast<size_t>(d) * sizeof(float));
          for (int64_t i = first2 + 1; i < rb.S; ++i) {
            const float* v = rb.src[i].v + n * d;
#pragma omp simd
            for (int64_t c = 0; c < d; ++c) tq[c] += v[c];
          }
          base2 = tq;
        }
        if (rebuild_logits) token_logits(sc.z(ch), sc.q2f(), rb.src, rb.S, rb.H, n, d);  // z is free again
        const float* z2 = rebuild_logits ? sc.z(ch) : rb.logits + n * rb.H * rb.S;
        for (int64_t h = 0; h < rb.H; ++h) softmax_row(alpha2 + h * rb.S, z2 + h * rb.S, rb.S);
        mix_row(rb.out + n * d, tmp, alpha2, rb.src, rb.S, rb.H, n, base2, m2, d);
      }
    }
    *sc.dg(ch) = dg;
  }

  // Deterministic reduction of the chunk partials, in chunk order.
  double* dq = sc.dq(0);  // chunk 0's partial becomes the total
  double* dnull = sc.dnull(0);
  double dg = *sc.dg(0);
  for (int64_t ch = 1; ch < nc; ++ch) {
    for (int64_t c = 0; c < d; ++c) dq[c] += sc.dq(ch)[c];
    if (null0)
      for (int64_t c = 0; c < d; ++c) dnull[c] += sc.dnull(ch)[c];
    dg += *sc.dg(ch);
  }
  for (int64_t c = 0; c < d; ++c) {
    dw[c] += static_cast<float>(dq[c] * gamma[c]);
    dgamma[c] += static_cast<float>(dq[c] * w[c]);
  }
  if (null0)
    for (int64_t c = 0; c < d; ++c) dsrc[0][c] += static_cast<float>(dnull[c]);
  if (gate) *dgate += static_cast<float>(dg);
}

// ---- sigmoid_vector's gate ---------------------------------------------------------
//
// Elementwise per token; the bias gradient's sum over tokens goes through
// 64-token chunk partials (double) added in chunk order.
void CpuKernels::gate_vector_forward_impl(float* u, float* g, float* diff, const float* bias, const float* base,
                                          int64_t N, int64_t d) {
#pragma omp parallel for schedule(static) num_threads(threads()) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* un = u + n * d;
    float* gn = g + n * d;
    const float* xn = base + n * d;
    for (int64_t c = 0; c < d; ++c) {
      const float gc = static_cast<float>(1.0 / (1.0 + std::exp(-(static_cast<double>(gn[c]) + bias[c]))));
      const float df = un[c] - xn[c];
      gn[c] = gc;
      if (diff) diff[n * d + c] = df;
      un[c] = xn[c] + gc * df;
    }
  }
}

namespace {

// dbias[c] += Σ_n f(i = n·d + c) over N tokens, through 64-token chunk
// partials (double) added in chunk order, so the sum does not depend on the
// thread count; f also writes the element's other outputs.  part: the
// workspace, 2·num_chunks(N)·pad16(d) floats.
template <class F>
void bias_sum_by_chunks(float* dbias, double* part, int threads, int64_t N, int64_t d, F f) {
  const int64_t nc = num_chunks(N);
#pragma omp parallel for schedule(static) num_threads(threads) if (nc > 1)
  for (int64_t ch = 0; ch < nc; ++ch) {
    double* db = part + ch * pad16(d);
    for (int64_t c = 0; c < d; ++c) db[c] = 0.0;
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n)
      for (int64_t c = 0; c < d; ++c) db[c] += f(n * d + c);
  }
  for (int64_t ch = 1; ch < nc; ++ch)
    for (int64_t c = 0; c < d; ++c) part[c] += part[ch * pad16(d) + c];
  for (int64_t c = 0; c < d; ++c) dbias[c] += static_cast<float>(part[c]);
}

}  // namespace

void CpuKernels::gate_vector_backward_impl(float* dh, float* dpre, float* dbias, float* dbase, const float* du,
                                           const float* g, const float* diff, int64_t N, int64_t d) {
  double* part = reinterpret_cast<double*>(ctx_.workspace(2 * num_chunks(N) * pad16(d)));
  bias_sum_by_chunks(dbias, part, threads(), N, d, [&](int64_t i) {
    const float gi = g[i], dui = du[i];
    const float dp = dui * diff[i] * gi * (1.0f - gi);
    dpre[i] = dp;
    dbase[i] = (1.0f - gi) * dui;
    dh[i] = gi * dui;
    return dp;
  });
}

// ---- pre_gated's source gate -------------------------------------------------------
//
// Elementwise per token; the bias gradient's sum over tokens goes through
// 64-token chunk partials (double) added in chunk order, as gate_vector's.
void CpuKernels::sigmoid_gate_forward_impl(float* g, const float* pre, const float* bias, int64_t N, int64_t d) {
#pragma omp parallel for schedule(static) num_threads(threads()) if (N * d >= kParallelMin)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < d; ++c) {
      const int64_t i = n * d + c;
      g[i] = static_cast<float>(1.0 / (1.0 + std::exp(-(static_cast<double>(pre[i]) + bias[c]))));
    }
}

void CpuKernels::sigmoid_gate_backward_impl(float* dpre, float* dbias, const float* dg, const float* g, int64_t N,
                                            int64_t d) {
  double* part = reinterpret_cast<double*>(ctx_.workspace(2 * num_chunks(N) * pad16(d)));
  bias_sum_by_chunks(dbias, part, threads(), N, d, [&](int64_t i) {
    const float gi = g[i];
    const float dp = dg[i] * gi * (1.0f - gi);  // dpre may alias dg: read before written
    dpre[i] = dp;
    return dp;
  });
}

// y = g∘v per token and its rstd (Σ y² in double, in element order), eight
// tokens' sums side by side (side_sums.h).
void CpuKernels::gated_source_forward_impl(float* y, float* y_rstd, const float* g, const float* v, int64_t N,
                                           int64_t d, float eps) {
  const int64_t blocks = (N + kSideSums - 1) / kSideSums;
#pragma omp parallel for schedule(static) num_threads(threads()) if (N * d >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n0 = b * kSideSums, rows = std::min(kSideSums, N - n0);
    float* yb = y + n0 * d;
    const float* gb = g + n0 * d;
    const float* vb = v + n0 * d;
#pragma omp simd
    for (int64_t i = 0; i < rows * d; ++i) yb[i] = gb[i] * vb[i];
    double ss[kSideSums] = {};
    side_dots(ss, yb, yb, d, rows, d);
    for (int64_t r = 0; r < rows; ++r)
      y_rstd[n0 + r] = static_cast<float>(1.0 / std::sqrt(ss[r] / static_cast<double>(d) + eps));
  }
}

void CpuKernels::gated_source_backward_impl(float* dv, float* dg, const float* dy, const float* g, const float* v,
                                            int64_t N, int64_t d, bool accumulate_dv) {
  const int64_t n = N * d;
#pragma omp parallel for simd schedule(static) num_threads(threads()) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gdy = g[i] * dy[i];
    dv[i] = accumulate_dv ? dv[i] + gdy : gdy;
    dg[i] += v[i] * dy[i];
  }
}

// ---- the entropy term ----------------------------------------------------------
//
// Per token: α = softmax_row of each head's stored logits (the bits every
// routing op uses), e = (1/H) Σ_h −Σ_i α_hi ln(α_hi + ε); the chunks' sums
// (double) are added in chunk order.  Scratch: per chunk H·S doubles of α,
// then the chunks' partials.
void CpuKernels::route_entropy_impl(double* sum, const float* logits, int64_t S, int64_t H, int64_t N) {
  const int64_t nc = num_chunks(N), hs = pad16(2 * H * S) / 2;
  double* scratch = reinterpret_cast<double*>(ctx_.workspace(2 * nc * (hs + 1)));
  double* part = scratch + nc * hs;
  const double inv_h = 1.0 / static_cast<double>(H);
#pragma omp parallel for schedule(static) num_threads(threads()) if (nc > 1)
  for (int64_t ch = 0; ch < nc; ++ch) {
    double* alpha = scratch + ch * hs;
    double e = 0.0;
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n) {
      double t = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        softmax_row(alpha, logits + (n * H + h) * S, S);
        for (int64_t i = 0; i < S; ++i) t -= alpha[i] * std::log(alpha[i] + kEntropyEps);
      }
      e += t * inv_h;
    }
    part[ch] = e;
  }
  double total = 0.0;
  for (int64_t ch = 0; ch < nc; ++ch) total += part[ch];
  *sum += total;
}

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"
