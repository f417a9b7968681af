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
//
// With --lrs (and --lrs-routing), each mode first sweeps its learning rate:
// a short run per rate (--sweep-fraction of the steps, the first seed) in
// OUT/sweep/, validated on the tuning split — the last --tuning-tokens of
// the validation file, copied to OUT/tuning.bin, which the reported
// validation never reads — and the mode's seeds then train at the rate of
// the lowest tuning loss (choose_rate).
// The results go to OUT/results.json and, as a Markdown table, to stdout and
// OUT/results.md, and the report to OUT/report.html.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
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
  // The learning-rate sweep (empty lists: none).
  std::string lrs_flag, lrs_routing_flag;
  double sweep_fraction = 0;
  int64_t tuning_tokens = 0;
  // The depth study (experiment/depth_study.h; empty: one depth, --config's).
  std::string layers_flag;
  std::vector<int64_t> layers;
  // What they resolve to (cli/compare.cpp: resolve_comparison).
  std::vector<std::string> modes;
  int64_t steps = 0, B = 0, T = 0;
  bool precision_given = false;
  std::vector<std::string> launcher;             // mpirun -np N, for --ranks N > 1
  std::map<std::string, std::string> computed;   // the options each run gets by compare's rules
  std::vector<std::string> passed_fixed, passed_free;  // "--flag=value" of each given option
  nlohmann::json settings;                       // compare.json: a rerun must ask for the same comparison
  // The sweep, resolved: its rates, each sweep run's steps and options, and
  // the split of the validation file (reported: its first val_tokens + 1
  // tokens, which evaluation reads; tuning: its last tuning_tokens).
  std::vector<double> lrs, lrs_routing;
  int64_t sweep_steps = 0, val_file_tokens = 0;
  std::map<std::string, std::string> sweep_computed;
  bool sweeping() const { return !lrs.empty() || !lrs_routing.empty(); }
};

// A point of the sweep: a peak learning rate, and the routing group's where
// it is swept (otherwise the run's own rule: --lr-routing if given, else lr).
struct Rates {
  double lr = 0;
  std::optional<double> lr_routing;
  bool operator==(const Rates&) const = default;
  // The flags that set them (each decays to a tenth of its peak, unless --lr-min was given).
  std::vector<std::string> flags(const Comparison& o) const;
  // "lr 0.003" or "lr 0.003, routing 0.01".
  std::string text() const;
};

// One run of the comparison: a mode and a seed, in its own directory; its
// length, validation and per-run options (the sweep's runs differ in these).
struct ComparisonRun {
  ComparisonRun(std::string mode_, std::string dir_, int64_t seed_)
      : mode(std::move(mode_)), dir(std::move(dir_)), seed(seed_) {}
  std::string mode, dir;
  int64_t seed;
  int64_t steps = 0;
  std::string val_data;
  std::map<std::string, std::string> computed;  // Comparison::computed, or sweep_computed
  std::optional<Rates> rates;                    // set: trains at these (a swept or chosen point)
  bool sweep = false;                            // a sweep run: its record is its tuning loss, no analysis
};

// The runs of the comparison, in order: the sweep's (rates of each mode),
// then the seeds of each mode (their rates unknown until the sweep is read).
std::vector<ComparisonRun> sweep_runs(const Comparison& o);
std::vector<ComparisonRun> seed_runs(const Comparison& o);

// The sweep's points for a mode: --lrs (or --lr alone) × --lrs-routing where
// the mode has routing.  One point: the mode does not sweep.
std::vector<Rates> sweep_points(const Comparison& o, const std::string& mode);

// A comma-separated list of positive learning rates, none twice ("" = none);
// an Error names `flag`.
std::vector<double> parse_rates(const std::string& s, const char* flag);

// Each mode's rate from its sweep runs' records (results.json's "sweep"):
// the lowest tuning loss, at the end of the runs — or, where --minutes cut
// one, at the last validation every run of the mode made before any
// schedule was shortened (match_runs).  A diverged rate is never chosen;
// ties go to the first rate listed.  An Error when no rate can be chosen.
struct RateChoice {
  Rates rates;
  double tuning_loss = 0;
  int64_t step = 0;  // the step compared
  bool at_matched_step = false;
};
RateChoice choose_rate(const std::string& mode, const nlohmann::json& sweep_records, int64_t sweep_steps);

// The items between commas, the empty ones kept ("a,,b": a, "", b) for the
// flags that refuse them (data/corpus.h's split_commas drops them).
std::vector<std::string> list_items(const std::string& s);

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
// A learning rate as the flags, the directories and the tables write it: 0.003, 1e-05.
std::string fmt_rate(double x);

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
