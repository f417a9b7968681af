// comparison.h — matched training runs of several routing modes (× seeds),
// and their table: what `attnres compare` runs (cli/compare.cpp parses its
// flags into a Comparison and calls run_comparison).
//
// Matched: every run has the same config apart from attnres_mode, the same
// schedule and number of tokens, reads the same windows in the same order
// (the data generator is separate from the init's), and starts from the same
// base weights (routing tensors draw from a stream of their own) — or, with
// --init, converts the same checkpoint.  Each run is `attnres train` in a
// process of its own (its peak RSS is its own), writing OUT/<mode>-seed<k>/;
// a finished run leaves done.json and is not rerun, an interrupted one
// resumes.  After each run its routing is measured on the validation tokens.
// The results go to OUT/results.json and, as a Markdown table, to stdout and
// OUT/results.md, and the report to OUT/report.html.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/options.h"

namespace attnres {

// A comparison: compare's own flags, every training option of `attnres
// train` (train/options.h) with train's default — passed on to each run when
// given — except those compare sets per run, and what they resolve to.
struct Comparison {
  // The flags.
  std::string modes_flag, config, init, data, val_data;
  int64_t tokens = 0, steps_flag = 0;
  double minutes = 0;
  int64_t seeds = 0;
  uint64_t seed = 0;
  std::string precision;  // "auto" until resolved, then fp32 or bf16
  int64_t ranks = 0, routing_tokens = 0, interventions = 0;
  std::string out, vega_dir;
  TrainOptions t;  // the runs' training options (those compare sets per run aside)
  // What they resolve to (cli/compare.cpp: resolve_comparison).
  std::vector<std::string> modes;
  int64_t steps = 0, B = 0, T = 0;
  bool precision_given = false;
  std::vector<std::string> launcher;             // mpirun -np N, for --ranks N > 1
  std::map<std::string, std::string> computed;   // the options each run gets by compare's rules
  std::vector<std::string> passed_fixed, passed_free;  // "--flag=value" of each given option
  nlohmann::json settings;                       // compare.json: a rerun must ask for the same comparison
};

// One run of the comparison: a mode and a seed, in its own directory.
struct ComparisonRun {
  std::string mode, dir;
  int64_t seed;
};

// --modes: names between commas, none empty, none twice (an Error otherwise).
std::vector<std::string> split_modes(const std::string& s);

// The training options that act on the routing alone (--entropy-lambda,
// --freeze-base): a run of a mode without routing (baseline) trains without
// them, as `attnres train` refuses them there.  `passed` is "--flag=value"
// per option (Comparison::passed_fixed); the flags a run of mode `mode` gets.
std::vector<std::string> train_flags_for(const std::vector<std::string>& passed, const std::string& mode);
// Those of `passed` that a mode without routing leaves out (for the one line compare prints).
std::vector<std::string> routing_only_flags(const std::vector<std::string>& passed);

// x with `digits` decimals; "-" for NaN.
std::string fmt(double x, int digits);

// The mean of the per-token max weight over the deepest third of a run's
// routers (`attnres routing --json`'s token_max); NaN without routing.
double deep_max_weight(const nlohmann::json& routing);

// Matched or not (issue 33): runs cut by --minutes before their planned
// steps did not train the tokens the others did, nor with their learning
// rates after the cut.  Their final losses are then not compared; the modes
// are compared at the last validation every run made before any schedule was
// shortened (the runs were the same computation up to it), or, with no such
// step, not at all.
struct Matched {
  std::vector<std::string> cut_runs;  // "mode seed S at step K"
  int64_t step = 0;                   // the step compared: the planned steps when no run was cut
  bool comparable = true;
  // A run's validation loss at `step` (its final loss when no run was cut).
  double loss_of(const nlohmann::json& r) const {
    if (cut_runs.empty()) return r["val_loss"].get<double>();
    for (const auto& w : r["val_curve"])
      if (w["step"].get<int64_t>() == step) return w["val_loss"].get<double>();
    return NAN;
  }
};

// The runs' records (results.json's runs) compared: which were cut, and the step they are compared at.
Matched match_runs(const nlohmann::json& results, int64_t steps);

// Per mode: mean and spread over seeds — the Markdown table's rows, the
// notes comparing each mode with baseline, and results.json's summary.
struct ModeTable {
  std::string table;
  std::vector<std::string> notes;
  nlohmann::json summary = nlohmann::json::object();
};

ModeTable mode_table(const std::vector<std::string>& modes, const nlohmann::json& results, const Matched& match,
                     int64_t seeds, int64_t steps);

// compare.json: written by a new comparison; a rerun must ask for the same
// one (an Error naming the first setting that differs).
void check_or_write_settings(const Comparison& o);

// The record of a run that finished before (its done.json), checked field by
// field; null where there is none or it does not hold (the file is removed
// and the run is evaluated again).
nlohmann::json finished_record(const Comparison& o, const ComparisonRun& run);

// Every run of the comparison, in order (trained, resumed, or only read back
// when finished), then the results: results.md, results.json and the report.
// Creates --out and holds its lock while it runs.
void run_comparison(const Comparison& o);

}  // namespace attnres
