// loop_parts_test.cpp — the training loop's deciding parts, each alone
// (train/loop_parts.h); the loop itself is tested whole in trainer_test.cpp.
#include "train/loop_parts.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "testing/check.h"
#include "train/optimizer.h"

namespace attnres {
namespace {

TEST(LrSchedule, RoutingFollowsTheBaseUnlessGivenItsOwn) {
  TrainOptions o;
  o.lr = 1e-3;
  o.lr_min = 1e-4;
  o.warmup = 5;
  o.steps = 50;
  LrSchedule s = LrSchedule::of(o);
  EXPECT_EQ(s.end, 50);
  for (int64_t t : {0, 3, 5, 20, 49}) {
    EXPECT_EQ(s.base(t), lr_at(t, 5, 50, 1e-3, 1e-4));
    EXPECT_EQ(s.routing(t), s.base(t));
  }
  s.lr_routing = 1e-2;  // its own peak, the base's floor
  EXPECT_EQ(s.routing(20), lr_at(20, 5, 50, 1e-2, 1e-4));
  s.lr_min_routing = 2e-3;  // and its own floor
  EXPECT_EQ(s.routing(20), lr_at(20, 5, 50, 1e-2, 2e-3));
  s.end = 30;  // a shortened schedule ends its decay sooner
  EXPECT_EQ(s.base(29), lr_at(29, 5, 30, 1e-3, 1e-4));
  EXPECT_LT(s.base(29), lr_at(29, 5, 50, 1e-3, 1e-4));
}

TEST(TimeBudget, ShortensTheScheduleToWhatTheBudgetAllowsAndStopsWhenSpent) {
  const std::unique_ptr<Comm> comm = Comm::single();
  // No budget: the schedule as it is, never out of time.
  TimeBudget none(0, *comm);
  EXPECT_EQ(none.decide(10, 100, 100, 1e9, 0).end, 100);
  EXPECT_FALSE(none.decide(10, 100, 100, 1e9, 0).out_of_time);
  TimeBudget b(100, *comm);
  EXPECT_EQ(b.decide(1, 100, 100, 1, 0).end, 100);  // the warm-up step: no pace yet
  // 9 more steps in 9 s: 1 s a step; 90 s left less the reserve (3 steps
  // and 1 s): 86 more steps, the schedule ends at 96.
  EXPECT_EQ(b.decide(10, 100, 100, 10, 0).end, 96);
  // At step 50 after 50 s: 50 s left, less the reserve: 46 more steps.
  TimeBudget::Decision d = b.decide(50, 100, 100, 50, 0);
  EXPECT_EQ(d.end, 96);
  EXPECT_FALSE(d.out_of_time);
  // The final validation's time is kept: 4 s of it leave 42 steps.
  EXPECT_EQ(b.decide(50, 100, 100, 50, 4).end, 92);
  // Never below the next step.
  EXPECT_EQ(b.decide(99, 100, 100, 99.99, 0).end, 100);
  EXPECT_EQ(b.decide(60, 100, 100, 99.99, 0).end, 61);
  // Spent: out of time.
  d = b.decide(60, 100, 100, 100.5, 0);
  EXPECT_TRUE(d.out_of_time);
  EXPECT_EQ(d.end, 61);
}

// Issue 48.7: the first step (kernels built, pages touched) is not the
// run's pace — 95 ms against 15 ms later made a 2000-step run with 19 s
// shrink to 403 steps after step 1.  No decision from the warm-up; the pace
// since it; and an end shortened while the steps were slow grows back when
// they are fast again.
TEST(TimeBudget, JudgesTheRunByItsPaceAfterTheWarmUpAndLetsTheScheduleGrowBack) {
  const std::unique_ptr<Comm> comm = Comm::single();
  TimeBudget b(19, *comm);
  EXPECT_EQ(b.decide(1, 2000, 2000, 0.095, 0).end, 2000);
  // The end a pace since the warm-up gives: the time left, less the reserve
  // (3 steps and 0.19 s), over the pace.
  auto fits = [](int64_t done, double elapsed) {
    const double pace = (elapsed - 0.095) / static_cast<double>(done - 1);
    return done + static_cast<int64_t>((19 - elapsed - 3 * pace - 0.19) / pace);
  };
  // 10 steps of 15 ms after it: 1234 more.
  EXPECT_EQ(b.decide(11, 2000, 2000, 0.245, 0).end, 11 + 1234);
  EXPECT_EQ(fits(11, 0.245), 11 + 1234);
  // The machine gets busy: 100 steps of 60 ms, the end comes in...
  const int64_t busy = b.decide(111, 1245, 2000, 6.245, 0).end;
  EXPECT_EQ(busy, fits(111, 6.245));
  EXPECT_LT(busy, 400);
  // ...and when it is quiet again (400 steps of 5 ms), it grows back.
  const int64_t quiet = b.decide(511, busy, 2000, 8.245, 0).end;
  EXPECT_EQ(quiet, fits(511, 8.245));
  EXPECT_GT(quiet, busy + 100);
  // A change of less than 2% of the plan is no change: the end does not jitter.
  EXPECT_EQ(b.decide(512, quiet, 2000, 8.2466, 0).end, quiet);
}

TEST(NanPolicy, TenSkippedInARowEndTheRunNamingTheLastCheckpoint) {
  NanPolicy p;
  for (int i = 1; i < NanPolicy::kLimit; ++i) {
    EXPECT_EQ(p.skipped(), i);
    p.end_if_diverged(i, "");
  }
  p.finite();  // a finite step starts the count again
  for (int i = 1; i < NanPolicy::kLimit; ++i) p.skipped();
  p.end_if_diverged(30, "");
  EXPECT_EQ(p.skipped(), NanPolicy::kLimit);
  EXPECT_THROW_MSG(p.end_if_diverged(31, "run/step_20"),
                   "step 31: 10 steps in a row had a non-finite loss or gradient (--on-nan skip): training diverged "
                   "(try a lower --lr); the last checkpoint is run/step_20");
}

TEST(Cadence, EveryNStepsExceptTheLastOrWhenStopping) {
  const Cadence c{3, 5};
  EXPECT_FALSE(c.validate(2, false));
  EXPECT_TRUE(c.validate(3, false));
  EXPECT_FALSE(c.validate(3, true));  // finish() validates the last step once
  EXPECT_TRUE(c.checkpoint(10, false));
  EXPECT_FALSE(c.checkpoint(10, true));
  EXPECT_FALSE(c.checkpoint(9, false));
  const Cadence never{0, 0};
  EXPECT_FALSE(never.validate(3, false));
  EXPECT_FALSE(never.checkpoint(5, false));
}

TEST(StepRecord, TheLineAndTheJsonSayTheSame) {
  StepRecord r{12, 100, 5.12345, 3e-4, 0.75, 0.25, 4096, 0.612, -1};
  EXPECT_EQ(r.line(), "step    12/100 | loss 5.1235 | lr 3.00e-04 | norm 0.750 |   250.0 ms |    4096 tok/s | MFU 61.2%");
  EXPECT_FALSE(r.json().contains("comm_ms"));
  EXPECT_EQ(r.json()["step"], 12);
  EXPECT_DOUBLE_EQ(r.json()["ms"].get<double>(), 250.0);
  r.comm_seconds = 0.0125;  // several ranks
  EXPECT_EQ(r.line().substr(r.line().size() - 13), " | comm 12 ms");
  EXPECT_DOUBLE_EQ(r.json()["comm_ms"].get<double>(), 12.5);
  EXPECT_FALSE(r.json().contains("route_entropy"));
  r.route_entropy = 1.23456;  // train --entropy-lambda
  EXPECT_EQ(r.line().substr(r.line().size() - 23), " | route entropy 1.2346");
  EXPECT_DOUBLE_EQ(r.json()["route_entropy"].get<double>(), 1.23456);
}

TEST(SumOverRanks, AddsEachValueInRankOrder) {
  // Three ranks of two values: rank-major, as Comm::all_gather returns them.
  EXPECT_EQ(sum_over_ranks({1, 2, 10, 20, 100, 200}, 3, 2), (std::vector<double>{111, 222}));
  // In rank order, so the bits are the same on every rank: (1e16 + 1) − 1e16 is 0, not 1.
  EXPECT_EQ(sum_over_ranks({1e16, 1, -1e16}, 3, 1)[0], 0.0);
}

}  // namespace
}  // namespace attnres
