// comparison_test.cpp — the comparison's logic without running it: the
// modes flag, matching cut runs, the table and its notes, the settings a
// rerun must repeat, and finished runs read back.  The whole command runs in
// cli_test.cpp (a comparison of real runs, resumed and cut).
#include "experiment/comparison.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"
#include "testing/check.h"

namespace attnres {
namespace {

// --entropy-lambda and --freeze-base act on the routing alone: a baseline run
// trains without them (attnres train refuses them there), every routed mode
// with them; the other options reach every run.
TEST(Comparison, ABaselineRunTrainsWithoutTheRoutingOnlyOptions) {
  const std::vector<std::string> passed = {"--lr-routing=0.01", "--entropy-lambda=0.1", "--freeze-base=true",
                                           "--clip=0.5"};
  EXPECT_EQ(routing_only_flags(passed), (std::vector<std::string>{"--entropy-lambda=0.1", "--freeze-base=true"}));
  EXPECT_EQ(train_flags_for(passed, "baseline"), (std::vector<std::string>{"--lr-routing=0.01", "--clip=0.5"}));
  for (const char* mode : {"block", "delta_block", "full_additive", "delta_mh"})
    EXPECT_EQ(train_flags_for(passed, mode), passed) << mode;
  EXPECT_THROW(train_flags_for(passed, "nope"), Error);
}

TEST(Comparison, ModesAreNamesBetweenCommasEachOnce) {
  EXPECT_EQ(split_modes("baseline,block"), (std::vector<std::string>{"baseline", "block"}));
  EXPECT_EQ(split_modes("delta"), (std::vector<std::string>{"delta"}));
  EXPECT_THROW_MSG(split_modes("baseline,,block"), "an empty name (two commas, or one at an end)");
  EXPECT_THROW_MSG(split_modes("block,"), "an empty name");
  EXPECT_THROW_MSG(split_modes("block,block"), "names block twice");
}

// A run's record as train_and_record writes it, with what the table reads.
nlohmann::json record(const std::string& mode, int64_t seed, double val_loss, int64_t steps,
                      std::vector<std::pair<int64_t, double>> curve, int64_t cut_at = 0) {
  nlohmann::json vc = nlohmann::json::array();
  for (const auto& [k, v] : curve) vc.push_back({{"step", k}, {"val_loss", v}});
  return {{"mode", mode},     {"seed", seed},     {"val_loss", val_loss},        {"steps", steps},
          {"cut", cut_at > 0}, {"schedule_cut_at", cut_at}, {"val_curve", vc}, {"tok_per_s", 1000.0},
          {"peak_rss_bytes", int64_t{64} << 20},    {"params", 1234},  {"routing_heads", mode == "baseline" ? 0 : 1}};
}

TEST(Comparison, CutRunsAreComparedAtTheLastValidationEveryRunMadeBeforeTheCut) {
  const int64_t steps = 100;
  // No run cut: the final losses, at the planned step.
  nlohmann::json all = {record("baseline", 1, 5.0, 100, {{50, 5.5}, {100, 5.0}}),
                        record("block", 1, 4.8, 100, {{50, 5.4}, {100, 4.8}})};
  Matched m = match_runs(all, steps);
  EXPECT_TRUE(m.comparable);
  EXPECT_TRUE(m.cut_runs.empty());
  EXPECT_EQ(m.step, 100);
  EXPECT_EQ(m.loss_of(all[1]), 4.8);
  // block cut at step 80 (its schedule shortened at 60): compared at step 50.
  all[1] = record("block", 1, 4.9, 80, {{25, 6.0}, {50, 5.4}, {75, 5.0}}, 60);
  all[0]["val_curve"] = {{{"step", 25}, {"val_loss", 6.1}}, {{"step", 50}, {"val_loss", 5.5}},
                         {{"step", 75}, {"val_loss", 5.2}}, {{"step", 100}, {"val_loss", 5.0}}};
  m = match_runs(all, steps);
  EXPECT_TRUE(m.comparable);
  EXPECT_EQ(m.cut_runs, (std::vector<std::string>{"block seed 1 at step 80"}));
  EXPECT_EQ(m.step, 50);
  EXPECT_EQ(m.loss_of(all[0]), 5.5);
  EXPECT_EQ(m.loss_of(all[1]), 5.4);
  // Cut before any common validation: not compared at all.
  all[1] = record("block", 1, 6.0, 20, {{10, 6.5}}, 15);
  m = match_runs(all, steps);
  EXPECT_FALSE(m.comparable);
  EXPECT_EQ(m.step, 0);
}

TEST(Comparison, TheTableGivesEachDifferenceAnIntervalAndACorrectedP) {
  const int64_t steps = 100;
  auto run = [&](const std::string& mode, int64_t seed, double loss) {
    return record(mode, seed, loss, steps, {{100, loss}});
  };
  // Three seeds each, paired by seed: block below baseline by 0.21, 0.18,
  // 0.25; delta by −0.02, 0.05, −0.01.  The reference: scipy 1.17.1,
  // ttest_1samp(block − baseline, 0) and its confidence_interval(0.95);
  // Holm over the two modes by hand (0.00891·2; max(that, 0.789·1)).
  nlohmann::json all = {run("baseline", 1, 5.00), run("baseline", 2, 5.10), run("baseline", 3, 4.90),
                        run("block", 1, 4.79),    run("block", 2, 4.92),    run("block", 3, 4.65),
                        run("delta", 1, 5.02),    run("delta", 2, 5.05),    run("delta", 3, 4.91)};
  const std::vector<std::string> modes = {"baseline", "block", "delta"};
  const ModeTable t = mode_table(modes, all, match_runs(all, steps), 3, steps);
  const nlohmann::json& block = t.summary["block"];
  EXPECT_NEAR(block["vs_baseline"].get<double>(), -0.21333333333333324, 1e-12);
  EXPECT_NEAR(block["ci95"][0].get<double>(), -0.3005733826846848, 1e-10);
  EXPECT_NEAR(block["ci95"][1].get<double>(), -0.12609328398198166, 1e-10);
  EXPECT_NEAR(block["p"].get<double>(), 0.00891261906798263, 1e-10);
  EXPECT_NEAR(block["p_adjusted"].get<double>(), 2 * 0.00891261906798263, 1e-10);
  EXPECT_EQ(block["paired_seeds"], 3);
  const nlohmann::json& delta = t.summary["delta"];
  EXPECT_NEAR(delta["ci95"][0].get<double>(), -0.10071460255584036, 1e-10);
  EXPECT_NEAR(delta["ci95"][1].get<double>(), 0.08738126922250672, 1e-10);
  EXPECT_NEAR(delta["p_adjusted"].get<double>(), 0.7891814893221019, 1e-10);
  ASSERT_EQ(t.notes.size(), 2u);
  EXPECT_EQ(t.notes[0],
            "block vs baseline: -0.2133 nats, 95% interval [-0.3006, -0.1261] (paired t over 3 seeds), p 0.018 "
            "(Holm-adjusted over 2 modes): a difference at the 5% level");
  EXPECT_EQ(t.notes[1],
            "delta vs baseline: -0.0067 nats, 95% interval [-0.1007, 0.0874] (paired t over 3 seeds), p 0.789 "
            "(Holm-adjusted over 2 modes): no difference shown at this size");
  EXPECT_DOUBLE_EQ(t.summary["block"]["val_loss_min"].get<double>(), 4.65);
  EXPECT_EQ(t.summary["block"]["seeds"], 3);
  EXPECT_NE(t.table.find("| block | 4.7867 ± 0.1350 | 119.90 | -0.2133 [-0.3006, -0.1261]; p 0.018 |"),
            std::string::npos)
      << t.table;
  // Two seeds: the note says how wide the interval is.
  const nlohmann::json two = {run("baseline", 1, 5.0), run("baseline", 2, 5.1), run("block", 1, 4.7),
                              run("block", 2, 4.9)};
  const ModeTable t2 = mode_table({"baseline", "block"}, two, match_runs(two, steps), 2, steps);
  ASSERT_EQ(t2.notes.size(), 1u);
  EXPECT_NE(t2.notes[0].find("(one mode compared): no difference shown at this size; with 2 seeds the interval "
                             "is wide (±0.6353: t on one degree of freedom is 12.7)"),
            std::string::npos)
      << t2.notes[0];
  // One seed: the note says the noise is not measured.
  const nlohmann::json one = {run("baseline", 1, 5.0), run("block", 1, 4.8)};
  const ModeTable t1 = mode_table({"baseline", "block"}, one, match_runs(one, steps), 1, steps);
  ASSERT_EQ(t1.notes.size(), 1u);
  EXPECT_NE(t1.notes[0].find("from one seed each; seed noise is not measured"), std::string::npos);
  EXPECT_TRUE(t1.summary["block"]["ci95"].is_null());
}

TEST(Comparison, ARerunMustAskForTheSameComparison) {
  testing::TempDir dir("comparison");
  Comparison o;
  o.out = dir.path();
  o.settings = {{"modes", {"baseline", "block"}}, {"lr", 1e-3}, {"steps", 100}};
  check_or_write_settings(o);  // a new comparison: written
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/compare.json"));
  check_or_write_settings(o);  // the same: accepted
  o.settings["modes"] = {"block", "baseline"};  // the same modes in another order are the same comparison
  EXPECT_NO_THROW(check_or_write_settings(o));
  o.settings["lr"] = 3e-3;
  EXPECT_THROW_MSG(check_or_write_settings(o), "holds a comparison with lr 0.001, not 0.003");
}

TEST(Comparison, AFinishedRunIsReadBackOnlyWhenItsRecordHolds) {
  testing::TempDir dir("comparison");
  Comparison o;
  o.out = dir.path();
  const ComparisonRun run{"block", dir.path() + "/block-seed1", 1};
  std::filesystem::create_directories(run.dir);
  EXPECT_TRUE(finished_record(o, run).is_null());  // none yet
  // A record that does not hold (not even a run record): removed, the run is evaluated again.
  write_file_atomic(run.dir + "/done.json", "{\"mode\": \"block\"}\n");
  EXPECT_TRUE(finished_record(o, run).is_null());
  EXPECT_FALSE(std::filesystem::exists(run.dir + "/done.json"));
}

}  // namespace
}  // namespace attnres
