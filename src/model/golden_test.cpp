// golden_test.cpp — the engine against the independent PyTorch oracle.
//
// For every case in tests/golden/ (written by tests/oracle/make_golden.py in
// float64) and each precision: logits, loss and every parameter gradient of
// one micro-batch, then ten AdamW steps with accumulation and clipping
// (losses, learning rates, gradient norms, and the loss after the last
// update).  fp32 is held against golden.safetensors; bf16 against
// golden_bf16.safetensors (the oracle with the products' operands rounded as
// the engine rounds them) and, at bf16's own size, against golden.safetensors.
// Each comparison is |a − b| ≤ atol + rtol·|b| with the tolerances below.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "core/file_util.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "testing/check.h"
#include "testing/context.h"
#include "testing/golden.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace attnres {
namespace {

const std::string& kGolden = testing::kGoldenDir;

// Largest violation of |a − b| ≤ atol + rtol·|b|, and where.
::testing::AssertionResult close(const std::string& what, const float* a, const float* b, int64_t n, double atol,
                                 double rtol) {
  double worst = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(a[i]) - b[i]) - (atol + rtol * std::fabs(b[i]));
    if (!(err <= worst)) worst = err, at = i;  // NaN counts as a violation
  }
  if (at < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << "[" << at << "]: engine " << a[at] << " vs oracle " << b[at]
                                       << " (atol " << atol << ", rtol " << rtol << ")";
}

// What the engine computes for a case: logits and loss of micro-batch (0, 0),
// every parameter gradient, and ten AdamW steps (losses, learning rates,
// norms, the loss after the last update).
struct Outputs {
  std::vector<float> logits;
  float loss = 0;
  float route_entropy = 0;  // the entropy term's E, where the case trains with it (train.json entropy_lambda)
  std::vector<float> grads;  // the gradient arena
  std::vector<float> train_losses, train_lrs, train_norms;
  float final_loss = 0;
};

// Tolerances of one comparison (engine in `precision` against an oracle of
// that precision, or bf16 against the float64 one), |a − b| ≤ atol + rtol·|b|;
// the gradient norms of the first `norm_steps` steps of the trajectory.
struct GoldenTolerance {
  double logits, loss, grad_atol, grad_rtol, gate_atol, train_loss, norm_atol, norm_rtol, final_loss;
  int64_t norm_steps;
};
// fp32 against the float64 oracle: float32's rounding, accumulated through the
// model (tests/oracle/README.md).  A CPU's kernels change only the order of
// float32 sums; PyTorch's float32 run, another order, is ≥ 10× inside each.
constexpr GoldenTolerance kFp32{1e-4, 1e-5, 1e-5, 1e-3, 2e-5, 5e-4, 1e-5, 1e-3, 5e-4, 10};
// bf16 against the oracle's bf16 mode (the same operands rounded).  What is
// left is float32 against float64 arithmetic before each rounding, and that
// moves a few rounded values to the other bf16 neighbour ("flips": about one
// per forward here, each a change of 2⁻⁸ in one element, which these random
// six-layer models amplify to up to ~1e-2 in a logit).  Which values flip
// depends on the build (the sanitizer build's -O1 rounds its float32 sums
// differently), so the bounds hold for any: measured worst over the cases
// cases and both builds (2026-12-01, printed by this test) logits 1.1e-2,
// loss 4.9e-4, gradients 6.4e-3, trajectory losses 5.2e-2, final loss
// 2.5e-2; the bounds are 2–3× those.  The products' kernel decides the flips
// too: oneDNN's AMX kernels (an Intel Xeon with AMX-BF16, 2026-12-03) sum in
// another order than its AVX512-BF16 ones, and there one flip in block_alpha
// grows to 3.5e-2 in a logit (every other case ≤ 5.7e-3; loss 1.0e-3,
// gradients 3.2e-3, trajectory losses 3.1e-2): the logits' bound is 2× that.  Ten steps of routed training on these
// random models amplify the flips (full_alpha's gradient norms part by 61 %
// by step 10; fp32 itself is 6e-4 from the oracle there): the norms are
// compared over the first three steps (at most 2 % apart measured).  Each
// product is held to 1e-5 by the per-op tests (ops/products_test.cpp), and
// that the right operands are rounded, over all cases, by
// GoldenBf16.CloserToTheOraclesBf16ThanBf16IsToFloat64 below.
// Since attention's products became bf16 products (2026-12-04: their
// operands Q, K, V, P, dY and dS are rounded too, in the oracle as in the
// engine) full_alpha's chaotic ten steps end 6.7e-2 to 8.4e-2 from the
// oracle's bf16 in the final loss over the five configurations (its
// trajectory losses 5.4e-2 to 6.3e-2, every other case's final loss ≤ 4e-3;
// the oracle's own bf16 run ends 7.5e-2 from its float64 one there, where the
// engine's ends 6.3e-3 from it): the final loss's bound is 2× that worst,
// 0.17 (it was 8e-2), the only bound that moved.
// All of these are measured, not derived: both CPUs passed them at bdd43a0
// (attention on VDPBF16PS there); AMX tiles in attention move which values
// flip, so the Intel Xeon's figures are to be measured again.
constexpr GoldenTolerance kBf16{7e-2, 2e-3, 2e-2, 0, 2e-2, 0.15, 1e-2, 0.1, 0.17, 3};
// bf16 against the float64 oracle: the size of bf16 itself.  The oracle's
// bf16 mode differs from its float64 run by up to 5.6e-2 in the logits (of
// |logit| ≤ 2.9), 2.3e-3 in the loss, 3.4e-2 in a gradient (of |g| ≤ 0.7),
// 8.8e-2 in a trajectory loss and 2.2e-2 in the final loss (make_golden.py
// prints these); the engine's bf16 adds its flips to those.  The gradient
// norm of the first step only: the trajectories part after it.
// With bf16 attention those five are 7.4e-2, 2.4e-3, 2.4e-2, 0.107, 7.5e-2:
// wherever kBf16 holds, adding them gives the logits, loss and gradient bounds
// here on any CPU; not the trajectory and final ones (0.257 > 0.25, 0.245 >
// 0.1), which rest on measurement alone (both CPUs passed at bdd43a0).
// So the trajectory and final losses' bounds are now derived the same way:
// kBf16's (0.15, 0.17) plus the oracle's own (0.107, 7.5e-2), 0.26 and 0.25
// (they were 0.25 and 0.1, measured): by the triangle inequality they hold
// wherever kBf16 does, on any CPU.
constexpr GoldenTolerance kBf16VsF64{0.15, 1e-2, 0.1, 0, 0.1, 0.26, 5e-2, 0.1, 0.25, 1};

// Tolerances belong to a (backend, precision) pair: each backend's rows are
// measured on that backend (the ones above: the CPU backend's).  A backend
// without rows fails the test naming itself, rather than borrowing another's.
struct BackendTolerances {
  const char* backend;
  GoldenTolerance fp32, bf16, bf16_vs_f64;
};
// cpu-guarded runs the CPU's kernels (its memory locked outside the interface): the CPU's rows.
constexpr BackendTolerances kTolerances[] = {{"cpu", kFp32, kBf16, kBf16VsF64},
                                             {"cpu-guarded", kFp32, kBf16, kBf16VsF64}};
const BackendTolerances* tolerances_of(const std::string& backend) {
  for (const BackendTolerances& t : kTolerances)
    if (testing::device_base(backend) == t.backend) return &t;
  return nullptr;
}

// The largest |a − b| over n values.
double max_diff(const float* a, const float* b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; ++i) w = std::max(w, std::fabs(static_cast<double>(a[i]) - b[i]));
  return w;
}

// Compares `out` with the golden file at `path` (tokens from golden.safetensors).
void expect_matches(const std::string& what, const ParamLayout& layout, const Outputs& out, const std::string& path,
                    const GoldenTolerance& tol) {
  SCOPED_TRACE(what + ": " + path);
  const SafeTensorsReader gold(path);
  {  // the measured differences, for the record (the tolerances above)
    double g = 0, n = 0;
    for (const auto& s : layout.specs()) {
      const auto want = gold.read_float("grad." + s.name);
      g = std::max(g, max_diff(out.grads.data() + s.offset, want.data(), want.size()));
    }
    const auto norms = gold.read_float("train_grad_norms");
    for (size_t i = 0; i < norms.size(); ++i) n = std::max(n, std::fabs(out.train_norms[i] / norms[i] - 1.0));
    const auto logits = gold.read_float("logits"), losses = gold.read_float("train_losses");
    std::printf("%-28s %-22s logits %.1e  loss %.1e  grad %.1e  train loss %.1e  norm %.1e (rel)  final %.1e\n",
                what.c_str(), std::filesystem::path(path).parent_path().filename().c_str(),
                max_diff(out.logits.data(), logits.data(), logits.size()),
                std::fabs(out.loss - gold.read_float("loss")[0]), g,
                max_diff(out.train_losses.data(), losses.data(), losses.size()), n,
                std::fabs(out.final_loss - gold.read_float("final_loss")[0]));
  }
  const auto want_logits = gold.read_float("logits");
  ASSERT_EQ(want_logits.size(), out.logits.size());
  EXPECT_TRUE(close("logits", out.logits.data(), want_logits.data(), static_cast<int64_t>(out.logits.size()),
                    tol.logits, 0));
  const float want_loss = gold.read_float("loss")[0];
  EXPECT_TRUE(close("loss", &out.loss, &want_loss, 1, tol.loss, 0));
  if (gold.has("route_entropy")) {  // E sums softmaxes like the loss: the loss's bound
    const float want_e = gold.read_float("route_entropy")[0];
    EXPECT_TRUE(close("route_entropy", &out.route_entropy, &want_e, 1, tol.loss, 0));
  }
  // Every parameter gradient.  Scalar gates sum B·T·d terms with cancellation:
  // compared with an absolute term only.
  for (const auto& s : layout.specs()) {
    const auto want = gold.read_float("grad." + s.name);
    ASSERT_EQ(static_cast<int64_t>(want.size()), s.numel) << s.name;
    const double atol = s.shape.empty() ? tol.gate_atol : tol.grad_atol;
    EXPECT_TRUE(close("grad." + s.name, out.grads.data() + s.offset, want.data(), s.numel, atol, tol.grad_rtol));
  }
  const auto want_losses = gold.read_float("train_losses");
  const auto want_lrs = gold.read_float("train_lrs");
  const auto want_norms = gold.read_float("train_grad_norms");
  ASSERT_EQ(want_losses.size(), out.train_losses.size());
  for (size_t s = 0; s < want_losses.size(); ++s) {
    EXPECT_TRUE(close("train_lrs", &out.train_lrs[s], &want_lrs[s], 1, 0, 1e-6)) << "step " << s;
    EXPECT_TRUE(close("train_losses", &out.train_losses[s], &want_losses[s], 1, tol.train_loss, 0)) << "step " << s;
    if (static_cast<int64_t>(s) < tol.norm_steps) {
      EXPECT_TRUE(close("train_grad_norms", &out.train_norms[s], &want_norms[s], 1, tol.norm_atol, tol.norm_rtol))
          << "step " << s;
    }
  }
  const float want_fl = gold.read_float("final_loss")[0];
  EXPECT_TRUE(close("final_loss", &out.final_loss, &want_fl, 1, tol.final_loss, 0));
}

class Golden : public ::testing::TestWithParam<std::tuple<testing::BackendParam, std::string, Precision>> {};

TEST_P(Golden, MatchesOracle) {
  const auto [backend, name, precision] = GetParam();
  const BackendTolerances* tol = tolerances_of(backend.backend);
  ASSERT_TRUE(tol) << "backend " << backend.backend << " has no measured tolerances (kTolerances)";
  Context& ctx = testing::context_for(backend);
  if (const std::string why = ctx.ops().unsupported(precision); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = kGolden + name;
  const Config c = Config::load(dir + "/config.json");
  const auto train = nlohmann::json::parse(read_file(dir + "/train.json"));
  const SafeTensorsReader gold(dir + "/golden.safetensors");
  const auto tok_shape = gold.info("tokens").shape;  // [steps, accum, B, T+1]
  const int64_t steps = tok_shape[0], accum = tok_shape[1], B = tok_shape[2], T = tok_shape[3] - 1;
  const std::vector<int32_t> tokens = gold.read_i32("tokens");
  auto micro = [&](int64_t s, int64_t k, int32_t* in, int32_t* tg) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int32_t* row = tokens.data() + ((s * accum + k) * B + b) * (T + 1);
        in[b * T + t] = row[t];
        tg[b * T + t] = row[t + 1];
      }
  };

  ModelOptions mo{B, T};
  mo.precision = precision;
  mo.entropy_lambda = train.value("entropy_lambda", 0.0);  // the entropy term, in the cases that train with it
  Model model(ctx, c, mo);
  load_weights(model, dir + "/model.safetensors");
  std::vector<int32_t> in(B * T), tg(B * T);
  micro(0, 0, in.data(), tg.data());

  Outputs out;
  out.logits.resize(static_cast<size_t>(B * T * c.V));
  model.forward_logits(in.data(), out.logits.data());
  model.zero_grad();
  out.loss = static_cast<float>(model.forward_backward(in.data(), tg.data(), true));
  if (mo.entropy_lambda > 0) out.route_entropy = static_cast<float>(model.route_entropy());
  out.grads = testing::host(ctx.ops(), model.grads(), static_cast<size_t>(model.layout().total()));

  // Ten AdamW steps from the initial weights.
  load_weights(model, dir + "/model.safetensors");
  AdamWConfig ac;
  ac.beta1 = train["beta1"];
  ac.beta2 = train["beta2"];
  ac.eps = train["eps"];
  ac.weight_decay = train["weight_decay"];
  AdamW adamw(ctx.ops(), model.layout(), ac);
  // The decayed set is part of the contract: check it against the oracle's list.
  std::vector<std::string> decayed;
  for (const auto& s : model.layout().specs())
    if (s.decay()) decayed.push_back(s.name);
  auto want_decayed = train["decayed_params"].get<std::vector<std::string>>();
  std::sort(decayed.begin(), decayed.end());
  std::sort(want_decayed.begin(), want_decayed.end());
  EXPECT_EQ(decayed, want_decayed);
  for (int64_t s = 0; s < steps; ++s) {
    const double lr = lr_at(s, train["warmup"], train["total_steps"], train["lr_max"], train["lr_min"]);
    int64_t k = 0;
    const StepStats st = train_step(
        model, adamw, [&](int32_t* i, int32_t* t) { micro(s, k++, i, t); }, accum, lr, s + 1, train["clip"]);
    out.train_lrs.push_back(static_cast<float>(lr));
    out.train_losses.push_back(static_cast<float>(st.loss));
    out.train_norms.push_back(static_cast<float>(st.grad_norm));
  }
  double final_loss = 0;
  for (int64_t k = 0; k < accum; ++k) {
    micro(0, k, in.data(), tg.data());
    final_loss += model.forward_backward(in.data(), tg.data(), false) / static_cast<double>(accum);
  }
  out.final_loss = static_cast<float>(final_loss);

  if (precision == Precision::kF32) {
    expect_matches("fp32 vs the oracle", model.layout(), out, dir + "/golden.safetensors", tol->fp32);
    return;
  }
  expect_matches("bf16 vs the oracle's bf16", model.layout(), out, dir + "/golden_bf16.safetensors", tol->bf16);
  expect_matches("bf16 vs the float64 oracle", model.layout(), out, dir + "/golden.safetensors", tol->bf16_vs_f64);
}

// That the engine rounds the operands the oracle's bf16 mode rounds, told
// apart from flips: over all cases, the engine's distance from the oracle's
// bf16 against the distance of that bf16 from the float64 oracle (logits
// and gradients of the first micro-batch).  A flip is large in a few cases
// and absent in the rest; a product left in the wrong precision is large in
// every case.  Measured (2026-12-01, this build): logits median 0.000 (eight
// of the cases had no flip in the forward), largest 0.21; gradients
// median 0.19, largest 0.34; in the sanitizer build one case's logits 0.57.
// In the oracle, leaving the
// products' activations unrounded moves the logits by 0.57–0.85 of bf16's
// size in every case, an unrounded embedding lookup by 0.95–1.4, unrounded
// output gradients the weight gradients by 0.11–0.45; an engine with its
// embedding lookup in fp32 failed this test in all eleven cases it had then.
TEST(GoldenBf16, CloserToTheOraclesBf16ThanBf16IsToFloat64) {
  Context& ctx = testing::test_context();
  if (const std::string why = ctx.ops().unsupported(Precision::kBF16); !why.empty()) GTEST_SKIP() << why;
  std::vector<double> logit_ratio, grad_ratio;
  for (const std::string& name : testing::golden_cases()) {
    const std::string dir = kGolden + name;
    const Config c = Config::load(dir + "/config.json");
    const SafeTensorsReader g16(dir + "/golden_bf16.safetensors"), g64(dir + "/golden.safetensors");
    const auto tok_shape = g64.info("tokens").shape;
    const int64_t B = tok_shape[2], T = tok_shape[3] - 1;
    const std::vector<int32_t> tokens = g64.read_i32("tokens");
    std::vector<int32_t> in(B * T), tg(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        in[b * T + t] = tokens[b * (T + 1) + t];
        tg[b * T + t] = tokens[b * (T + 1) + t + 1];
      }
    ModelOptions mo{B, T};
    mo.precision = Precision::kBF16;
    mo.entropy_lambda = nlohmann::json::parse(read_file(dir + "/train.json")).value("entropy_lambda", 0.0);
    Model model(ctx, c, mo);
    load_weights(model, dir + "/model.safetensors");
    std::vector<float> logits(static_cast<size_t>(B * T * c.V));
    model.forward_logits(in.data(), logits.data());
    model.zero_grad();
    model.forward_backward(in.data(), tg.data(), true);
    const auto l16 = g16.read_float("logits"), l64 = g64.read_float("logits");
    logit_ratio.push_back(max_diff(logits.data(), l16.data(), l16.size()) / max_diff(l16.data(), l64.data(), l64.size()));
    double to16 = 0, size = 0;
    for (const auto& s : model.layout().specs()) {
      const auto a = g16.read_float("grad." + s.name), b = g64.read_float("grad." + s.name);
      to16 = std::max(to16, max_diff(model.grads() + s.offset, a.data(), a.size()));
      size = std::max(size, max_diff(a.data(), b.data(), a.size()));
    }
    grad_ratio.push_back(to16 / size);
    std::printf("%-22s engine-to-bf16-oracle / bf16-oracle-to-float64: logits %.3f, gradients %.3f\n", name.c_str(),
                logit_ratio.back(), grad_ratio.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The medians tell a right rounding from a wrong one, on any CPU.  A right
  // engine differs from the oracle's bf16 only by flips: operands whose
  // float32 value lies within float32's sum error (K·2⁻²⁴ relative, K terms)
  // of a bf16 rounding midpoint round to the other neighbour than the
  // oracle's float64 value does — a share of about K·2⁻²⁴/2⁻⁸ of them, each
  // one bf16 unit — so it sits a fraction of bf16's own distance from the
  // oracle's bf16, whichever order the CPU's kernels sum in (medians 0.06 and
  // 0.29 on the AMD EPYC, 2026-12-05; gradients 0.30 on the Intel Xeon with
  // oneDNN's AMX products, 2026-12-04).  An operand family rounded wrongly
  // moves every element of it, as far as bf16's rounding itself: with
  // attention's P truncated instead of rounded to nearest even (tried on the
  // AMD EPYC, 2026-12-05) the medians are 0.80 and 0.89, no case below 0.42.
  // The bound is between the two, at 0.5 for both.  (It was 0.25 and 0.3,
  // set from one CPU's measurement, which the Intel Xeon's 0.304 passed.)
  EXPECT_LE(median(logit_ratio), 0.5);
  EXPECT_LE(median(grad_ratio), 0.5);
  // No case farther from the oracle's bf16 than that is from float64 (measured
  // on an Intel Xeon, 2026-12-03: worst 0.21 with oneDNN's AVX512-BF16
  // kernels, 0.86 in the logits and 0.72 in the gradients with its AMX ones,
  // where one flip in block_alpha grows: see kBf16); a flip is one bf16 unit
  // of one operand, bf16's rounding is one of every operand: below 1 by
  // definition, however a flip grows along one case's path.
  EXPECT_LE(*std::max_element(logit_ratio.begin(), logit_ratio.end()), 1.0);
  EXPECT_LE(*std::max_element(grad_ratio.begin(), grad_ratio.end()), 1.0);
}

// Every case × precision on every backend configuration (testing/check.h).
INSTANTIATE_TEST_SUITE_P(Oracle, Golden,
                         ::testing::Combine(::testing::ValuesIn(testing::backend_params()),
                                            ::testing::ValuesIn(testing::golden_cases()),
                                            ::testing::Values(Precision::kF32, Precision::kBF16)),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_" + precision_name(std::get<2>(info.param)) + "_" +
                                  std::get<0>(info.param).name;
                         });

}  // namespace
}  // namespace attnres
