// ops_test.cpp — every op of the Backend interface (ops/backend.h) on every
// backend configuration (testing::backend_params()): the forward against a
// plain double-precision reference, the backward against central finite
// differences, with odd sizes (not multiples of tiles, chunks or SIMD widths).
// The ops see only backend memory (testing::DeviceVec) and scratch from the
// Context's workspace, reserved with the op's *_workspace function.
#include "ops/backend.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "ops/context.h"
#include "core/error.h"
#include "ops/cpu/cpu_level.h"
#include "ops/cpu/fast_exp.h"
#include "testing/check.h"

namespace attnres {
namespace {

using testing::all_close;
using testing::dev;
using testing::DeviceVec;
using testing::dot;
using testing::fd_gradient;
using testing::randn;
using testing::ScopedOmpThreads;
using testing::to_double;

// FD tolerances for float32 kernels with h = 1e-2.  They are the central
// difference's own error (h² terms, the loss's float32 rounding over 2h), which
// no kernel's summation order changes: the same on every CPU.
constexpr double kFdAtol = 2e-3, kFdRtol = 2e-2;

std::vector<float> filled(size_t n, float value) {
  return std::vector<float>(n, value);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- matmul ------------------------------------------------------------------------

class Matmul : public testing::OnBackend {};

// The forward and backward against references in each precision, and their
// independence of the thread count: products_test.cpp.  Here: the backward's
// math against finite differences (fp32).
TEST_P(Matmul, BackwardMatchesFiniteDifferences) {
  const int64_t N = 6, I = 11, O = 7;
  auto x = randn(N * I, 3), w = randn(O * I, 4), G = randn(N * O, 5);
  auto x_d = dev(ops, x), w_d = dev(ops, w), G_d = dev(ops, G);
  auto dx = dev(ops, filled(N * I, 99.f)), dw = dev(ops, filled(O * I, 0.f));
  DeviceVec<float> out(ops, N * O);
  ops.matmul_backward(dx.data(), dw.data(), G_d.data(), x_d.data(), w_d.data(), N, I, O);
  auto loss = [&] {
    ops.matmul_forward(out.data(), x_d.data(), w_d.data(), N, I, O);
    return dot(out, G);
  };
  const auto dx_h = dx.host(), dw_h = dw.host();
  EXPECT_TRUE(all_close(to_double(dx_h), fd_gradient(x_d, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dw_h), fd_gradient(w_d, loss), kFdAtol, kFdRtol));
  // accumulate_dinp adds onto what is there; dweight always accumulates.
  auto dx2 = dev(ops, filled(N * I, 1.f)), dw2 = dev(ops, dw_h);
  ops.matmul_backward(dx2.data(), dw2.data(), G_d.data(), x_d.data(), w_d.data(), N, I, O, true);
  const auto dx2_h = dx2.host(), dw2_h = dw2.host();
  for (size_t i = 0; i < dx_h.size(); ++i) EXPECT_NEAR(dx2_h[i], dx_h[i] + 1.f, 1e-5);
  for (size_t i = 0; i < dw_h.size(); ++i) EXPECT_NEAR(dw2_h[i], 2 * dw_h[i], 1e-4);
}

ATTNRES_ON_BACKENDS(Matmul);

// ---- RMSNorm -----------------------------------------------------------------------

class RmsNorm : public testing::OnBackend {};

TEST_P(RmsNorm, ForwardMatchesReference) {
  const int64_t N = 5, C = 37;
  const float eps = 1e-6f;
  auto x = randn(N * C, 6), w = randn(C, 7);
  auto x_d = dev(ops, x), w_d = dev(ops, w);
  DeviceVec<float> out_d(ops, N * C), rstd_d(ops, N);
  ops.rmsnorm_forward(out_d.data(), rstd_d.data(), x_d.data(), w_d.data(), N, C, eps);
  const auto rstd = rstd_d.host();
  std::vector<double> ref(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) ref[n * C + c] = x[n * C + c] * r * w[c];
    EXPECT_NEAR(rstd[n], r, 1e-5 * r);
  }
  EXPECT_TRUE(all_close(to_double(out_d.host()), ref, 1e-5, 1e-5));
}

TEST_P(RmsNorm, BackwardMatchesFiniteDifferences) {
  for (int64_t C : {1, 3, 37, 130}) {
    const int64_t N = 4;
    const float eps = 1e-6f;
    auto x = randn(N * C, 8), w = randn(C, 9), G = randn(N * C, 10);
    auto x_d = dev(ops, x), w_d = dev(ops, w), G_d = dev(ops, G);
    DeviceVec<float> out(ops, N * C), rstd(ops, N), dx(ops, N * C), dw(ops, C);
    ops.rmsnorm_forward(out.data(), rstd.data(), x_d.data(), w_d.data(), N, C, eps);
    ops.rmsnorm_backward(dx.data(), dw.data(), G_d.data(), x_d.data(), w_d.data(), rstd.data(), N, C);
    const auto dx_h = dx.host(), dw_h = dw.host();
    auto loss = [&] {
      ops.rmsnorm_forward(out.data(), rstd.data(), x_d.data(), w_d.data(), N, C, eps);
      return dot(out, G);
    };
    if (C > 1) {  // with C = 1 the output is sign(x)·w: flat in x
      EXPECT_TRUE(all_close(to_double(dx_h), fd_gradient(x_d, loss, 1e-3f), kFdAtol, kFdRtol)) << "C=" << C;
    }
    EXPECT_TRUE(all_close(to_double(dw_h), fd_gradient(w_d, loss), kFdAtol, kFdRtol)) << "C=" << C;
    // In-place (dinp aliases dout) gives the same dinp.
    auto inplace = dev(ops, G);
    DeviceVec<float> dw2(ops, C);
    ops.rmsnorm_forward(out.data(), rstd.data(), x_d.data(), w_d.data(), N, C, eps);
    ops.rmsnorm_backward(inplace.data(), dw2.data(), inplace.data(), x_d.data(), w_d.data(), rstd.data(), N, C);
    const auto inplace_h = inplace.host(), dw2_h = dw2.host();
    for (size_t i = 0; i < dx_h.size(); ++i) EXPECT_FLOAT_EQ(inplace_h[i], dx_h[i]);
    for (int64_t c = 0; c < C; ++c) EXPECT_FLOAT_EQ(dw2_h[c], dw_h[c]);
  }
}

// With a bf16 output (the operand of the projections that follow) the rows
// are the float32 rows rounded, to the bit, and rstd is the same.
TEST_P(RmsNorm, Bf16OutputIsTheFloatOutputRounded) {
  for (int64_t C : {37, 128}) {
    const int64_t N = 300;
    auto x = randn(N * C, 11, 3.0), w = randn(C, 12);
    auto x_d = dev(ops, x), w_d = dev(ops, w);
    DeviceVec<float> out(ops, N * C), rstd(ops, N), rstd16(ops, N);
    DeviceVec<bf16> out16(ops, N * C);
    ops.rmsnorm_forward(out.data(), rstd.data(), x_d.data(), w_d.data(), N, C, 1e-6f);
    ops.rmsnorm_forward(out16.data(), rstd16.data(), x_d.data(), w_d.data(), N, C, 1e-6f);
    const auto f = out.host();
    const auto b = out16.host();
    for (int64_t i = 0; i < N * C; ++i) ASSERT_EQ(b[i], float_to_bf16(f[i])) << i << ", C=" << C;
    EXPECT_TRUE(same_bits(rstd.host(), rstd16.host()));
  }
}

ATTNRES_ON_BACKENDS(RmsNorm);

// ---- RoPE --------------------------------------------------------------------------

class Rope : public testing::OnBackend {};

// x·cos + rotate_half(x)·sin at position p, rotate_half(x) = cat(−x[h:], x[:h]), in double.
double rope_ref(const float* x, int64_t j, int64_t hd, int64_t p, double theta) {
  const int64_t jj = j % (hd / 2);
  const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * jj / hd);
  const double rot = j < hd / 2 ? -x[j + hd / 2] : x[j - hd / 2];
  return x[j] * std::cos(angle) + rot * std::sin(angle);
}

TEST_P(Rope, ForwardMatchesHfRotateHalf) {
  const int64_t B = 2, T = 9, heads = 3, hd = 10;
  const double theta = 10000.0;
  DeviceVec<float> cos_t(ops, T * hd / 2), sin_t(ops, T * hd / 2);
  ops.rope_tables(cos_t.data(), sin_t.data(), T, hd, theta);
  auto x = randn(B * T * heads * hd, 11);
  auto y_d = dev(ops, x);
  ops.rope_forward(y_d.data(), cos_t.data(), sin_t.data(), B, T, heads, hd);
  const auto y = y_d.host();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < hd; ++j) {
          const int64_t base = ((b * T + t) * heads + h) * hd;
          EXPECT_NEAR(y[base + j], rope_ref(x.data() + base, j, hd, t, theta), 1e-5);
        }
}

// A block of T rows at positions pos[b] … pos[b]+T−1 (decoding with a cache)
// is rotated as those rows of the whole sequence are.
TEST_P(Rope, PositionsGiveTheRowsOfTheWholeSequence) {
  const int64_t B = 2, T = 4, heads = 3, hd = 10, P = 12;
  const double theta = 10000.0;
  const std::vector<int64_t> pos = {8, 2};  // 8 + 3 = P − 1: the tables' last row
  const auto pos_d = dev(ops, pos);
  DeviceVec<float> cos_t(ops, P * hd / 2), sin_t(ops, P * hd / 2);
  ops.rope_tables(cos_t.data(), sin_t.data(), P, hd, theta);
  const int64_t row = heads * hd;
  auto whole = randn(B * P * row, 30);  // batch row b: a sequence of P positions
  std::vector<float> block(B * T * row);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(&block[(b * T + t) * row], &whole[(b * P + pos[b] + t) * row], row * sizeof(float));
  auto whole_d = dev(ops, whole), block_d = dev(ops, block);
  ops.rope_forward(whole_d.data(), cos_t.data(), sin_t.data(), B, P, heads, hd);
  ops.rope_forward(block_d.data(), cos_t.data(), sin_t.data(), B, T, heads, hd, pos_d.data());
  const auto whole_rot = whole_d.host(), block_rot = block_d.host();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < hd; ++j) {
          const int64_t i = (b * T + t) * row + h * hd;
          EXPECT_EQ(block_rot[i + j], whole_rot[(b * P + pos[b] + t) * row + h * hd + j])
              << "b " << b << " t " << t << " head " << h << " j " << j;
          EXPECT_NEAR(block_rot[i + j], rope_ref(block.data() + i, j, hd, pos[b] + t, theta), 1e-5);
        }
}

TEST_P(Rope, BackwardMatchesFiniteDifferences) {
  const int64_t B = 1, T = 7, heads = 2, hd = 6;
  DeviceVec<float> cos_t(ops, T * hd / 2), sin_t(ops, T * hd / 2);
  ops.rope_tables(cos_t.data(), sin_t.data(), T, hd, 1e6);
  auto x = randn(B * T * heads * hd, 12), G = randn(x.size(), 13);
  auto x_d = dev(ops, x), dx = dev(ops, G);
  DeviceVec<float> y(ops, x.size());
  ops.rope_backward(dx.data(), cos_t.data(), sin_t.data(), B, T, heads, hd);
  auto loss = [&] {
    ops.copy(y.data(), x_d.data(), static_cast<int64_t>(x.size()));
    ops.rope_forward(y.data(), cos_t.data(), sin_t.data(), B, T, heads, hd);
    return dot(y, G);
  };
  EXPECT_TRUE(all_close(to_double(dx.host()), fd_gradient(x_d, loss), kFdAtol, kFdRtol));
}

ATTNRES_ON_BACKENDS(Rope);

// ---- attention ---------------------------------------------------------------------

// Naive causal GQA attention in double; lse (B, H, T), when asked, gets the
// log-sum-exp of each scaled score row.
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                  int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                  std::vector<double>* lse = nullptr) {
  std::vector<double> y(B * T * H * hd, 0.0);
  if (lse) lse->assign(B * H * T, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double acc = 0;
          for (int64_t j = 0; j < hd; ++j)
            acc += static_cast<double>(q[((b * T + t) * H + h) * hd + j]) * k[((b * T + u) * KV + g) * hd + j];
          s[u] = acc * scale;
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        if (lse) (*lse)[(b * H + h) * T + t] = mx + std::log(sum);
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t j = 0; j < hd; ++j)
            y[((b * T + t) * H + h) * hd + j] += s[u] / sum * v[((b * T + u) * KV + g) * hd + j];
      }
    }
  return y;
}

struct AttnCase {
  int64_t B, T, H, KV, hd;
};

std::string attn_case_name(const AttnCase& c) {
  return cat("B", c.B, "_T", c.T, "_H", c.H, "_KV", c.KV, "_hd", c.hd);
}

class Attention : public testing::OnBackendWith<AttnCase> {};
class AttentionLong : public testing::OnBackend {};

// The forward of (B, T, H, KV, hd) on ops against attention_ref: y and lse.
// The bounds are several times float32's typical rounding of sums of ≤ 200
// terms (√K·2⁻²⁴), in whatever order the CPU's BLAS kernel sums the tiles.
void expect_forward_matches_reference(Context& ctx, Backend& ops, int64_t B, int64_t T, int64_t H, int64_t KV,
                                      int64_t hd) {
  ctx.reserve(ops.attention_workspace(T, hd, Precision::kF32));
  auto q = randn(B * T * H * hd, 14), k = randn(B * T * KV * hd, 15), v = randn(B * T * KV * hd, 16);
  auto q_d = dev(ops, q), k_d = dev(ops, k), v_d = dev(ops, v);
  DeviceVec<float> y(ops, q.size()), lse(ops, B * H * T);
  ops.attention_forward(y.data(), lse.data(), q_d.data(), KeyValues{k_d.data(), v_d.data(), T * KV * hd}, B, T, H, KV,
                        hd, Precision::kF32);
  std::vector<double> lse_ref;
  EXPECT_TRUE(all_close(to_double(y.host()), attention_ref(q, k, v, B, T, H, KV, hd, &lse_ref), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(to_double(lse.host()), lse_ref, 1e-5, 1e-5));
}

TEST_P(Attention, ForwardMatchesReference) {
  const auto [B, T, H, KV, hd] = shape();
  expect_forward_matches_reference(ctx, ops, B, T, H, KV, hd);
}

TEST_P(Attention, BackwardMatchesFiniteDifferences) {
  const auto [B, T, H, KV, hd] = shape();
  ctx.reserve(ops.attention_workspace(T, hd, Precision::kF32));
  auto q = randn(B * T * H * hd, 17), k = randn(B * T * KV * hd, 18), v = randn(B * T * KV * hd, 19);
  auto G = randn(q.size(), 20);
  auto q_d = dev(ops, q), k_d = dev(ops, k), v_d = dev(ops, v), G_d = dev(ops, G);
  DeviceVec<float> y(ops, q.size()), lse(ops, B * H * T), dq(ops, q.size());
  auto dk = dev(ops, filled(k.size(), 7.f)), dv = dev(ops, filled(v.size(), 7.f));
  const KeyValues kv{k_d.data(), v_d.data(), T * KV * hd};
  ops.attention_forward(y.data(), lse.data(), q_d.data(), kv, B, T, H, KV, hd, Precision::kF32);
  ops.attention_backward(dq.data(), dk.data(), dv.data(), G_d.data(), q_d.data(), k_d.data(), v_d.data(), y.data(),
                         lse.data(), B, T, H, KV, hd, Precision::kF32);
  auto loss = [&] {
    ops.attention_forward(y.data(), lse.data(), q_d.data(), kv, B, T, H, KV, hd, Precision::kF32);
    return dot(y, G);
  };
  EXPECT_TRUE(all_close(to_double(dq.host()), fd_gradient(q_d, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dk.host()), fd_gradient(k_d, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dv.host()), fd_gradient(v_d, loss), kFdAtol, kFdRtol));
}

// T = 70 and 67 span two query tiles (64 rows each); KV = H is plain MHA;
// odd hd, and hd 16 and 48 (whole vectors of the vectorised softmax levels).
ATTNRES_ON_BACKENDS_WITH(Attention, AttnCase,
                         ::testing::Values(AttnCase{1, 1, 1, 1, 2}, AttnCase{2, 5, 4, 2, 6}, AttnCase{1, 70, 2, 1, 4},
                                           AttnCase{1, 9, 3, 3, 5}, AttnCase{1, 70, 2, 1, 16},
                                           AttnCase{1, 67, 2, 1, 48}),
                         attn_case_name);

// ---- attention in bf16 ------------------------------------------------------------

// The bf16 attention of backend.h in double, every product operand rounded as
// the kernel rounds it (bf16 = false: the float32 definition, unrounded):
//   S = s·r(Q)r(K)ᵀ, P = softmax(S) (causal), y = r(P)r(V);
//   D = rowsum(dY∘y), dP = r(dY)r(V)ᵀ, dS = P∘(dP − D),
//   dQ = s·r(dS)r(K), dK = s·Σ_h r(dS)ᵀr(Q), dV = Σ_h r(P)ᵀr(dY).
//
// With each output, what a right kernel may differ from it by (`tol`):
//   - float32's sums: 2⁻²⁴ times the product's length times Σ|terms| (the
//     worst order; a tile path sums in the hardware's order), the bound of
//     the textbook γₙ;
//   - flips: P and dS are the kernel's float32 values, rounded to bf16 in the
//     kernel.  Where the double value is so near a bf16 rounding midpoint that
//     float32's error of it (its own sums' bound, the softmax's 1e-6, the
//     flips of y reaching D) spans the midpoint, either neighbour is right:
//     the term may move by the two neighbours' distance, one bf16 unit.
// So the bound follows from the definition on any CPU and any tile path
// (AMX sums a tile in its own order, so it flips other values than
// VDPBF16PS), while a wrongly rounded operand moves every term of it.
struct AttnResult {
  std::vector<double> y, lse, dq, dk, dv;
  std::vector<double> y_tol, lse_tol, dq_tol, dk_tol, dv_tol;
};
AttnResult attention_bf16_ref(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                              const std::vector<float>& dy, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                              bool bf16) {
  auto r = [bf16](double x) { return bf16 ? static_cast<double>(round_bf16(static_cast<float>(x))) : x; };
  constexpr double u = 0x1p-24;  // float32's unit roundoff
  // The distance between the roundings of the ends of [x − e, x + e]: one
  // bf16 unit where that interval spans a rounding midpoint, else 0.
  auto flip = [&](double x, double e) { return bf16 ? std::fabs(r(x + e) - r(x - e)) : 0.0; };
  const size_t nq = q.size(), nk = k.size(), nv = v.size();
  AttnResult o;
  for (auto* f : {&o.y, &o.dq, &o.y_tol, &o.dq_tol}) f->assign(nq, 0.0);
  for (auto* f : {&o.dk, &o.dk_tol}) f->assign(nk, 0.0);
  for (auto* f : {&o.dv, &o.dv_tol}) f->assign(nv, 0.0);
  for (auto* f : {&o.lse, &o.lse_tol}) f->assign(B * H * T, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto qi = [&](int64_t b, int64_t t, int64_t h, int64_t j) { return ((b * T + t) * H + h) * hd + j; };
  auto ki = [&](int64_t b, int64_t t, int64_t g, int64_t j) { return ((b * T + t) * KV + g) * hd + j; };
  // Σ|terms| of dQ, dK, dV (their float32 error is added at the end) and their flips.
  std::vector<double> dq_abs(nq), dk_abs(nk), dv_abs(nv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = t + 1;
        std::vector<double> P(n), dP(n), eS(n), eP(n), fP(n), edS(n), fdS(n);
        double mx = -1e300, sum = 0.0, D = 0.0, eD = 0.0, eS_max = 0.0;
        // Σ_j r(x[row t, j])·r(w[key c, j]) over hd, and Σ of the terms' magnitudes.
        auto dot_hd = [&](const std::vector<float>& x, const std::vector<float>& w, int64_t c, double& mag) {
          double acc = 0.0;
          mag = 0.0;
          for (int64_t j = 0; j < hd; ++j) {
            const double term = r(x[qi(b, t, h, j)]) * r(w[ki(b, c, g, j)]);
            acc += term;
            mag += std::fabs(term);
          }
          return acc;
        };
        for (int64_t c = 0; c < n; ++c) {
          double mag;
          const double acc = dot_hd(q, k, c, mag);
          P[c] = acc * scale;
          eS[c] = (hd + 1) * u * mag * scale;  // S's float32 error
          eS_max = std::max(eS_max, eS[c]);
          mx = std::max(mx, P[c]);
        }
        for (auto& e : P) sum += (e = std::exp(e - mx));
        for (auto& e : P) e /= sum;
        o.lse[(b * H + h) * T + t] = mx + std::log(sum);
        o.lse_tol[(b * H + h) * T + t] = 2 * eS_max + (n + 4) * u * std::fabs(o.lse[(b * H + h) * T + t]) + 1e-6;
        for (int64_t c = 0; c < n; ++c) {
          // P's float32 relative error: its S and the row's (max, log-sum-exp), exp's 3e-7, the sum and division.
          eP[c] = P[c] * (eS[c] + 2 * eS_max + 1e-6 + (n + 4) * u);
          fP[c] = flip(P[c], eP[c]);
        }
        for (int64_t j = 0; j < hd; ++j) {
          double acc = 0.0, mag = 0.0, fl = 0.0;
          for (int64_t c = 0; c < n; ++c) {
            const double vr = r(v[ki(b, c, g, j)]);
            acc += r(P[c]) * vr;
            mag += std::fabs(r(P[c]) * vr);
            fl += fP[c] * std::fabs(vr);
          }
          const int64_t i = qi(b, t, h, j);
          o.y[i] = acc;
          o.y_tol[i] = (n + 1) * u * mag + fl;
          D += static_cast<double>(dy[i]) * acc;
          eD += std::fabs(static_cast<double>(dy[i])) * (o.y_tol[i] + u * std::fabs(acc)) +
                (hd + 1) * u * std::fabs(dy[i] * acc);
        }
        for (int64_t c = 0; c < n; ++c) {
          double mag;
          const double acc = dot_hd(dy, v, c, mag);
          dP[c] = P[c] * (acc - D);  // dS
          edS[c] = std::fabs(dP[c]) * (eP[c] / std::max(P[c], 1e-300)) + P[c] * ((hd + 1) * u * mag + eD) +
                   u * std::fabs(dP[c]);
          fdS[c] = flip(dP[c], edS[c]);
        }
        for (int64_t c = 0; c < n; ++c)
          for (int64_t j = 0; j < hd; ++j) {
            const int64_t iq = qi(b, t, h, j), ik = ki(b, c, g, j);
            const double rk = r(k[ik]), rq = r(q[iq]), rdy = r(dy[iq]), rds = r(dP[c]), rp = r(P[c]);
            o.dq[iq] += scale * rds * rk;
            o.dk[ik] += scale * rds * rq;
            o.dv[ik] += rp * rdy;
            dq_abs[iq] += scale * std::fabs(rds * rk);
            dk_abs[ik] += scale * std::fabs(rds * rq);
            dv_abs[ik] += std::fabs(rp * rdy);
            o.dq_tol[iq] += scale * fdS[c] * std::fabs(rk);
            o.dk_tol[ik] += scale * fdS[c] * std::fabs(rq);
            o.dv_tol[ik] += fP[c] * std::fabs(rdy);
          }
      }
    }
  // dQ sums T terms; dK and dV sum T·H/KV (the heads of a group, each a sum of query tiles).
  for (size_t i = 0; i < nq; ++i) o.dq_tol[i] += (T + 2) * u * dq_abs[i];
  for (size_t i = 0; i < nk; ++i) o.dk_tol[i] += (T * H / KV + 2) * u * dk_abs[i];
  for (size_t i = 0; i < nv; ++i) o.dv_tol[i] += (T * H / KV + 2) * u * dv_abs[i];
  return o;
}

// |a − b| ≤ tol elementwise (tol: attention_bf16_ref's bound of each output).
::testing::AssertionResult within(const std::vector<double>& a, const std::vector<double>& b,
                                  const std::vector<double>& tol) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= tol[i] + 1e-30))
      return ::testing::AssertionFailure() << "[" << i << "]: " << a[i] << " vs " << b[i] << " (bound " << tol[i]
                                           << ")";
  return ::testing::AssertionSuccess();
}


// In bf16 the kernel computes its definition: within float32's sums and the
// operands (P, dS) whose float32 value may round to the other bf16 neighbour
// than the double one does (attention_bf16_ref's bound, derived, so it holds
// on every CPU and tile path) — and the float32 definition is not within it:
// the rounding is there, of the right operands.  Every level runs it at its
// best tile path (AMX, VDPBF16PS or float sums: tiles.h), and
// AttentionTiles below runs every path this CPU has.  (The bounds were 2e-3
// and 0.05× bf16's effect, measured on VDPBF16PS: a flip of a large P can
// pass them, and AMX flips other values.)
void expect_bf16_definition(Context& ctx, Backend& ops, const AttnCase& shape) {
  const auto [B, T, H, KV, hd] = shape;
  SCOPED_TRACE(std::string("attention tiles ") + ops.attention_tiles());
  ctx.reserve(ops.attention_workspace(T, hd, Precision::kBF16));
  auto q = randn(B * T * H * hd, 21), k = randn(B * T * KV * hd, 22), v = randn(B * T * KV * hd, 23);
  auto G = randn(q.size(), 24);
  auto q_d = dev(ops, q), k_d = dev(ops, k), v_d = dev(ops, v), G_d = dev(ops, G);
  DeviceVec<float> y(ops, q.size()), lse(ops, B * H * T), dq(ops, q.size());
  auto dk = dev(ops, filled(k.size(), 7.f)), dv = dev(ops, filled(v.size(), 7.f));
  ops.attention_forward(y.data(), lse.data(), q_d.data(), KeyValues{k_d.data(), v_d.data(), T * KV * hd}, B, T, H, KV,
                        hd, Precision::kBF16);
  ops.attention_backward(dq.data(), dk.data(), dv.data(), G_d.data(), q_d.data(), k_d.data(), v_d.data(), y.data(),
                         lse.data(), B, T, H, KV, hd, Precision::kBF16);
  const AttnResult want = attention_bf16_ref(q, k, v, G, B, T, H, KV, hd, true);
  const AttnResult f32 = attention_bf16_ref(q, k, v, G, B, T, H, KV, hd, false);
  AttnResult got;
  got.y = to_double(y.host()), got.lse = to_double(lse.host()), got.dq = to_double(dq.host());
  got.dk = to_double(dk.host()), got.dv = to_double(dv.host());
  const char* names[] = {"y", "lse", "dq", "dk", "dv"};
  using Field = std::vector<double> AttnResult::*;
  const Field fields[] = {&AttnResult::y, &AttnResult::lse, &AttnResult::dq, &AttnResult::dk, &AttnResult::dv};
  const Field tols[] = {&AttnResult::y_tol, &AttnResult::lse_tol, &AttnResult::dq_tol, &AttnResult::dk_tol,
                        &AttnResult::dv_tol};
  for (int i = 0; i < 5; ++i) {
    const auto &g = got.*fields[i], &w = want.*fields[i], &f = f32.*fields[i];
    EXPECT_TRUE(within(g, w, want.*tols[i])) << names[i];
    // The rounding is there, of the right operands: the float32 definition
    // is outside the bound wherever bf16 moves it at all.
    if (i != 1 && (T > 1 || i != 0)) {  // (lse has no bf16 operand; one key: y = r(V) exactly in both)
      EXPECT_FALSE(within(f, w, want.*tols[i])) << names[i] << ": bf16's rounding does not show";
    }
  }
}
TEST_P(Attention, Bf16IsItsDefinition) { expect_bf16_definition(ctx, ops, shape()); }

// Every tile path this CPU has (cpu_level.h TilePath: amx where the CPU has
// AMX-BF16 and the kernel grants the tiles, avx512-bf16, float) computes the
// bf16 definition through the one tiled kernel (tiles.h), on shapes whose
// products have partial tiles in every dimension: M (query rows 70 = 64 + 6,
// hd 40 = 32 + 8 rows of dKᵀ), N (keys 37, 70; hd 6, 40) and K (hd 6 and 40
// padded to 32 and 64, keys to multiples of 32, query tiles of 6).
TEST(AttentionTiles, EveryPathHereComputesTheBf16Definition) {
  const std::vector<TilePath> paths = tile_paths_here(cpu_level_detected());
  ASSERT_EQ(paths.front(), TilePath::kFloat);
  for (TilePath path : paths) {
    ::setenv("ATTNRES_ATTENTION_TILES", tile_path_name(path), 1);
    Context ctx(3);
    ::unsetenv("ATTNRES_ATTENTION_TILES");
    ASSERT_STREQ(ctx.ops().attention_tiles(), tile_path_name(path));
    for (const AttnCase& c : {AttnCase{2, 5, 4, 2, 6}, AttnCase{1, 70, 2, 1, 40}, AttnCase{1, 37, 4, 1, 64}})
      expect_bf16_definition(ctx, ctx.ops(), c);
  }
}

// Each level's kernels take the paths their copy has: below avx512, float.
TEST(AttentionTiles, LevelsBelowAvx512RunTheFloatPath) {
  for (CpuLevel l : cpu_levels_here()) {
    const Context ctx(1, "cpu", cpu_level_name(l));
    if (l != CpuLevel::kAvx512) {
      EXPECT_STREQ(ctx.ops().attention_tiles(), "float");
    }
    EXPECT_STREQ(ctx.ops().attention_tiles(), tile_path_name(tile_path_detected(l)));
    const Context guarded(1, "cpu-guarded", cpu_level_name(l));
    EXPECT_STREQ(guarded.ops().attention_tiles(), ctx.ops().attention_tiles());
  }
}

// ATTNRES_ATTENTION_TILES: an unknown path, or one above what this CPU has,
// is one clear error naming the variable.
TEST(AttentionTiles, ABadOrTooHighPathIsAClearError) {
  auto error_of = [] {
    try {
      Context ctx(1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ::setenv("ATTNRES_ATTENTION_TILES", "tmul", 1);
  EXPECT_EQ(error_of(), "ATTNRES_ATTENTION_TILES 'tmul' is not a path (float, avx512-bf16, amx)");
  if (tile_path_detected(cpu_level_detected()) != TilePath::kAmx) {
    ::setenv("ATTNRES_ATTENTION_TILES", "amx", 1);
    const std::string e = error_of();
    EXPECT_NE(e.find("ATTNRES_ATTENTION_TILES amx: kernels of level"), std::string::npos) << e;
    EXPECT_NE(e.find("run at most"), std::string::npos) << e;
  }
  ::unsetenv("ATTNRES_ATTENTION_TILES");
  EXPECT_EQ(error_of(), "");
}

// Longer rows against the reference (the forward alone: finite differences
// of T = 200 would take minutes): four query tiles, the last partial, hd 64.
TEST_P(AttentionLong, ForwardMatchesReference) { expect_forward_matches_reference(ctx, ops, 1, 200, 2, 1, 64); }
ATTNRES_ON_BACKENDS(AttentionLong);

// Attention of a block of queries over a KV cache (KeyValues with slots and
// positions): each batch row's output is the last T rows of a causal
// attention over its whole sequence, whose keys and values are the cache's.
class AttentionCache : public testing::OnBackend {};

TEST_P(AttentionCache, BlockAtPositionsIsTheWholeSequencesRows) {
  struct CacheCase {
    int64_t T, seqs, P;              // block rows; cache: seqs sequences × P positions
    std::vector<int64_t> slot, pos;  // (B)
  };
  // B = 2 both; the second: T = 70 spans two query tiles at a start past 0.
  const CacheCase cases[] = {{3, 3, 12, {1, 0}, {5, 3}}, {70, 3, 80, {0, 2}, {9, 0}}};
  const int64_t H = 4, KV = 2;
  for (Precision p : {Precision::kF32, Precision::kBF16})
  for (int64_t hd : {6, 32})
  for (const CacheCase& c : cases) {
    const bool bf16 = p == Precision::kBF16;
    const int64_t B = static_cast<int64_t>(c.slot.size()), T = c.T, row = KV * hd, stride = c.P * row;
    int64_t max_keys = 0;
    for (int64_t b = 0; b < B; ++b) max_keys = std::max(max_keys, c.pos[b] + T);
    ctx.reserve(ops.attention_workspace(max_keys, hd, p));
    // Past max_keys the cache holds unrelated values, which a causal query never reads.
    auto kc = randn(c.seqs * stride, 50 + T), vc = randn(c.seqs * stride, 51 + T), q = randn(B * T * H * hd, 52 + T);
    auto kc_d = dev(ops, kc), vc_d = dev(ops, vc), q_d = dev(ops, q);
    DeviceVec<float> y(ops, q.size()), lse(ops, B * H * T), y_nolse(ops, q.size());
    const auto slot_d = dev(ops, c.slot), pos_d = dev(ops, c.pos);
    const KeyValues kv{kc_d.data(), vc_d.data(), stride, slot_d.data(), pos_d.data()};
    ops.attention_forward(y.data(), lse.data(), q_d.data(), kv, B, T, H, KV, hd, p);
    ops.attention_forward(y_nolse.data(), nullptr, q_d.data(), kv, B, T, H, KV, hd, p);
    const auto y_h = y.host(), lse_h = lse.host();
    EXPECT_TRUE(same_bits(y_nolse.host(), y_h)) << "T=" << T << ": lse = null changes y";
    for (int64_t b = 0; b < B; ++b) {
      // The whole sequence of batch row b: L = pos + T positions; queries
      // before the block are arbitrary (they do not change the block's rows).
      const int64_t p0 = c.pos[b], L = p0 + T;
      auto qw = randn(L * H * hd, 60 + b);
      std::memcpy(&qw[p0 * H * hd], &q[b * T * H * hd], T * H * hd * sizeof(float));
      const std::vector<float> kw(kc.begin() + c.slot[b] * stride, kc.begin() + c.slot[b] * stride + L * row);
      const std::vector<float> vw(vc.begin() + c.slot[b] * stride, vc.begin() + c.slot[b] * stride + L * row);
      std::vector<double> lse_ref, yw, y_tol, lse_tol;
      if (bf16) {  // the bf16 definition (attention_bf16_ref), within its float32 sums and flips
        AttnResult r = attention_bf16_ref(qw, kw, vw, std::vector<float>(qw.size()), 1, L, H, KV, hd, true);
        yw = std::move(r.y);
        lse_ref = std::move(r.lse);
        y_tol.assign(r.y_tol.begin() + p0 * H * hd, r.y_tol.end());
        lse_tol = std::move(r.lse_tol);
      } else {
        yw = attention_ref(qw, kw, vw, 1, L, H, KV, hd, &lse_ref);
      }
      const std::vector<double> want(yw.begin() + p0 * H * hd, yw.end());
      const std::vector<double> got_b = to_double(&y_h[b * T * H * hd], T * H * hd);
      // bf16: the definition's derived bound (attention_bf16_ref); fp32: float32's sums, any order.
      EXPECT_TRUE(bf16 ? within(got_b, want, y_tol) : all_close(got_b, want, 1e-5, 1e-4))
          << "T=" << T << " b " << b << " " << precision_name(p);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          EXPECT_NEAR(lse_h[(b * H + h) * T + t], lse_ref[h * L + p0 + t],
                      std::max(bf16 ? lse_tol[h * L + p0 + t] : 0.0, 1e-5 + 1e-5 * std::fabs(lse_ref[h * L + p0 + t])))
              << "T=" << T << " b " << b << " head " << h << " t " << t;
    }
  }
}

// A block's keys into a KV cache land at each sequence's slot and positions,
// and nothing else of the cache changes.
TEST_P(AttentionCache, StoreWritesEachRowAtItsSlotAndPosition) {
  const int64_t B = 2, T = 3, P = 7, seqs = 3, w = 5;
  const std::vector<int64_t> slot = {2, 0}, pos = {4, 1};  // 4 + 3 = P: the last positions
  auto cache = randn(seqs * P * w, 60), x = randn(B * T * w, 61);
  auto cache_d = dev(ops, cache), x_d = dev(ops, x);
  const auto slot_d = dev(ops, slot), pos_d = dev(ops, pos);
  ops.kv_cache_store(cache_d.data(), x_d.data(), slot_d.data(), pos_d.data(), B, T, P, w);
  std::vector<float> want = cache;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < w; ++c) want[((slot[b] * P + pos[b] + t) * w) + c] = x[(b * T + t) * w + c];
  EXPECT_TRUE(same_bits(cache_d.host(), want));
}

ATTNRES_ON_BACKENDS(AttentionCache);

// The guarded backend keeps its promise: its memory is reachable through
// upload, download and the ops, and a host access beside them faults.
TEST(GuardedBackend, HostAccessOutsideTheInterfaceFaults) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  Context ctx(1, "cpu-guarded");
  Backend& ops = ctx.ops();
  EXPECT_STREQ(ops.name(), "cpu-guarded");
  DeviceVec<float> v(ops, std::vector<float>{1, 2, 3});
  ops.scale(v.data(), 2.0f, 3);
  EXPECT_EQ(v.host(), (std::vector<float>{2, 4, 6}));
  float* p = v.data();
  EXPECT_DEATH({ volatile float x = p[1]; (void)x; }, "");
  EXPECT_DEATH({ p[1] = 5.0f; }, "");
  EXPECT_EQ(v.host(), (std::vector<float>{2, 4, 6}));
  EXPECT_NO_THROW(check_device("cpu-guarded"));  // --device cpu-guarded runs any command on it
}

// And an op given host memory where backend memory belongs — the data, an
// array inside an argument record, an entry of a routing source list — is an
// internal error naming the op, not a silent success a GPU would not repeat.
TEST(GuardedBackend, AnOpGivenHostMemoryIsAnError) {
  Context ctx(1, "cpu-guarded");
  Backend& ops = ctx.ops();
  std::vector<float> host_rows(4 * 6, 1.0f);
  EXPECT_THROW(ops.scale(host_rows.data(), 2.0f, 4), InternalError);
  DeviceVec<float> x(ops, host_rows), cos_t(ops, 4 * 3), sin_t(ops, 4 * 3);
  ops.rope_tables(cos_t.data(), sin_t.data(), 4, 6, 1e4);
  const std::vector<int64_t> pos = {0};
  try {
    ops.rope_forward(x.data(), cos_t.data(), sin_t.data(), 1, 4, 1, 6, pos.data());  // host positions
    ADD_FAILURE() << "host positions accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_forward"), std::string::npos) << e.what();
  }
  const auto pos_d = dev(ops, pos);
  ops.rope_forward(x.data(), cos_t.data(), sin_t.data(), 1, 4, 1, 6, pos_d.data());  // backend positions: fine
  DeviceVec<float> k(ops, 4 * 6), y(ops, 4 * 6);
  ctx.reserve(ops.attention_workspace(4, 6, Precision::kF32));
  EXPECT_THROW(ops.attention_forward(y.data(), nullptr, x.data(), KeyValues{k.data(), k.data(), 24, nullptr, pos.data()},
                                     1, 4, 1, 1, 6, Precision::kF32),
               InternalError);
  // A routing source list: in host memory, or in backend memory naming a host row.
  DeviceVec<float> rstd(ops, 4), w(ops, 6), gamma(ops, 6), out(ops, 4 * 6), logits(ops, 4);
  ctx.reserve(ops.route_workspace(4, 6, 1, 1));
  const std::vector<RouteSource> list = {{x.data(), rstd.data(), false}};
  EXPECT_THROW(ops.route_forward(out.data(), logits.data(), list.data(), 1, 1, w.data(), gamma.data(), nullptr, nullptr,
                                 Combine::kReplace, 4, 6),
               InternalError);
  const auto list_d = dev(ops, std::vector<RouteSource>{{host_rows.data(), rstd.data(), false}});
  EXPECT_THROW(ops.route_forward(out.data(), logits.data(), list_d.data(), 1, 1, w.data(), gamma.data(), nullptr,
                                 nullptr, Combine::kReplace, 4, 6),
               InternalError);
}


// The defect this guards against: a model built with one thread count and
// run under another.  Kernels once sized per-thread scratch from OpenMP's
// global thread count, so a model built (scratch reserved) under few threads
// and run after omp_set_num_threads(more) wrote past its scratch.  Now every
// kernel runs the Context's threads: the workspace reserved for them is all
// it takes, whatever OpenMP's setting.
TEST(Context, KernelsUseTheContextsThreadsNotOpenMPs) {
  const int64_t B = 2, T = 70, H = 4, KV = 2, hd = 6;  // T = 70: two query tiles
  const int saved = omp_get_max_threads();
  {
    // An op asserts that its workspace was reserved.
    Context bare(1);
    EXPECT_EQ(bare.reserved(), 0);
    EXPECT_THROW(bare.workspace(1), InternalError);
    DeviceVec<float> q(bare.ops(), B * T * H * hd), kv_rows(bare.ops(), B * T * KV * hd), y(bare.ops(), q.size());
    EXPECT_THROW(bare.ops().attention_forward(y.data(), nullptr, q.data(),
                                              KeyValues{kv_rows.data(), kv_rows.data(), T * KV * hd}, B, T, H, KV, hd, Precision::kF32),
                 InternalError);
  }
  Context ctx(1);
  Backend& ops = ctx.ops();
  const int64_t need = ops.attention_workspace(T, hd, Precision::kF32);
  ctx.reserve(need);  // exactly what one thread's attention takes, nothing more
  EXPECT_EQ(ctx.reserved(), need);
  float* const ws = ctx.workspace(need);
  EXPECT_THROW(ctx.workspace(need + 1), InternalError);

  auto q = randn(B * T * H * hd, 70), k = randn(B * T * KV * hd, 71), v = randn(B * T * KV * hd, 72);
  auto G = randn(q.size(), 73);
  auto q_d = dev(ops, q), k_d = dev(ops, k), v_d = dev(ops, v), G_d = dev(ops, G);
  struct Result {
    std::vector<float> y, lse, dq, dk, dv;
  };
  auto run = [&](Context& c, int omp_threads) {
    ScopedOmpThreads omp(omp_threads);
    Backend& o = c.ops();
    DeviceVec<float> y(o, q.size()), lse(o, B * H * T), dq(o, q.size()), dk(o, k.size()), dv(o, v.size());
    o.attention_forward(y.data(), lse.data(), q_d.data(), KeyValues{k_d.data(), v_d.data(), T * KV * hd}, B, T, H, KV,
                        hd, Precision::kF32);
    o.attention_backward(dq.data(), dk.data(), dv.data(), G_d.data(), q_d.data(), k_d.data(), v_d.data(), y.data(),
                         lse.data(), B, T, H, KV, hd, Precision::kF32);
    return Result{y.host(), lse.host(), dq.host(), dk.host(), dv.host()};
  };
  const Result one = run(ctx, 1);
  const Result eight = run(ctx, 8);
  EXPECT_EQ(omp_get_max_threads(), saved);
  // Nothing grew, nothing moved: the kernels ran within the reservation.
  EXPECT_EQ(ctx.reserved(), need);
  EXPECT_EQ(ctx.workspace(need), ws);
  // Correct under OpenMP's eight threads, and the bits of the run under one.
  std::vector<double> lse_ref;
  EXPECT_TRUE(all_close(to_double(eight.y), attention_ref(q, k, v, B, T, H, KV, hd, &lse_ref), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(to_double(eight.lse), lse_ref, 1e-5, 1e-5));
  EXPECT_TRUE(same_bits(eight.y, one.y));
  EXPECT_TRUE(same_bits(eight.lse, one.lse));
  EXPECT_TRUE(same_bits(eight.dq, one.dq));
  EXPECT_TRUE(same_bits(eight.dk, one.dk));
  EXPECT_TRUE(same_bits(eight.dv, one.dv));
  // The other way round: built for three threads, run under OpenMP's one.
  // Every (batch, head) is one thread's work, so the bits do not change.
  Context three(3);
  three.reserve(three.ops().attention_workspace(T, hd, Precision::kF32));
  const Result other = run(three, 1);
  EXPECT_TRUE(same_bits(other.y, one.y));
  EXPECT_TRUE(same_bits(other.dq, one.dq));
  EXPECT_TRUE(same_bits(other.dk, one.dk));
  EXPECT_TRUE(same_bits(other.dv, one.dv));
  EXPECT_EQ(omp_get_max_threads(), saved);
}

// bf16 attention gives the same bits for any thread count (each (batch, head)
// or (batch, KV head) is one thread's work), at every level.
TEST_P(AttentionLong, Bf16BitsDoNotDependOnThreads) {
  const int64_t B = 2, T = 140, H = 4, KV = 2, hd = 40;  // three query tiles; hd: two vectors and a part
  auto q = randn(B * T * H * hd, 80), k = randn(B * T * KV * hd, 81), v = randn(B * T * KV * hd, 82);
  auto G = randn(q.size(), 83);
  std::vector<std::vector<float>> first;
  for (int threads : {1, 2, 3}) {
    Context c(threads, GetParam().backend, GetParam().level);
    Backend& o = c.ops();
    c.reserve(o.attention_workspace(T, hd, Precision::kBF16));
    auto q_d = dev(o, q), k_d = dev(o, k), v_d = dev(o, v), G_d = dev(o, G);
    DeviceVec<float> y(o, q.size()), lse(o, B * H * T), dq(o, q.size()), dk(o, k.size()), dv(o, v.size());
    o.attention_forward(y.data(), lse.data(), q_d.data(), KeyValues{k_d.data(), v_d.data(), T * KV * hd}, B, T, H, KV,
                        hd, Precision::kBF16);
    o.attention_backward(dq.data(), dk.data(), dv.data(), G_d.data(), q_d.data(), k_d.data(), v_d.data(), y.data(),
                         lse.data(), B, T, H, KV, hd, Precision::kBF16);
    std::vector<std::vector<float>> got = {y.host(), lse.host(), dq.host(), dk.host(), dv.host()};
    if (first.empty()) first = got;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], first[i])) << threads << " threads, output " << i;
  }
}

// ---- SwiGLU ------------------------------------------------------------------------

class SwiGlu : public testing::OnBackend {};

TEST_P(SwiGlu, ForwardAndBackward) {
  const int64_t n = 53;
  auto g = randn(n, 21, 2.0), u = randn(n, 22), G = randn(n, 23);
  auto g_d = dev(ops, g), u_d = dev(ops, u), G_d = dev(ops, G);
  DeviceVec<float> h(ops, n), dg(ops, n), du(ops, n);
  ops.swiglu_forward(h.data(), g_d.data(), u_d.data(), n);
  const auto h_h = h.host();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(h_h[i], g[i] / (1 + std::exp(-static_cast<double>(g[i]))) * u[i], 1e-5);
  ops.swiglu_backward(dg.data(), du.data(), G_d.data(), g_d.data(), u_d.data(), n);
  auto loss = [&] {
    ops.swiglu_forward(h.data(), g_d.data(), u_d.data(), n);
    return dot(h, G);
  };
  EXPECT_TRUE(all_close(to_double(dg.host()), fd_gradient(g_d, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(du.host()), fd_gradient(u_d, loss), kFdAtol, kFdRtol));
}

// With bf16 outputs (the operand of the down projection, and of the gate/up
// backward) the ops write their float32 results rounded, to the bit, over
// lengths that cross the kernel's chunks and pieces; g spans values where
// σ saturates.
TEST_P(SwiGlu, Bf16OutputsAreTheFloatOutputsRounded) {
  for (int64_t n : {int64_t{53}, int64_t{2 * 8192 + 1031}}) {
    auto g = randn(n, 24, 6.0), u = randn(n, 25), G = randn(n, 26);
    auto g_d = dev(ops, g), u_d = dev(ops, u), G_d = dev(ops, G);
    DeviceVec<float> h(ops, n), dg(ops, n), du(ops, n);
    DeviceVec<bf16> h16(ops, n), dg16(ops, n), du16(ops, n);
    ops.swiglu_forward(h.data(), g_d.data(), u_d.data(), n);
    ops.swiglu_forward(h16.data(), g_d.data(), u_d.data(), n);
    ops.swiglu_backward(dg.data(), du.data(), G_d.data(), g_d.data(), u_d.data(), n);
    ops.swiglu_backward(dg16.data(), du16.data(), G_d.data(), g_d.data(), u_d.data(), n);
    const auto hf = h.host(), dgf = dg.host(), duf = du.host();
    const auto hb = h16.host(), dgb = dg16.host(), dub = du16.host();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hb[i], float_to_bf16(hf[i])) << "h[" << i << "] of " << n;
      ASSERT_EQ(dgb[i], float_to_bf16(dgf[i])) << "dg[" << i << "] of " << n;
      ASSERT_EQ(dub[i], float_to_bf16(duf[i])) << "du[" << i << "] of " << n;
    }
  }
  DeviceVec<float> f(ops, 4), g(ops, 4);
  DeviceVec<bf16> b(ops, 4);
  EXPECT_THROW(ops.swiglu_backward(f.data(), b.data(), g.data(), g.data(), g.data(), 4), InternalError);
}

ATTNRES_ON_BACKENDS(SwiGlu);

// ---- sigmoid (the sigmoid gates) ----------------------------------------------------

class Sigmoid : public testing::OnBackend {};

// y = σ(x) against the double formula over saturating values too; the
// backward adds dy·σ'(x) to what dx held, against finite differences.
TEST_P(Sigmoid, ForwardAndBackward) {
  const int64_t n = 53;
  auto x = randn(n, 27, 4.0), G = randn(n, 28), start = randn(n, 29);
  x[0] = -40.0f, x[1] = 40.0f;  // saturated: 4e−18 and 1
  auto x_d = dev(ops, x), G_d = dev(ops, G), dx = dev(ops, start);
  DeviceVec<float> y(ops, n);
  ops.sigmoid_forward(y.data(), x_d.data(), n);
  const auto y_h = y.host();
  for (int64_t i = 0; i < n; ++i) {
    const double want = 1 / (1 + std::exp(-static_cast<double>(x[i])));
    EXPECT_NEAR(y_h[i], want, 1e-7 * want) << i;
  }
  ops.sigmoid_backward(dx.data(), G_d.data(), y.data(), n);
  auto loss = [&] {
    ops.sigmoid_forward(y.data(), x_d.data(), n);
    return dot(y, G);
  };
  auto got = to_double(dx.host());
  for (int64_t i = 0; i < n; ++i) got[i] -= start[i];
  EXPECT_TRUE(all_close(got, fd_gradient(x_d, loss), kFdAtol, kFdRtol));
}

ATTNRES_ON_BACKENDS(Sigmoid);

// ---- sigmoid_vector's gate --------------------------------------------------------

class GateVector : public testing::OnBackend {};

// u = x + σ(pre + b)∘(h − x) per element against the formula; the backward
// (dh, d(pre), d(x) through the gate, and db accumulated) against finite
// differences of L = Σ G∘u, over 70 tokens (a full 64-token chunk of the bias
// sum and a partial one) of 5 channels.
TEST_P(GateVector, ForwardAndBackward) {
  const int64_t N = 70, d = 5, n = N * d;
  auto h = randn(n, 31), pre = randn(n, 32, 2.0), x = randn(n, 33), b = randn(d, 34), G = randn(n, 35);
  auto h_d = dev(ops, h), pre_d = dev(ops, pre), x_d = dev(ops, x), b_d = dev(ops, b), G_d = dev(ops, G);
  DeviceVec<float> u(ops, n), g(ops, n), diff(ops, n);
  ops.context().reserve(4 * n);
  auto forward = [&] {
    ops.copy(u.data(), h_d.data(), n);
    ops.copy(g.data(), pre_d.data(), n);
    ops.gate_vector_forward(u.data(), g.data(), diff.data(), b_d.data(), x_d.data(), N, d);
  };
  forward();
  const auto u_h = u.host(), g_h = g.host(), diff_h = diff.host();
  for (int64_t i = 0; i < n; ++i) {
    const double gi = 1 / (1 + std::exp(-(static_cast<double>(pre[i]) + b[i % d])));
    EXPECT_NEAR(g_h[i], gi, 1e-7) << i;
    EXPECT_NEAR(diff_h[i], static_cast<double>(h[i]) - x[i], 1e-6) << i;
    EXPECT_NEAR(u_h[i], x[i] + gi * (static_cast<double>(h[i]) - x[i]), 1e-5) << i;
  }
  const auto db0 = randn(d, 36);
  DeviceVec<float> dh(ops, n), dpre(ops, n), dx(ops, n);
  auto db = dev(ops, db0);
  ops.gate_vector_backward(dh.data(), dpre.data(), db.data(), dx.data(), G_d.data(), g.data(), diff.data(), N, d);
  auto loss = [&] {
    forward();
    return dot(u, G);
  };
  EXPECT_TRUE(all_close(to_double(dh.host()), fd_gradient(h_d, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dpre.host()), fd_gradient(pre_d, loss), kFdAtol, kFdRtol));
  // x's gradient through the gate alone: d(u)/d(x) = 1 − g with pre held (the caller adds d(pre)·W).
  EXPECT_TRUE(all_close(to_double(dx.host()), fd_gradient(x_d, loss), kFdAtol, kFdRtol));
  auto got_db = to_double(db.host());
  for (int64_t c = 0; c < d; ++c) got_db[c] -= db0[c];
  EXPECT_TRUE(all_close(got_db, fd_gradient(b_d, loss), kFdAtol, kFdRtol));
  // dh may alias du (the model passes its dU_ as both); g and diff as the
  // first backward read them (the differences left the last bias perturbed).
  forward();
  DeviceVec<float> du = dev(ops, G);
  ops.gate_vector_backward(du.data(), dpre.data(), db.data(), dx.data(), du.data(), g.data(), diff.data(), N, d);
  EXPECT_EQ(du.host(), dh.host());
}

ATTNRES_ON_BACKENDS(GateVector);

// ---- pre_gated's source gate ------------------------------------------------------

class SourceGate : public testing::OnBackend {};

// g = σ(pre + b), y_i = g∘v_i and y_i's rstd against the formulas; the
// backward (d(pre), db accumulated, every dv_i, assigned and accumulated)
// against finite differences of L = Σ_i Σ G_i∘y_i + Σ r_i·H_i (the rstd has
// no backward: the router's backward takes the keys' gradient into dy), over
// 70 tokens (a full 64-token chunk of the bias sum and a partial one) of 5
// channels and two sources.
TEST_P(SourceGate, ForwardAndBackward) {
  const int64_t N = 70, d = 5, n = N * d;
  const float eps = 1e-6f;
  auto pre = randn(n, 41, 2.0), b = randn(d, 42), v0 = randn(n, 43), v1 = randn(n, 44), G0 = randn(n, 45),
       G1 = randn(n, 46);
  auto pre_d = dev(ops, pre), b_d = dev(ops, b), v0_d = dev(ops, v0), v1_d = dev(ops, v1), G0_d = dev(ops, G0),
       G1_d = dev(ops, G1);
  DeviceVec<float> g(ops, n), y0(ops, n), y1(ops, n), r0(ops, N), r1(ops, N);
  ops.context().reserve(4 * n);
  auto forward = [&] {
    ops.sigmoid_gate_forward(g.data(), pre_d.data(), b_d.data(), N, d);
    ops.gated_source_forward(y0.data(), r0.data(), g.data(), v0_d.data(), N, d, eps);
    ops.gated_source_forward(y1.data(), r1.data(), g.data(), v1_d.data(), N, d, eps);
  };
  forward();
  const auto g_h = g.host(), y0_h = y0.host(), r0_h = r0.host();
  for (int64_t t = 0; t < N; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) {
      const int64_t i = t * d + c;
      const double gi = 1 / (1 + std::exp(-(static_cast<double>(pre[i]) + b[c])));
      EXPECT_NEAR(g_h[i], gi, 1e-7) << i;
      EXPECT_NEAR(y0_h[i], gi * v0[i], 1e-6) << i;
      ss += gi * v0[i] * gi * v0[i];
    }
    EXPECT_NEAR(r0_h[t], 1 / std::sqrt(ss / d + eps), 1e-4 * r0_h[t]) << t;
  }
  // The backward of L = Σ G0∘y0 + Σ G1∘y1: dy_i = G_i.
  const auto db0 = randn(d, 47), dv1_0 = randn(n, 48);
  auto db = dev(ops, db0), dv1 = dev(ops, dv1_0);
  DeviceVec<float> dv0(ops, n), dg(ops, n), dpre(ops, n);
  ops.fill(dg.data(), 0.0f, n);
  ops.gated_source_backward(dv0.data(), dg.data(), G0_d.data(), g.data(), v0_d.data(), N, d, false);
  ops.gated_source_backward(dv1.data(), dg.data(), G1_d.data(), g.data(), v1_d.data(), N, d, true);
  ops.sigmoid_gate_backward(dpre.data(), db.data(), dg.data(), g.data(), N, d);
  auto loss = [&] {
    forward();
    return dot(y0, G0) + dot(y1, G1);
  };
  EXPECT_TRUE(all_close(to_double(dpre.host()), fd_gradient(pre_d, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dv0.host()), fd_gradient(v0_d, loss), kFdAtol, kFdRtol));
  auto got_dv1 = to_double(dv1.host());
  for (int64_t i = 0; i < n; ++i) got_dv1[i] -= dv1_0[i];
  EXPECT_TRUE(all_close(got_dv1, fd_gradient(v1_d, loss), kFdAtol, kFdRtol));
  auto got_db = to_double(db.host());
  for (int64_t c = 0; c < d; ++c) got_db[c] -= db0[c];
  EXPECT_TRUE(all_close(got_db, fd_gradient(b_d, loss), kFdAtol, kFdRtol));
  // dpre may alias dg (the model passes one buffer as both); g as the first
  // backward read it (the differences left the last input perturbed).
  forward();
  DeviceVec<float> dg2(ops, n);
  ops.copy(dg2.data(), dg.data(), n);
  ops.sigmoid_gate_backward(dpre.data(), db.data(), dg.data(), g.data(), N, d);
  ops.sigmoid_gate_backward(dg2.data(), db.data(), dg2.data(), g.data(), N, d);
  EXPECT_EQ(dg2.host(), dpre.host());
}

ATTNRES_ON_BACKENDS(SourceGate);

// ---- embedding ---------------------------------------------------------------------

class Embedding : public testing::OnBackend {};

TEST_P(Embedding, ForwardAndBackward) {
  const int64_t N = 9, C = 5, V = 4;
  const std::vector<int32_t> tok = {0, 3, 3, 1, 0, 2, 3, 3, 1};
  auto wte = randn(V * C, 24), G = randn(N * C, 25);
  auto tok_d = dev(ops, tok);
  auto wte_d = dev(ops, wte), G_d = dev(ops, G);
  DeviceVec<float> out(ops, N * C), dwte(ops, V * C);
  ops.embedding_forward(out.data(), tok_d.data(), wte_d.data(), N, C);
  const auto out_h = out.host();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out_h[i * C + c], wte[tok[i] * C + c]);
  ops.embedding_backward(dwte.data(), G_d.data(), tok_d.data(), N, C);
  auto loss = [&] {
    ops.embedding_forward(out.data(), tok_d.data(), wte_d.data(), N, C);
    return dot(out, G);
  };
  EXPECT_TRUE(all_close(to_double(dwte.host()), fd_gradient(wte_d, loss), kFdAtol, kFdRtol));
}

// A bfloat16 table: each output row is the token's row widened to float, exactly.
TEST_P(Embedding, Bf16TableGivesTheWidenedRows) {
  const int64_t N = 11, C = 37, V = 6;
  const std::vector<int32_t> tok = {5, 0, 3, 3, 1, 0, 2, 5, 4, 1, 5};
  const auto wte = randn(V * C, 26);
  std::vector<bf16> t16(wte.size());
  for (size_t i = 0; i < wte.size(); ++i) t16[i] = float_to_bf16(wte[i]);
  auto tok_d = dev(ops, tok);
  auto t16_d = dev(ops, t16);
  DeviceVec<float> out(ops, N * C);
  ops.embedding_forward(out.data(), tok_d.data(), t16_d.data(), N, C);
  const auto out_h = out.host();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out_h[i * C + c], bf16_to_float(t16[tok[i] * C + c])) << i << "," << c;
}

ATTNRES_ON_BACKENDS(Embedding);

// ---- LM head -----------------------------------------------------------------------

class LmHead : public testing::OnBackend {};

TEST_P(LmHead, LossAndGradientsMatchReference) {
  // N = 300 rows: more than one 256-row chunk; odd V and C; one ignored target.
  const int64_t N = 300, C = 7, V = 19;
  auto x = randn(N * C, 26), W = randn(V * C, 27, 0.5);
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[i] = static_cast<int32_t>((i * 7) % V);
  tg[5] = -1;
  const float scale = 0.37f;
  ctx.reserve(ops.lm_head_workspace(C, V, Precision::kF32));
  auto x_d = dev(ops, x), W_d = dev(ops, W);
  auto tg_d = dev(ops, tg);
  DeviceVec<float> dx(ops, N * C), dW(ops, V * C), losses_d(ops, N);
  const double sum =
      ops.lm_head_loss(dx.data(), dW.data(), x_d.data(), W_d.data(), tg_d.data(), N, C, V, scale, losses_d.data());
  const auto losses = losses_d.host();
  double ref = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (tg[i] < 0) continue;
    std::vector<double> z(V);
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t c = 0; c < C; ++c) z[v] += static_cast<double>(x[i * C + c]) * W[v * C + c];
      mx = std::max(mx, z[v]);
    }
    for (double e : z) s += std::exp(e - mx);
    const double li = mx + std::log(s) - z[tg[i]];
    // float32 logits of C = 7 terms: ~1e-6 off in any summation order, on any CPU.
    EXPECT_NEAR(losses[i], li, 1e-4);
    ref += li;
  }
  EXPECT_NEAR(sum, ref, 1e-6 * std::fabs(ref) + 1e-4);
  EXPECT_EQ(losses[5], 0.f);
  // The gradients are those of scale · Σ loss_i.
  auto loss = [&] {
    return scale * ops.lm_head_loss(nullptr, nullptr, x_d.data(), W_d.data(), tg_d.data(), N, C, V, 0);
  };
  const auto dx_h = dx.host(), dW_h = dW.host();
  EXPECT_TRUE(all_close(to_double(dx_h), fd_gradient(x_d, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dW_h), fd_gradient(W_d, loss), kFdAtol * 10, kFdRtol));
}

// greedy_out: 1 where the target is the first index of the row's largest
// logit (torch.argmax), checked against the logits computed here — targets
// on the argmax, off it, on a tie's later index, and ignored rows.
TEST_P(LmHead, GreedyFlagsMarkTheFirstArgmax) {
  const int64_t C = 4, V = 300, N = 7;
  std::vector<float> W(V * C, 0.0f), x(N * C, 0.0f);
  for (int64_t v = 0; v < V; ++v) W[v * C + v % C] = 0.1f * static_cast<float>(v % 10);  // many ties
  for (int64_t n = 0; n < N; ++n) x[n * C + n % C] = 1.0f;  // row n reads column n % C
  // Row n's logits: z_v = 0.1·(v % 10) where v % C == n % C, else 0.
  auto logits = [&](int64_t n) {
    std::vector<float> z(V, 0.0f);
    for (int64_t v = 0; v < V; ++v) z[v] = (v % C == n % C) ? W[v * C + v % C] : 0.0f;
    return z;
  };
  std::vector<int32_t> tg(N);
  std::vector<uint8_t> want(N);
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<float> z = logits(n);
    const int64_t first = std::max_element(z.begin(), z.end()) - z.begin();  // the first maximum
    int64_t later = -1;
    for (int64_t v = first + 1; v < V && later < 0; ++v) later = z[v] == z[first] ? v : -1;
    switch (n % 4) {
      case 0: tg[n] = static_cast<int32_t>(first), want[n] = 1; break;
      case 1: tg[n] = static_cast<int32_t>((first + 1) % V), want[n] = 0; break;
      case 2: tg[n] = static_cast<int32_t>(later >= 0 ? later : (first + 2) % V), want[n] = 0; break;
      default: tg[n] = -1, want[n] = 0; break;
    }
  }
  ctx.reserve(ops.lm_head_workspace(C, V, Precision::kF32));
  auto W_d = dev(ops, W);
  auto x_d = dev(ops, x);
  auto tg_d = dev(ops, tg);
  DeviceVec<uint8_t> g(ops, N);
  ops.lm_head_loss(nullptr, nullptr, x_d.data(), W_d.data(), tg_d.data(), N, C, V, 1.0f, nullptr, g.data());
  EXPECT_EQ(g.host(), want);
}

// Softmax cross-entropy of given logits (the LM head's composition): losses
// against a double reference, dlogits against finite differences of
// scale · Σ loss, in place (dlogits aliasing logits) as the composition runs it.
TEST_P(LmHead, CrossEntropyMatchesReferenceAndItsGradient) {
  const int64_t N = 6, V = 300;  // V: more than one block of 256
  auto z = randn(N * V, 29, 2.0);
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[i] = static_cast<int32_t>((i * 53) % V);
  tg[3] = -1;
  const float scale = 0.41f;
  auto z_d = dev(ops, z);
  auto tg_d = dev(ops, tg);
  DeviceVec<float> dz(ops, N * V), losses_d(ops, N);
  const double sum = ops.cross_entropy(dz.data(), z_d.data(), tg_d.data(), N, V, scale, losses_d.data(), nullptr);
  const auto losses = losses_d.host();
  double ref = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (tg[i] < 0) continue;
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(z[i * V + v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[i * V + v] - mx);
    const double li = mx + std::log(s) - z[i * V + tg[i]];
    EXPECT_NEAR(losses[i], li, 1e-5);
    ref += li;
  }
  EXPECT_NEAR(sum, ref, 1e-6 * std::fabs(ref));
  EXPECT_EQ(losses[3], 0.f);
  const auto dz_h = dz.host();
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dz_h[3 * V + v], 0.f);  // no target: no gradient
  auto loss = [&] { return scale * ops.cross_entropy(nullptr, z_d.data(), tg_d.data(), N, V, 0, nullptr, nullptr); };
  EXPECT_TRUE(all_close(to_double(dz_h), fd_gradient(z_d, loss), kFdAtol, kFdRtol));
  // In place: the same dlogits.
  ops.cross_entropy(z_d.data(), z_d.data(), tg_d.data(), N, V, scale, nullptr, nullptr);
  EXPECT_EQ(z_d.host(), dz_h);
}

ATTNRES_ON_BACKENDS(LmHead);

// fast_exp is a helper of the CPU kernels (ops/cpu/), not a backend op.
TEST(FastExp, RelativeErrorBelow3e7OverTheRange) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.00731f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(fast_exp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fast_exp(-100.f), 0.f);
  EXPECT_EQ(fast_exp(0.f), 1.f);
}

// ---- elementwise and memory --------------------------------------------------------

class Elementwise : public testing::OnBackend {};

TEST_P(Elementwise, Add) {
  auto a = randn(33, 28), b = randn(33, 29);
  auto a_d = dev(ops, a), b_d = dev(ops, b);
  DeviceVec<float> out(ops, 33);
  ops.add(out.data(), a_d.data(), b_d.data(), 33);
  ops.add_inplace(a_d.data(), b_d.data(), 33);
  const auto out_h = out.host(), a_h = a_d.host();
  for (int i = 0; i < 33; ++i) EXPECT_EQ(out_h[i], a_h[i]);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(out_h[i], a[i] + b[i]);
}

// sub (also in place), scale, copy, fill: the float results, exactly.
TEST_P(Elementwise, SubScaleCopyFill) {
  const int64_t n = 1037;
  const auto a = randn(n, 30), b = randn(n, 31);
  auto a_d = dev(ops, a), b_d = dev(ops, b);
  DeviceVec<float> out(ops, n), copied(ops, n);
  ops.sub(out.data(), a_d.data(), b_d.data(), n);
  ops.sub(a_d.data(), a_d.data(), b_d.data(), n);  // out aliasing a
  const auto out_h = out.host(), inplace = a_d.host();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(out_h[i], a[i] - b[i]);
    EXPECT_EQ(inplace[i], a[i] - b[i]);
  }
  ops.scale(b_d.data(), -0.37f, n);
  const auto scaled = b_d.host();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(scaled[i], b[i] * -0.37f);
  ops.copy(copied.data(), out.data(), n);
  EXPECT_TRUE(same_bits(copied.host(), out_h));
  ops.fill(copied.data(), 2.5f, n - 3);  // the last 3 keep their values
  auto f = copied.host();
  for (int64_t i = 0; i < n - 3; ++i) EXPECT_EQ(f[i], 2.5f);
  for (int64_t i = n - 3; i < n; ++i) EXPECT_EQ(f[i], out_h[i]);
  ops.fill(copied.data(), 0.0f, n);
  f = copied.host();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(f[i], 0.0f);
}

// Σ x² in double; the same bits from call to call.
TEST_P(Elementwise, SumSquares) {
  for (int64_t n : {1, 7, 100003}) {
    const auto x = randn(n, 33 + n);
    auto x_d = dev(ops, x);
    double ref = 0;
    for (float e : x) ref += static_cast<double>(e) * e;
    const double s = ops.sum_squares(x_d.data(), n);
    EXPECT_NEAR(s, ref, 1e-12 * ref) << "n=" << n;
    EXPECT_EQ(ops.sum_squares(x_d.data(), n), s) << "n=" << n;
  }
}

// The sum's order is part of its definition (the gradient norm's bits, and
// so fp32 training's): chunks of 2^16 elements, each summed in double in
// element order, the chunk sums added in chunk order — to the bit, with
// whole groups of eight chunks, a group cut short, and a short last chunk.
TEST_P(Elementwise, SumSquaresIsChunkSumsInOrder) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  for (int64_t n : {kChunk - 5, 8 * kChunk, 11 * kChunk + 12345, 17 * kChunk}) {
    const auto x = randn(n, 7 + n);
    auto x_d = dev(ops, x);
    double ref = 0;
    for (int64_t b = 0; b < n; b += kChunk) {
      double chunk = 0;
      for (int64_t i = b; i < std::min(n, b + kChunk); ++i) chunk += static_cast<double>(x[i]) * x[i];
      ref += chunk;
    }
    EXPECT_EQ(ops.sum_squares(x_d.data(), n), ref) << "n=" << n;
  }
}

ATTNRES_ON_BACKENDS(Elementwise);

// ---- AdamW -------------------------------------------------------------------------

class AdamWStep : public testing::OnBackend {};

// One update (step 3, with moments from earlier steps) against PyTorch's
// AdamW written out in double, with and without weight decay; n above and
// below the CPU kernel's threading threshold.
TEST_P(AdamWStep, OneStepMatchesScalarReference) {
  const double lr = 3e-3, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  const int t = 3;
  for (int64_t n : {37, 65536 + 37})
    for (bool decayed : {false, true}) {
      const auto p = randn(n, 80), g = randn(n, 81), m = randn(n, 82, 0.1);
      auto v = randn(n, 83, 0.1);
      for (auto& e : v) e = e * e;  // second moments are ≥ 0
      const AdamWUpdate u{static_cast<float>(b1),
                          static_cast<float>(b2),
                          static_cast<float>(eps),
                          static_cast<float>(decayed ? 1.0 - lr * wd : 1.0),
                          static_cast<float>(lr / (1.0 - std::pow(b1, t))),
                          static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(b2, t)))};
      auto p_d = dev(ops, p), g_d = dev(ops, g), m_d = dev(ops, m), v_d = dev(ops, v);
      ops.adamw_update(p_d.data(), g_d.data(), m_d.data(), v_d.data(), n, u);
      const auto p1 = p_d.host(), m1 = m_d.host(), v1 = v_d.host();
      for (int64_t i = 0; i < n; ++i) {
        const double mi = b1 * m[i] + (1 - b1) * g[i];
        const double vi = b2 * v[i] + (1 - b2) * static_cast<double>(g[i]) * g[i];
        const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
        const double pi = p[i] * (decayed ? 1 - lr * wd : 1.0) - lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
        ASSERT_NEAR(m1[i], mi, 1e-6 * (1 + std::fabs(mi))) << "n=" << n << " [" << i << "]";
        ASSERT_NEAR(v1[i], vi, 1e-6 * (1 + std::fabs(vi))) << "n=" << n << " [" << i << "]";
        ASSERT_NEAR(p1[i], pi, 1e-6 * (1 + std::fabs(pi))) << "n=" << n << " decayed " << decayed << " [" << i << "]";
      }
    }
}

ATTNRES_ON_BACKENDS(AdamWStep);


// ---- the kernels' instruction-set levels (ops/cpu/cpu_level.h) ----------------

namespace {
std::string level_error(const std::string& request) {
  try {
    choose_cpu_level(request);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(CpuLevel, EveryLevelThisCpuHasRunsAndSaysWhichItIs) {
  const std::vector<CpuLevel> here = cpu_levels_here();
  ASSERT_FALSE(here.empty());
  EXPECT_EQ(here.front(), CpuLevel::kX86_64);
  EXPECT_EQ(here.back(), cpu_level_detected());
  for (CpuLevel l : here) {
    Context ctx(1, "cpu", cpu_level_name(l));
    EXPECT_STREQ(ctx.ops().kernels(), cpu_level_name(l));
    Context guarded(1, "cpu-guarded", cpu_level_name(l));
    EXPECT_STREQ(guarded.ops().kernels(), cpu_level_name(l));
  }
  EXPECT_STREQ(Context(1).ops().kernels(), cpu_level_name(cpu_level_detected()));  // unset: the best
}

TEST(CpuLevel, ABadOrTooHighLevelIsAClearError) {
  EXPECT_EQ(level_error("avx9"), "cpu level 'avx9' is not a level (x86-64, avx2, avx512)");
  EXPECT_EQ(level_error("AVX2"), "cpu level 'AVX2' is not a level (x86-64, avx2, avx512)");
  if (cpu_level_detected() != CpuLevel::kAvx512) {
    const std::string e = level_error("avx512");
    EXPECT_NE(e.find("this CPU runs at most"), std::string::npos) << e;
  }
  ::setenv("ATTNRES_CPU_LEVEL", "sse9", 1);
  EXPECT_EQ(level_error(""), "ATTNRES_CPU_LEVEL 'sse9' is not a level (x86-64, avx2, avx512)");
  EXPECT_THROW(Context(1), Error);
  ::setenv("ATTNRES_CPU_LEVEL", "x86-64", 1);
  EXPECT_EQ(choose_cpu_level(""), CpuLevel::kX86_64);
  EXPECT_STREQ(Context(1).ops().kernels(), "x86-64");
  EXPECT_EQ(choose_cpu_level(cpu_level_name(cpu_level_detected())), cpu_level_detected());  // the request wins
  ::unsetenv("ATTNRES_CPU_LEVEL");
  EXPECT_EQ(choose_cpu_level(""), cpu_level_detected());
}

}  // namespace
}  // namespace attnres
