// loop_parts.h — the parts of the training loop that decide, each with one
// job, so that the loop (trainer.cpp, Run::step_loop) only calls them in
// order and each can be tested alone:
//   LrSchedule   the learning rates of a step (warmup, cosine, the routing
//                parameters' own), and where the decay ends;
//   TimeBudget   whether the run must stop or end its decay sooner, decided
//                by rank 0's clock for every rank;
//   NanPolicy    --on-nan skip: how many non-finite steps in a row end a run;
//   Cadence      which ended steps validate and checkpoint;
//   StepRecord   what one step reports: the line on stdout and the JSONL line;
//   sum_routing_over_ranks  the routing statistics of the global batch.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distributed/comm.h"
#include "model/routing_stats.h"
#include "train/options.h"

namespace attnres {

// Warmup to lr, then a cosine to lr_min at step `end` (lr_at, optimizer.h);
// the routing parameters follow their own peak and floor where given (else
// the base's).  `end` starts at --steps; only a binding time budget moves it.
struct LrSchedule {
  double lr = 0, lr_min = 0;
  double lr_routing = -1, lr_min_routing = -1;  // < 0: as the base
  int64_t warmup = 0, end = 0;
  static LrSchedule of(const TrainOptions& o);
  double base(int64_t step) const;     // step 0-based
  double routing(int64_t step) const;
};

// --time-budget: after each step rank 0 estimates how many steps remain from
// the time left and the run's pace since its first step: wall-clock seconds
// per step, validations and checkpoints included, the process's first step
// (its warm-up: kernels built, pages touched, often 5× a steady one) left
// out.  It keeps the last validation's time (the final one takes it again)
// and a reserve of three steps and 1% of the budget.  The schedule's end
// follows the estimate, never below the next step and never past the planned
// end: shortened as soon as the steps left do not fit, lengthened back (by 2%
// of the plan or more at a time) when the pace has become faster (issue 48:
// judged by its first step, a run shrank to a fifth of what its budget
// allowed).  A cut run so still ends its decay at lr_min.  Once the budget is
// spent the run stops.  Rank 0's decision is broadcast: every rank stops at
// the same step.
class TimeBudget {
 public:
  TimeBudget(double budget_s, Comm& comm) : budget_(budget_s), comm_(comm) {}
  struct Decision {
    int64_t end = 0;           // the schedule's end after this step
    bool out_of_time = false;  // stop after this step
  };
  // After step `done` (1-based), with the schedule ending at `end` of the
  // `planned`: elapsed seconds since the run (this process) started; val_s
  // the last validation's seconds.  The first call is the warm-up step's.
  // No budget: {end, false}, with no collective.
  Decision decide(int64_t done, int64_t end, int64_t planned, double elapsed_s, double val_s);

 private:
  double budget_;
  Comm& comm_;
  int64_t first_done_ = -1;  // the warm-up step, and the seconds elapsed at its end
  double first_elapsed_ = 0;
};

// --on-nan skip: a step with a non-finite loss or gradient is skipped; ten in
// a row mean the run diverged, and it ends with an Error naming the last
// checkpoint.  (--on-nan stop never gets here: the step itself fails.)
class NanPolicy {
 public:
  static constexpr int kLimit = 10;
  int skipped() { return ++in_a_row_; }  // a step was skipped: how many in a row now
  void finite() { in_a_row_ = 0; }
  // After step `done` was reported: an Error at kLimit skipped in a row.
  void end_if_diverged(int64_t done, const std::string& last_checkpoint) const;

 private:
  int in_a_row_ = 0;
};

// Validation every val_every and checkpoints every ckpt_every steps (0:
// never), except after the last step or when the run stops: finish() does
// those once.
struct Cadence {
  int64_t val_every = 0, ckpt_every = 0;
  bool validate(int64_t done, bool ending) const { return !ending && val_every > 0 && done % val_every == 0; }
  bool checkpoint(int64_t done, bool ending) const { return !ending && ckpt_every > 0 && done % ckpt_every == 0; }
};

// One finished step as the run reports it.
struct StepRecord {
  int64_t done = 0, schedule = 0;  // 1-based step, the schedule's end
  double loss = 0, lr = 0, grad_norm = 0;
  double seconds = 0, tok_per_s = 0, mfu = 0;
  double comm_seconds = -1;  // < 0: a world of one (not reported)
  // The entropy term's E (train --entropy-lambda); NaN: not trained with it.
  // (E itself may be a hair below 0: a router of one source has −ln(1 + 1e−8).)
  double route_entropy = std::numeric_limits<double>::quiet_NaN();
  std::string line() const;  // "step    12/100 | loss 5.1234 | lr ... | MFU 61.2%"
  nlohmann::json json() const;
};

// Every rank's `width` values as Comm::all_gather returns them (rank by
// rank): each value summed over the ranks in rank order, so that every rank
// gets the same bits.
std::vector<double> sum_over_ranks(const std::vector<double>& all, int ranks, size_t width);
// The routing statistics of the global batch: every rank's sums, added in
// rank order.  A world of one: as given, with no collective.
RoutingStats sum_routing_over_ranks(RoutingStats mine, Comm& comm, int64_t step);

}  // namespace attnres
