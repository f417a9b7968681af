// model_test.cpp — the routing modes of Model beyond the golden files:
// which sources each router reads, the learnable_alpha identities, routing
// statistics, repeatability, and a short training run per mode on real text.
//
// The golden cases (golden_test.cpp) pin every mode to the PyTorch oracle on
// one micro-batch and ten AdamW steps; these tests pin the properties that
// hold for any weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "testing/check.h"
#include "testing/context.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace attnres {
namespace {

Config tiny(const std::string& mode, nlohmann::json extra = {}) {
  nlohmann::json j = {{"hidden_size", 48},        {"num_hidden_layers", 6}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"head_dim", 16},         {"intermediate_size", 80},
                      {"vocab_size", 97},         {"rope_theta", 10000.0},  {"tie_word_embeddings", false},
                      {"attnres_mode", mode},     {"attnres_num_blocks", 3}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return Config::from_json(j, "test");
}

// A bf16 inference model starts from the weights a float32 model of the same
// seed does — its vectors equal, its matrices those rounded — for every init
// option (the routing tensors draw from their own stream in both; the bf16
// path once drew them from the base stream, so attnres_query_init=normal
// gave other queries and shifted every later draw).
TEST(Init, Bf16AndFp32ModelsStartFromTheSameWeights) {
  if (const std::string why = testing::bf16_here(); !why.empty()) GTEST_SKIP() << why;
  Context& ctx = testing::test_context();
  for (const char* mode : {"block", "full", "delta", "delta_block"})
    for (const char* query : {"zero", "normal"})
      for (const char* gate : {"bias", "learnable_alpha", "sigmoid_scalar", "sigmoid_vector"}) {
        const Config c = tiny(mode, {{"attnres_query_init", query}, {"attnres_gate_type", gate},
                                     {"attnres_use_null_source", std::string(mode).rfind("delta", 0) == 0}});
        ModelOptions f32{.batch = 1, .seq_len = 8, .training = false, .precision = Precision::kF32};
        ModelOptions b16 = f32;
        b16.precision = Precision::kBF16;
        Model a(ctx, c, f32), b(ctx, c, b16);
        Rng ra(11), rb(11);
        a.init(ra);
        b.init(rb);
        EXPECT_EQ(ra.state(), rb.state()) << mode << " " << query << " " << gate << ": the base stream drew differently";
        const int64_t n = a.layout().total();
        std::vector<float> pa(static_cast<size_t>(n)), pb(pa.size());
        std::vector<bf16> qb(pa.size());
        ctx.ops().download(pa.data(), a.params(), pa.size() * sizeof(float));
        ctx.ops().download(pb.data(), b.params(), pb.size() * sizeof(float));
        ctx.ops().download(qb.data(), b.params_bf16(), qb.size() * sizeof(bf16));
        int bad = 0;
        for (const TensorSpec& s : a.layout().specs())
          for (int64_t i = s.offset; i < s.offset + s.numel; ++i)
            bad += s.matrix ? qb[i] != float_to_bf16(pa[i]) : pb[i] != pa[i];
        EXPECT_EQ(bad, 0) << mode << " " << query << " " << gate;
      }
}

// Random weights, with routing tensors far from their init so that routing
// matters: pseudo-queries N(0, 0.25), norms 1 + 0.1·N, null sources N(0, 0.2).
// The gates are set separately.
void randomise(Model& m, uint64_t seed) {
  Rng rng(seed);
  m.init(rng);
  for (const auto& s : m.layout().specs()) {
    float* p = m.params() + s.offset;
    const bool proj = s.name.find("_res_proj") != std::string::npos;
    const bool norm = s.name.find("_res_norm") != std::string::npos;
    const bool null = s.name.find("_null_source") != std::string::npos;
    for (int64_t i = 0; i < s.numel; ++i) {
      if (proj) p[i] = static_cast<float>(0.25 * rng.normal());
      if (norm) p[i] = static_cast<float>(1.0 + 0.1 * rng.normal());
      if (null) p[i] = static_cast<float>(0.2 * rng.normal());
    }
  }
}

void set_gates(Model& m, float g) {
  for (const auto& s : m.layout().specs())
    if (s.name.find("_res_alpha") != std::string::npos) m.params()[s.offset] = g;
}

// Every tensor of `to` that `from` has too, copied by name.
void copy_shared(const Model& from_m, const float* from, Model& to) {
  for (const auto& s : to.layout().specs())
    if (const TensorSpec* f = testing::find_tensor(from_m.layout(), s.name))
      std::memcpy(to.params() + s.offset, from + f->offset, static_cast<size_t>(s.numel) * sizeof(float));
}

constexpr int64_t kB = 2, kT = 11;

std::vector<int32_t> tokens(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

std::vector<float> logits(Model& m, const std::vector<int32_t>& in) {
  std::vector<float> out(static_cast<size_t>(kB * kT * m.config().V));
  m.forward_logits(in.data(), out.data());
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::fabs(static_cast<double>(a[i]) - b[i]));
  return w;
}

std::vector<std::string> sources_of(const Model& m, const std::string& router) {
  for (const auto& r : m.routers())
    if (r.name == router) return r.source_names;
  return {"<no router>"};
}

using Names = std::vector<std::string>;

// L = 6, attnres_num_blocks = 3: B = 2 layers per block, blocks start at layers 0, 2, 4.
TEST(Routers, SourcesPerMode) {
  {
    Model m(testing::test_context(), tiny("full"), 1, 4);
    EXPECT_EQ(m.routers().size(), 13u);  // 12 sublayers + final
    EXPECT_EQ(sources_of(m, "layers.0.attn"), Names({"embed"}));
    EXPECT_EQ(sources_of(m, "layers.1.attn"), Names({"embed", "layers.0.attn", "layers.0.mlp"}));
    EXPECT_EQ(sources_of(m, "final").size(), 13u);
  }
  {
    Model m(testing::test_context(), tiny("block"), 1, 4);
    EXPECT_EQ(sources_of(m, "layers.0.attn"), Names({"partial"}));  // partial = e
    EXPECT_EQ(sources_of(m, "layers.0.mlp"), Names({"block.0", "partial"}));
    EXPECT_EQ(sources_of(m, "layers.1.attn"), Names({"block.0", "partial"}));
    // Layer 2 starts block 2: its attention still sees the finished block as the partial sum.
    EXPECT_EQ(sources_of(m, "layers.2.attn"), Names({"block.0", "partial"}));
    EXPECT_EQ(sources_of(m, "layers.2.mlp"), Names({"block.0", "block.1", "partial"}));
    EXPECT_EQ(sources_of(m, "final"), Names({"block.0", "block.1", "block.2", "partial"}));
  }
  {
    Model m(testing::test_context(), tiny("delta"), 1, 4);
    EXPECT_EQ(sources_of(m, "layers.0.attn"), Names({"<no router>"}));  // input x = e
    EXPECT_EQ(sources_of(m, "layers.0.mlp"), Names({"embed", "layers.0.attn"}));
    EXPECT_EQ(sources_of(m, "final"), Names({"<no router>"}));
    Model n(testing::test_context(), tiny("delta", {{"attnres_use_null_source", true}}), 1, 4);
    EXPECT_EQ(sources_of(n, "layers.0.attn"), Names({"null"}));
    EXPECT_EQ(sources_of(n, "layers.0.mlp"), Names({"null", "embed", "layers.0.attn"}));
  }
  {
    Model m(testing::test_context(), tiny("delta_block"), 1, 4);
    EXPECT_EQ(sources_of(m, "layers.0.attn"), Names({"<no router>"}));
    EXPECT_EQ(sources_of(m, "layers.0.mlp"), Names({"block.0"}));
    EXPECT_EQ(sources_of(m, "layers.2.attn"), Names({"block.0"}));  // block 1 is appended after it
    EXPECT_EQ(sources_of(m, "layers.2.mlp"), Names({"block.0", "block.1"}));
    EXPECT_EQ(sources_of(m, "layers.5.mlp"), Names({"block.0", "block.1", "block.2"}));
  }
  EXPECT_TRUE(Model(testing::test_context(), tiny("baseline"), 1, 4).routers().empty());
}

// Delta modes: the gate gives x + g·R, so every g = 0 is exactly baseline.
TEST(LearnableAlpha, ZeroIsBaselineInDeltaModes) {
  Model base(testing::test_context(), tiny("baseline"), kB, kT);
  randomise(base, 3);
  const auto in = tokens(kB * kT, 97, 4);
  const auto want = logits(base, in);
  const nlohmann::json variants[] = {
      {{"attnres_mode", "delta"}},
      {{"attnres_mode", "delta"}, {"attnres_use_null_source", true}},
      {{"attnres_mode", "delta_block"}, {"attnres_block_delta", "true"}},
      {{"attnres_mode", "delta_block"}, {"attnres_block_delta", "reference"}},
      {{"attnres_mode", "delta_block"}, {"attnres_block_delta", "reference"}, {"attnres_use_null_source", true}},
      {{"attnres_mode", "delta_block"}, {"attnres_block_delta", "true"}, {"attnres_num_heads", 8}},
      {{"attnres_mode", "delta"}, {"attnres_num_heads", 4}},
      {{"attnres_mode", "delta_mh"}},
      {{"attnres_mode", "full_additive"}},
      {{"attnres_mode", "full_additive"}, {"attnres_use_null_source", true}, {"attnres_num_heads", 4}},
      // delta_replace replaces, but its gate's base is its last source, the stream: (1 − 0)·x + 0·R = x.
      {{"attnres_mode", "delta_replace"}},
      {{"attnres_mode", "delta_replace"}, {"attnres_num_heads", 4}},
      // delta_v: the value router shares the attention router's gate, so one g = 0 switches both off.
      {{"attnres_mode", "delta_v"}},
      {{"attnres_mode", "delta_v"}, {"attnres_use_null_source", true}, {"attnres_num_heads", 4}},
      // full_v replaces, against its last source, the stream: as delta_replace.
      {{"attnres_mode", "full_v"}},
      {{"attnres_mode", "full_v"}, {"attnres_num_heads", 4}},
  };
  for (nlohmann::json v : variants) {
    v["attnres_gate_type"] = "learnable_alpha";
    Model m(testing::test_context(), tiny("delta", v), kB, kT);
    randomise(m, 5);  // routing tensors random ...
    copy_shared(base, base.params(), m);  // ... the rest baseline's
    set_gates(m, 0.0f);
    EXPECT_LE(max_abs_diff(logits(m, in), want), 1e-5) << v.dump();
    set_gates(m, 0.5f);  // and the routing really is wired in
    EXPECT_GT(max_abs_diff(logits(m, in), want), 1e-3) << v.dump();
  }
}

// Every mode: g = 1 is the "bias" (ungated) model.  In block and full the
// gate mixes the router's output with the partial block sum / the latest
// output, not with a residual stream (the reference code's semantics,
// tests/oracle/README.md §3), so g = 0 is NOT baseline there: it feeds each
// sublayer the previous partial sum / output alone.
TEST(LearnableAlpha, OneIsBiasInEveryMode) {
  const auto in = tokens(kB * kT, 97, 6);
  for (const char* mode :
       {"block", "full", "delta", "delta_block", "block_mh", "full_mh", "delta_mh", "full_additive", "delta_replace",
        "delta_v", "full_v"}) {
    Model bias(testing::test_context(), tiny(mode), kB, kT);
    randomise(bias, 7);
    Model gated(testing::test_context(), tiny(mode, {{"attnres_gate_type", "learnable_alpha"}}), kB, kT);
    copy_shared(bias, bias.params(), gated);
    set_gates(gated, 1.0f);
    EXPECT_LE(max_abs_diff(logits(gated, in), logits(bias, in)), 1e-5) << mode;
  }
  Model base(testing::test_context(), tiny("baseline"), kB, kT);
  randomise(base, 8);
  const auto want = logits(base, in);
  for (const char* mode : {"block", "full"}) {
    Model gated(testing::test_context(), tiny(mode, {{"attnres_gate_type", "learnable_alpha"}}), kB, kT);
    randomise(gated, 9);
    copy_shared(base, base.params(), gated);
    set_gates(gated, 0.0f);
    EXPECT_GT(max_abs_diff(logits(gated, in), want), 1e-2) << mode << ": g = 0 is not an identity here";
  }
}

// Two forward+backward passes give the same bits: no state leaks between
// steps (source gradients, running partial sums, α).
TEST(Routing, RepeatableGradients) {
  for (const char* mode : {"block", "full", "delta", "delta_block", "block_mh", "full_mh", "delta_mh", "full_additive",
                           "delta_replace", "first_layer", "delta_v", "full_v", "pre_gated"}) {
    // first_layer and pre_gated have no gate (the reference applies none there).
    const char* gate = std::string(mode) == "first_layer" ? "bias" : "learnable_alpha";
    if (std::string(mode) == "pre_gated") gate = "bias";
    Model m(testing::test_context(), tiny(mode, {{"attnres_use_null_source", true}, {"attnres_gate_type", gate}}), kB, kT);
    randomise(m, 10);
    set_gates(m, 0.6f);
    const auto in = tokens(kB * kT, 97, 11), tg = tokens(kB * kT, 97, 12);
    const int64_t n = m.layout().total();
    m.zero_grad();
    const double l1 = m.forward_backward(in.data(), tg.data(), true);
    std::vector<float> g1(m.grads(), m.grads() + n);
    m.zero_grad();
    const double l2 = m.forward_backward(in.data(), tg.data(), true);
    EXPECT_EQ(l1, l2) << mode;
    EXPECT_EQ(0, std::memcmp(g1.data(), m.grads(), static_cast<size_t>(n) * sizeof(float))) << mode;
  }
}

// Random weights (routing far from init, gates 0.6) in `a`, copied into `b`:
// two builds of one model, compared bit for bit.
void same_random_weights(Model& a, Model& b) {
  randomise(a, 10);
  set_gates(a, 0.6f);
  std::memcpy(b.params(), a.params(), static_cast<size_t>(a.layout().total()) * sizeof(float));
}

// The backward's bookkeeping (model.h: which router assigns a source's
// gradient and which accumulate, the sources zeroed at its start, the shared
// dx_ of block mode, the input a router backward rebuilt): NaN in every
// gradient buffer before each backward changes no gradient bit, in every
// mode and every variant that changes which buffers exist or who writes first.
TEST(Routing, GradientBookkeepingReadsNoBufferBeforeWritingIt) {
  struct Variant {
    const char* mode;
    nlohmann::json extra;
    bool recompute, freeze;
    double entropy = 0;  // ModelOptions::entropy_lambda
  };
  const nlohmann::json alpha = {{"attnres_gate_type", "learnable_alpha"}}, bias = {{"attnres_gate_type", "bias"}};
  std::vector<Variant> variants;
  for (const char* mode : {"baseline", "block", "full", "delta", "delta_block"})
    for (bool recompute : {false, true}) variants.push_back({mode, alpha, recompute, false});
  for (const char* mode : {"block", "full", "delta", "delta_block"}) {
    variants.push_back({mode, bias, false, true});  // frozen base: only the routing gradients
    variants.push_back({mode, {{"attnres_gate_type", "bias"}, {"attnres_num_blocks", 6}}, false, false});
  }
  variants.push_back({"delta", {{"attnres_use_null_source", true}}, false, false});
  variants.push_back({"delta_block", {{"attnres_use_null_source", true}, {"attnres_block_delta", "reference"}}, false, false});
  variants.push_back({"delta_block", {{"attnres_use_null_source", false}, {"attnres_block_delta", "true"}}, true, false});
  // Routing heads, and the reference's _mh names (block_mh: no final router,
  // so no router assigns the block gradients and the final norm writes dx_ first).
  for (const char* mode : {"block_mh", "full_mh", "delta_mh"})
    for (bool recompute : {false, true}) variants.push_back({mode, alpha, recompute, false});
  for (const char* mode : {"block_mh", "full_mh", "delta_mh"}) variants.push_back({mode, bias, false, true});
  variants.push_back({"block_mh", {{"attnres_num_blocks", 6}, {"attnres_num_heads", 2}}, false, false});
  variants.push_back({"delta", {{"attnres_num_heads", 4}, {"attnres_use_null_source", true}}, false, false});
  variants.push_back({"delta_block", {{"attnres_num_heads", 4}, {"attnres_block_delta", "true"}}, true, false});
  // The sigmoid gates (sigmoid_vector keeps every input and its gates' rows;
  // sigmoid_scalar's d(sigmoid(theta)) is zeroed per router), and the entropy term.
  for (const char* mode : {"block", "full", "delta", "delta_block"}) {
    for (bool recompute : {false, true})
      variants.push_back({mode, {{"attnres_gate_type", "sigmoid_vector"}}, recompute, false});
    variants.push_back({mode, {{"attnres_gate_type", "sigmoid_vector"}}, false, true});
    variants.push_back({mode, {{"attnres_gate_type", "sigmoid_scalar"}}, false, false, 0.3});
  }
  variants.push_back({"delta", {{"attnres_use_null_source", true}, {"attnres_gate_type", "sigmoid_vector"}}, false,
                      false, 0.3});
  // full_additive: each state's gradient joins the stream's where the walk crosses it.
  for (bool recompute : {false, true}) variants.push_back({"full_additive", alpha, recompute, false});
  variants.push_back({"full_additive", bias, false, true});
  variants.push_back({"full_additive", {{"attnres_use_null_source", true}, {"attnres_num_heads", 4}}, false, false, 0.3});
  // delta_replace: the states' gradients join the stream's, its inputs rebuilt from the kept logits (u_);
  // first_layer: no router before layer 2, the states and a_1 zeroed but the last router's.
  for (bool recompute : {false, true}) {
    variants.push_back({"delta_replace", alpha, recompute, false});
    variants.push_back({"first_layer", bias, recompute, false});
  }
  variants.push_back({"delta_replace", bias, false, true});
  variants.push_back({"first_layer", bias, false, true});
  variants.push_back({"delta_replace", {{"attnres_gate_type", "sigmoid_vector"}, {"attnres_num_heads", 4}}, false,
                      false, 0.3});
  variants.push_back({"delta_replace", {{"attnres_gate_type", "sigmoid_scalar"}}, true, false});
  variants.push_back({"first_layer", {{"attnres_num_heads", 2}}, false, false, 0.3});
  // delta_v: the value router's gradient (dU_v) and its shared null source and gates.
  for (bool recompute : {false, true}) variants.push_back({"delta_v", alpha, recompute, false});
  variants.push_back({"delta_v", {{"attnres_use_null_source", true}}, false, true});
  variants.push_back({"delta_v", {{"attnres_use_null_source", true}, {"attnres_gate_type", "sigmoid_vector"}}, false,
                      false, 0.3});
  variants.push_back({"delta_v", {{"attnres_gate_type", "sigmoid_scalar"}, {"attnres_num_heads", 4}}, true, false});
  // full_v: a source read twice by one router (no router assigns first), the value router, the states.
  for (bool recompute : {false, true}) variants.push_back({"full_v", alpha, recompute, false});
  variants.push_back({"full_v", bias, false, true});
  variants.push_back({"full_v", {{"attnres_gate_type", "sigmoid_vector"}, {"attnres_num_heads", 2}}, false, false, 0.3});
  // pre_gated: the gated slots' gradients (assigned by each router), the gate's d(pre) and d(x).
  for (bool recompute : {false, true}) variants.push_back({"pre_gated", bias, recompute, false});
  variants.push_back({"pre_gated", bias, false, true});
  variants.push_back({"pre_gated", {{"attnres_num_heads", 4}}, false, false, 0.3});
  for (const Variant& v : variants) {
    const Config c = tiny(v.mode, v.extra);
    ModelOptions o{kB, kT};
    o.recompute = v.recompute;
    o.freeze_base = v.freeze;
    o.entropy_lambda = v.mode == std::string("baseline") ? 0.0 : v.entropy;
    Model clean(testing::test_context(), c, o), dirty(testing::test_context(), c, o);
    same_random_weights(clean, dirty);
    const int64_t n = clean.layout().total();
    for (int step = 0; step < 2; ++step) {
      const auto in = tokens(kB * kT, 97, 11 + step), tg = tokens(kB * kT, 97, 21 + step);
      clean.zero_grad();
      dirty.zero_grad();
      dirty.fill_gradient_buffers_for_testing(std::nanf(""));
      const double a = clean.forward_backward(in.data(), tg.data(), true);
      EXPECT_EQ(a, dirty.forward_backward(in.data(), tg.data(), true)) << v.mode;
      ASSERT_EQ(0, std::memcmp(clean.grads(), dirty.grads(), static_cast<size_t>(n) * sizeof(float)))
          << v.mode << " " << v.extra.dump() << " recompute " << v.recompute << " freeze " << v.freeze << " step " << step;
    }
  }
}

// --freeze-base: the routing gradients are exactly those of the full model,
// and no base gradient is computed.
TEST(Routing, FrozenBaseGivesTheSameRoutingGradientsAndNoOthers) {
  for (const char* mode : {"block", "full", "delta", "delta_block"}) {
    const Config c = tiny(mode, {{"attnres_use_null_source", true}, {"attnres_gate_type", "learnable_alpha"}});
    Model full(testing::test_context(), c, kB, kT);
    ModelOptions fo{kB, kT};
    fo.freeze_base = true;
    Model frozen(testing::test_context(), c, fo);
    same_random_weights(full, frozen);
    const auto in = tokens(kB * kT, 97, 11), tg = tokens(kB * kT, 97, 12);
    full.zero_grad();
    frozen.zero_grad();
    EXPECT_EQ(full.forward_backward(in.data(), tg.data(), true), frozen.forward_backward(in.data(), tg.data(), true));
    for (const TensorSpec& s : full.layout().specs()) {
      EXPECT_EQ(frozen.trains(s), s.routing()) << s.name;
      for (int64_t i = 0; i < s.numel; ++i) {
        const float want = s.routing() ? full.grads()[s.offset + i] : 0.0f;
        ASSERT_EQ(frozen.grads()[s.offset + i], want) << mode << " " << s.name << "[" << i << "]";
      }
    }
  }
  ModelOptions o{kB, kT};
  o.freeze_base = true;
  EXPECT_THROW(Model(testing::test_context(), tiny("baseline"), o), Error);
}

// --recompute: one shared set of activations refilled in the backward gives
// the same loss and the same gradient bits in every mode.
TEST(Routing, RecomputeGivesTheSameGradientBits) {
  for (const char* mode : {"baseline", "block", "full", "delta", "delta_block", "block_mh", "full_mh", "delta_mh"}) {
    const Config c = tiny(mode, {{"attnres_use_null_source", true}, {"attnres_gate_type", "learnable_alpha"}});
    Model full(testing::test_context(), c, kB, kT);
    ModelOptions ro{kB, kT};
    ro.recompute = true;
    Model re(testing::test_context(), c, ro);
    same_random_weights(full, re);
    const int64_t n = full.layout().total();
    const auto in = tokens(kB * kT, 97, 11), tg = tokens(kB * kT, 97, 12);
    for (int rep = 0; rep < 2; ++rep) {  // the second step starts from used buffers
      full.zero_grad();
      re.zero_grad();
      EXPECT_EQ(full.forward_backward(in.data(), tg.data(), true), re.forward_backward(in.data(), tg.data(), true));
      EXPECT_EQ(0, std::memcmp(full.grads(), re.grads(), static_cast<size_t>(n) * sizeof(float))) << mode;
    }
  }
}

TEST(Routing, StatisticsOnlyWhileCollecting) {
  Model m(testing::test_context(), tiny("full"), kB, kT);
  randomise(m, 13);
  const auto in = tokens(kB * kT, 97, 14);
  logits(m, in);  // not collecting: adds nothing
  m.collect_routing_stats(true);
  logits(m, in);
  m.collect_routing_stats(false);
  logits(m, in);  // stopped: adds nothing
  const nlohmann::json j = m.routing_stats().to_json();
  ASSERT_EQ(j["routers"].size(), 13u);
  EXPECT_EQ(j["routers"][0], "layers.0.attn");
  EXPECT_EQ(j["routers"][12], "final");
  EXPECT_EQ(j["tokens"], kB * kT);
  for (size_t r = 0; r < 13; ++r) {
    double sum = 0, mx = 0;
    for (double w : j["mean_weight"][r]) sum += w, mx = std::max(mx, w);
    EXPECT_NEAR(sum, 1.0, 1e-5) << r;
    EXPECT_DOUBLE_EQ(j["max_weight"][r].get<double>(), mx);
    EXPECT_GE(j["token_max"][r].get<double>(), mx - 1e-12);
    EXPECT_LE(j["entropy"][r].get<double>(), std::log(static_cast<double>(j["mean_weight"][r].size())) + 1e-9);
  }
  EXPECT_TRUE(j["cosine"][0].is_null());  // one source
  EXPECT_DOUBLE_EQ(j["max_weight"][0].get<double>(), 1.0);
  EXPECT_FALSE(j.contains("heads"));  // single-head routers: no per-head fields
}

// With routing heads, each head's statistics: its mean weights sum to 1 and
// average to the router's, its token max and entropy average to the
// router's, and the disagreement is 0 exactly where the heads agree (one
// source) and positive where routing is random.
TEST(Routing, StatisticsPerHead) {
  const int64_t H = 4;
  Model m(testing::test_context(), tiny("full_mh", {{"attnres_num_heads", H}}), kB, kT);
  randomise(m, 13);
  const auto in = tokens(kB * kT, 97, 14);
  m.collect_routing_stats(true);
  logits(m, in);
  const nlohmann::json j = m.routing_stats().to_json();
  EXPECT_EQ(j["mode"], "full_mh");
  EXPECT_EQ(j["heads"], H);
  const size_t R = j["routers"].size();
  ASSERT_EQ(j["head_mean_weight"].size(), R);
  for (size_t r = 0; r < R; ++r) {
    const size_t S = j["mean_weight"][r].size();
    ASSERT_EQ(j["head_mean_weight"][r].size(), static_cast<size_t>(H));
    double tmax = 0, ent = 0;
    std::vector<double> mean(S, 0.0);
    for (int64_t h = 0; h < H; ++h) {
      double sum = 0;
      for (size_t i = 0; i < S; ++i) {
        const double w = j["head_mean_weight"][r][h][i].get<double>();
        sum += w;
        mean[i] += w / H;
      }
      EXPECT_NEAR(sum, 1.0, 1e-9) << r << " head " << h;
      tmax += j["head_token_max"][r][h].get<double>() / H;
      ent += j["head_entropy"][r][h].get<double>() / H;
    }
    for (size_t i = 0; i < S; ++i) EXPECT_NEAR(mean[i], j["mean_weight"][r][i].get<double>(), 1e-9) << r;
    EXPECT_NEAR(tmax, j["token_max"][r].get<double>(), 1e-9) << r;
    EXPECT_NEAR(ent, j["entropy"][r].get<double>(), 1e-9) << r;
    const double dis = j["head_disagreement"][r].get<double>();
    if (S == 1) EXPECT_EQ(dis, 0.0) << r;
    else EXPECT_GT(dis, 1e-3) << r;
  }
}

// A few dozen AdamW steps per mode on the bytes of the GPL: the loss falls, nothing is NaN.
TEST(Routing, EveryModeTrainsOnText) {
  std::ifstream f("/usr/share/common-licenses/GPL-3", std::ios::binary);
  if (!f) GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 not found";
  const std::vector<unsigned char> text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const int64_t B = 4, T = 64, steps = 40;
  for (const char* mode : {"baseline", "block", "full", "delta", "delta_block", "block_mh", "full_mh", "delta_mh"}) {
    const Config c = Config::from_json({{"hidden_size", 64}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                                        {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 128},
                                        {"vocab_size", 256}, {"attnres_mode", mode}, {"attnres_num_blocks", 2}},
                                       "test");
    Model m(testing::test_context(), c, B, T);
    Rng rng(1);
    m.init(rng);
    AdamW adamw(testing::test_context().ops(), m.layout(), AdamWConfig{});
    size_t pos = 0;
    auto next = [&](int32_t* in, int32_t* tg) {
      for (int64_t b = 0; b < B; ++b) {
        if (pos + T + 1 > text.size()) pos = 0;
        for (int64_t t = 0; t < T; ++t) in[b * T + t] = text[pos + t], tg[b * T + t] = text[pos + t + 1];
        pos += T;
      }
    };
    double first = 0, last = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const double lr = lr_at(s, 5, steps, 1e-2, 1e-3);
      const double loss = train_step(m, adamw, next, 1, lr, s + 1, 1.0).loss;
      ASSERT_TRUE(std::isfinite(loss)) << mode << " step " << s;
      if (s == 0) first = loss;
      if (s >= steps - 5) last += loss / 5;
    }
    std::printf("  %-12s loss %.3f -> %.3f (mean of the last 5 of %lld steps)\n", mode, first, last,
                static_cast<long long>(steps));
    // ln V at the start is the initialisation's (near-zero logits), not a kernel's;
    // the 1.5-nat drop is measured, in fp32, where a CPU's kernels move only roundings.
    EXPECT_NEAR(first, std::log(256.0), 0.2) << mode;
    EXPECT_LT(last, first - 1.5) << mode << ": loss " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace attnres
