// modes_test.cpp — the table of modes (model/modes.h) against what params.cpp
// and model.cpp build from it, for every row: a mode added to the table and
// forgotten somewhere shows here (the compiler names the switches).
#include "model/modes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "core/error.h"
#include "model/params.h"
#include "testing/context.h"

namespace attnres {
namespace {

Config config_for(const ModeSpec& m, bool null_source) {
  Config c = Config::from_json({{"hidden_size", 8}, {"num_hidden_layers", 4}, {"num_attention_heads", 2},
                                {"num_key_value_heads", 1}, {"head_dim", 4}, {"intermediate_size", 12},
                                {"vocab_size", 11}, {"attnres_num_blocks", 2}},
                               "test");
  c.mode = m.mode;
  c.null_source = null_source;
  return c;
}

int count_params(const ParamLayout& layout, const std::string& part) {
  int n = 0;
  for (const auto& s : layout.specs()) n += s.name.find(part) != std::string::npos;
  return n;
}

// The CLI's mode lists come from the table: compare's default, train's help.
TEST(Modes, TheCommandsListTheTable) {
  EXPECT_EQ(compared_modes(), "baseline,block,delta,delta_block");
  EXPECT_EQ(mode_name_list(false),
            "baseline, block, full, delta, delta_block, block_add, full_additive, delta_replace, first_layer, "
            "delta_v, full_v, pre_gated");
  EXPECT_EQ(mode_name_list(true, ","), "block_mh,full_mh,delta_mh");
  std::string all;
  for (const ModeName& m : mode_names()) all += cat(all.empty() ? "" : ", ", m.name);
  EXPECT_EQ(all, mode_name_list(false) + ", " + mode_name_list(true));
}

TEST(Modes, EveryRowMatchesWhatTheModelBuilds) {
  EXPECT_EQ(kNumModes, 12u);
  for (const ModeSpec& m : kModeSpecs) {
    SCOPED_TRACE(m.name);
    EXPECT_EQ(parse_mode_name(m.name).mode, m.mode);
    EXPECT_FALSE(parse_mode_name(m.name).reference_mh);
    EXPECT_STREQ(mode_name(m.mode), m.name);
    EXPECT_EQ(&mode_spec(m.mode), &m);
    // A mode routes iff it has sources; a replacement has no stream; a final
    // router exactly where there is no stream; the null source is additive.
    EXPECT_EQ(m.routed(), m.sources != Sources::kNone);
    EXPECT_EQ(m.stream, !m.final_router);
    EXPECT_TRUE(!m.null_source || m.combine == Combine::kAdd);
    EXPECT_TRUE(m.routed() || m.stores_inputs);

    for (bool null : {false, true}) {
      const Config c = config_for(m, null);
      const ParamLayout layout(c);
      const int L = static_cast<int>(c.L);
      // (V-stream routing: a value router's v_res_proj per layer besides.)
      EXPECT_EQ(count_params(layout, "_res_proj.weight"),
                m.routed() ? 2 * L + (m.final_router ? 1 : 0) + (m.value_router ? L : 0) : 0);
      EXPECT_EQ(count_params(layout, "v_res_proj.weight"), m.value_router ? L : 0);
      EXPECT_EQ(count_params(layout, "final_res_"), m.final_router ? 2 : 0);
      EXPECT_EQ(count_params(layout, "_null_source"), m.null_source && null ? 2 * L : 0);

      Model model(testing::test_context(), c, 1, 3);
      const auto& routers = model.routers();
      // Every sublayer has a router, but the delta modes' layer-0 attention
      // without a null source (no output or block source exists yet; block_add
      // has P_0 = e) and first_layer's first two layers, plus the final router.
      // (pre_gated has no null source: its layer-0 attention has no router either.)
      const bool first_empty =
          (m.null_source || m.source_gates) && !(m.null_source && null) && m.sources != Sources::kPartialSums;
      const int unrouted = m.sources == Sources::kStreamAndA1 ? 4 : first_empty ? 1 : 0;
      // V-stream routing: a value router beside every routed attention sublayer.
      const int values = m.value_router ? L - (first_empty ? 1 : 0) : 0;
      const int expected = m.routed() ? 2 * L - unrouted + (m.final_router ? 1 : 0) + values : 0;
      EXPECT_EQ(static_cast<int>(routers.size()), expected);
      EXPECT_EQ(!routers.empty() && routers.back().name == "final", m.final_router);
      for (const Router& r : routers) {
        EXPECT_EQ(!r.source_names.empty() && r.source_names[0] == "null", m.null_source && null && r.name != "final")
            << r.name;
        if (m.sources == Sources::kPartialSums) {
          EXPECT_EQ(r.source_names.back(), "partial") << r.name;
        }
        if (m.last_source_is_stream()) {
          EXPECT_EQ(r.source_names.back(), "stream") << r.name;
        }
        if (m.value_router) {  // every attention router is followed by its value router, over the same sources
          EXPECT_EQ(r.name.size() > 2 && r.name.compare(r.name.size() - 2, 2, ".v") == 0, r.value) << r.name;
          if (r.value) {
            const Router& qk = *(&r - 1);
            EXPECT_EQ(qk.k, r.k);
            EXPECT_EQ(qk.source_names, r.source_names) << r.name;
          }
        } else {
          EXPECT_FALSE(r.value) << r.name;
        }
        if (m.sources == Sources::kSublayerOutputs) {
          for (const std::string& n : r.source_names) EXPECT_NE(n, "embed") << r.name;
        }
        if (m.sources == Sources::kStreamAndA1) {
          EXPECT_EQ(r.source_names, (std::vector<std::string>{"stream", "layers.1.attn"})) << r.name;
        }
        if (m.sources == Sources::kBlockDeltas) {
          for (size_t i = 0; i < r.source_names.size(); ++i)
            EXPECT_TRUE(r.source_names[i] == "null" || r.source_names[i].rfind("block.", 0) == 0) << r.name;
        }
      }
      // A forward runs and is finite in every mode.
      Rng rng(1);
      model.init(rng);
      const int32_t in[3] = {1, 5, 7}, tg[3] = {5, 7, 2};
      EXPECT_TRUE(std::isfinite(model.forward_backward(in, tg, true)));
    }
  }
}

// The reference's multi-head names: each is one of the modes with H
// heads (8 unless the key says otherwise); block_mh has no final router (the
// final norm reads the last partial sum), delta_mh always has the null source
// and the reference's block deltas; each is written back under its own name.
TEST(Modes, TheReferenceMultiHeadNames) {
  const nlohmann::json shape = {{"hidden_size", 16}, {"num_hidden_layers", 4}, {"num_attention_heads", 2},
                                {"num_key_value_heads", 1}, {"head_dim", 8},  {"intermediate_size", 12},
                                {"vocab_size", 11},  {"attnres_num_blocks", 2}, {"model_type", "qwen3_attnres"}};
  struct Want {
    const char* name;
    Mode mode;
    bool final_router;
  };
  for (const Want& w : {Want{"block_mh", Mode::kBlock, false}, Want{"full_mh", Mode::kFull, true},
                        Want{"delta_mh", Mode::kDeltaBlock, false}}) {
    SCOPED_TRACE(w.name);
    nlohmann::json j = shape;
    j["attnres_mode"] = w.name;
    j["attnres_use_null_source"] = false;  // as the reference's config class writes it: delta_mh ignores it
    const Config c = Config::from_json(j, "test");
    EXPECT_EQ(c.mode, w.mode);
    EXPECT_TRUE(c.reference_mh);
    EXPECT_EQ(c.routing_heads, 8);
    EXPECT_STREQ(c.mode_label(), w.name);
    EXPECT_EQ(c.final_router(), w.final_router);
    const ParamLayout layout(c);
    EXPECT_EQ(count_params(layout, "final_res_"), w.final_router ? 2 : 0);
    if (w.mode == Mode::kDeltaBlock) {
      EXPECT_TRUE(c.null_source);
      EXPECT_EQ(c.block_delta, BlockDelta::kReference);
      EXPECT_EQ(count_params(layout, "_null_source"), 2 * c.L);
    }
    // Written and read back: the same name, heads and fixed keys.
    const nlohmann::json out = c.to_json();
    EXPECT_EQ(out["attnres_mode"], w.name);
    EXPECT_EQ(out["attnres_num_heads"], 8);
    EXPECT_EQ(Config::from_json(out, "test").to_json(), out);
    // attnres_num_heads 1 written explicitly: accepted, single-head.
    j["attnres_num_heads"] = 1;
    EXPECT_EQ(Config::from_json(j, "test").routing_heads, 1);
    // A model of it runs forward and backward.
    Model model(testing::test_context(), c, 1, 3);
    EXPECT_EQ(!model.routers().empty() && model.routers().back().name == "final", w.final_router);
    Rng rng(1);
    model.init(rng);
    const int32_t in[3] = {1, 5, 7}, tg[3] = {5, 7, 2};
    EXPECT_TRUE(std::isfinite(model.forward_backward(in, tg, true)));
  }
  // The other names take one head unless told; with_mode gives a name's defaults.
  nlohmann::json j = shape;
  j["attnres_mode"] = "delta_block";
  const Config single = Config::from_json(j, "test");
  EXPECT_EQ(single.routing_heads, 1);
  EXPECT_FALSE(single.reference_mh);
  const Config mh = single.with_mode("delta_mh");
  EXPECT_EQ(mh.routing_heads, 8);
  EXPECT_TRUE(mh.null_source);
  EXPECT_EQ(mh.with_mode("delta_block").routing_heads, 1);
  EXPECT_STREQ(mh.with_mode("delta_mh").mode_label(), "delta_mh");
}

// Bad routing heads: one line naming the key and what is wrong.
TEST(Modes, BadRoutingHeadsAreClearErrors) {
  const nlohmann::json shape = {{"hidden_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                                {"num_key_value_heads", 1}, {"head_dim", 8},  {"intermediate_size", 12},
                                {"vocab_size", 11}};
  auto error_of = [&](const nlohmann::json& extra) -> std::string {
    nlohmann::json j = shape;
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    try {
      Config::from_json(j, "c.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(error_of({{"attnres_mode", "delta"}, {"attnres_num_heads", 5}}),
            "c.json: attnres_num_heads 5 does not divide hidden_size 48 (each routing head owns hidden_size / "
            "attnres_num_heads dimensions)");
  EXPECT_EQ(error_of({{"attnres_mode", "delta"}, {"attnres_num_heads", 0}}),
            "c.json: attnres_num_heads must be at least 1, got 0");
  EXPECT_EQ(error_of({{"attnres_mode", "full_mh"}, {"attnres_num_heads", -8}}),
            "c.json: attnres_num_heads must be at least 1, got -8");
  EXPECT_EQ(error_of({{"attnres_mode", "delta"}, {"attnres_num_heads", 96}}),
            "c.json: attnres_num_heads 96 is beyond what this engine supports (at most 64)");
  EXPECT_EQ(error_of({{"attnres_mode", "baseline"}, {"attnres_num_heads", 8}}),
            "c.json: attnres_num_heads 8 with attnres_mode baseline, which has no depth routing (routing heads "
            "need a routed mode)");
  EXPECT_EQ(error_of({{"attnres_mode", "delta"}, {"attnres_num_heads", "8"}}),
            "c.json: field \"attnres_num_heads\" has the wrong type: \"8\"");
  EXPECT_EQ(error_of({{"attnres_mode", "delta_mh"}, {"attnres_block_delta", "true"}}),
            "c.json: attnres_mode delta_mh computes its block deltas as the reference code does (\"reference\"); "
            "attnres_block_delta \"true\" contradicts it (the paper's block deltas with heads: attnres_mode "
            "delta_block with attnres_num_heads)");
  EXPECT_EQ(error_of({{"attnres_mode", "block_mh"}, {"attnres_num_heads", 1}}), "(no error)");
  EXPECT_EQ(error_of({{"attnres_mode", "delta_mh"}}), "(no error)");  // 8 heads divide 48
}

}  // namespace
}  // namespace attnres

namespace attnres {
namespace {

// Prose that lists the modes is held to the table: every markdown table in
// the docs whose first column names a mode (`name`) lists exactly the modes'
// own names (kModeSpecs) or exactly the reference's multi-head names — one
// added to the table and left out of a doc, or a doc row for a mode that is
// gone, fails here.  Every named doc must hold at least one such table.
TEST(Modes, TheDocsTablesListEveryModeOfTheTable) {
  std::set<std::string> own, mh, every;
  for (const ModeName& n : mode_names()) {
    (n.reference_mh ? mh : own).insert(n.name);
    every.insert(n.name);
  }
  for (const char* doc : {"docs/DESIGN.md", "docs/routing.md"}) {
    std::ifstream in(std::string(ATTNRES_SOURCE_DIR) + "/" + doc);
    ASSERT_TRUE(in) << doc;
    std::vector<std::set<std::string>> tables(1);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("| `", 0) != 0) {  // a table's rows end at the first other line
        if (!tables.back().empty()) tables.emplace_back();
        continue;
      }
      const std::string first = line.substr(3, line.find('`', 3) - 3);
      if (every.count(first)) tables.back().insert(first);
    }
    int listed = 0;
    for (const auto& t : tables) {
      if (t.empty()) continue;
      ++listed;
      EXPECT_TRUE(t == own || t == mh) << doc << ": a table of modes lists " << ::testing::PrintToString(t)
                                       << ", not the modes " << ::testing::PrintToString(own)
                                       << " nor the multi-head names " << ::testing::PrintToString(mh);
    }
    EXPECT_GE(listed, 1) << doc << " has no table of the modes";
  }
}

// first_layer routes from layer 2 on and applies no gate (the reference's
// branch calls none): fewer layers, or a gate, is refused saying so.
TEST(Modes, FirstLayerRefusesWhatTheReferenceDoesNotRun) {
  auto config = [](int layers, const char* gate) {
    return nlohmann::json{{"hidden_size", 16},         {"num_hidden_layers", layers}, {"num_attention_heads", 2},
                          {"num_key_value_heads", 1},  {"intermediate_size", 24},     {"vocab_size", 40},
                          {"attnres_mode", "first_layer"}, {"attnres_gate_type", gate}};
  };
  EXPECT_NO_THROW(Config::from_json(config(3, "bias"), "c.json"));
  try {
    Config::from_json(config(2, "bias"), "c.json");
    ADD_FAILURE() << "2 layers accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "c.json: attnres_mode first_layer routes from layer 2 on (between the stream and layer 1's attention "
              "output): it needs num_hidden_layers >= 3, got 2");
  }
  for (const char* mode : {"first_layer", "pre_gated"})  // neither branch of the reference applies a gate
    for (const char* gate : {"learnable_alpha", "sigmoid_scalar", "sigmoid_vector"}) {
      nlohmann::json j = config(4, gate);
      j["attnres_mode"] = mode;
      try {
        Config::from_json(j, "c.json");
        ADD_FAILURE() << mode << " " << gate << " accepted";
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), cat("c.json: attnres_mode ", mode, " applies no gate in the reference code; ",
                                             "attnres_gate_type must be \"bias\", got \"", gate, "\""));
      }
    }  // A config whose mode is set in code after it was read is held to the same
  // rules when a model of it is planned (once a segfault, not an error).
  nlohmann::json two = config(2, "bias");
  two["attnres_mode"] = "delta";
  Config c = Config::from_json(two, "c.json");
  c.mode = Mode::kFirstLayer;
  EXPECT_THROW(RoutingPlan::build(c, ModelOptions{1, 4}), Error);
}

// The reference code's other names are refused by name, saying what each is
// (never "unknown"), by the config and by every --mode flag (parse_mode_name);
// and docs/routing.md's table of them lists every one, and no other.
TEST(Modes, TheReferencesOtherNamesAreRefusedSayingWhatTheyAre) {
  // A small config with `key` set to `name`: refused with exactly `message`.
  auto expect_refused = [](const char* key, const char* name, const std::string& message) {
    nlohmann::json j = {{"hidden_size", 16},         {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                        {"num_key_value_heads", 1},  {"intermediate_size", 24}, {"vocab_size", 40},
                        {"model_type", "qwen3_attnres"}, {"attnres_mode", "delta"}};
    j[key] = name;
    try {
      Config::from_json(j, "c.json");
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  };
  std::set<std::string> unrun;
  for (const UnrunName& u : kUnrunModes) {
    unrun.insert(u.name);
    expect_refused("attnres_mode", u.name,
                   cat("c.json: attnres_mode \"", u.name, "\" (a mode of the reference code): ", u.what));
    EXPECT_THROW(parse_mode_name(u.name), Error);
    for (const ModeName& n : mode_names()) EXPECT_STRNE(n.name, u.name) << "a name both run and refused";
  }
  // docs/routing.md: the table whose rows start with these names holds all of them.
  std::ifstream in(std::string(ATTNRES_SOURCE_DIR) + "/docs/routing.md");
  ASSERT_TRUE(in);
  std::set<std::string> listed;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::string first = line.substr(3, line.find('`', 3) - 3);
    if (unrun.count(first)) listed.insert(first);
  }
  EXPECT_EQ(listed, unrun) << "docs/routing.md, \"The reference code's other modes and gates\"";
}

}  // namespace
}  // namespace attnres
