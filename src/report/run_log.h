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
  int64_t schedule_cut_at = 0;           // > 0: the step after which it was first shortened (before it, the
                                         // run trained as an uncut one would)
  double tok_per_s = 0;                  // median over the steps
  nlohmann::json val_curve = nlohmann::json::array();      // [{step, val_loss}]
  nlohmann::json loss_curve = nlohmann::json::array();     // [{step, loss}]
  nlohmann::json routing_curve = nlohmann::json::array();  // [{step, token_max: per router}]
  nlohmann::json last_routing;                             // the last routing statistics logged (null: none)
  int64_t last_routing_step = 0;
  int64_t peak_rss_bytes = 0;  // the largest rank's, as the run logged it at its end (0: not logged)
  int64_t skipped_lines = 0;   // lines that are not JSON objects (the reader says how many)
};

// Reads DIR/log.jsonl.  A line that is not a JSON object is counted in
// skipped_lines (an unterminated last one, a killed run's torn write, is not);
// a known field of the wrong type is an Error "FILE:LINE: 'field' is …".
RunLog read_run_log(const std::string& path);

// Checks a run's record as compare writes it (done.json, and each entry of
// results.json's "runs"): every field the table and the report read, with
// its type; an Error "WHERE: 'field' is missing / is …, not …" otherwise.
void check_run_record(const nlohmann::json& r, const std::string& where);

// The same for a run of compare's learning-rate sweep (OUT/sweep/*/done.json,
// results.json's "sweep"): its rates, its tuning loss (val_loss; null where
// it diverged) and curve.
void check_sweep_record(const nlohmann::json& r, const std::string& where);

// The output of `attnres routing --interventions --json` (eval/interventions.h),
// as the report reads it: an Error naming `where` and the first malformed part.
void check_interventions(const nlohmann::json& iv, const std::string& where);

}  // namespace attnres
