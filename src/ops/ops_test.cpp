// ops_test.cpp — every kernel of ops.h: the forward against a plain
// double-precision reference, the backward against central finite differences,
// with odd sizes (not multiples of tiles, chunks or SIMD widths).
#include "ops/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/fast_exp.h"
#include "testing/check.h"

namespace attnres {
namespace {

using testing::all_close;
using testing::dot;
using testing::fd_gradient;
using testing::randn;
using testing::to_double;

// FD tolerances for float32 kernels with h = 1e-2.
constexpr double kFdAtol = 2e-3, kFdRtol = 2e-2;

TEST(Matmul, ForwardMatchesReference) {
  const int64_t N = 7, I = 13, O = 5;
  auto x = randn(N * I, 1), w = randn(O * I, 2);
  std::vector<float> out(N * O);
  matmul_forward(out.data(), x.data(), w.data(), N, I, O);
  std::vector<double> ref(N * O);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i) ref[n * O + o] += static_cast<double>(x[n * I + i]) * w[o * I + i];
  EXPECT_TRUE(all_close(to_double(out.data(), out.size()), ref, 1e-5, 1e-5));
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  const int64_t N = 6, I = 11, O = 7;
  auto x = randn(N * I, 3), w = randn(O * I, 4), G = randn(N * O, 5);
  std::vector<float> out(N * O), dx(N * I, 99.f), dw(O * I, 0.f);
  matmul_backward(dx.data(), dw.data(), G.data(), x.data(), w.data(), N, I, O);
  auto loss = [&] {
    matmul_forward(out.data(), x.data(), w.data(), N, I, O);
    return dot(out, G);
  };
  EXPECT_TRUE(all_close(to_double(dx.data(), dx.size()), fd_gradient(x, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dw.data(), dw.size()), fd_gradient(w, loss), kFdAtol, kFdRtol));
  // accumulate_dinp adds onto what is there; dweight always accumulates.
  std::vector<float> dx2(N * I, 1.f), dw2 = dw;
  matmul_backward(dx2.data(), dw2.data(), G.data(), x.data(), w.data(), N, I, O, true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], dx[i] + 1.f, 1e-5);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-4);
}

TEST(RmsNorm, ForwardMatchesReference) {
  const int64_t N = 5, C = 37;
  const float eps = 1e-6f;
  auto x = randn(N * C, 6), w = randn(C, 7);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  std::vector<double> ref(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) ref[n * C + c] = x[n * C + c] * r * w[c];
    EXPECT_NEAR(rstd[n], r, 1e-5 * r);
  }
  EXPECT_TRUE(all_close(to_double(out.data(), out.size()), ref, 1e-5, 1e-5));
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  for (int64_t C : {1, 3, 37, 130}) {
    const int64_t N = 4;
    const float eps = 1e-6f;
    auto x = randn(N * C, 8), w = randn(C, 9), G = randn(N * C, 10);
    std::vector<float> out(N * C), rstd(N), dx(N * C), dw(C, 0.f);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    rmsnorm_backward(dx.data(), dw.data(), G.data(), x.data(), w.data(), rstd.data(), N, C);
    auto loss = [&] {
      rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
      return dot(out, G);
    };
    if (C > 1) {  // with C = 1 the output is sign(x)·w: flat in x
      EXPECT_TRUE(all_close(to_double(dx.data(), dx.size()), fd_gradient(x, loss, 1e-3f), kFdAtol, kFdRtol))
          << "C=" << C;
    }
    EXPECT_TRUE(all_close(to_double(dw.data(), dw.size()), fd_gradient(w, loss), kFdAtol, kFdRtol)) << "C=" << C;
    // In-place (dinp aliases dout) gives the same dinp.
    std::vector<float> inplace = G, dw2(C, 0.f);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    rmsnorm_backward(inplace.data(), dw2.data(), inplace.data(), x.data(), w.data(), rstd.data(), N, C);
    for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(inplace[i], dx[i]);
    for (int64_t c = 0; c < C; ++c) EXPECT_FLOAT_EQ(dw2[c], dw[c]);
  }
}

TEST(Rope, ForwardMatchesHfRotateHalf) {
  const int64_t B = 2, T = 9, heads = 3, hd = 10;
  const double theta = 10000.0;
  std::vector<float> cos_t(T * hd / 2), sin_t(T * hd / 2);
  rope_tables(cos_t.data(), sin_t.data(), T, hd, theta);
  auto x = randn(B * T * heads * hd, 11), y = x;
  rope_forward(y.data(), cos_t.data(), sin_t.data(), B, T, heads, hd);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < hd; ++j) {
          const int64_t base = ((b * T + t) * heads + h) * hd;
          const int64_t jj = j % (hd / 2);
          const double angle = t * std::pow(theta, -2.0 * jj / hd);
          // x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x[h:], x[:h])
          const double rot = j < hd / 2 ? -x[base + j + hd / 2] : x[base + j - hd / 2];
          EXPECT_NEAR(y[base + j], x[base + j] * std::cos(angle) + rot * std::sin(angle), 1e-5);
        }
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  const int64_t B = 1, T = 7, heads = 2, hd = 6;
  std::vector<float> cos_t(T * hd / 2), sin_t(T * hd / 2);
  rope_tables(cos_t.data(), sin_t.data(), T, hd, 1e6);
  auto x = randn(B * T * heads * hd, 12), G = randn(x.size(), 13);
  std::vector<float> dx = G;
  rope_backward(dx.data(), cos_t.data(), sin_t.data(), B, T, heads, hd);
  auto loss = [&] {
    auto y = x;
    rope_forward(y.data(), cos_t.data(), sin_t.data(), B, T, heads, hd);
    return dot(y, G);
  };
  EXPECT_TRUE(all_close(to_double(dx.data(), dx.size()), fd_gradient(x, loss), kFdAtol, kFdRtol));
}

// Naive causal GQA attention in double.
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int64_t B, int64_t T, int64_t H, int64_t KV,
                                  int64_t hd) {
  std::vector<double> y(B * T * H * hd, 0.0);
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

class Attention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Attention, ForwardMatchesReference) {
  const auto [B, T, H, KV, hd] = GetParam();
  auto q = randn(B * T * H * hd, 14), k = randn(B * T * KV * hd, 15), v = randn(B * T * KV * hd, 16);
  std::vector<float> y(q.size()), lse(B * H * T), scratch(attention_scratch_floats(T) * num_threads());
  attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd, scratch.data());
  EXPECT_TRUE(all_close(to_double(y.data(), y.size()), attention_ref(q, k, v, B, T, H, KV, hd), 1e-5, 1e-4));
}

TEST_P(Attention, BackwardMatchesFiniteDifferences) {
  const auto [B, T, H, KV, hd] = GetParam();
  auto q = randn(B * T * H * hd, 17), k = randn(B * T * KV * hd, 18), v = randn(B * T * KV * hd, 19);
  auto G = randn(q.size(), 20);
  std::vector<float> y(q.size()), lse(B * H * T), scratch(attention_scratch_floats(T) * num_threads());
  std::vector<float> dq(q.size()), dk(k.size(), 7.f), dv(v.size(), 7.f);
  attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd, scratch.data());
  attention_backward(dq.data(), dk.data(), dv.data(), G.data(), q.data(), k.data(), v.data(), y.data(), lse.data(),
                     B, T, H, KV, hd, scratch.data());
  auto loss = [&] {
    attention_forward(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd, scratch.data());
    return dot(y, G);
  };
  EXPECT_TRUE(all_close(to_double(dq.data(), dq.size()), fd_gradient(q, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dk.data(), dk.size()), fd_gradient(k, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dv.data(), dv.size()), fd_gradient(v, loss), kFdAtol, kFdRtol));
}

// T = 70 spans two query tiles (64 rows each); KV = H is plain MHA; odd hd.
INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnCase{1, 1, 1, 1, 2}, AttnCase{2, 5, 4, 2, 6}, AttnCase{1, 70, 2, 1, 4},
                                           AttnCase{1, 9, 3, 3, 5}),
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return cat("B", c.B, "_T", c.T, "_H", c.H, "_KV", c.KV, "_hd", c.hd);
                         });

TEST(SwiGlu, ForwardAndBackward) {
  const int64_t n = 53;
  auto g = randn(n, 21, 2.0), u = randn(n, 22), G = randn(n, 23);
  std::vector<float> h(n), dg(n), du(n);
  swiglu_forward(h.data(), g.data(), u.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(h[i], g[i] / (1 + std::exp(-static_cast<double>(g[i]))) * u[i], 1e-5);
  swiglu_backward(dg.data(), du.data(), G.data(), g.data(), u.data(), n);
  auto loss = [&] {
    swiglu_forward(h.data(), g.data(), u.data(), n);
    return dot(h, G);
  };
  EXPECT_TRUE(all_close(to_double(dg.data(), n), fd_gradient(g, loss), kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(du.data(), n), fd_gradient(u, loss), kFdAtol, kFdRtol));
}

TEST(Embedding, ForwardAndBackward) {
  const int64_t N = 9, C = 5, V = 4;
  const std::vector<int32_t> tok = {0, 3, 3, 1, 0, 2, 3, 3, 1};
  auto wte = randn(V * C, 24), G = randn(N * C, 25);
  std::vector<float> out(N * C), dwte(V * C, 0.f);
  embedding_forward(out.data(), tok.data(), wte.data(), N, C);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[i * C + c], wte[tok[i] * C + c]);
  embedding_backward(dwte.data(), G.data(), tok.data(), N, C);
  auto loss = [&] {
    embedding_forward(out.data(), tok.data(), wte.data(), N, C);
    return dot(out, G);
  };
  EXPECT_TRUE(all_close(to_double(dwte.data(), dwte.size()), fd_gradient(wte, loss), kFdAtol, kFdRtol));
}

TEST(LmHead, LossAndGradientsMatchReference) {
  // N = 300 rows: more than one 256-row chunk; odd V and C; one ignored target.
  const int64_t N = 300, C = 7, V = 19;
  auto x = randn(N * C, 26), W = randn(V * C, 27, 0.5);
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[i] = static_cast<int32_t>((i * 7) % V);
  tg[5] = -1;
  const float scale = 0.37f;
  std::vector<float> scratch(lm_head_scratch_floats(V)), dx(N * C), dW(V * C, 0.f), losses(N);
  const double sum = lm_head_loss(dx.data(), dW.data(), x.data(), W.data(), tg.data(), N, C, V, scale,
                                  scratch.data(), losses.data());
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
    EXPECT_NEAR(losses[i], li, 1e-4);
    ref += li;
  }
  EXPECT_NEAR(sum, ref, 1e-6 * std::fabs(ref) + 1e-4);
  EXPECT_EQ(losses[5], 0.f);
  // The gradients are those of scale · Σ loss_i.
  auto loss = [&] { return scale * lm_head_loss(nullptr, nullptr, x.data(), W.data(), tg.data(), N, C, V, 0, scratch.data()); };
  auto fd_x = fd_gradient(x, loss);
  EXPECT_TRUE(all_close(to_double(dx.data(), dx.size()), fd_x, kFdAtol, kFdRtol));
  EXPECT_TRUE(all_close(to_double(dW.data(), dW.size()), fd_gradient(W, loss), kFdAtol * 10, kFdRtol));
}

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

TEST(Elementwise, Add) {
  auto a = randn(33, 28), b = randn(33, 29);
  std::vector<float> out(33);
  add(out.data(), a.data(), b.data(), 33);
  add_inplace(a.data(), b.data(), 33);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(out[i], a[i]);
}

}  // namespace
}  // namespace attnres
