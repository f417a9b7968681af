// harness_test.cpp — what `attnres bench` measures, run small: the figures
// are there and say what ran (no timing is asserted: speed targets live in
// the benchmarks, docs/performance.md), and the counted work is the model's.
#include "bench/harness.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "model/params.h"
#include "testing/context.h"
#include "testing/configs.h"

namespace attnres {
namespace {


// The products of a step are 6 FLOPs per matrix parameter per token (forward,
// input gradient, weight gradient), the LM head counted as a V × d matrix.
TEST(BenchHarness, TheStepsProductsAreSixFlopsPerMatrixParameterPerToken) {
  const Config c = testing::small_config("baseline", {{"num_hidden_layers", 2}, {"vocab_size", 97}});
  const int64_t N = 256;  // a whole number of the LM head's row chunks
  double flops = 0;
  for (const GemmShape& s : step_gemm_shapes(c, N))
    flops += 2.0 * static_cast<double>(s.M * s.N * s.K * s.per_step);
  const int64_t per_layer = c.d * c.q_dim() + 2 * c.d * c.kv_dim() + c.q_dim() * c.d + 3 * c.d * c.F;
  EXPECT_EQ(flops, 6.0 * static_cast<double>(N) * static_cast<double>(c.L * per_layer + c.V * c.d));
}

TEST(BenchHarness, DecodingReadsEveryWeightOnceAndOnlyTheHeadOfAnUntiedEmbedding) {
  Context& ctx = testing::test_context();
  ModelOptions o{1, 4};
  o.training = false;
  const Model tied(ctx, testing::small_config("block", {{"num_hidden_layers", 2}, {"vocab_size", 97}}), o);
  EXPECT_EQ(weight_bytes_per_token(tied), 4.0 * static_cast<double>(tied.num_params()));
  const Config u = testing::small_config("block", {{"num_hidden_layers", 2}, {"vocab_size", 97}, {"tie_word_embeddings", false}});
  const Model untied(ctx, u, o);
  EXPECT_EQ(weight_bytes_per_token(untied), 4.0 * static_cast<double>(untied.num_params() - u.V * u.d));
}

// A training step at initialisation predicts uniformly: its loss is ln V
// (the routers' queries are zero, every weight small), so the harness trained
// the model it names.  A timed Context gives where the step went.
TEST(BenchHarness, TrainingStepsGiveTheirFiguresAndWithTimedOpsTheirProfile) {
  const std::unique_ptr<Context> timed = open_context({1, "cpu", Precision::kF32, /*time_ops=*/true});
  Context& ctx = *timed;
  const Config c = testing::small_config("delta", {{"num_hidden_layers", 2}, {"vocab_size", 97}});
  const nlohmann::json r = bench_training(ctx, c, 2, 16, Precision::kF32, 2, 1, 1e9);
  EXPECT_EQ(r["mode"], "delta");
  EXPECT_EQ(r["steps"], 2);
  EXPECT_GT(r["tok_per_s"].get<double>(), 0.0);
  EXPECT_GT(r["mfu"].get<double>(), 0.0);
  EXPECT_NEAR(r["loss"].get<double>(), std::log(static_cast<double>(c.V)), 0.2);
  for (const char* family : {"products", "attention", "routing", "norms_elementwise", "lm_head_loss", "optimizer", "outside_ops"})
    EXPECT_TRUE(r["profile_ms_per_step"].contains(family)) << family;
  EXPECT_GT(r["routing_traffic"]["bytes_per_token"].get<double>(), 0.0);
  EXPECT_TRUE(r["ops_ms_per_step"].contains("route_forward"));
}

TEST(BenchHarness, GenerationGivesPrefillAndDecodeRates) {
  Context& ctx = testing::test_context();
  GenerationBench g;
  g.prompt_len = 8;
  g.decode_prompt_len = 4;
  g.new_tokens = 3;
  g.decode_batch = 2;
  const nlohmann::json r = bench_generation(ctx, testing::small_config("block", {{"num_hidden_layers", 2}, {"vocab_size", 97}}), g);
  for (const char* key : {"prefill_tok_per_s", "decode_tok_per_s_b1", "decode_tok_per_s_b2", "train_forward_tok_per_s"})
    EXPECT_GT(r[key].get<double>(), 0.0) << key;
  EXPECT_GT(r["bytes_per_token"].get<double>(), 0.0);
}

}  // namespace
}  // namespace attnres
