// golden_test.cpp — the engine against the independent PyTorch oracle.
//
// For every case in tests/golden/ (written by tests/oracle/make_golden.py in
// float64): logits, loss and every parameter gradient of one micro-batch, then
// ten AdamW steps with accumulation and clipping (losses, learning rates,
// gradient norms, and the loss after the last update).  Each comparison is
// |a − b| ≤ atol + rtol·|b| with the tolerances stated per tensor below.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/file_util.h"
#include "io/safetensors.h"
#include "model/model.h"
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

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesOracle) {
  const std::string dir = kGolden + GetParam();
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

  Model model(testing::test_context(), c, B, T);
  model.load(dir + "/model.safetensors");
  std::vector<int32_t> in(B * T), tg(B * T);
  micro(0, 0, in.data(), tg.data());

  // Logits and loss of micro-batch (0, 0).
  std::vector<float> logits(static_cast<size_t>(B * T * c.V));
  model.forward_logits(in.data(), logits.data());
  const auto want_logits = gold.read_float("logits");
  EXPECT_TRUE(close("logits", logits.data(), want_logits.data(), B * T * c.V, 1e-4, 0));
  model.zero_grad();
  const float loss = static_cast<float>(model.forward_backward(in.data(), tg.data(), true));
  const float want_loss = gold.read_float("loss")[0];
  EXPECT_TRUE(close("loss", &loss, &want_loss, 1, 1e-5, 0));

  // Every parameter gradient.  Scalar gates sum B·T·d terms with cancellation:
  // compared with an absolute term only.
  for (const auto& s : model.layout().specs()) {
    const auto want = gold.read_float("grad." + s.name);
    ASSERT_EQ(static_cast<int64_t>(want.size()), s.numel) << s.name;
    const double atol = s.shape.empty() ? 2e-5 : 1e-5;
    EXPECT_TRUE(close("grad." + s.name, model.grads() + s.offset, want.data(), s.numel, atol, 1e-3));
  }

  // Ten AdamW steps from the initial weights.
  model.load(dir + "/model.safetensors");
  AdamWConfig ac;
  ac.beta1 = train["beta1"];
  ac.beta2 = train["beta2"];
  ac.eps = train["eps"];
  ac.weight_decay = train["weight_decay"];
  AdamW adamw(testing::test_context().ops(), model.layout(), ac);
  // The decayed set is part of the contract: check it against the oracle's list.
  std::vector<std::string> decayed;
  for (const auto& s : model.layout().specs())
    if (s.decay) decayed.push_back(s.name);
  auto want_decayed = train["decayed_params"].get<std::vector<std::string>>();
  std::sort(decayed.begin(), decayed.end());
  std::sort(want_decayed.begin(), want_decayed.end());
  EXPECT_EQ(decayed, want_decayed);

  const auto want_losses = gold.read_float("train_losses");
  const auto want_lrs = gold.read_float("train_lrs");
  const auto want_norms = gold.read_float("train_grad_norms");
  for (int64_t s = 0; s < steps; ++s) {
    const float lr = static_cast<float>(lr_at(s, train["warmup"], train["total_steps"], train["lr_max"], train["lr_min"]));
    EXPECT_TRUE(close("train_lrs", &lr, &want_lrs[s], 1, 0, 1e-6)) << "step " << s;
    int64_t k = 0;
    const StepStats st = train_step(
        model, adamw, [&](int32_t* i, int32_t* t) { micro(s, k++, i, t); }, accum, lr, s + 1, train["clip"]);
    const float l = static_cast<float>(st.loss), nrm = static_cast<float>(st.grad_norm);
    EXPECT_TRUE(close("train_losses", &l, &want_losses[s], 1, 5e-4, 0)) << "step " << s;
    EXPECT_TRUE(close("train_grad_norms", &nrm, &want_norms[s], 1, 1e-5, 1e-3)) << "step " << s;
  }
  double final_loss = 0;
  for (int64_t k = 0; k < accum; ++k) {
    micro(0, k, in.data(), tg.data());
    final_loss += model.forward_backward(in.data(), tg.data(), false) / static_cast<double>(accum);
  }
  const float fl = static_cast<float>(final_loss), want_fl = gold.read_float("final_loss")[0];
  EXPECT_TRUE(close("final_loss", &fl, &want_fl, 1, 5e-4, 0));
}

INSTANTIATE_TEST_SUITE_P(Oracle, Golden, ::testing::ValuesIn(testing::golden_cases()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace attnres
