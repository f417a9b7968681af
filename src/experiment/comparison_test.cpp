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
  // Another --steps moves the settings derived from it too: the refusal names steps.
  o.settings = {{"modes", {"baseline"}}, {"routing_every", 5}, {"steps", 100}, {"val_every", 25}};
  o.out = dir.path() + "/derived";
  std::filesystem::create_directories(o.out);
  check_or_write_settings(o);
  o.settings = {{"modes", {"baseline"}}, {"routing_every", 10}, {"steps", 200}, {"val_every", 50}};
  EXPECT_THROW_MSG(check_or_write_settings(o), "holds a comparison with steps 100, not 200");
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

// A sweep run's record as compare writes it: its rates, its tuning loss at
// the end, and its validations on the tuning split.
nlohmann::json swept(const std::string& mode, double lr, double loss, bool diverged = false) {
  return {{"mode", mode}, {"seed", 1}, {"dir", "d"}, {"lr", lr}, {"lr_routing", nullptr}, {"steps", 40},
          {"planned_steps", 40}, {"cut", false}, {"schedule_cut_at", 0}, {"diverged", diverged},
          {"val_loss", diverged ? nlohmann::json(nullptr) : nlohmann::json(loss)},
          {"val_curve", {{{"step", 20}, {"val_loss", loss + 0.5}}, {{"step", 40}, {"val_loss", loss}}}}};
}

// Each mode's own rate: the lowest tuning loss of its sweep — baseline's
// here is not delta's — never a diverged one, the first on a tie.
TEST(Comparison, EachModeTakesTheRateOfItsLowestTuningLoss) {
  const nlohmann::json sweep = {swept("baseline", 1e-3, 5.0), swept("baseline", 3e-3, 5.2),
                                swept("baseline", 1e-2, 5.9), swept("delta", 1e-3, 5.1),
                                swept("delta", 3e-3, 4.8),    swept("delta", 1e-2, 0, true)};
  const RateChoice base = choose_rate("baseline", sweep, 40), delta = choose_rate("delta", sweep, 40);
  EXPECT_EQ(base.rates.lr, 1e-3);
  EXPECT_EQ(base.tuning_loss, 5.0);
  EXPECT_EQ(delta.rates.lr, 3e-3);
  EXPECT_EQ(delta.tuning_loss, 4.8);
  EXPECT_FALSE(delta.at_matched_step);
  const nlohmann::json tie = {swept("block", 3e-3, 5.0), swept("block", 1e-3, 5.0)};
  EXPECT_EQ(choose_rate("block", tie, 40).rates.lr, 3e-3);
  // Where --minutes cut a run, the rates are compared at the last validation
  // every run made before the cut: 1e-3 ends lower, but was cut (5.5 at step 20).
  nlohmann::json cut = {swept("block", 1e-3, 4.0), swept("block", 3e-3, 4.9)};
  cut[0]["cut"] = true;
  cut[0]["steps"] = 30;
  cut[0]["schedule_cut_at"] = 25;
  cut[0]["val_curve"][0]["val_loss"] = 5.5;
  const RateChoice c = choose_rate("block", cut, 40);
  EXPECT_EQ(c.rates.lr, 3e-3);
  EXPECT_EQ(c.step, 20);
  EXPECT_TRUE(c.at_matched_step);
  EXPECT_EQ(c.tuning_loss, 5.4);
  // Nothing to choose: an Error naming the mode.
  EXPECT_THROW_MSG(choose_rate("delta", nlohmann::json::array({swept("delta", 1e-2, 0, true)}), 40),
                   "delta: every rate of its sweep diverged (lr 0.01): sweep lower --lrs");
  cut[1]["cut"] = true;
  cut[1]["steps"] = 10;
  cut[1]["schedule_cut_at"] = 5;
  EXPECT_THROW_MSG(choose_rate("block", cut, 40), "block: --minutes cut its sweep before its runs shared a validation");
}

// --lrs: positive rates between commas, each once; the sweep's points per
// mode (the routing rate only where the mode has routing).
TEST(Comparison, TheSweepsRatesAndPoints) {
  EXPECT_EQ(parse_rates("3e-4,1e-3,0.003", "--lrs"), (std::vector<double>{3e-4, 1e-3, 3e-3}));
  EXPECT_TRUE(parse_rates("", "--lrs").empty());
  EXPECT_THROW_MSG(parse_rates("1e-3,,3e-3", "--lrs"), "--lrs '1e-3,,3e-3': '' is not a positive learning rate");
  EXPECT_THROW_MSG(parse_rates("1e-3,fast", "--lrs"), "'fast' is not a positive learning rate");
  EXPECT_THROW_MSG(parse_rates("-1e-3", "--lrs"), "'-1e-3' is not a positive learning rate");
  EXPECT_THROW_MSG(parse_rates("nan", "--lrs-routing"), "--lrs-routing 'nan': 'nan' is not a positive");
  EXPECT_THROW_MSG(parse_rates("1e-3,0.001", "--lrs"), "names 0.001 twice");
  Comparison o;
  o.t.lr = 3e-3;
  o.lrs_routing = {1e-3, 1e-2};
  EXPECT_EQ(sweep_points(o, "baseline").size(), 1u);  // no routing: nothing to sweep
  const std::vector<Rates> delta = sweep_points(o, "delta_block");
  ASSERT_EQ(delta.size(), 2u);
  EXPECT_EQ(delta[1], (Rates{3e-3, 1e-2}));
  EXPECT_EQ(delta[1].text(), "lr 0.003, routing 0.01");
  // Only the swept rate is set by flags (the peak lr comes from --lr as given), each decaying to a tenth.
  EXPECT_EQ(delta[1].flags(o), (std::vector<std::string>{"--lr-routing=0.01", "--lr-min-routing=0.001"}));
  o.lrs = {1e-3, 3e-3};
  EXPECT_EQ(sweep_points(o, "block").size(), 4u);
  EXPECT_EQ(sweep_points(o, "baseline").size(), 2u);
  o.passed_fixed = {"--lr-min=0"};  // a given --lr-min holds for every rate
  EXPECT_EQ((Rates{1e-3, std::nullopt}).flags(o), (std::vector<std::string>{"--lr=0.001"}));
}

}  // namespace
}  // namespace attnres
