// loop_parts.cpp — see loop_parts.h.
#include "train/loop_parts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "train/optimizer.h"

namespace attnres {

LrSchedule LrSchedule::of(const TrainOptions& o) {
  return {o.lr, o.lr_min, o.lr_routing, o.lr_min_routing, o.warmup, o.steps};
}

double LrSchedule::base(int64_t step) const { return lr_at(step, warmup, end, lr, lr_min); }

double LrSchedule::routing(int64_t step) const {
  if (lr_routing < 0) return base(step);
  return lr_at(step, warmup, end, lr_routing, lr_min_routing < 0 ? lr_min : lr_min_routing);
}

TimeBudget::Decision TimeBudget::decide(int64_t done, int64_t end, int64_t planned, double elapsed_s, double val_s) {
  if (budget_ <= 0) return {end, false};
  int64_t decision[2] = {end, 0};  // the schedule's end; out of time
  if (comm_.root()) {
    if (first_done_ < 0) {  // the warm-up step: no pace from it
      first_done_ = done;
      first_elapsed_ = elapsed_s;
    } else if (done < planned) {
      const double pace = (elapsed_s - first_elapsed_) / static_cast<double>(done - first_done_);
      const double left = budget_ - elapsed_s - val_s - (3 * pace + 0.01 * budget_);
      const double more = std::max(0.0, left) / std::max(pace, 1e-9);
      const int64_t can =
          std::clamp(done + static_cast<int64_t>(std::min(more, static_cast<double>(planned))), done + 1, planned);
      if (can < end || can >= end + std::max<int64_t>(2, planned / 50)) decision[0] = can;
    }
    decision[1] = elapsed_s > budget_;
  }
  comm_.broadcast(decision, sizeof decision, cat("step ", done, ": the time-budget decision"));
  return {decision[0], decision[1] != 0};
}

void NanPolicy::end_if_diverged(int64_t done, const std::string& last_checkpoint) const {
  if (in_a_row_ >= kLimit)
    fail("step ", done, ": ", kLimit, " steps in a row had a non-finite loss or gradient (--on-nan skip): training "
         "diverged (try a lower --lr)", last_checkpoint.empty() ? "" : "; the last checkpoint is ", last_checkpoint);
}

std::string StepRecord::line() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %7.0f tok/s | MFU %4.1f%%",
                static_cast<long long>(done), static_cast<long long>(schedule), loss, lr, grad_norm, seconds * 1e3,
                tok_per_s, 100.0 * mfu);
  std::string s = buf;
  if (comm_seconds >= 0) s += cat(" | comm ", static_cast<int>(comm_seconds * 1e3), " ms");
  if (!std::isnan(route_entropy)) {
    std::snprintf(buf, sizeof buf, " | route entropy %.4f", route_entropy);
    s += buf;
  }
  return s;
}

nlohmann::json StepRecord::json() const {
  nlohmann::json j = {{"step", done},          {"loss", loss},          {"lr", lr}, {"grad_norm", grad_norm},
                      {"ms", seconds * 1e3}, {"tok_per_s", tok_per_s}, {"mfu", mfu}};
  if (comm_seconds >= 0) j["comm_ms"] = comm_seconds * 1e3;
  if (!std::isnan(route_entropy)) j["route_entropy"] = route_entropy;
  return j;
}

std::vector<double> sum_over_ranks(const std::vector<double>& all, int ranks, size_t width) {
  std::vector<double> sum(width, 0.0);
  for (int q = 0; q < ranks; ++q)
    for (size_t i = 0; i < width; ++i) sum[i] += all[static_cast<size_t>(q) * width + i];
  return sum;
}

RoutingStats sum_routing_over_ranks(RoutingStats mine, Comm& comm, int64_t step) {
  if (comm.size() == 1) return mine;
  const std::vector<double> v = mine.values();
  mine.set_values(sum_over_ranks(comm.all_gather(v, cat("step ", step, ": the routing statistics")), comm.size(),
                                 v.size()));
  return mine;
}

}  // namespace attnres
