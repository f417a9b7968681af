// modes_test.cpp — the table of modes (model/modes.h) against what params.cpp
// and model.cpp build from it, for every row: a mode added to the table and
// forgotten somewhere shows here (the compiler names the switches).
#include "model/modes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/model.h"
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

TEST(Modes, EveryRowMatchesWhatTheModelBuilds) {
  EXPECT_EQ(kNumModes, 5u);
  for (const ModeSpec& m : kModeSpecs) {
    SCOPED_TRACE(m.name);
    EXPECT_EQ(parse_mode(m.name), m.mode);
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
      EXPECT_EQ(count_params(layout, "_res_proj.weight"), m.routed() ? 2 * L + (m.final_router ? 1 : 0) : 0);
      EXPECT_EQ(count_params(layout, "final_res_"), m.final_router ? 2 : 0);
      EXPECT_EQ(count_params(layout, "_null_source"), m.null_source && null ? 2 * L : 0);

      Model model(testing::test_context(), c, 1, 3);
      const auto& routers = model.routers();
      // Every sublayer has a router, but the delta modes' layer-0 attention
      // without a null source (no source exists yet), plus the final router.
      const int expected = m.routed() ? 2 * L - (m.null_source && !null ? 1 : 0) + (m.final_router ? 1 : 0) : 0;
      EXPECT_EQ(static_cast<int>(routers.size()), expected);
      EXPECT_EQ(!routers.empty() && routers.back().name == "final", m.final_router);
      for (const Router& r : routers) {
        EXPECT_EQ(!r.source_names.empty() && r.source_names[0] == "null", m.null_source && null && r.name != "final")
            << r.name;
        if (m.sources == Sources::kPartialSums) {
          EXPECT_EQ(r.source_names.back(), "partial") << r.name;
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

}  // namespace
}  // namespace attnres
