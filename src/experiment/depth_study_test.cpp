// depth_study_test.cpp — the depth study's table on fixed numbers: the
// differences per depth side by side, p corrected over every (mode, depth);
// --layers parsed.  The study runs end to end in cli/compare_sweep_test.cpp.
#include "experiment/depth_study.h"

#include <gtest/gtest.h>

#include "experiment/paired_stats.h"
#include "testing/check.h"

namespace attnres {
namespace {

nlohmann::json summary_entry(double loss, double vs, double lo, double hi, double p) {
  return {{"val_loss", loss}, {"val_loss_min", loss - 0.01}, {"val_loss_max", loss + 0.01}, {"seeds", 3},
          {"vs_baseline", vs}, {"ci95", {lo, hi}}, {"p", p}, {"paired_seeds", 3}, {"lr", 3e-3}};
}

TEST(DepthStudy, TheDepthsSideBySideWithPCorrectedOverTheWholeStudy) {
  nlohmann::json base = {{"val_loss", 5.0}, {"val_loss_min", 4.99}, {"val_loss_max", 5.01}, {"seeds", 3},
                         {"chosen_lr", 1e-2}};
  const nlohmann::json depths = {
      {{"layers", 12}, {"dir", "o/layers-12"},
       {"summary", {{"baseline", base}, {"delta_block", summary_entry(4.98, -0.02, -0.1, 0.06, 0.40)}}}},
      {{"layers", 24}, {"dir", "o/layers-24"},
       {"summary", {{"baseline", base}, {"delta_block", summary_entry(4.80, -0.20, -0.25, -0.15, 0.004)}}}}};
  const DepthTable t = depth_table({"baseline", "delta_block"}, depths);
  ASSERT_EQ(t.deltas.size(), 2u);
  // Holm over the study's two differences: 0.004·2 = 0.008, then max(0.008, 0.40·1) = 0.40.
  const std::vector<double> adj = holm({0.40, 0.004});
  EXPECT_DOUBLE_EQ(t.deltas[0]["p_adjusted"].get<double>(), adj[0]);
  EXPECT_DOUBLE_EQ(t.deltas[1]["p_adjusted"].get<double>(), 0.008);
  EXPECT_EQ(t.deltas[1]["layers"], 24);
  EXPECT_NE(t.table.find("| mode | 12 layers: val loss (lr) | vs baseline (95% CI; p) | 24 layers: val loss (lr) |"),
            std::string::npos)
      << t.table;
  EXPECT_NE(t.table.find("| baseline | 5.0000 ± 0.0100 (0.01) | - | 5.0000 ± 0.0100 (0.01) | - |"), std::string::npos)
      << t.table;
  EXPECT_NE(t.table.find("| delta_block | 4.9800 ± 0.0100 (0.003) | -0.0200 [-0.1000, 0.0600]; p 0.400 | "
                         "4.8000 ± 0.0100 (0.003) | -0.2000 [-0.2500, -0.1500]; p 0.008 |"),
            std::string::npos)
      << t.table;
  EXPECT_NE(t.notes[0].find("p Holm-adjusted over all 2 (mode, depth) differences of the study; a difference at the "
                            "5% level: delta_block at 24 layers."),
            std::string::npos)
      << t.notes[0];
}

TEST(DepthStudy, LayersAreNumbersBetweenCommasAtLeastTwo) {
  EXPECT_EQ(parse_layers("12,24"), (std::vector<int64_t>{12, 24}));
  EXPECT_THROW_MSG(parse_layers("12"), "a depth study needs two depths or more");
  EXPECT_THROW_MSG(parse_layers("12,0"), "'0' is not a number of layers (1 to 1000)");
  EXPECT_THROW_MSG(parse_layers("12,x"), "'x' is not a number of layers");
  EXPECT_THROW_MSG(parse_layers("12,,24"), "'' is not a number of layers");
  EXPECT_THROW_MSG(parse_layers("12,12"), "names 12 twice");
}

}  // namespace
}  // namespace attnres
