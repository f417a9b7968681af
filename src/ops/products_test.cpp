// products_test.cpp — the matrix products of the Backend interface (matmul,
// the fused LM head) in each precision, on every backend configuration, with
// the tolerances of the (backend, precision) pair (testing::product_tolerance).
//
// A product is held against a double-precision reference of the operands it
// reads: in fp32 the inputs as given, in bf16 the inputs rounded to bfloat16
// (core/precision.h).  The backward formulas are checked against finite
// differences in fp32 (ops_test.cpp); a bf16 product rounds its input, so its
// forward is flat between bf16 neighbours and finite differences say nothing
// there — its backward is held against the reference of its rounded operands.
// bf16 cases skip, with the reason, on a CPU without bf16 matrix instructions.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "ops/context.h"
#include "core/error.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/dnnl_matmul.h"
#include "testing/check.h"

namespace attnres {
namespace {

using testing::dev;
using testing::DeviceVec;
using testing::randn;

// The operand values a product of precision p reads.
std::vector<float> as_read(std::vector<float> x, Precision p) {
  if (p == Precision::kBF16)
    for (float& v : x) v = round_bf16(v);
  return x;
}
bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
std::vector<bf16> to_bf16_host(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16(x[i]);
  return out;
}

// got[M,N] against Σ_k a(m,k)·b(k,n) in double, |got − ref| ≤ rtol · Σ_k |a·b| (+ base).
template <class A, class B>
::testing::AssertionResult product_matches(const std::vector<float>& got, int64_t M, int64_t N, int64_t K, A a, B b,
                                           double rtol, const std::vector<float>* base = nullptr) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = base ? (*base)[m * N + n] : 0.0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double t = static_cast<double>(a(m, k)) * b(k, n);
        ref += t;
        mag += std::fabs(t);
      }
      const double g = got[m * N + n];
      if (!(std::fabs(g - ref) <= rtol * mag + 1e-30))
        return ::testing::AssertionFailure() << "[" << m << ", " << n << "] of " << M << " x " << N << " x " << K
                                             << ": " << g << " vs " << ref << " (Σ|terms| " << mag << ", rtol "
                                             << rtol << ")";
    }
  return ::testing::AssertionSuccess();
}

class Products : public testing::OnBackendWith<Precision> {
 protected:
  void SetUp() override {
    if (const std::string why = ops.unsupported(precision()); !why.empty()) GTEST_SKIP() << why;
  }
  static Precision precision() { return shape(); }
  static testing::ProductTolerance tol() { return testing::product_tolerance(backend(), precision()); }
  // The weight as a product of this precision is handed it, in backend memory.
  struct DevWeight {
    DeviceVec<float> f32;
    DeviceVec<bf16> b16;
    Weight view() { return b16.size() ? Weight(b16.data()) : Weight(f32.data()); }
  };
  DevWeight weight(const std::vector<float>& w) {
    if (precision() == Precision::kBF16) return {DeviceVec<float>(ops, 0), dev(ops, to_bf16_host(w))};
    return {dev(ops, w), DeviceVec<bf16>(ops, 0)};
  }
};

// out = x·Wᵀ for few rows (the streaming kernel, N ≤ 16) and many (tiles;
// N = 600 makes several row tiles), odd and even I, and a partial last tile.
TEST_P(Products, MatmulForwardMatchesReference) {
  const Precision p = precision();
  for (int64_t I : {37, 70, 128}) {
    const int64_t O = 131;
    const auto w = randn(O * I, 42);
    const auto wr = as_read(w, p);
    DevWeight W = weight(w);
    ctx.reserve(ops.matmul_workspace(600, I, O, p));
    for (int64_t N : {1, 5, 16, 17, 70, 600}) {
      const auto x = randn(N * I, 43 + N);
      const auto xr = as_read(x, p);
      auto x_d = dev(ops, x);
      DeviceVec<float> out(ops, N * O);
      ops.matmul_forward(out.data(), x_d.data(), W.view(), N, I, O);
      EXPECT_TRUE(product_matches(
          out.host(), N, O, I, [&](int64_t n, int64_t i) { return xr[n * I + i]; },
          [&](int64_t i, int64_t o) { return wr[o * I + i]; }, tol().sums))
          << "I=" << I << " N=" << N;
    }
  }
}

// dinp = dout·W (assigned or accumulated), dW += doutᵀ·x, with the operands
// as the precision reads them (bf16: dout, W and x rounded).
TEST_P(Products, MatmulBackwardMatchesReference) {
  const Precision p = precision();
  for (int64_t N : {6, 70, 300}) {
    const int64_t I = 45, O = 77;
    const auto x = randn(N * I, 3), w = randn(O * I, 4), G = randn(N * O, 5);
    const auto xr = as_read(x, p), wr = as_read(w, p), Gr = as_read(G, p);
    const auto dx0 = randn(N * I, 6), dw0 = randn(O * I, 7);
    DevWeight W = weight(w);
    auto x_d = dev(ops, x), G_d = dev(ops, G);
    auto dx = dev(ops, dx0), dw = dev(ops, dw0);
    ctx.reserve(ops.matmul_workspace(N, I, O, p));
    for (bool accumulate : {false, true}) {
      dx.upload(dx0);
      dw.upload(dw0);
      ops.matmul_backward(dx.data(), dw.data(), G_d.data(), x_d.data(), W.view(), N, I, O, accumulate);
      EXPECT_TRUE(product_matches(
          dx.host(), N, I, O, [&](int64_t n, int64_t o) { return Gr[n * O + o]; },
          [&](int64_t o, int64_t i) { return wr[o * I + i]; }, tol().sums, accumulate ? &dx0 : nullptr))
          << "dinp, N=" << N << " accumulate " << accumulate;
      EXPECT_TRUE(product_matches(
          dw.host(), O, I, N, [&](int64_t o, int64_t n) { return Gr[n * O + o]; },
          [&](int64_t n, int64_t i) { return xr[n * I + i]; }, tol().sums, &dw0))
          << "dW, N=" << N;
    }
    // Either output may be skipped.
    dx.upload(dx0);
    ops.matmul_backward(dx.data(), nullptr, G_d.data(), x_d.data(), W.view(), N, I, O);
    dw.upload(dw0);
    ops.matmul_backward(nullptr, dw.data(), G_d.data(), x_d.data(), W.view(), N, I, O);
    EXPECT_TRUE(product_matches(
        dw.host(), O, I, N, [&](int64_t o, int64_t n) { return Gr[n * O + o]; },
        [&](int64_t n, int64_t i) { return xr[n * I + i]; }, tol().sums, &dw0));
  }
}

// Outputs wider than the whole-row tiles (kWholeRows, matmul.cpp): bf16 runs
// their tiles through a dense block of the thread's, copied in where the
// product accumulates and out — the forward's out (O wide), and the
// backward's dinp and dW (I wide), accumulated onto what they held.
TEST_P(Products, OutputsWiderThanWholeRowTilesMatchTheReference) {
  const Precision p = precision();
  const int64_t N = 40;
  // The forward's out (N, O) with O = 4133, and the backward's dinp (N, I)
  // and dW (O, I) with I = 4100: wider than 4096, with ragged last tiles.
  for (auto [I, O] : {std::pair<int64_t, int64_t>{24, 4133}, {4100, 24}}) {
    const auto x = randn(N * I, 60), w = randn(O * I, 61), G = randn(N * O, 62);
    const auto xr = as_read(x, p), wr = as_read(w, p), Gr = as_read(G, p);
    const auto dx0 = randn(N * I, 63), dw0 = randn(O * I, 64);
    DevWeight W = weight(w);
    auto x_d = dev(ops, x), G_d = dev(ops, G), dx = dev(ops, dx0), dw = dev(ops, dw0);
    ctx.reserve(ops.matmul_workspace(N, I, O, p));
    if (O > I) {
      DeviceVec<float> out(ops, N * O);
      ops.matmul_forward(out.data(), x_d.data(), W.view(), N, I, O);
      EXPECT_TRUE(product_matches(
          out.host(), N, O, I, [&](int64_t n, int64_t i) { return xr[n * I + i]; },
          [&](int64_t i, int64_t o) { return wr[o * I + i]; }, tol().sums))
          << "out";
      continue;
    }
    ops.matmul_backward(dx.data(), dw.data(), G_d.data(), x_d.data(), W.view(), N, I, O, /*accumulate_dinp=*/true);
    EXPECT_TRUE(product_matches(
        dx.host(), N, I, O, [&](int64_t n, int64_t o) { return Gr[n * O + o]; },
        [&](int64_t o, int64_t i) { return wr[o * I + i]; }, tol().sums, &dx0))
        << "dinp";
    EXPECT_TRUE(product_matches(
        dw.host(), O, I, N, [&](int64_t o, int64_t n) { return Gr[n * O + o]; },
        [&](int64_t n, int64_t i) { return xr[n * I + i]; }, tol().sums, &dw0))
        << "dW";
  }
}

// Products cut into several tiles give the same bits on 1 and on 3 threads
// (the tiles depend on the shape alone; each is one single-threaded call).
TEST_P(Products, ThreadCountDoesNotChangeTheBits) {
  const Precision p = precision();
  const int64_t N = 600, I = 200, O = 300;
  const auto x = randn(N * I, 50), w = randn(O * I, 51), G = randn(N * O, 52);
  std::vector<std::vector<float>> results[2];
  for (int t = 0; t < 2; ++t) {
    Context c(t == 0 ? 1 : 3, backend().backend);
    Backend& o = c.ops();
    c.reserve(o.matmul_workspace(N, I, O, p));
    auto x_d = dev(o, x), G_d = dev(o, G);
    DeviceVec<float> w32 = dev(o, p == Precision::kF32 ? w : std::vector<float>());
    DeviceVec<bf16> w16 = dev(o, p == Precision::kBF16 ? to_bf16_host(w) : std::vector<bf16>());
    const Weight W = p == Precision::kBF16 ? Weight(w16.data()) : Weight(w32.data());
    DeviceVec<float> out(o, N * O), dx(o, N * I), dw(o, O * I);
    o.matmul_forward(out.data(), x_d.data(), W, N, I, O);
    o.matmul_backward(dx.data(), dw.data(), G_d.data(), x_d.data(), W, N, I, O);
    results[t] = {out.host(), dx.host(), dw.host()};
  }
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(results[0][k].size(), results[1][k].size());
    EXPECT_EQ(std::memcmp(results[0][k].data(), results[1][k].data(), results[0][k].size() * sizeof(float)), 0)
        << "output " << k << " (out, dinp, dW) differs between 1 and 3 threads";
  }
}

// Rows given in bf16 (as the norm and SwiGLU write them before a product)
// are the same product as the float32 rows they round: the same bits, for few
// rows (the streaming kernel) and many (tiles), forward and backward (dinp
// and dW; dout alone, inp alone, and both in bf16).  fp32 products refuse
// them with a clear error.
TEST_P(Products, Bf16RowsGiveTheBitsOfTheRowsTheyRound) {
  const Precision p = precision();
  const int64_t I = 70, O = 45;
  const auto w = randn(O * I, 60);
  DevWeight W = weight(w);
  for (int64_t N : {5, 300}) {
    const auto x = randn(N * I, 61), G = randn(N * O, 62);
    auto x_d = dev(ops, x), G_d = dev(ops, G);
    auto x16 = dev(ops, to_bf16_host(x)), G16 = dev(ops, to_bf16_host(G));
    ctx.reserve(ops.matmul_workspace(N, I, O, p));
    DeviceVec<float> out(ops, N * O), dx(ops, N * I), dw(ops, O * I);
    if (p == Precision::kF32) {
      EXPECT_THROW(ops.matmul_forward(out.data(), x16.data(), W.view(), N, I, O), InternalError);
      EXPECT_THROW(ops.matmul_backward(dx.data(), dw.data(), G16.data(), x_d.data(), W.view(), N, I, O), InternalError);
      continue;
    }
    ops.matmul_forward(out.data(), x_d.data(), W.view(), N, I, O);
    const auto want = out.host();
    ops.matmul_forward(out.data(), x16.data(), W.view(), N, I, O);
    EXPECT_TRUE(same_floats(out.host(), want)) << "forward, N=" << N;
    auto backward = [&](Rows dout, Rows inp) {
      dx.upload(std::vector<float>(N * I, 0.f));
      dw.upload(std::vector<float>(O * I, 0.f));
      ops.matmul_backward(dx.data(), dw.data(), dout, inp, W.view(), N, I, O);
      return std::make_pair(dx.host(), dw.host());
    };
    const auto ref = backward(G_d.data(), x_d.data());
    for (int which = 1; which < 4; ++which) {
      const auto got = backward(which & 1 ? Rows(G16.data()) : Rows(G_d.data()),
                                which & 2 ? Rows(x16.data()) : Rows(x_d.data()));
      EXPECT_TRUE(same_floats(got.first, ref.first)) << "dinp, N=" << N << ", bf16 dout " << (which & 1);
      EXPECT_TRUE(same_floats(got.second, ref.second)) << "dW, N=" << N << ", bf16 inp " << (which >> 1);
    }
  }
}

// The fused LM head in the precision: the loss of each row from logits of
// the operands as read, and dx, dW from dlogits = scale·(softmax − onehot)
// (bf16: dlogits rounded too; that rounding is of a value the op computed in
// float32, hence tol().rounding).  N = 300: more than one 256-row chunk;
// one ignored target.
TEST_P(Products, LmHeadMatchesReference) {
  const Precision p = precision();
  const int64_t N = 300, C = 29, V = 53;
  const auto x = randn(N * C, 26), w = randn(V * C, 27, 0.5);
  const auto xr = as_read(x, p), wr = as_read(w, p);
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[i] = static_cast<int32_t>((i * 7) % V);
  tg[5] = -1;
  const float scale = 0.37f;
  ctx.reserve(ops.lm_head_workspace(C, V, p));
  DevWeight W = weight(w);
  auto x_d = dev(ops, x);
  auto tg_d = dev(ops, tg);
  const auto dW0 = randn(V * C, 28);
  auto dW = dev(ops, dW0);
  DeviceVec<float> dx(ops, N * C), losses_d(ops, N);
  const double sum =
      ops.lm_head_loss(dx.data(), dW.data(), x_d.data(), W.view(), tg_d.data(), N, C, V, scale, losses_d.data());
  const auto losses = losses_d.host();
  // The reference: logits in double, losses, dlogits as the op rounds them.
  std::vector<float> dl(static_cast<size_t>(N * V), 0.0f);
  double ref = 0;
  for (int64_t i = 0; i < N; ++i) {
    std::vector<double> z(V, 0.0);
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t c = 0; c < C; ++c) z[v] += static_cast<double>(xr[i * C + c]) * wr[v * C + c];
      mx = std::max(mx, z[v]);
    }
    for (double e : z) s += std::exp(e - mx);
    if (tg[i] < 0) continue;
    const double lse = mx + std::log(s), li = lse - z[tg[i]];
    // Logits are float32 sums of C = 29 products: even the worst order's error
    // (30·2⁻²⁴·Σ|terms| ≈ 2e-5 a logit) keeps the loss under 1e-4 on any CPU.
    EXPECT_NEAR(losses[i], li, 1e-4) << "row " << i;
    ref += li;
    for (int64_t v = 0; v < V; ++v) dl[i * V + v] = static_cast<float>(scale * (std::exp(z[v] - lse) - (v == tg[i])));
  }
  // The rows' float32 errors are independent: their sum grows as √N, ~2e-5 here.
  EXPECT_NEAR(sum, ref, 1e-6 * std::fabs(ref) + 1e-4);
  EXPECT_EQ(losses[5], 0.f);
  const auto dlr = as_read(dl, p);
  const double rtol = tol().sums + tol().rounding;
  EXPECT_TRUE(product_matches(
      dx.host(), N, C, V, [&](int64_t n, int64_t v) { return dlr[n * V + v]; },
      [&](int64_t v, int64_t c) { return wr[v * C + c]; }, rtol))
      << "dx";
  EXPECT_TRUE(product_matches(
      dW.host(), V, C, N, [&](int64_t v, int64_t n) { return dlr[n * V + v]; },
      [&](int64_t n, int64_t c) { return xr[n * C + c]; }, rtol, &dW0))
      << "dW";
  // Inference: few rows, no gradients.
  for (int64_t n : {1, 5}) {
    DeviceVec<float> l(ops, n);
    const double s = ops.lm_head_loss(nullptr, nullptr, x_d.data(), W.view(), tg_d.data(), n, C, V, 1.0f, l.data());
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += losses[i];
    // Two kernels of one run on the same operands: float32 order only (~1e-6).
    EXPECT_NEAR(s, want, 1e-5 * std::fabs(want)) << "rows " << n;
  }
}

ATTNRES_ON_BACKENDS_WITH(Products, Precision, ::testing::Values(Precision::kF32, Precision::kBF16),
                         [](Precision p) { return precision_name(p); });

// ---- float32 products through either library (cpu_backend.h, Fp32Gemm) --------

// OpenBLAS's SGEMM and oneDNN's float32 matmul run the same tiles, each one
// call on one thread: each gives the product of the float32 inputs within the
// fp32 tolerance, and the same bits on 1 and 3 threads.  (The Products tests
// above run the default, OpenBLAS.)  On the plain CPU
// configurations: the guarded one wraps a CpuBackend of its own.
class ProductsByLibrary : public testing::OnBackend {
 protected:
  void SetUp() override {
    cpu = dynamic_cast<CpuBackend*>(&ops);
    if (!cpu) GTEST_SKIP() << "the guarded backend's kernels are a CpuBackend of its own";
  }
  void TearDown() override {
    if (cpu) cpu->set_fp32_gemm(choose_fp32_gemm());
  }
  static std::vector<Fp32Gemm> libraries() {
    if (!onednn::available()) return {Fp32Gemm::kOpenBlas};
    return {Fp32Gemm::kOpenBlas, Fp32Gemm::kOneDnn};
  }
  CpuBackend* cpu = nullptr;
};

TEST_P(ProductsByLibrary, ForwardAndBackwardMatchTheReference) {
  const double rtol = testing::product_tolerance(GetParam(), Precision::kF32).sums;
  for (Fp32Gemm lib : libraries()) {
    cpu->set_fp32_gemm(lib);
    for (int64_t N : {17, 70, 600}) {
      const int64_t I = 70, O = 131;
      const auto x = randn(N * I, 60 + N), w = randn(O * I, 61), G = randn(N * O, 62);
      const auto dx0 = randn(N * I, 63), dw0 = randn(O * I, 64);
      auto x_d = dev(ops, x), w_d = dev(ops, w), G_d = dev(ops, G), dx = dev(ops, dx0), dw = dev(ops, dw0);
      DeviceVec<float> out(ops, N * O);
      ops.matmul_forward(out.data(), x_d.data(), Weight(w_d.data()), N, I, O);
      EXPECT_TRUE(product_matches(
          out.host(), N, O, I, [&](int64_t n, int64_t i) { return x[n * I + i]; },
          [&](int64_t i, int64_t o) { return w[o * I + i]; }, rtol))
          << fp32_gemm_name(lib) << " forward, N=" << N;
      ops.matmul_backward(dx.data(), dw.data(), G_d.data(), x_d.data(), Weight(w_d.data()), N, I, O,
                          /*accumulate_dinp=*/true);
      EXPECT_TRUE(product_matches(
          dx.host(), N, I, O, [&](int64_t n, int64_t o) { return G[n * O + o]; },
          [&](int64_t o, int64_t i) { return w[o * I + i]; }, rtol, &dx0))
          << fp32_gemm_name(lib) << " dinp (accumulated), N=" << N;
      EXPECT_TRUE(product_matches(
          dw.host(), O, I, N, [&](int64_t o, int64_t n) { return G[n * O + o]; },
          [&](int64_t n, int64_t i) { return x[n * I + i]; }, rtol, &dw0))
          << fp32_gemm_name(lib) << " dW, N=" << N;
    }
  }
}

TEST_P(ProductsByLibrary, ThreadCountDoesNotChangeTheBits) {
  const int64_t N = 600, I = 200, O = 300;
  const auto x = randn(N * I, 70), w = randn(O * I, 71), G = randn(N * O, 72);
  for (Fp32Gemm lib : libraries()) {
    std::vector<float> results[2][3];
    for (int t = 0; t < 2; ++t) {
      Context c(t == 0 ? 1 : 3, "cpu", GetParam().level);
      dynamic_cast<CpuBackend&>(c.ops()).set_fp32_gemm(lib);
      Backend& o = c.ops();
      auto x_d = dev(o, x), w_d = dev(o, w), G_d = dev(o, G);
      DeviceVec<float> out(o, N * O), dx(o, N * I), dw(o, O * I);
      o.matmul_forward(out.data(), x_d.data(), Weight(w_d.data()), N, I, O);
      o.matmul_backward(dx.data(), dw.data(), G_d.data(), x_d.data(), Weight(w_d.data()), N, I, O);
      results[t][0] = out.host();
      results[t][1] = dx.host();
      results[t][2] = dw.host();
    }
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(results[0][k], results[1][k])
          << fp32_gemm_name(lib) << ": output " << k << " (out, dinp, dW) differs between 1 and 3 threads";
  }
}

ATTNRES_ON_BACKENDS(ProductsByLibrary);

// oneDNN's float32 GEMM kernels point rsp into the heap while they run
// (dnnl_matmul.cpp): a signal handled on that thread would write its frame
// over the heap.  Signals sent to the thread running products, thousands of
// them, with a handler installed, change no result and corrupt nothing (the
// corruption aborted the process in malloc, or changed results, before the
// products blocked signals).
std::atomic<int64_t> g_signals_handled{0};
extern "C" void count_signal(int) { g_signals_handled.fetch_add(1, std::memory_order_relaxed); }

TEST(OneDnnProducts, SignalsDuringAProductCorruptNothing) {
  if (!onednn::available()) GTEST_SKIP() << "built without oneDNN";
  struct sigaction sa {}, old {};
  sa.sa_handler = count_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ASSERT_EQ(::sigaction(SIGUSR2, &sa, &old), 0);
  const int64_t N = 96, I = 256, O = 384;
  const auto x = randn(N * I, 80), w = randn(O * I, 81);
  Context c(1);
  dynamic_cast<CpuBackend&>(c.ops()).set_fp32_gemm(Fp32Gemm::kOneDnn);
  Backend& o = c.ops();
  auto x_d = dev(o, x), w_d = dev(o, w);
  DeviceVec<float> out(o, N * O);
  o.matmul_forward(out.data(), x_d.data(), Weight(w_d.data()), N, I, O);
  const std::vector<float> want = out.host();
  const pthread_t self = pthread_self();
  std::atomic<bool> done{false};
  std::thread sender([&] {
    while (!done.load()) {
      pthread_kill(self, SIGUSR2);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  int64_t differ = 0;
  for (int rep = 0; rep < 3000; ++rep) {
    o.matmul_forward(out.data(), x_d.data(), Weight(w_d.data()), N, I, O);
    std::vector<float> got = out.host();  // a heap allocation and release each time
    differ += got != want;
  }
  done = true;
  sender.join();
  ::sigaction(SIGUSR2, &old, nullptr);
  EXPECT_EQ(differ, 0);
  EXPECT_GT(g_signals_handled.load(), 1000);  // the signals did arrive
}

TEST(Fp32Gemm, ABadLibraryNameIsAClearError) {
  ::setenv("ATTNRES_FP32_GEMM", "mkl", 1);
  try {
    choose_fp32_gemm();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "ATTNRES_FP32_GEMM 'mkl' is not a library (openblas, onednn)");
  }
  EXPECT_THROW(Context(1), Error);
  ::setenv("ATTNRES_FP32_GEMM", "openblas", 1);
  EXPECT_EQ(choose_fp32_gemm(), Fp32Gemm::kOpenBlas);
  ::unsetenv("ATTNRES_FP32_GEMM");  // unset: oneDNN where built with it (cpu_backend.h says why)
  EXPECT_EQ(choose_fp32_gemm(), onednn::available() ? Fp32Gemm::kOneDnn : Fp32Gemm::kOpenBlas);
}

// ---- rounding, and the copies the optimizer writes ---------------------------------

class Bf16Rounding : public testing::OnBackend {};

// to_bf16 rounds to nearest, ties to even, as torch's .to(torch.bfloat16):
// hand-made bit patterns, halfway cases both ways, carries into the exponent,
// infinities, NaN (stays a quiet NaN), subnormals (kept, not flushed), and
// lengths around the kernel's pieces.
TEST_P(Bf16Rounding, NearestEvenAsTorch) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {
      {0x3F800000u, 0x3F80},  // 1.0
      {0x3F808000u, 0x3F80},  // 1 + 2⁻⁸: halfway, to even (down)
      {0x3F818000u, 0x3F82},  // halfway above an odd mantissa: up
      {0x3F808001u, 0x3F81},  // just above halfway: up
      {0x3F807FFFu, 0x3F80},  // just below: down
      {0xBF808001u, 0xBF81},  // negative
      {0x3FFF8000u, 0x4000},  // the carry runs into the exponent
      {0x7F7FFFFFu, 0x7F80},  // the largest float rounds to infinity
      {0x7F800000u, 0x7F80},  // +inf
      {0xFF800000u, 0xFF80},  // −inf
      {0x7FC00001u, 0x7FC0},  // NaN stays NaN
      {0x7F800001u, 0x7FC0},  // a signalling NaN becomes quiet
      {0x00018000u, 0x0002},  // a subnormal, halfway above an odd one: kept, rounded up
      {0x80000001u, 0x8000},  // the smallest negative subnormal: −0
  };
  std::vector<float> x;
  for (auto [u, want] : cases) x.push_back(bits(u));
  for (int64_t n : {int64_t{14}, int64_t{65536 + 14}}) {  // around the pieces of 2¹⁶
    std::vector<float> in(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) in[i] = x[i % x.size()];
    auto in_d = dev(ops, in);
    DeviceVec<bf16> out(ops, static_cast<size_t>(n));
    ops.to_bf16(out.data(), in_d.data(), n);
    const auto got = out.host();
    for (int64_t i = 0; i < n; ++i) {
      const auto [u, want] = cases[i % cases.size()];
      ASSERT_EQ(got[i], want) << std::hex << "0x" << u << " at " << std::dec << i << " of " << n;
    }
  }
}

// The AdamW update with a bf16 copy: the same float32 parameters and moments
// as without, and the copy holds them rounded.
TEST_P(Bf16Rounding, AdamWWritesTheRoundedCopy) {
  for (int64_t n : {37, 65536 + 37}) {
    const auto p = randn(n, 80), g = randn(n, 81), m = randn(n, 82, 0.1);
    auto v = randn(n, 83, 0.1);
    for (auto& e : v) e = e * e;
    const AdamWUpdate u{0.9f, 0.95f, 1e-8f, 0.9997f, 3e-3f, 1.2f};
    auto p1 = dev(ops, p), m1 = dev(ops, m), v1 = dev(ops, v), g_d = dev(ops, g);
    auto p2 = dev(ops, p), m2 = dev(ops, m), v2 = dev(ops, v);
    DeviceVec<bf16> p16(ops, static_cast<size_t>(n));
    ops.adamw_update(p1.data(), g_d.data(), m1.data(), v1.data(), n, u);
    ops.adamw_update(p2.data(), g_d.data(), m2.data(), v2.data(), n, u, p16.data());
    const auto a = p1.host(), b = p2.host();
    const auto c = p16.host();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
    EXPECT_EQ(m1.host(), m2.host());
    EXPECT_EQ(v1.host(), v2.host());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(c[i], float_to_bf16(b[i])) << i;
  }
}

ATTNRES_ON_BACKENDS(Bf16Rounding);

}  // namespace
}  // namespace attnres
