// routing.cpp — the depth-routing kernel (see routing.h for the math and the
// conventions).  Tokens are cut into fixed chunks of kChunk rows; OpenMP
// threads take whole chunks, and every token-sum is first a per-chunk partial
// (double) added in chunk order afterwards, so a result never depends on how
// many threads ran or which chunk each took.
#include "ops/routing.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace attnres {

namespace {

constexpr int64_t kChunk = 64;

int64_t num_chunks(int64_t N) { return (N + kChunk - 1) / kChunk; }

// Per-chunk scratch, in doubles:  dq (d) | dnull (d) | tmp (d) | dg (1) |
// stats (S + 3) | qv (S) | da (S), padded to 8.
struct ChunkLayout {
  int64_t dq, dnull, tmp, dg, stats, qv, da, stride;
  ChunkLayout(int64_t d, int64_t S) {
    dq = 0;
    dnull = dq + d;
    tmp = dnull + d;
    dg = tmp + d;
    stats = dg + 1;
    qv = stats + S + 3;
    da = qv + S;
    stride = (da + S + 7) / 8 * 8;
  }
};

inline const float* row(const RouteSource& s, int64_t n, int64_t d) { return s.broadcast ? s.v : s.v + n * d; }
inline float rstd_at(const RouteSource& s, int64_t n) { return s.broadcast ? s.rstd[0] : s.rstd[n]; }

// (a, c) of out = a·base + c·R; see the table in routing.h.
struct Mix {
  double a, c;
};
Mix mix_coefficients(Combine combine, const float* gate) {
  const double g = gate ? static_cast<double>(*gate) : 1.0;
  if (combine == Combine::kAdd) return {1.0, g};
  return {gate ? 1.0 - g : 0.0, g};
}

void check_sources(const RouteSource* src, int64_t S) {
  ATTNRES_CHECK(S >= 1, "a router needs at least one source");
  for (int64_t i = 1; i < S; ++i) ATTNRES_CHECK(!src[i].broadcast, "only source 0 may be broadcast");
}

// One token's combination: tmp = Σ_i α_i v_i (double), out = a·base + c·tmp.
// Shared by route_forward and route_mix so both give the same bits.
inline void mix_row(float* out, double* tmp, const float* alpha_row, const RouteSource* src, int64_t S, int64_t n,
                    const float* base_row, Mix m, int64_t d) {
  for (int64_t c = 0; c < d; ++c) tmp[c] = 0.0;
  for (int64_t i = 0; i < S; ++i) {
    const float* v = row(src[i], n, d);
    const double al = alpha_row[i];
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) tmp[c] += al * v[c];
  }
  if (m.a == 0.0) {
    for (int64_t c = 0; c < d; ++c) out[c] = static_cast<float>(m.c * tmp[c]);
  } else {
    for (int64_t c = 0; c < d; ++c) out[c] = static_cast<float>(m.a * base_row[c] + m.c * tmp[c]);
  }
}

}  // namespace

void source_rstd(float* rstd, const float* v, int64_t N, int64_t d, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = v + n * d;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < d; ++c) ss += static_cast<double>(x[c]) * x[c];
    rstd[n] = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
  }
}

int64_t route_scratch_doubles(int64_t N, int64_t d, int64_t S) {
  return d + num_chunks(N) * ChunkLayout(d, S).stride;
}

// ---- forward ------------------------------------------------------------------
//
// Per token:  qv_i = q·v_i,  z_i = r_i·qv_i,  α = softmax(z) (double, stored
// as float),  out = a·base + c·Σ α_i v_i.  The source rows of one token (S·d
// floats) stay in cache between the two passes.
void route_forward(float* out, float* alpha, const RouteSource* src, int64_t S, const float* w, const float* gamma,
                   const float* base, const float* gate, Combine combine, int64_t N, int64_t d, double* scratch,
                   RouteStats* stats) {
  check_sources(src, S);
  const Mix m = mix_coefficients(combine, gate);
  ATTNRES_CHECK(m.a == 0.0 || base, "this combination needs a base");
  ATTNRES_CHECK(!stats || static_cast<int64_t>(stats->weight_sum.size()) == S, "stats sized for another router");
  const ChunkLayout L(d, S);
  double* q = scratch;
  for (int64_t c = 0; c < d; ++c) q[c] = static_cast<double>(w[c]) * gamma[c];
  double* chunks = scratch + d;
  const int64_t nc = num_chunks(N);

#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < nc; ++ch) {
    double* cs = chunks + ch * L.stride;
    double* tmp = cs + L.tmp;
    double* z = cs + L.qv;
    double* st = cs + L.stats;  // weight_sum (S) | token_max | entropy | cosine
    if (stats)
      for (int64_t i = 0; i < S + 3; ++i) st[i] = 0.0;
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n) {
      double zmax = -INFINITY;
      for (int64_t i = 0; i < S; ++i) {
        const float* v = row(src[i], n, d);
        double qv = 0.0;
#pragma omp simd reduction(+ : qv)
        for (int64_t c = 0; c < d; ++c) qv += q[c] * v[c];
        z[i] = rstd_at(src[i], n) * qv;
        zmax = z[i] > zmax ? z[i] : zmax;
      }
      double sum = 0.0;
      for (int64_t i = 0; i < S; ++i) sum += (z[i] = std::exp(z[i] - zmax));
      float* al = alpha + n * S;
      for (int64_t i = 0; i < S; ++i) al[i] = static_cast<float>(z[i] / sum);
      mix_row(out + n * d, tmp, al, src, S, n, base ? base + n * d : nullptr, m, d);

      if (stats) {
        double amax = 0.0, ent = 0.0;
        for (int64_t i = 0; i < S; ++i) {
          const double a = al[i];
          st[i] += a;
          amax = a > amax ? a : amax;
          if (a > 0) ent -= a * std::log(a);
        }
        st[S] += amax;
        st[S + 1] += ent;
        if (S >= 2) {
          // Gram matrix of this token's sources: norms on the diagonal.
          double* nrm = z;  // the logits are dead once α is stored
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
  if (stats) {
    for (int64_t ch = 0; ch < nc; ++ch) {
      const double* st = chunks + ch * L.stride + L.stats;
      for (int64_t i = 0; i < S; ++i) stats->weight_sum[i] += st[i];
      stats->token_max_sum += st[S];
      stats->entropy_sum += st[S + 1];
      stats->cosine_sum += st[S + 2];
    }
    stats->tokens += N;
  }
}

void route_mix(float* out, const float* alpha, const RouteSource* src, int64_t S, const float* base,
               const float* gate, Combine combine, int64_t N, int64_t d, double* scratch) {
  check_sources(src, S);
  const Mix m = mix_coefficients(combine, gate);
  ATTNRES_CHECK(m.a == 0.0 || base, "this combination needs a base");
  const ChunkLayout L(d, S);
  double* chunks = scratch + d;
  const int64_t nc = num_chunks(N);
#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < nc; ++ch) {
    double* tmp = chunks + ch * L.stride + L.tmp;
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    // mix_row reads base[c] after the whole tmp is built, so out may alias base.
    for (int64_t n = ch * kChunk; n < n1; ++n)
      mix_row(out + n * d, tmp, alpha + n * S, src, S, n, base ? base + n * d : nullptr, m, d);
  }
}

// ---- backward -------------------------------------------------------------------
//
// out = a·base + c·R, R = Σ_i α_i v_i, α = softmax(z), z_i = r_i (q·v_i),
// r_i = (|v_i|²/d + eps)^(-1/2), q = w∘γ.   Given dout:
//
//   dbase  = a·dout                       dR = c·dout
//   dg     = dout·(R − base)  (kReplace)  or  dout·R  (kAdd)        [gate only]
//   dα_i   = dR·v_i
//   dz_i   = α_i (dα_i − Σ_j α_j dα_j)                             (softmax Jacobian)
//   ∂z_i/∂v_i = r_i q + (q·v_i) ∂r_i/∂v_i,  ∂r_i/∂v_i = −r_i³ v_i / d
//   dv_i  += α_i dR + dz_i r_i (q − (q·v_i) r_i² v_i / d)
//   dq    += Σ_tokens Σ_i dz_i r_i v_i ;   q = w∘γ ⇒ dw += dq∘γ,  dγ += dq∘w
//
// Per token: pass 1 computes dα_i and q·v_i (and R when gated), pass 2 the
// source gradients and this token's share of dq (into its chunk's partial).
void route_backward(float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate, const float* dout,
                    const float* alpha, const RouteSource* src, int64_t S, const float* w, const float* gamma,
                    const float* base, const float* gate, Combine combine, int64_t N, int64_t d,
                    double* scratch) {
  check_sources(src, S);
  const Mix m = mix_coefficients(combine, gate);
  const bool replace_gate = gate && combine == Combine::kReplace;
  ATTNRES_CHECK(!replace_gate || base, "a gated replacement needs its base in the backward");
  const ChunkLayout L(d, S);
  double* q = scratch;
  for (int64_t c = 0; c < d; ++c) q[c] = static_cast<double>(w[c]) * gamma[c];
  double* chunks = scratch + d;
  const int64_t nc = num_chunks(N);
  const bool null0 = src[0].broadcast;
  const double inv_d = 1.0 / static_cast<double>(d);

#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < nc; ++ch) {
    double* cs = chunks + ch * L.stride;
    double* dq = cs + L.dq;
    double* dnull = cs + L.dnull;
    double* tmp = cs + L.tmp;
    double* qv = cs + L.qv;
    double* da = cs + L.da;
    for (int64_t c = 0; c < d; ++c) dq[c] = dnull[c] = 0.0;
    double dg = 0.0;
    const int64_t n1 = (ch + 1) * kChunk < N ? (ch + 1) * kChunk : N;
    for (int64_t n = ch * kChunk; n < n1; ++n) {
      const float* go = dout + n * d;
      const float* al = alpha + n * S;
      // Pass 1: dα_i = c·(dout·v_i), q·v_i; R for the gate.
      if (gate)
        for (int64_t c = 0; c < d; ++c) tmp[c] = 0.0;
      double s = 0.0;
      for (int64_t i = 0; i < S; ++i) {
        const float* v = row(src[i], n, d);
        double dot_g = 0.0, dot_q = 0.0;
#pragma omp simd reduction(+ : dot_g, dot_q)
        for (int64_t c = 0; c < d; ++c) {
          dot_g += static_cast<double>(go[c]) * v[c];
          dot_q += q[c] * v[c];
        }
        da[i] = m.c * dot_g;
        qv[i] = dot_q;
        s += al[i] * da[i];
        if (gate) {
          const double a_i = al[i];
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) tmp[c] += a_i * v[c];
        }
      }
      // Pass 2: source gradients and dq.
      for (int64_t i = 0; i < S; ++i) {
        const float* v = row(src[i], n, d);
        const double r = rstd_at(src[i], n);
        const double dz = al[i] * (da[i] - s);
        const double ka = m.c * al[i], kq = dz * r, kv = -dz * qv[i] * r * r * r * inv_d;
        if (i == 0 && null0) {
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) dnull[c] += ka * go[c] + kq * q[c] + kv * v[c];
        } else {
          float* dv = dsrc[i] + n * d;
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) dv[c] += static_cast<float>(ka * go[c] + kq * q[c] + kv * v[c]);
        }
        if (dz != 0.0) {
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) dq[c] += kq * v[c];
        }
      }
      if (dbase && m.a != 0.0) {
        float* db = dbase + n * d;
        for (int64_t c = 0; c < d; ++c) db[c] += static_cast<float>(m.a * go[c]);
      }
      if (gate) {
        double t = 0.0;
        if (replace_gate) {
          const float* b = base + n * d;
#pragma omp simd reduction(+ : t)
          for (int64_t c = 0; c < d; ++c) t += go[c] * (tmp[c] - b[c]);
        } else {
#pragma omp simd reduction(+ : t)
          for (int64_t c = 0; c < d; ++c) t += go[c] * tmp[c];
        }
        dg += t;
      }
    }
    cs[L.dg] = dg;
  }

  // Deterministic reduction of the chunk partials, in chunk order.
  double* dq = chunks + L.dq;  // chunk 0's partial becomes the total
  double* dnull = chunks + L.dnull;
  double dg = chunks[L.dg];
  for (int64_t ch = 1; ch < nc; ++ch) {
    const double* cs = chunks + ch * L.stride;
    for (int64_t c = 0; c < d; ++c) dq[c] += cs[L.dq + c];
    if (null0)
      for (int64_t c = 0; c < d; ++c) dnull[c] += cs[L.dnull + c];
    dg += cs[L.dg];
  }
  for (int64_t c = 0; c < d; ++c) {
    dw[c] += static_cast<float>(dq[c] * gamma[c]);
    dgamma[c] += static_cast<float>(dq[c] * w[c]);
  }
  if (null0)
    for (int64_t c = 0; c < d; ++c) dsrc[0][c] += static_cast<float>(dnull[c]);
  if (gate) *dgate += static_cast<float>(dg);
}

void sum_sources(float* out, const float* const* v, int64_t S, int64_t N, int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * d;
    std::memcpy(o, v[0] + n * d, static_cast<size_t>(d) * sizeof(float));
    for (int64_t i = 1; i < S; ++i) {
      const float* x = v[i] + n * d;
      for (int64_t c = 0; c < d; ++c) o[c] += x[c];
    }
  }
}

void sub(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
}

}  // namespace attnres
