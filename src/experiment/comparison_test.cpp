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

TEST(Comparison, TheTableSaysWhetherADifferenceIsBeyondTheSeedsSpread) {
  const int64_t steps = 100;
  auto run = [&](const std::string& mode, int64_t seed, double loss) {
    return record(mode, seed, loss, steps, {{100, loss}});
  };
  // Two seeds each: block 0.2 below baseline, spreads 0.05 and 0.05.
  nlohmann::json all = {run("baseline", 1, 5.05), run("baseline", 2, 4.95), run("block", 1, 4.85),
                        run("block", 2, 4.75), run("delta", 1, 5.05), run("delta", 2, 4.90)};
  const std::vector<std::string> modes = {"baseline", "block", "delta"};
  const ModeTable t = mode_table(modes, all, match_runs(all, steps), 2, steps);
  ASSERT_EQ(t.notes.size(), 2u);
  EXPECT_EQ(t.notes[0], "block vs baseline: -0.2000 nats, beyond the seeds' spread (±0.1000)");
  EXPECT_EQ(t.notes[1],
            "delta vs baseline: -0.0250 nats, within the seeds' spread (±0.1250): no difference shown at this size");
  EXPECT_DOUBLE_EQ(t.summary["block"]["val_loss"].get<double>(), 4.8);
  EXPECT_DOUBLE_EQ(t.summary["block"]["val_loss_min"].get<double>(), 4.75);
  EXPECT_EQ(t.summary["block"]["seeds"], 2);
  EXPECT_NE(t.table.find("| block | 4.8000 ± 0.0500 |"), std::string::npos) << t.table;
  // One seed: the note says the noise is not measured.
  const nlohmann::json one = {run("baseline", 1, 5.0), run("block", 1, 4.8)};
  const ModeTable t1 = mode_table({"baseline", "block"}, one, match_runs(one, steps), 1, steps);
  ASSERT_EQ(t1.notes.size(), 1u);
  EXPECT_NE(t1.notes[0].find("from one seed each; seed noise is not measured"), std::string::npos);
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
