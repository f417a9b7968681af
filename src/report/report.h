// report.h — one self-contained HTML page of training runs: the table and the
// pictures behind the paper's comparisons.
//
// Inputs are run directories: a comparison (`attnres compare`'s OUT, with
// results.json) or single training runs (log.jsonl; their routing is the last
// one logged with --routing-every).  The page holds the data as JSON and draws
// it with Vega-Lite (declarative specs in the page's script; Vega, Vega-Lite
// and vega-embed are inlined from third_party/npm, fetched by
// scripts/fetch_vega.sh — nothing is loaded from the network):
//   validation loss curves of all runs; final perplexity per mode with the
//   seeds' range; the table (perplexity, tok/s, peak RSS, parameters);
//   per-depth max routing weight per routed mode (the collapse plot), the
//   distribution of the per-token max weight in the deepest routers; a
//   heatmap per routed mode of mean routing weight, router × source;
//   entropy by depth; the max weight over training; the first steps' training
//   loss (conversions: the loss spike); with routing interventions (compare
//   --interventions, or a run directory's interventions.json written by
//   `attnres routing --interventions --json`): routing mass against Δ loss per
//   source, mean and uniform routing's Δ loss by depth, and per routed mode a
//   router × source heatmap of Δ loss beside its weights; the settings and the
//   machine.  The legends name the modes the page holds.
// A script error or a chart that fails to render is written into the page's
// #errors element (the headless-browser test reads it).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnres {

// The directory holding vega/, vega-lite/ and vega-embed/ (node_modules):
// `flag` if given, else $ATTNRES_VEGA_DIR, else the first of: an install's
// (PREFIX/share/attnres/node_modules beside the binary's bin/, then the
// configured install prefix's), the source tree's third_party/npm/node_modules
// (where the build was configured from; scripts/fetch_vega.sh fills it), and
// third_party/npm/node_modules beside the binary's build directory.  Throws an
// Error saying how to fetch them and naming every place it looked.
std::string find_vega_dir(const std::string& flag);

// What the page shows of `dirs` (comparison or run directories), read and
// checked: every error about the runs comes before Vega is looked for.
// data["warnings"]: what was read but not used (skipped log lines, a run
// with no logged step), one line each, for the caller to print.
nlohmann::json read_report_data(const std::vector<std::string>& dirs);
// Writes the page of that data to `out_html` (atomically), Vega from vega_dir.
void write_report(const nlohmann::json& data, const std::string& out_html, const std::string& vega_dir);

// The page of a depth study (compare --layers; experiment/depth_study.h): its
// results.json as `study`; the difference to baseline and the loss against
// depth per mode, the table, and links to each depth's own report.
void write_depth_report(const nlohmann::json& study, const std::string& out_html, const std::string& vega_dir);

}  // namespace attnres
