// depth_study.h — `attnres compare --layers 12,24`: the same comparison at
// several depths, width and tokens fixed, and how each mode's difference to
// baseline moves with depth.
//
// Each depth is a comparison of its own (experiment/comparison.h) in
// OUT/layers-<L>/, from OUT/config-L<L>.json (--config with
// num_hidden_layers replaced): its runs, its learning-rate sweep when --lrs
// is given (the best rate may move with depth), its table, notes and report.
// Above them, OUT/results.md and results.json put the depths side by side —
// each mode's mean loss and paired difference to baseline per depth, the p
// corrected with Holm over every (mode, depth) compared — and OUT/report.html
// draws the difference against depth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiment/comparison.h"

namespace attnres {

// --layers: positive layer counts between commas, each once, at least two.
std::vector<int64_t> parse_layers(const std::string& s);

// The depths side by side.  `depths`: per depth {"layers": L, "dir": ...,
// "summary": its results.json summary}.  Returns the Markdown table, the
// notes, and per (mode, depth) the difference record (mode, layers,
// vs_baseline, ci95, p, p_adjusted over every pair with a p, lr).
struct DepthTable {
  std::string table;
  std::vector<std::string> notes;
  nlohmann::json deltas = nlohmann::json::array();
};
DepthTable depth_table(const std::vector<std::string>& modes, const nlohmann::json& depths);

// Runs every depth's comparison in turn (a finished one is read back), then
// writes OUT/results.{md,json} and OUT/report.html.
void run_depth_study(const Comparison& o);

}  // namespace attnres
