// plan_test.cpp — the routing plan (model/plan.h) of every mode, built from a
// Config alone (no model, no backend): its sources, routers, each sublayer's
// steps, the backward's bookkeeping and what the activation arena keeps,
// written out for one small shape, and every golden
// case's routers against the PyTorch oracle's (the number of sources each of
// its routers read, tests/golden/*/interventions.safetensors).
#include "model/plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "testing/golden.h"

namespace attnres {
namespace {

// 4 layers in blocks of 2 (blocks start at sublayers 0 and 4), d 16.
Config shape(const std::string& mode, bool null_source) {
  return Config::from_json({{"hidden_size", 16}, {"num_hidden_layers", 4}, {"num_attention_heads", 2},
                            {"num_key_value_heads", 1}, {"head_dim", 8}, {"intermediate_size", 24},
                            {"vocab_size", 11}, {"attnres_num_blocks", 2}, {"attnres_mode", mode},
                            {"attnres_use_null_source", null_source}},
                           "test");
}

// "name[i,j,...]" per router, in order.
std::string routers_of(const RoutingPlan& p) {
  std::string s;
  for (const PlanRouter& r : p.routers) {
    s += cat(s.empty() ? "" : " ", r.name, "[");
    for (size_t q = 0; q < r.index.size(); ++q) s += cat(q ? "," : "", r.index[q]);
    s += "]";
  }
  return s;
}
std::string sources_of(const RoutingPlan& p) {
  std::string s;
  for (const PlanSource& x : p.sources) s += cat(s.empty() ? "" : " ", x.name, x.owns_gradient ? "" : "~");
  return s;
}
// Each sublayer's steps (PlanSublayer) as "in>out": in is "x" (the stream) or
// "r<router>" (then "v<router>": its value router, V-stream routing), with "*" when stored; out lists, in the forward's order, "B<j>"
// (block source j made), "+x" (added to the stream), "S<j>" (the stream
// copied into state source j), "o<j>" (written into source j) or "p<j>"
// (into the partial sum j), "+P<j>" (plus partial sum j).
std::string steps_of(const RoutingPlan& p) {
  std::string s;
  for (const PlanSublayer& k : p.sublayers) {
    std::string out;
    auto add = [&](const std::string& t) { out += cat(out.empty() ? "" : ",", t); };
    if (k.makes_block >= 0) add(cat("B", k.makes_block));
    if (k.adds_to_stream) add("+x");
    if (k.makes_state >= 0) add(cat("S", k.makes_state));
    if (k.output_source >= 0) add(cat(k.output_is_partial_sum ? "p" : "o", k.output_source));
    if (k.previous_partial >= 0) add(cat("+P", k.previous_partial));
    s += cat(s.empty() ? "" : " ", k.router < 0 ? "x" : cat("r", k.router), k.v_router < 0 ? "" : cat("v", k.v_router),
             k.stores_input ? "*" : "", ">", out);
  }
  return s;
}
std::string ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += cat(s.empty() ? "" : ",", x);
  return s;
}

struct Expected {
  const char* mode;
  bool null;
  const char* sources;  // "~": shares the running gradient
  const char* routers;
  int final_router, first_backward;
  const char* zeroed;  // −1: the running gradient
  bool keeps_logits;
  const char* steps;  // steps_of
  int embedding;      // the source e is, or −1
};

// Written out from docs/DESIGN.md §2 for this shape, not computed.
const Expected kExpected[] = {
    {"baseline", false, "", "", -1, -1, "", false, "x> x> x> x> x> x> x> x>", -1},
    {"full", false,
     "embed layers.0.attn layers.0.mlp layers.1.attn layers.1.mlp layers.2.attn layers.2.mlp layers.3.attn layers.3.mlp",
     "layers.0.attn[0] layers.0.mlp[0,1] layers.1.attn[0,1,2] layers.1.mlp[0,1,2,3] layers.2.attn[0,1,2,3,4] "
     "layers.2.mlp[0,1,2,3,4,5] layers.3.attn[0,1,2,3,4,5,6] layers.3.mlp[0,1,2,3,4,5,6,7] final[0,1,2,3,4,5,6,7,8]",
     8, 8, "", false, "r0>o1 r1>o2 r2>o3 r3>o4 r4>o5 r5>o6 r6>o7 r7>o8", 0},
    {"block", false, "block.0 partial~ partial~ partial~ block.1 partial~ partial~ partial~ partial~",
     "layers.0.attn[0] layers.0.mlp[0,1] layers.1.attn[0,2] layers.1.mlp[0,3] layers.2.attn[0,4] layers.2.mlp[0,4,5] "
     "layers.3.attn[0,4,6] layers.3.mlp[0,4,7] final[0,4,8]",
     8, 8, "", true, "r0>p1 r1>p2,+P1 r2>p3,+P2 r3>p4,+P3 r4>p5 r5>p6,+P5 r6>p7,+P6 r7>p8,+P7", 0},
    // block_mh: no final router; the final norm writes the running gradient, the blocks are zeroed.
    {"block_mh", false, "block.0 partial~ partial~ partial~ block.1 partial~ partial~ partial~ partial~",
     "layers.0.attn[0] layers.0.mlp[0,1] layers.1.attn[0,2] layers.1.mlp[0,3] layers.2.attn[0,4] layers.2.mlp[0,4,5] "
     "layers.3.attn[0,4,6] layers.3.mlp[0,4,7]",
     -1, -1, "0,4", true, "r0>p1 r1>p2,+P1 r2>p3,+P2 r3>p4,+P3 r4>p5 r5>p6,+P5 r6>p7,+P6 r7>p8,+P7", 0},
    // delta: layer 0's attention has no router without a null source; the last output is read by none.
    {"delta", false,
     "embed layers.0.attn layers.0.mlp layers.1.attn layers.1.mlp layers.2.attn layers.2.mlp layers.3.attn layers.3.mlp",
     "layers.0.mlp[0,1] layers.1.attn[0,1,2] layers.1.mlp[0,1,2,3] layers.2.attn[0,1,2,3,4] layers.2.mlp[0,1,2,3,4,5] "
     "layers.3.attn[0,1,2,3,4,5,6] layers.3.mlp[0,1,2,3,4,5,6,7]",
     -1, 6, "8", true, "x>+x,o1 r0>+x,o2 r1>+x,o3 r2>+x,o4 r3>+x,o5 r4>+x,o6 r5>+x,o7 r6>+x,o8", 0},
    {"delta", true,
     "embed layers.0.attn layers.0.mlp layers.1.attn layers.1.mlp layers.2.attn layers.2.mlp layers.3.attn layers.3.mlp",
     "layers.0.attn[-1] layers.0.mlp[-1,0,1] layers.1.attn[-1,0,1,2] layers.1.mlp[-1,0,1,2,3] "
     "layers.2.attn[-1,0,1,2,3,4] layers.2.mlp[-1,0,1,2,3,4,5] layers.3.attn[-1,0,1,2,3,4,5,6] "
     "layers.3.mlp[-1,0,1,2,3,4,5,6,7]",
     -1, 7, "8", true, "r0>+x,o1 r1>+x,o2 r2>+x,o3 r3>+x,o4 r4>+x,o5 r5>+x,o6 r6>+x,o7 r7>+x,o8", 0},
    // delta_block: a block's source is made at its start, after that attention sublayer read its input.
    {"delta_block", false, "block.0 block.1",
     "layers.0.mlp[0] layers.1.attn[0] layers.1.mlp[0] layers.2.attn[0] layers.2.mlp[0,1] layers.3.attn[0,1] "
     "layers.3.mlp[0,1]",
     -1, 6, "", true, "x*>B0,+x r0*>+x r1*>+x r2*>+x r3*>B1,+x r4*>+x r5*>+x r6*>+x", -1},
    // block_add: block's sources, [null] first, added to the stream: no final router, and the
    // partials' running gradient is zeroed like the blocks' (the final norm writes the stream's).
    {"block_add", true, "block.0 partial~ partial~ partial~ block.1 partial~ partial~ partial~ partial~",
     "layers.0.attn[-1,0] layers.0.mlp[-1,0,1] layers.1.attn[-1,0,2] layers.1.mlp[-1,0,3] layers.2.attn[-1,0,4] "
     "layers.2.mlp[-1,0,4,5] layers.3.attn[-1,0,4,6] layers.3.mlp[-1,0,4,7]",
     -1, -1, "0,-1,4", true,
     "r0*>+x,p1 r1*>+x,p2,+P1 r2*>+x,p3,+P2 r3*>+x,p4,+P3 r4*>+x,p5 r5*>+x,p6,+P5 r6*>+x,p7,+P6 r7*>+x,p8,+P7", 0},
    // full_additive: the stream after each sublayer but the last is a source (S_1 … S_7), read by every
    // later router; the last MLP's reads them all, so nothing is zeroed; e only starts the stream.
    {"full_additive", true,
     "layers.0.attn.state layers.0.mlp.state layers.1.attn.state layers.1.mlp.state layers.2.attn.state "
     "layers.2.mlp.state layers.3.attn.state",
     "layers.0.attn[-1] layers.0.mlp[-1,0] layers.1.attn[-1,0,1] layers.1.mlp[-1,0,1,2] layers.2.attn[-1,0,1,2,3] "
     "layers.2.mlp[-1,0,1,2,3,4] layers.3.attn[-1,0,1,2,3,4,5] layers.3.mlp[-1,0,1,2,3,4,5,6]",
     -1, 7, "", true, "r0*>+x,S0 r1*>+x,S1 r2*>+x,S2 r3*>+x,S3 r4*>+x,S4 r5*>+x,S5 r6*>+x,S6 r7*>+x", -1},
    // delta_replace: S_0 = e, then each output and the stream after it (out_7 and S_8 are read by no router);
    // router k reads out_0 … out_{k−1} and S_k; the last MLP's reads no state but S_7, so the others are zeroed.
    {"delta_replace", false,
     "embed layers.0.attn layers.0.attn.state layers.0.mlp layers.0.mlp.state layers.1.attn layers.1.attn.state "
     "layers.1.mlp layers.1.mlp.state layers.2.attn layers.2.attn.state layers.2.mlp layers.2.mlp.state "
     "layers.3.attn layers.3.attn.state",
     "layers.0.attn[0] layers.0.mlp[1,2] layers.1.attn[1,3,4] layers.1.mlp[1,3,5,6] layers.2.attn[1,3,5,7,8] "
     "layers.2.mlp[1,3,5,7,9,10] layers.3.attn[1,3,5,7,9,11,12] layers.3.mlp[1,3,5,7,9,11,13,14]",
     -1, 7, "0,2,4,6,8,10,12", true,
     "r0>+x,S2,o1 r1>+x,S4,o3 r2>+x,S6,o5 r3>+x,S8,o7 r4>+x,S10,o9 r5>+x,S12,o11 r6>+x,S14,o13 r7>+x", 0},
    // first_layer: a_1 (sublayer 2) and the stream before each sublayer from layer 2 on; layers 0 and 1
    // read the stream; the last MLP's router reads S_7 and a_1, the other states are zeroed.
    {"first_layer", false, "layers.1.attn layers.1.mlp.state layers.2.attn.state layers.2.mlp.state layers.3.attn.state",
     "layers.2.attn[1,0] layers.2.mlp[2,0] layers.3.attn[3,0] layers.3.mlp[4,0]", -1, 3, "1,2,3", true,
     "x*>+x x*>+x x*>+x,o0 x*>+x,S1 r0*>+x,S2 r1*>+x,S3 r2*>+x,S4 r3*>+x", -1},
    // delta_v: the outputs but the last (not e); after each attention router its value router over the
    // same sources; the last MLP's router reads every output, so nothing is zeroed.
    {"delta_v", true,
     "layers.0.attn layers.0.mlp layers.1.attn layers.1.mlp layers.2.attn layers.2.mlp layers.3.attn",
     "layers.0.attn[-1] layers.0.v[-1] layers.0.mlp[-1,0] layers.1.attn[-1,0,1] layers.1.v[-1,0,1] "
     "layers.1.mlp[-1,0,1,2] layers.2.attn[-1,0,1,2,3] layers.2.v[-1,0,1,2,3] layers.2.mlp[-1,0,1,2,3,4] "
     "layers.3.attn[-1,0,1,2,3,4,5] layers.3.v[-1,0,1,2,3,4,5] layers.3.mlp[-1,0,1,2,3,4,5,6]",
     -1, 11, "", true, "r0v1*>+x,o0 r2*>+x,o1 r3v4*>+x,o2 r5*>+x,o3 r6v7*>+x,o4 r8*>+x,o5 r9v10*>+x,o6 r11*>+x", -1},
    // Without the null source layer 0's attention has no router, nor a value router.
    {"delta_v", false,
     "layers.0.attn layers.0.mlp layers.1.attn layers.1.mlp layers.2.attn layers.2.mlp layers.3.attn",
     "layers.0.mlp[0] layers.1.attn[0,1] layers.1.v[0,1] layers.1.mlp[0,1,2] layers.2.attn[0,1,2,3] "
     "layers.2.v[0,1,2,3] layers.2.mlp[0,1,2,3,4] layers.3.attn[0,1,2,3,4,5] layers.3.v[0,1,2,3,4,5] "
     "layers.3.mlp[0,1,2,3,4,5,6]",
     -1, 9, "", true, "x*>+x,o0 r0*>+x,o1 r1v2*>+x,o2 r3*>+x,o3 r4v5*>+x,o4 r6*>+x,o5 r7v8*>+x,o6 r9*>+x", -1},
    // full_v: e and the stream after each sublayer; router k reads S_1 … S_k and the stream S_k again (layer 0's
    // attention: e), each attention router followed by its value router; the routers that read S_k twice
    // accumulate into one buffer, so none assigns first: every source gradient is zeroed.
    {"full_v", false,
     "embed layers.0.attn.state layers.0.mlp.state layers.1.attn.state layers.1.mlp.state layers.2.attn.state "
     "layers.2.mlp.state layers.3.attn.state",
     "layers.0.attn[0] layers.0.v[0] layers.0.mlp[1,1] layers.1.attn[1,2,2] layers.1.v[1,2,2] layers.1.mlp[1,2,3,3] "
     "layers.2.attn[1,2,3,4,4] layers.2.v[1,2,3,4,4] layers.2.mlp[1,2,3,4,5,5] layers.3.attn[1,2,3,4,5,6,6] "
     "layers.3.v[1,2,3,4,5,6,6] layers.3.mlp[1,2,3,4,5,6,7,7]",
     -1, -1, "0,1,2,3,4,5,6,7", true,
     "r0v1*>+x,S1 r2*>+x,S2 r3v4*>+x,S3 r5*>+x,S4 r6v7*>+x,S5 r8*>+x,S6 r9v10*>+x,S7 r11*>+x", 0},
    // pre_gated: delta_v's sources and routers, no value routers, no null source (layer 0's attention reads x).
    {"pre_gated", false,
     "layers.0.attn layers.0.mlp layers.1.attn layers.1.mlp layers.2.attn layers.2.mlp layers.3.attn",
     "layers.0.mlp[0] layers.1.attn[0,1] layers.1.mlp[0,1,2] layers.2.attn[0,1,2,3] layers.2.mlp[0,1,2,3,4] "
     "layers.3.attn[0,1,2,3,4,5] layers.3.mlp[0,1,2,3,4,5,6]",
     -1, 6, "", true, "x*>+x,o0 r0*>+x,o1 r1*>+x,o2 r2*>+x,o3 r3*>+x,o4 r4*>+x,o5 r5*>+x,o6 r6*>+x", -1},
    {"delta_mh", false, "block.0 block.1",  // delta_mh always has the null source
     "layers.0.attn[-1] layers.0.mlp[-1,0] layers.1.attn[-1,0] layers.1.mlp[-1,0] layers.2.attn[-1,0] "
     "layers.2.mlp[-1,0,1] layers.3.attn[-1,0,1] layers.3.mlp[-1,0,1]",
     -1, 7, "", true, "r0*>B0,+x r1*>+x r2*>+x r3*>+x r4*>B1,+x r5*>+x r6*>+x r7*>+x", -1},
};

TEST(Plan, EveryModeRoutesWhatDesignSays) {
  for (const Expected& e : kExpected) {
    SCOPED_TRACE(cat(e.mode, e.null ? " + null" : ""));
    const Config c = shape(e.mode, e.null);
    const RoutingPlan p = RoutingPlan::build(c, ModelOptions{1, 4});  // a training model's
    EXPECT_EQ(sources_of(p), e.sources);
    EXPECT_EQ(routers_of(p), e.routers);
    EXPECT_EQ(p.final_router, e.final_router);
    EXPECT_EQ(p.first_backward_router, e.first_backward);
    EXPECT_EQ(ints(p.zeroed_gradients), e.zeroed);
    for (const PlanRouter& r : p.routers) {
      EXPECT_EQ(r.keeps_logits, e.keeps_logits) << r.name;
      ASSERT_EQ(r.source_names.size(), r.index.size());
      for (size_t q = 0; q < r.index.size(); ++q) {  // every source exists before its router runs
        if (r.index[q] < 0) continue;
        EXPECT_LT(p.sources[r.index[q]].sublayer, r.k) << r.name;
      }
      if (r.k < p.K) {  // the router (or value router) its sublayer names
        EXPECT_EQ(p.routers[r.value ? p.sublayers[r.k].v_router : p.sublayers[r.k].router].name, r.name);
      }
    }
    EXPECT_EQ(steps_of(p), e.steps);
    EXPECT_EQ(p.embedding_source, e.embedding);
    EXPECT_EQ(p.stream_in_inputs, !p.routed());
    ModelOptions inference{1, 4};
    inference.training = false;
    for (const PlanRouter& r : RoutingPlan::build(c, inference).routers) EXPECT_FALSE(r.keeps_logits) << r.name;
  }
  // The block starts, written once.
  const RoutingPlan p = RoutingPlan::build(shape("block", false), ModelOptions{1, 4});
  std::string starts;
  for (int64_t k = 0; k < p.K; ++k)
    if (p.starts_block(k)) starts += cat(starts.empty() ? "" : ",", k);
  EXPECT_EQ(starts, "0,4");
}

// model.h's table of what each mode keeps for the backward, read off the
// plan's arena (4 layers, 2 blocks: blocks start at sublayers 0 and 4).
TEST(Plan, TheArenaKeepsWhatTheModelHeaderSays) {
  auto count = [](const RoutingPlan& p, const std::string& prefix, const std::string& suffix) {
    int n = 0;
    for (const ArenaEntry& e : p.arena)
      n += e.what.rfind(prefix, 0) == 0 && e.what.size() >= suffix.size() &&
           e.what.compare(e.what.size() - suffix.size(), suffix.size(), suffix) == 0;
    return n;
  };
  const int K = 8;
  struct Keeps {
    const char* mode;
    int inputs, sources, source_grads;  // stored sublayer inputs; source tensors; their own gradient buffers
    bool running_gradient, second_running_gradient, u;  // dx; dp and dsum (block_add); the rebuilt input's buffer
  };
  // baseline: every sublayer input; full, delta: e and every output, each with
  // its gradient, inputs rebuilt; block: every partial sum, gradients for the
  // 2 blocks only, inputs rebuilt; delta_block: the inputs and the block
  // sources with gradients; block_add: the inputs and every partial sum,
  // gradients for the blocks, and a running gradient of the partial sums
  // beside the stream's; full_additive: the inputs and every state but the
  // last, each with its gradient; delta_replace: e, every output and state
  // but the last ones, each with its gradient, inputs rebuilt; first_layer:
  // the inputs, a_1 and the states from S_4 on, each with its gradient.
  for (const Keeps& k : {Keeps{"baseline", K, 0, 0, true, false, false}, Keeps{"full", 0, K + 1, K + 1, false, false, true},
                         Keeps{"delta", 0, K + 1, K + 1, true, false, true}, Keeps{"block", 0, K + 1, 2, true, false, true},
                         Keeps{"delta_block", K, 2, 2, true, false, false},
                         Keeps{"block_add", K, K + 1, 2, true, true, false},
                         Keeps{"full_additive", K, K - 1, K - 1, true, false, false},
                         Keeps{"delta_replace", 0, 2 * K - 1, 2 * K - 1, true, false, true},
                         Keeps{"first_layer", K, K - 3, K - 3, true, false, false},
                         Keeps{"delta_v", K, K - 1, K - 1, true, false, false},
                         Keeps{"full_v", K, K, K, true, false, false},
                         Keeps{"pre_gated", K, K - 1, K - 1, true, false, false}}) {
    SCOPED_TRACE(k.mode);
    const RoutingPlan p = RoutingPlan::build(shape(k.mode, false), ModelOptions{2, 4});
    EXPECT_EQ(count(p, "layers.", ".x_attn") + count(p, "layers.", ".x_mlp"), k.inputs);
    EXPECT_EQ(count(p, "sources.", ".v"), k.sources);
    EXPECT_EQ(count(p, "sources.", ".dv"), k.source_grads);
    EXPECT_EQ(count(p, "dx", ""), k.running_gradient ? 1 : 0);
    EXPECT_EQ(count(p, "dp", "") + count(p, "dsum", ""), k.second_running_gradient ? 2 : 0);
    EXPECT_EQ(count(p, "u", ""), k.u ? 1 : 0);
    // every layer's activations: rstd1 … up (V-stream routing: the value input and its rstd besides)
    const bool value = std::string(k.mode) == "delta_v" || std::string(k.mode) == "full_v";
    EXPECT_EQ(count(p, "layers.3.", ""), 11 + (k.inputs ? 2 : 0) + (value ? 2 : 0));
    EXPECT_EQ(count(p, "dU_v", ""), value ? 1 : 0);
    // z, for the backward; full's backward computes them again (one shared buffer for the forward's).
    const bool full = std::string(k.mode) == "full";
    EXPECT_EQ(count(p, "routers.", ".logits"), full ? 0 : static_cast<int>(p.routers.size()));
    EXPECT_EQ(count(p, "shared_logits", ""), full ? 1 : 0);
    // The entries tile the arena: in order, 64-byte aligned, no overlap.
    int64_t end = 0;
    for (const ArenaEntry& e : p.arena) {
      EXPECT_EQ(e.offset, end) << e.what;
      EXPECT_EQ(e.offset % 16, 0) << e.what;
      end = e.offset + (e.floats + 15) / 16 * 16;
    }
    EXPECT_EQ(p.arena_floats, end);
    // Inference: one layer's activations shared by all, no gradients, one logits buffer.
    ModelOptions io{2, 4};
    io.training = false;
    const RoutingPlan inf = RoutingPlan::build(shape(k.mode, false), io);
    EXPECT_TRUE(inf.shares_layer_acts);
    EXPECT_EQ(count(inf, "layers.1.", ""), 0);
    EXPECT_EQ(count(inf, "sources.", ".dv") + count(inf, "d", ""), 0);
    EXPECT_EQ(count(inf, "sources.", ".v"), k.sources);  // later routers read them
    EXPECT_EQ(count(inf, "layers.0.", ".x_attn"), k.inputs ? 1 : 0);
    // Recompute: every layer's stored inputs, one shared set of the rest.
    ModelOptions rc{2, 4};
    rc.recompute = true;
    const RoutingPlan re = RoutingPlan::build(shape(k.mode, false), rc);
    EXPECT_EQ(count(re, "layers.3.", ""), (k.inputs ? 2 : 0) + (value ? 1 : 0));
    EXPECT_EQ(count(re, "layers.0.", ".q"), 1);
  }
  // Rows between max(B, T) and B·T, or a clear error before anything is sized.
  ModelOptions rows{2, 4};
  rows.rows = 5;
  EXPECT_EQ(RoutingPlan::build(shape("delta", false), rows).arena[0].floats, 5);
  rows.rows = 3;
  std::string error = "(no error)";
  try {
    RoutingPlan::build(shape("delta", false), rows);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "ModelOptions: rows 3 must lie between max(batch, seq_len) and batch x seq_len");
  // A KV cache past the positions the model has is refused before its RoPE tables are sized (2^62 would overflow).
  ModelOptions cache{2, 4};
  cache.training = false;
  cache.cache_len = int64_t{1} << 62;
  error = "(no error)";
  try {
    RoutingPlan::build(shape("delta", false), cache);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(error, cat("a KV cache of ", int64_t{1} << 62, " positions exceeds max_position_embeddings ",
                       shape("delta", false).max_position_embeddings));
}

// Every golden case: as many routers, each reading as many sources, as the
// oracle's forward runs (its probe; stored by make_golden.py).
TEST(Plan, EveryGoldenCaseRoutesAsTheOracle) {
  int cases = 0;
  for (const std::string& name : testing::golden_cases()) {
    const std::string dir = testing::kGoldenDir + name;
    const Config c = Config::load(dir + "/config.json");
    const RoutingPlan p = RoutingPlan::build(c, ModelOptions{1, 4});
    if (!std::filesystem::exists(dir + "/interventions.safetensors")) {  // the baseline cases
      EXPECT_FALSE(p.routed()) << name;
      continue;
    }
    const SafeTensorsReader f(dir + "/interventions.safetensors");
    const auto sizes = nlohmann::json::parse(f.metadata().at("router_sources")).get<std::vector<size_t>>();
    ASSERT_EQ(p.routers.size(), sizes.size()) << name;
    for (size_t r = 0; r < sizes.size(); ++r) EXPECT_EQ(p.routers[r].index.size(), sizes[r]) << name << " " << r;
    EXPECT_EQ(p.final_router >= 0, c.final_router()) << name;
    ++cases;
  }
  EXPECT_GE(cases, 14);
}

}  // namespace
}  // namespace attnres
