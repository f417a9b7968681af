// run_log.h — what a training run's log.jsonl says, gathered for tables and
// charts (attnres compare, attnres report).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace attnres {

struct RunLog {
  double val_loss = NAN, val_ppl = NAN;  // the last validation
  int64_t steps = 0;                     // the last step logged
  int64_t schedule_steps = 0;            // > 0: a time budget shortened the schedule to this step
  double tok_per_s = 0;                  // median over the steps
  nlohmann::json val_curve = nlohmann::json::array();      // [{step, val_loss}]
  nlohmann::json loss_curve = nlohmann::json::array();     // [{step, loss}]
  nlohmann::json routing_curve = nlohmann::json::array();  // [{step, token_max: per router}]
  nlohmann::json last_routing;                             // the last routing statistics logged (null: none)
  int64_t last_routing_step = 0;
  int64_t peak_rss_bytes = 0;  // the largest rank's, as the run logged it at its end (0: not logged)
};

// Reads DIR/log.jsonl (a torn last line of a killed run is skipped).
RunLog read_run_log(const std::string& path);

}  // namespace attnres
