// routing_test.cpp — the routing ops of the Backend interface (ops/backend.h)
// on every backend configuration (testing::backend_params()), against a
// double-precision reference (forward) and central finite differences of that
// reference (backward).
//
// Every case checks every entry of every gradient: sources (including a
// broadcast null source), base, w, γ and the gate.  Loss = Σ_n,c dout·out for a
// fixed random dout, so a source entry of token n only moves token n's loss
// and its difference quotient costs one token's forward.  Sizes are odd (d = 37,
// N = 70: one full 64-token chunk and a partial one).  Gradient buffers start
// non-zero to check that the kernel accumulates (+=).  The ops see only
// backend memory (testing::DeviceVec) and the Context's workspace.
#include "ops/backend.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/context.h"
#include "testing/check.h"

namespace attnres {
namespace {

using testing::dev;
using testing::DeviceVec;

constexpr float kEps = 1e-6f;

struct Case {
  const char* name;
  int64_t N, d, S;
  bool null0;       // source 0 is a broadcast (d) row
  Combine combine;
  bool gate;
  bool alias_base;  // dbase is dsrc[S−1] and base is source S−1 (gated full/block)
  int64_t H = 1;    // routing heads (H divides d)
  double entropy = 0;  // κ of the entropy term: the loss adds κ·Σ_hi α_hi ln(α_hi + ε) per token
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// All inputs in double; the kernel gets float copies of the same values.
struct Data {
  Case k;
  std::vector<std::vector<double>> v;  // (S) × (N·d), or (d) for a broadcast source
  std::vector<double> w, gamma, base, dout;
  double g = 1.0;

  explicit Data(const Case& c, uint32_t seed) : k(c) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    const int64_t N = c.N, d = c.d;
    for (int64_t i = 0; i < c.S; ++i) {
      std::vector<double> x(static_cast<size_t>(i == 0 && c.null0 ? d : N * d));
      const double scale = 0.5 + 0.3 * static_cast<double>(i % 3);  // sources of different sizes
      for (auto& e : x) e = scale * nd(rng);
      v.push_back(std::move(x));
    }
    w.resize(d), gamma.resize(d), base.resize(N * d), dout.resize(N * d);
    for (auto& e : w) e = 0.4 * nd(rng);  // logits of order 1: α far from uniform
    for (auto& e : gamma) e = 1.0 + 0.2 * nd(rng);
    for (auto& e : base) e = nd(rng);
    for (auto& e : dout) e = nd(rng);
    g = 0.7;
  }
  const double* row(int64_t i, int64_t n) const { return k.null0 && i == 0 ? v[0].data() : v[i].data() + n * k.d; }
  const std::vector<double>& base_of() const { return k.alias_base ? v[k.S - 1] : base; }
};

// Double-precision router for token n: out (d), alpha (H, S), and the
// logits (H, S) if asked.  Head h: the keys' RMSNorm over the full d, then
// the slice [h·d/H, (h+1)·d/H) of query, keys and values.
void ref_token(const Data& D, int64_t n, double* out, double* alpha, double* logits = nullptr) {
  const Case& k = D.k;
  const int64_t d = k.d, S = k.S, H = k.H, dh = d / H;
  std::vector<double> z(H * S);
  for (int64_t i = 0; i < S; ++i) {
    const double* v = D.row(i, n);
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += v[c] * v[c];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + kEps);
    for (int64_t h = 0; h < H; ++h) {
      double qv = 0;
      for (int64_t c = h * dh; c < (h + 1) * dh; ++c) qv += D.w[c] * D.gamma[c] * v[c];
      z[h * S + i] = qv * r;
    }
  }
  if (logits) std::copy(z.begin(), z.end(), logits);
  for (int64_t h = 0; h < H; ++h) {
    double zmax = -INFINITY, sum = 0;
    for (int64_t i = 0; i < S; ++i) zmax = std::max(zmax, z[h * S + i]);
    for (int64_t i = 0; i < S; ++i) sum += (alpha[h * S + i] = std::exp(z[h * S + i] - zmax));
    for (int64_t i = 0; i < S; ++i) alpha[h * S + i] /= sum;
  }
  const double g = k.gate ? D.g : 1.0;
  const double a = k.combine == Combine::kAdd ? 1.0 : (k.gate ? 1.0 - g : 0.0);
  const double* base = D.base_of().data() + n * d;
  for (int64_t c = 0; c < d; ++c) {
    const int64_t h = c / dh;
    double R = 0;
    for (int64_t i = 0; i < S; ++i) R += alpha[h * S + i] * D.row(i, n)[c];
    out[c] = a * base[c] + g * R;
  }
}

constexpr double kEntropyEps = 1e-8;  // the reference code's ε in −Σ α ln(α + ε)
double ref_loss_token(const Data& D, int64_t n) {
  std::vector<double> out(D.k.d), alpha(D.k.H * D.k.S);
  ref_token(D, n, out.data(), alpha.data());
  double l = 0;
  for (int64_t c = 0; c < D.k.d; ++c) l += D.dout[n * D.k.d + c] * out[c];
  // The entropy term: −κ times the token's entropy summed over its heads.
  for (const double a : alpha) l += D.k.entropy * a * std::log(a + kEntropyEps);
  return l;
}

double ref_loss(const Data& D) {
  double l = 0;
  for (int64_t n = 0; n < D.k.N; ++n) l += ref_loss_token(D, n);
  return l;
}

// Central difference of `loss` in the entry x (restored afterwards).
template <class F>
double fd(double& x, F loss) {
  const double h = 1e-5, x0 = x;
  x = x0 + h;
  const double lp = loss();
  x = x0 - h;
  const double lm = loss();
  x = x0;
  return (lp - lm) / (2 * h);
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// The kernel on D's values, every array in the backend's memory (the gate g
// and its gradient dg are one-element arrays); the workspace is reserved in
// the backend's Context.
struct Kernel {
  Backend& ops;
  std::vector<DeviceVec<float>> v, rstd, dsrc;
  DeviceVec<float> w, gamma, base, dout, out, logits, dw, dgamma, dbase, g, dg;
  // The source list and the gradient list, in backend memory as the ops read them.
  DeviceVec<RouteSource> src;
  DeviceVec<float*> dsrc_ptr;

  Kernel(const Data& D, Backend& ops_)
      : ops(ops_),
        w(ops, to_float(D.w)),
        gamma(ops, to_float(D.gamma)),
        base(ops, to_float(D.base)),
        dout(ops, to_float(D.dout)),
        out(ops, D.k.N * D.k.d),
        logits(ops, D.k.N * D.k.H * D.k.S),
        dw(ops, std::vector<float>(D.k.d, 0.5f)),
        dgamma(ops, std::vector<float>(D.k.d, -0.5f)),
        dbase(ops, std::vector<float>(D.k.N * D.k.d, 0.125f)),
        g(ops, std::vector<float>{static_cast<float>(D.g)}),
        dg(ops, std::vector<float>{0.375f}),
        src(ops, static_cast<size_t>(D.k.S)),
        dsrc_ptr(ops, static_cast<size_t>(D.k.S)) {
    const Case& k = D.k;
    const int64_t N = k.N, d = k.d, S = k.S;
    ops.context().reserve(ops.route_workspace(N, d, S, k.H));
    for (int64_t i = 0; i < S; ++i) {
      v.push_back(dev(ops, to_float(D.v[i])));
      const bool bc = k.null0 && i == 0;
      rstd.emplace_back(ops, bc ? 1 : N);
      ops.source_rstd(rstd.back().data(), v.back().data(), bc ? 1 : N, d, kEps);
      // Non-zero start: the kernel must add, not assign.
      std::vector<float> start(D.v[i].size());
      for (size_t j = 0; j < start.size(); ++j) start[j] = 0.25f * static_cast<float>(j % 7) - 0.5f;
      dsrc.push_back(dev(ops, start));
    }
    std::vector<RouteSource> list;
    std::vector<float*> dlist;
    for (int64_t i = 0; i < S; ++i) list.push_back({v[i].data(), rstd[i].data(), k.null0 && i == 0});
    for (auto& x : dsrc) dlist.push_back(x.data());
    src.upload(list);
    dsrc_ptr.upload(dlist);
  }
  const float* base_ptr(const Case& k) const { return k.alias_base ? v[k.S - 1].data() : base.data(); }
  const float* gate(const Case& k) const { return k.gate ? g.data() : nullptr; }
  float* dgate(const Case& k) { return k.gate ? dg.data() : nullptr; }
  void forward(const Case& k, double* st = nullptr) {
    ops.route_forward(out.data(), logits.data(), src.data(), k.S, k.H, w.data(), gamma.data(), base_ptr(k),
                      gate(k), k.combine, k.N, k.d, st);
  }
  void backward(const Case& k) {
    float* db = k.alias_base ? dsrc[k.S - 1].data() : dbase.data();
    ops.route_backward(dsrc_ptr.data(), db, dw.data(), dgamma.data(), dgate(k), dout.data(), logits.data(), src.data(),
                       k.S, k.H, w.data(), gamma.data(), base_ptr(k), gate(k), k.combine, k.N, k.d, nullptr,
                       /*accumulate_src=*/true, static_cast<float>(k.entropy));
  }
  // Host copies of the results.
  std::vector<std::vector<float>> dsrc_host() const {
    std::vector<std::vector<float>> h;
    for (const auto& x : dsrc) h.push_back(x.host());
    return h;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const Case kCases[] = {
    {"one_source_replace", 70, 37, 1, false, Combine::kReplace, false, false},
    {"two_sources_replace", 70, 37, 2, false, Combine::kReplace, false, false},
    {"two_sources_replace_gate", 70, 37, 2, false, Combine::kReplace, true, false},
    {"three_sources_replace_gate_base_is_last", 70, 37, 3, false, Combine::kReplace, true, true},
    {"many_sources_replace", 70, 37, 25, false, Combine::kReplace, false, false},
    {"null_only_add", 70, 37, 1, true, Combine::kAdd, false, false},
    {"null_only_add_gate", 70, 37, 1, true, Combine::kAdd, true, false},
    {"two_sources_add", 70, 5, 2, false, Combine::kAdd, false, false},
    {"many_sources_add_null", 70, 37, 9, true, Combine::kAdd, false, false},
    {"many_sources_add_null_gate", 70, 37, 9, true, Combine::kAdd, true, false},
    // H routing heads (odd head sizes: 19, 5, 1).
    {"one_source_replace_h2", 70, 38, 1, false, Combine::kReplace, false, false, 2},
    {"many_sources_replace_gate_base_is_last_h2", 70, 38, 5, false, Combine::kReplace, true, true, 2},
    {"two_sources_add_h8", 70, 40, 2, false, Combine::kAdd, false, false, 8},
    {"many_sources_add_null_gate_h8", 70, 40, 9, true, Combine::kAdd, true, false, 8},
    {"three_sources_replace_head_size_1", 70, 4, 3, false, Combine::kReplace, false, false, 4},
    // The entropy term's gradient (entropy_scale κ), alone and beside a gate and heads.
    {"many_sources_add_null_entropy", 70, 37, 9, true, Combine::kAdd, false, false, 1, 0.7},
    {"many_sources_replace_gate_base_is_last_entropy_h2", 70, 38, 5, false, Combine::kReplace, true, true, 2, 0.7},
    {"one_source_replace_entropy", 70, 37, 1, false, Combine::kReplace, false, false, 1, 0.7},
};

std::string case_name(const Case& c) { return c.name; }

class Routing : public testing::OnBackendWith<Case> {};

TEST_P(Routing, ForwardMatchesDoubleReference) {
  const Case k = shape();
  Data D(k, 7);
  Kernel K(D, ops);
  K.forward(k);
  const auto K_out = K.out.host(), K_logits = K.logits.host();
  std::vector<double> out(k.d), alpha(k.H * k.S), z(k.H * k.S);
  double worst_out = 0, worst_z = 0, worst_alpha = 0;
  for (int64_t n = 0; n < k.N; ++n) {
    ref_token(D, n, out.data(), alpha.data(), z.data());
    for (int64_t c = 0; c < k.d; ++c)
      worst_out = std::max(worst_out, std::fabs(K_out[n * k.d + c] - out[c]) / (1 + std::fabs(out[c])));
    // α from the stored logits (H, S), as the kernel's users compute it.
    for (int64_t h = 0; h < k.H; ++h) {
      const float* zk = K_logits.data() + (n * k.H + h) * k.S;
      const double* zr = z.data() + h * k.S;
      double zmax = -INFINITY, sum = 0;
      for (int64_t i = 0; i < k.S; ++i) zmax = std::max(zmax, static_cast<double>(zk[i]));
      for (int64_t i = 0; i < k.S; ++i) sum += std::exp(zk[i] - zmax);
      for (int64_t i = 0; i < k.S; ++i) {
        worst_z = std::max(worst_z, std::fabs(zk[i] - zr[i]) / (1 + std::fabs(zr[i])));
        worst_alpha = std::max(worst_alpha, std::fabs(std::exp(zk[i] - zmax) / sum - alpha[h * k.S + i]));
      }
    }
  }
  EXPECT_LT(worst_out, 2e-6);
  EXPECT_LT(worst_z, 1e-6);
  EXPECT_LT(worst_alpha, 1e-6);

  // route_mix rebuilds exactly the same bits from the stored logits.
  DeviceVec<float> again(ops, k.N * k.d);
  ops.route_mix(again.data(), K.logits.data(), K.src.data(), k.S, k.H, K.base_ptr(k), K.gate(k), k.combine, k.N,
                k.d);
  EXPECT_TRUE(same_bits(again.host(), K_out));
}

// route_mix_weights (the interventions' mean and uniform routing): against
// the double reference of out = a·base + c·Σ_i w_hi v_hi for arbitrary
// weights, and the same bits as route_forward where the softmax gives those
// weights exactly (a zero query: α = 1/S).
TEST_P(Routing, FixedWeightsMatchTheReferenceAndTheForward) {
  const Case k = shape();
  Data D(k, 13);
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.1, 1.0);
  std::vector<double> wts(static_cast<size_t>(k.H * k.S));
  for (int64_t h = 0; h < k.H; ++h) {
    double sum = 0;
    for (int64_t i = 0; i < k.S; ++i) sum += (wts[h * k.S + i] = u(rng));
    for (int64_t i = 0; i < k.S; ++i) wts[h * k.S + i] /= sum;
  }
  Kernel K(D, ops);
  DeviceVec<double> W(ops, wts);
  ops.route_mix_weights(K.out.data(), W.data(), K.src.data(), k.S, k.H, K.base_ptr(k), K.gate(k), k.combine, k.N,
                        k.d);
  const auto got = K.out.host();
  const double g = k.gate ? D.g : 1.0;
  const double a = k.combine == Combine::kAdd ? 1.0 : (k.gate ? 1.0 - g : 0.0);
  const int64_t dh = k.d / k.H;
  double worst = 0;
  for (int64_t n = 0; n < k.N; ++n)
    for (int64_t c = 0; c < k.d; ++c) {
      double R = 0;
      for (int64_t i = 0; i < k.S; ++i) R += wts[(c / dh) * k.S + i] * D.row(i, n)[c];
      const double want = a * D.base_of()[n * k.d + c] + g * R;
      worst = std::max(worst, std::fabs(got[n * k.d + c] - want) / (1 + std::fabs(want)));
    }
  EXPECT_LT(worst, 2e-6);

  for (auto& e : D.w) e = 0.0;  // every logit 0: α = 1/S exactly
  Kernel Z(D, ops);
  Z.forward(k);
  const DeviceVec<double> uniform(ops, std::vector<double>(static_cast<size_t>(k.H * k.S), 1.0 / static_cast<double>(k.S)));
  DeviceVec<float> again(ops, k.N * k.d);
  ops.route_mix_weights(again.data(), uniform.data(), Z.src.data(), k.S, k.H, Z.base_ptr(k), Z.gate(k), k.combine,
                        k.N, k.d);
  EXPECT_TRUE(same_bits(again.host(), Z.out.host()));
}

// Ablation is routing over the sources that remain (route_forward given the
// shorter list): a source whose weight is exactly 0 (its logit more than 708
// below the largest, where the exponential is 0 in double) leaves the output's
// bits unchanged when it is taken out.
TEST_P(Routing, AblatingAZeroWeightSourceChangesNoBit) {
  const Case k = shape();
  if (k.S < 3) GTEST_SKIP() << "needs a source to keep on either side of the ablated one";
  Data D(k, 17);
  const int64_t dh = k.d / k.H;
  std::fill(D.w.begin(), D.w.end(), 0.0);
  std::fill(D.gamma.begin(), D.gamma.end(), 1.0);
  for (int64_t h = 0; h < k.H; ++h) {  // per head: source 0 far above, source 1 far below every other
    const int64_t c = h * dh;
    D.w[c] = 200.0;
    for (int64_t e = c; e < static_cast<int64_t>(D.v[0].size()); e += k.d) D.v[0][e] = 5.0;
    for (int64_t e = c; e < static_cast<int64_t>(D.v[1].size()); e += k.d) D.v[1][e] = -50.0;
  }
  Kernel K(D, ops);
  K.forward(k);
  std::vector<RouteSource> all = K.src.host(), kept;
  for (int64_t i = 0; i < k.S; ++i)
    if (i != 1) kept.push_back(all[i]);
  const DeviceVec<RouteSource> rest(ops, kept);
  DeviceVec<float> out(ops, k.N * k.d), logits(ops, k.N * k.H * k.S);
  ops.route_forward(out.data(), logits.data(), rest.data(), k.S - 1, k.H, K.w.data(), K.gamma.data(), K.base_ptr(k),
                    K.gate(k), k.combine, k.N, k.d);
  EXPECT_TRUE(same_bits(out.host(), K.out.host()));
  // and a source of real weight does change it
  kept.assign(all.begin() + 1, all.end());
  const DeviceVec<RouteSource> without0(ops, kept);
  ops.route_forward(out.data(), logits.data(), without0.data(), k.S - 1, k.H, K.w.data(), K.gamma.data(),
                    K.base_ptr(k), K.gate(k), k.combine, k.N, k.d);
  EXPECT_FALSE(same_bits(out.host(), K.out.host()));
}

TEST_P(Routing, BackwardMatchesFiniteDifferences) {
  const Case k = shape();
  Data D(k, 11);
  Kernel K(D, ops);
  const Kernel K0(D, ops);  // the buffers' starting values
  K.forward(k);
  K.backward(k);
  const auto dsrc = K.dsrc_host(), dsrc0 = K0.dsrc_host();
  const auto dbase = K.dbase.host(), dbase0 = K0.dbase.host(), dw = K.dw.host(), dw0 = K0.dw.host();
  const auto dgamma = K.dgamma.host(), dgamma0 = K0.dgamma.host();
  const float dg = K.dg.host()[0], dg0 = K0.dg.host()[0];
  const int64_t N = k.N, d = k.d;
  // |analytic − numeric| ≤ atol + rtol·|numeric|; the kernel is float, the reference double.
  const double atol = 3e-5, rtol = 3e-4;
  auto expect_close = [&](const char* what, int64_t i, int64_t j, double got, double want) {
    EXPECT_LE(std::fabs(got - want), atol + rtol * std::fabs(want))
        << what << " " << i << "[" << j << "]: kernel " << got << ", finite difference " << want;
  };
  // Sources (the aliased last source also receives the base's gradient).
  for (int64_t i = 0; i < k.S; ++i) {
    const bool bc = k.null0 && i == 0;
    for (int64_t e = 0; e < static_cast<int64_t>(D.v[i].size()); ++e) {
      const int64_t n = e / d;
      const double want = bc ? fd(D.v[i][e], [&] { return ref_loss(D); })
                             : fd(D.v[i][e], [&] { return ref_loss_token(D, n); });
      expect_close("dsrc", i, e, dsrc[i][e] - dsrc0[i][e], want);
    }
  }
  if (!k.alias_base && (k.combine == Combine::kAdd || k.gate)) {
    for (int64_t e = 0; e < N * d; ++e)
      expect_close("dbase", 0, e, dbase[e] - dbase0[e], fd(D.base[e], [&] { return ref_loss_token(D, e / d); }));
  }
  for (int64_t c = 0; c < d; ++c) {
    expect_close("dw", 0, c, dw[c] - dw0[c], fd(D.w[c], [&] { return ref_loss(D); }));
    expect_close("dgamma", 0, c, dgamma[c] - dgamma0[c], fd(D.gamma[c], [&] { return ref_loss(D); }));
  }
  if (k.gate) expect_close("dgate", 0, 0, dg - dg0, fd(D.g, [&] { return ref_loss(D); }));
}

// route_entropy: the double reference's Σ_n (1/H) Σ_h −Σ_i α ln(α + ε) from
// the forward's logits, added to what the sum held.
TEST_P(Routing, EntropyMatchesTheReference) {
  const Case k = shape();
  Data D(k, 19);
  Kernel K(D, ops);
  K.forward(k);
  DeviceVec<double> sum(ops, std::vector<double>{0.25});
  ops.route_entropy(sum.data(), K.logits.data(), k.S, k.H, k.N);
  double want = 0.25;
  std::vector<double> out(k.d), alpha(k.H * k.S);
  for (int64_t n = 0; n < k.N; ++n) {
    ref_token(D, n, out.data(), alpha.data());
    double e = 0;
    for (const double a : alpha) e -= a * std::log(a + kEntropyEps);
    want += e / static_cast<double>(k.H);
  }
  // The logits are float (relative 6e−8), the rest double.
  EXPECT_NEAR(sum.host()[0], want, 1e-5 * (1 + std::fabs(want)));
}

ATTNRES_ON_BACKENDS_WITH(Routing, Case, ::testing::ValuesIn(kCases), case_name);

// The token-sum reductions go through fixed chunks: the same bits with 1 or 3
// threads (the Context's; OpenMP's global setting, crossed, plays no part).
TEST(RoutingDeterminism, SameBitsForAnyThreadCount) {
  const Case k{"det", 1000, 37, 6, true, Combine::kAdd, true, false};
  Data D(k, 3);
  const int saved = omp_get_max_threads();
  Context one(1), three(3);
  Kernel A(D, one.ops()), B(D, three.ops());
  {
    testing::ScopedOmpThreads omp(3);
    A.forward(k);
    A.backward(k);
  }
  {
    testing::ScopedOmpThreads omp(1);
    B.forward(k);
    B.backward(k);
  }
  EXPECT_EQ(omp_get_max_threads(), saved);
  EXPECT_TRUE(same_bits(A.out.host(), B.out.host()));
  EXPECT_TRUE(same_bits(A.logits.host(), B.logits.host()));
  EXPECT_TRUE(same_bits(A.dw.host(), B.dw.host()));
  EXPECT_TRUE(same_bits(A.dgamma.host(), B.dgamma.host()));
  EXPECT_TRUE(same_bits(A.dbase.host(), B.dbase.host()));
  EXPECT_EQ(A.dg.host()[0], B.dg.host()[0]);
  const auto a_dsrc = A.dsrc_host(), b_dsrc = B.dsrc_host();
  for (int64_t i = 0; i < k.S; ++i) EXPECT_TRUE(same_bits(a_dsrc[i], b_dsrc[i])) << "source " << i;
}

class RoutingStats : public testing::OnBackend {};

// The statistics of two calls against the reference's; with H heads each
// token's terms are the heads' mean (route_types.h).
void expect_stats_match_reference(Backend& ops, const Case& k) {
  Data D(k, 5);
  Kernel K(D, ops);
  DeviceVec<double> sums(ops, std::vector<double>(route_stats_size(k.S, k.H), 0.0));
  K.forward(k, sums.data());
  K.forward(k, sums.data());  // accumulates over calls
  const std::vector<double> st = sums.host();  // the layout of route_types.h
  std::vector<double> wsum(k.S, 0.0), out(k.d), alpha(k.H * k.S);
  double tmax = 0, ent = 0, cosine = 0, dis = 0;
  std::array<double, kMaxWeightBins> hist{};
  // With heads, each head's own: weights (H, S), max and entropy (H), the disagreement.
  std::vector<double> hw(k.H * k.S, 0.0), hmax(k.H, 0.0), hent(k.H, 0.0);
  for (int64_t n = 0; n < k.N; ++n) {
    ref_token(D, n, out.data(), alpha.data());
    double c_sum = 0;
    for (int64_t h = 0; h < k.H; ++h) {
      double m = 0;
      for (int64_t i = 0; i < k.S; ++i) {
        const double a = alpha[h * k.S + i];
        wsum[i] += a / k.H;
        m = std::max(m, a);
        ent -= a * std::log(a) / k.H;
        hw[h * k.S + i] += a;
        hent[h] -= a * std::log(a);
      }
      tmax += m / k.H;
      hmax[h] += m;
      hist[std::min<int64_t>(static_cast<int64_t>(m * kMaxWeightBins), kMaxWeightBins - 1)] += 2.0 / k.H;
    }
    for (int64_t i = 0; i < k.S; ++i) {
      for (int64_t j = i + 1; j < k.S; ++j) {
        double dot = 0, ni = 0, nj = 0;
        for (int64_t c = 0; c < k.d; ++c) {
          dot += D.row(i, n)[c] * D.row(j, n)[c];
          ni += D.row(i, n)[c] * D.row(i, n)[c];
          nj += D.row(j, n)[c] * D.row(j, n)[c];
        }
        c_sum += dot / std::sqrt(ni * nj);
      }
    }
    cosine += c_sum / (k.S * (k.S - 1) / 2);
    double dev = 0;  // Σ_{h,i} |α_hi − mean_h α_hi|
    for (int64_t i = 0; i < k.S; ++i) {
      double mean = 0;
      for (int64_t h = 0; h < k.H; ++h) mean += alpha[h * k.S + i] / k.H;
      for (int64_t h = 0; h < k.H; ++h) dev += std::fabs(alpha[h * k.S + i] - mean);
    }
    dis += dev / (k.H * k.S);
  }
  const int64_t S = k.S;
  EXPECT_EQ(st[S + 3], 2 * k.N);
  for (int64_t i = 0; i < S; ++i) EXPECT_NEAR(st[i], 2 * wsum[i], 1e-4);
  EXPECT_NEAR(st[S], 2 * tmax, 1e-4);
  EXPECT_NEAR(st[S + 1], 2 * ent, 1e-4);
  EXPECT_NEAR(st[S + 2], 2 * cosine, 1e-4);
  for (int b = 0; b < kMaxWeightBins; ++b)  // (a max weight at a bin edge could fall either side: none here)
    EXPECT_EQ(st[S + 4 + b], hist[b]) << k.name << " bin " << b;
  int populated = 0;
  for (double h : hist) populated += h > 0;
  EXPECT_GE(populated, 3) << k.name;  // the histogram is spread, so the check means something
  ASSERT_EQ(static_cast<int64_t>(st.size()), S + 4 + kMaxWeightBins + (k.H > 1 ? k.H * S + 2 * k.H + 1 : 0));
  if (k.H == 1) return;
  const double* h0 = st.data() + S + 4 + kMaxWeightBins;
  for (int64_t e = 0; e < k.H * S; ++e) EXPECT_NEAR(h0[e], 2 * hw[e], 1e-4) << k.name << " head weight " << e;
  for (int64_t h = 0; h < k.H; ++h) {
    EXPECT_NEAR(h0[k.H * S + h], 2 * hmax[h], 1e-4) << k.name << " head " << h;
    EXPECT_NEAR(h0[k.H * S + k.H + h], 2 * hent[h], 1e-4) << k.name << " head " << h;
  }
  EXPECT_NEAR(h0[k.H * S + 2 * k.H], 2 * dis, 1e-5);
  EXPECT_GT(dis / k.N, 0.01) << k.name;  // the heads disagree here, so the check means something
}

TEST_P(RoutingStats, MatchReference) {
  expect_stats_match_reference(ops, {"stats", 70, 37, 4, false, Combine::kReplace, false, false});
  expect_stats_match_reference(ops, {"stats_h4", 70, 40, 4, false, Combine::kReplace, false, false, 4});
}

ATTNRES_ON_BACKENDS(RoutingStats);

class RoutingHelpers : public testing::OnBackend {};

// Delta's backward rebuilds u = x + g·R in one pass; it must be the forward's bits.
TEST_P(RoutingHelpers, MixStreamIsTheForwardsInput) {
  for (int64_t H : {1, 8})
  for (bool null0 : {false, true}) {
    const Case k{"stream", 70, H == 1 ? 37 : 40, 6, null0, Combine::kAdd, true, false, H};
    Data D(k, 21);
    Kernel K(D, ops);
    std::vector<float> x(k.N * k.d);  // the stream as the forward builds it: x = v_first; x += v_i
    for (int64_t i = null0 ? 1 : 0; i < k.S; ++i) {
      const auto vi = to_float(D.v[i]);  // K.v[i]'s values
      for (int64_t e = 0; e < k.N * k.d; ++e) x[e] = i == (null0 ? 1 : 0) ? vi[e] : x[e] + vi[e];
    }
    auto x_d = dev(ops, x);
    ops.route_forward(K.out.data(), K.logits.data(), K.src.data(), k.S, H, K.w.data(), K.gamma.data(), x_d.data(),
                      K.g.data(), Combine::kAdd, k.N, k.d);
    DeviceVec<float> again(ops, k.N * k.d);
    ops.route_mix_stream(again.data(), K.logits.data(), K.src.data(), k.S, H, K.g.data(), k.N, k.d);
    EXPECT_TRUE(same_bits(again.host(), K.out.host())) << "null " << null0 << ", " << H << " heads";
  }
}

// route_backward's optional rebuild of the next input: the same gradients,
// and the same bits as route_mix / route_mix_stream.
TEST_P(RoutingHelpers, BackwardRebuildsTheNextInput) {
  for (int64_t H : {1, 8})
  for (bool stream : {false, true}) {
    const Case k{"rebuild", 70, H == 1 ? 37 : 40, 6, stream, stream ? Combine::kAdd : Combine::kReplace, true, false, H};
    Data D(k, 23);
    Kernel A(D, ops), B(D, ops);
    A.forward(k);
    B.forward(k);
    // The "previous" router: the first S−1 sources, its own logits.
    const int64_t S2 = k.S - 1;
    Kernel P(D, ops);
    ops.route_forward(P.out.data(), P.logits.data(), P.src.data(), S2, H, P.w.data(), P.gamma.data(), P.base.data(),
                      P.g.data(), k.combine, k.N, k.d);
    DeviceVec<float> want(ops, k.N * k.d), got(ops, k.N * k.d);
    if (stream)
      ops.route_mix_stream(want.data(), P.logits.data(), P.src.data(), S2, H, P.g.data(), k.N, k.d);
    else
      ops.route_mix(want.data(), P.logits.data(), P.src.data(), S2, H, P.base.data(), P.g.data(), k.combine, k.N,
                    k.d);
    RouteRebuild rb{got.data(), P.logits.data(), P.src.data(), S2, H, stream ? nullptr : P.base.data(), P.g.data(),
                    k.combine, stream};
    A.backward(k);
    ops.route_backward(B.dsrc_ptr.data(), B.dbase.data(), B.dw.data(), B.dgamma.data(), B.dg.data(), B.dout.data(),
                       B.logits.data(), B.src.data(), k.S, H, B.w.data(), B.gamma.data(), B.base.data(), B.g.data(),
                       k.combine, k.N, k.d, &rb);
    EXPECT_TRUE(same_bits(got.host(), want.host())) << "stream " << stream << ", " << H << " heads";
    EXPECT_TRUE(same_bits(A.dw.host(), B.dw.host()));
    EXPECT_EQ(A.dg.host()[0], B.dg.host()[0]);
    const auto a_dsrc = A.dsrc_host(), b_dsrc = B.dsrc_host();
    for (int64_t i = 0; i < k.S; ++i) EXPECT_TRUE(same_bits(a_dsrc[i], b_dsrc[i])) << i;
  }
}

// A backward without stored logits computes them again, its rebuilt
// router's too: the same bits as with them stored, for every level.
TEST_P(RoutingHelpers, BackwardWithoutStoredLogitsIsTheSame) {
  for (int64_t H : {1, 8})
  for (bool stream : {false, true}) {
    const Case k{"recompute", 70, H == 1 ? 37 : 40, 6, stream, stream ? Combine::kAdd : Combine::kReplace, true, false, H};
    Data D(k, 31);
    Kernel A(D, ops), B(D, ops);
    A.forward(k);
    B.forward(k);
    const int64_t S2 = k.S - 1;  // the rebuilt router: S−1 sources, a query of its own
    Data D2(k, 37);
    Kernel P(D2, ops);
    ops.route_forward(P.out.data(), P.logits.data(), P.src.data(), S2, H, P.w.data(), P.gamma.data(), P.base.data(),
                      P.g.data(), k.combine, k.N, k.d);
    DeviceVec<float> stored(ops, k.N * k.d), again(ops, k.N * k.d);
    RouteRebuild ra{stored.data(), P.logits.data(), P.src.data(), S2, H, stream ? nullptr : P.base.data(), P.g.data(),
                    k.combine, stream};
    RouteRebuild rb = ra;
    rb.out = again.data();
    rb.logits = nullptr;
    rb.w = P.w.data();
    rb.gamma = P.gamma.data();
    ops.route_backward(A.dsrc_ptr.data(), A.dbase.data(), A.dw.data(), A.dgamma.data(), A.dg.data(), A.dout.data(),
                       A.logits.data(), A.src.data(), k.S, H, A.w.data(), A.gamma.data(), A.base.data(), A.g.data(),
                       k.combine, k.N, k.d, &ra);
    ops.route_backward(B.dsrc_ptr.data(), B.dbase.data(), B.dw.data(), B.dgamma.data(), B.dg.data(), B.dout.data(),
                       nullptr, B.src.data(), k.S, H, B.w.data(), B.gamma.data(), B.base.data(), B.g.data(),
                       k.combine, k.N, k.d, &rb);
    const std::string what = cat(stream ? "stream, " : "", H, " heads");
    EXPECT_TRUE(same_bits(again.host(), stored.host())) << what;
    EXPECT_TRUE(same_bits(A.dw.host(), B.dw.host())) << what;
    EXPECT_TRUE(same_bits(A.dgamma.host(), B.dgamma.host())) << what;
    EXPECT_EQ(A.dg.host()[0], B.dg.host()[0]) << what;
    EXPECT_TRUE(same_bits(A.dbase.host(), B.dbase.host())) << what;
    const auto a_dsrc = A.dsrc_host(), b_dsrc = B.dsrc_host();
    for (int64_t i = 0; i < k.S; ++i) EXPECT_TRUE(same_bits(a_dsrc[i], b_dsrc[i])) << what << ", source " << i;
  }
}

// accumulate_src = false assigns the (N, d) source gradients (the broadcast
// null source, a parameter gradient, still accumulates).
TEST_P(RoutingHelpers, FirstRouterAssigns) {
  const Case k{"assign", 70, 37, 5, true, Combine::kAdd, true, false};
  Data D(k, 29);
  Kernel A(D, ops), B(D, ops);
  A.forward(k);
  B.forward(k);
  for (int64_t i = 1; i < k.S; ++i)
    ops.fill(A.dsrc[i].data(), 0.0f, static_cast<int64_t>(A.dsrc[i].size()));  // B keeps its garbage
  A.backward(k);
  ops.route_backward(B.dsrc_ptr.data(), B.dbase.data(), B.dw.data(), B.dgamma.data(), B.dg.data(), B.dout.data(),
                     B.logits.data(), B.src.data(), k.S, k.H, B.w.data(), B.gamma.data(), B.base.data(), B.g.data(),
                     k.combine, k.N, k.d, nullptr, /*accumulate_src=*/false, /*entropy_scale=*/0.0f);
  const auto a_dsrc = A.dsrc_host(), b_dsrc = B.dsrc_host();
  for (int64_t i = 0; i < k.S; ++i) EXPECT_TRUE(same_bits(a_dsrc[i], b_dsrc[i])) << i;
  EXPECT_TRUE(same_bits(A.dbase.host(), B.dbase.host()));
}

ATTNRES_ON_BACKENDS(RoutingHelpers);

}  // namespace
}  // namespace attnres
