// report.cpp — see report.h.
#include "report/report.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "model/config.h"
#include "model/modes.h"
#include "model/params.h"
#include "report/run_log.h"

namespace attnres {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kScripts[3] = {"vega/build/vega.min.js", "vega-lite/build/vega-lite.min.js",
                           "vega-embed/build/vega-embed.min.js"};

// A run of `attnres train` alone, in the shape compare's done.json has.
json single_run(const std::string& dir, json& warnings) {
  const std::string ckpt = resolve_model_dir(dir);
  const Config c = Config::load(ckpt + "/config.json");
  json run = {{"mode", c.mode_label()}, {"dir", dir}, {"params", ParamLayout(c).total()}};
  const TrainerState st = read_trainer_state(ckpt);
  run["seed"] = st.settings.value("seed", 0);
  run["steps"] = st.step;
  const RunLog log = read_run_log(dir + "/log.jsonl");
  if (log.skipped_lines > 0)
    warnings.push_back(cat(dir, "/log.jsonl: ", log.skipped_lines, " line", log.skipped_lines == 1 ? "" : "s",
                           " that are not JSON objects were skipped"));
  if (log.loss_curve.empty()) warnings.push_back(cat(dir, "/log.jsonl: no training step is logged"));
  run["val_curve"] = log.val_curve;
  run["loss_curve"] = log.loss_curve;
  run["routing_curve"] = log.routing_curve;
  if (!std::isnan(log.val_loss)) run["val_loss"] = log.val_loss, run["val_ppl"] = log.val_ppl;
  if (log.tok_per_s > 0) run["tok_per_s"] = log.tok_per_s;
  if (!log.last_routing.is_null()) {
    run["routing"] = log.last_routing;
    run["routing_source"] = cat("training batches of step ", log.last_routing_step);
  }
  run["settings"] = st.settings;
  // `attnres routing --interventions --json > DIR/interventions.json` puts them on the page too.
  if (const std::string iv = dir + "/interventions.json"; fs::exists(iv)) {
    run["interventions"] = parse_json(read_file(iv), iv);
    check_interventions(run["interventions"], iv);
  }
  return run;
}

std::string machine() {
  std::ifstream cpu("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpu, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return cat(model, ", ", ::sysconf(_SC_NPROCESSORS_ONLN), " cores, ",
             static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE) / (1 << 30), " GiB");
}

// The commit of the source tree the binary was built in, when it is a git checkout.
std::string commit() {
  std::error_code ec;
  const fs::path root = fs::canonical("/proc/self/exe", ec).parent_path().parent_path();
  std::string head = root / ".git/HEAD";
  if (ec || !fs::exists(head)) return "unknown";
  std::string ref = read_file(head);
  while (!ref.empty() && (ref.back() == '\n' || ref.back() == ' ')) ref.pop_back();
  if (ref.rfind("ref: ", 0) == 0) {
    const fs::path p = root / ".git" / ref.substr(5);
    if (!fs::exists(p)) return ref.substr(5);
    ref = read_file(p.string());
    while (!ref.empty() && ref.back() == '\n') ref.pop_back();
  }
  return ref.substr(0, 12);
}

// Code safe inside <script>: only "</script" (any case) would end the
// element early; it becomes "<\/script" (the same string or regex in JS).
// Other "</" must stay: in a regex literal like /</g an escape would change it.
std::string script_safe(std::string s) {
  for (size_t i = 0; (i = s.find("</", i)) != std::string::npos; i += 2) {
    std::string next = s.substr(i + 2, 6);
    for (char& ch : next) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (next == "script") s.replace(i, 2, "<\\/");
  }
  return s;
}

// JSON data safe inside <script>: '<', '>' and '&' occur only inside its
// strings, where \u003c, \u003e and \u0026 read the same — so no "</script"
// ends the element and no "<!--<script" puts the parser in a state where it
// never does (issue 48: a run directory named so broke every chart).
std::string json_safe(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '<': o += "\\u003c"; break;
      case '>': o += "\\u003e"; break;
      case '&': o += "\\u0026"; break;
      default: o += ch;
    }
  }
  return o;
}

// JSON text of the page's data: bytes that are not UTF-8 (a path's) each become U+FFFD, never an exception.
std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string html_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += ch;
    }
  }
  return o;
}

// The page's own script: Vega-Lite specs built from DATA, one per chart
// element; every failure lands in #errors.
const char* kPageScript = R"JS(
const errors = document.getElementById('errors');
function fail(what) { errors.textContent += what + '\n'; }
window.addEventListener('error', e => fail('script error: ' + e.message));
const runs = DATA.runs;
const label = r => r.mode + ' seed ' + r.seed;
const routed = runs.filter(r => r.routing);
const rows = (key, f) => runs.flatMap(r => (r[key] || []).map(p => f(r, p)));
const W = 560, H = 260;
// One colour per mode, fixed by the mode's place in attnres's table of modes
// (not by which modes a chart happens to show), so every chart and every report agree.
const palette = ['#4c78a8', '#f58518', '#54a24b', '#e45756', '#b279a2', '#72b7b2', '#eeca3b', '#ff9da6', '#9d755d', '#bab0ac'];
// The legends list the modes this page holds, in the table's order.
const shown = DATA.modes.filter(m => runs.some(r => r.mode === m));
const modeColor = {field: 'mode', type: 'nominal', scale: {domain: shown, range: shown.map(m => palette[DATA.modes.indexOf(m) % palette.length])}};
const specs = {};
specs['chart-val'] = {
  title: 'Validation loss', width: W, height: H,
  data: {values: rows('val_curve', (r, p) => ({run: label(r), mode: r.mode, step: p.step, val_loss: p.val_loss}))},
  mark: {type: 'line', point: true},
  encoding: {x: {field: 'step', type: 'quantitative'}, y: {field: 'val_loss', type: 'quantitative', scale: {zero: false}},
             color: modeColor, detail: {field: 'run'}}};
specs['chart-ppl'] = {
  title: 'Final validation perplexity per mode (each dot a seed; bar: mean)', width: W, height: H,
  data: {values: runs.filter(r => r.val_ppl != null).map(r => ({mode: r.mode, ppl: r.val_ppl, run: label(r)}))},
  layer: [
    {mark: {type: 'bar', opacity: 0.35}, encoding: {x: {field: 'mode', type: 'nominal'}, y: {aggregate: 'mean', field: 'ppl', type: 'quantitative', scale: {zero: false}}, color: modeColor}},
    {mark: {type: 'point', filled: true, size: 60}, encoding: {x: {field: 'mode', type: 'nominal'}, y: {field: 'ppl', type: 'quantitative'}, color: modeColor, tooltip: [{field: 'run'}, {field: 'ppl'}]}}]};
specs['chart-first'] = {
  title: 'Training loss over the first steps (a conversion\'s spike shows here)', width: W, height: H,
  data: {values: rows('loss_curve', (r, p) => ({run: label(r), mode: r.mode, step: p.step, loss: p.loss})).filter(p => p.step <= Math.max(50, Math.min(...runs.map(r => r.steps || 0)) / 5))},
  mark: 'line',
  encoding: {x: {field: 'step', type: 'quantitative'}, y: {field: 'loss', type: 'quantitative', scale: {zero: false}},
             color: modeColor, detail: {field: 'run'}}};
const depth = (key) => routed.flatMap(r => r.routing[key].map((v, i) => ({mode: r.mode, run: label(r), depth: i, router: r.routing.routers[i], value: v})));
specs['chart-depth'] = {
  title: 'Per-token max routing weight by depth (the collapse plot)', width: W, height: H,
  data: {values: depth('token_max')},
  mark: {type: 'line', point: true},
  encoding: {x: {field: 'depth', type: 'quantitative', axis: {tickMinStep: 1, format: 'd'}, title: 'router (input of sublayer k; the last is the final router)'},
             y: {field: 'value', type: 'quantitative', title: 'mean max weight', scale: {domain: [0, 1]}},
             color: modeColor, detail: {field: 'run'}, tooltip: [{field: 'router'}, {field: 'value'}]}};
specs['chart-entropy'] = {
  title: 'Routing entropy by depth (nats)', width: W, height: H,
  data: {values: depth('entropy')},
  mark: {type: 'line', point: true},
  encoding: {x: {field: 'depth', type: 'quantitative', axis: {tickMinStep: 1, format: 'd'}}, y: {field: 'value', type: 'quantitative', title: 'entropy'},
             color: modeColor, detail: {field: 'run'}}};
specs['chart-evolution'] = {
  title: 'Max routing weight during training (mean over the deepest third of the routers)', width: W, height: H,
  data: {values: rows('routing_curve', (r, p) => {
    const t = p.token_max, from = t.length - Math.max(1, Math.floor(t.length / 3));
    const deep = t.slice(from);
    return {run: label(r), mode: r.mode, step: p.step, value: deep.reduce((a, b) => a + b, 0) / deep.length};
  })},
  mark: 'line',
  encoding: {x: {field: 'step', type: 'quantitative'}, y: {field: 'value', type: 'quantitative', title: 'max weight'},
             color: modeColor, detail: {field: 'run'}}};
specs['chart-maxdist'] = {
  title: 'Distribution of the per-token max weight, deepest third of the routers', width: W, height: H,
  data: {values: routed.filter(r => r.routing.token_max_hist).flatMap(r => {
    const h = r.routing.token_max_hist, from = h.length - Math.max(1, Math.floor(h.length / 3));
    const bins = h[0].length, sum = new Array(bins).fill(0);
    for (const row of h.slice(from)) row.forEach((c, b) => sum[b] += c);
    const total = sum.reduce((a, b) => a + b, 0) || 1;
    return sum.map((c, b) => ({mode: r.mode, run: label(r), max_weight: (b + 0.5) / bins, share: c / total}));
  })},
  mark: {type: 'line', point: true, interpolate: 'step-after'},
  encoding: {x: {field: 'max_weight', type: 'quantitative', scale: {domain: [0, 1]}, title: 'largest weight of a token'},
             y: {field: 'share', type: 'quantitative', title: 'share of tokens'},
             color: modeColor, detail: {field: 'run'}}};
// compare --lrs: each mode's loss on the tuning split against the peak rate
// (log scale); a ring marks the rate its seeds trained at.  A line per
// routing rate where that was swept too; a diverged rate is left out.
const sweepLine = p => p.mode + (p.lr_routing != null ? ', routing ' + p.lr_routing : '') + ' (' + p.comparison + ')';
const sweepPoints = DATA.sweeps.filter(p => !p.diverged).map(p => ({mode: p.mode, lr: p.lr, line: sweepLine(p), loss: p.tuning_loss, chosen: p.chosen ? 'chosen' : 'swept'}));
specs['chart-sweep'] = {
  title: 'Learning-rate sweep: loss on the tuning split against the peak rate', width: W, height: H,
  data: {values: sweepPoints},
  layer: [
    {mark: {type: 'line', point: true}, encoding: {x: {field: 'lr', type: 'quantitative', scale: {type: 'log'}, title: 'peak learning rate'},
      y: {field: 'loss', type: 'quantitative', scale: {zero: false}, title: 'tuning loss'}, color: modeColor, detail: {field: 'line'},
      tooltip: [{field: 'line'}, {field: 'lr'}, {field: 'loss'}]}},
    {transform: [{filter: "datum.chosen === 'chosen'"}], mark: {type: 'point', size: 220, strokeWidth: 2},
     encoding: {x: {field: 'lr', type: 'quantitative', scale: {type: 'log'}}, y: {field: 'loss', type: 'quantitative'}, color: modeColor}}]};
if (!sweepPoints.length) {
  delete specs['chart-sweep'];
  document.getElementById('chart-sweep').textContent = 'No learning-rate sweep (attnres compare --lrs): every run at the rate it was given.';
  document.getElementById('chart-sweep').className = 'chart empty';
}
// A chart element of its own, appended to `parent` (the charts drawn one per run).
function chartDiv(parent, id) {
  const div = document.createElement('div');
  div.id = id;
  div.className = 'chart';
  parent.appendChild(div);
  return div;
}
// One run per mode: its first seed.
const firstPerMode = list => list.filter((r, i) => list.findIndex(h => h.mode === r.mode) === i);
const heatRuns = firstPerMode(routed);
const heats = document.getElementById('heatmaps');
heatRuns.forEach((r, k) => {
  const div = chartDiv(heats, 'chart-heat-' + k);
  const values = r.routing.routers.flatMap((name, i) => r.routing.sources[i].map((s, j) => ({router: i + ' ' + name, source: j + ' ' + s, weight: r.routing.mean_weight[i][j]})));
  specs[div.id] = {
    title: r.mode + ': mean routing weight, router × source (' + label(r) + ')', width: W, height: {step: 12},
    data: {values}, mark: 'rect',
    encoding: {x: {field: 'source', type: 'ordinal', sort: null}, y: {field: 'router', type: 'ordinal', sort: null},
               color: {field: 'weight', type: 'quantitative', scale: {scheme: 'viridis', domain: [0, 1]}},
               tooltip: [{field: 'router'}, {field: 'source'}, {field: 'weight', format: '.3f'}]}};
});
// Interventions (attnres routing --interventions): what a source's routing
// mass does to the loss.  Per run with them (one per mode: its first seed).
const ivRuns = firstPerMode(runs.filter(r => r.interventions));
const ivPoints = ivRuns.flatMap(r => r.interventions.routers.flatMap((e, i) => e.sources.map((s, j) => ({
  mode: r.mode, run: label(r), router: i + ' ' + e.router, source: j + ' ' + s, mass: e.mass[j],
  dloss: e.ablate[j].dloss, se: e.ablate[j].se}))));
specs['chart-iv-scatter'] = {
  title: 'Routing mass against causal effect: each point a (router, source); Δ loss when the source is ablated there', width: W, height: H,
  data: {values: ivPoints}, mark: {type: 'point', filled: true, opacity: 0.7},
  encoding: {x: {field: 'mass', type: 'quantitative', title: 'mean routing weight', scale: {domain: [0, 1]}},
             y: {field: 'dloss', type: 'quantitative', title: 'Δ loss (nats/token)'},
             color: modeColor, tooltip: [{field: 'mode'}, {field: 'router'}, {field: 'source'}, {field: 'mass', format: '.3f'}, {field: 'dloss', format: '+.4f'}, {field: 'se', format: '.4f'}]}};
specs['chart-iv-depth'] = {
  title: 'Content-independent routing by depth: Δ loss under mean routing (solid) and uniform routing (dashed)', width: W, height: H,
  data: {values: ivRuns.flatMap(r => r.interventions.routers.flatMap((e, i) => [
    {mode: r.mode, run: label(r), kind: 'mean', depth: i, router: e.router, dloss: e.mean_routing.dloss},
    {mode: r.mode, run: label(r), kind: 'uniform', depth: i, router: e.router, dloss: e.uniform_routing.dloss}]))},
  mark: {type: 'line', point: true},
  encoding: {x: {field: 'depth', type: 'quantitative', axis: {tickMinStep: 1, format: 'd'}, title: 'router (depth)'},
             y: {field: 'dloss', type: 'quantitative', title: 'Δ loss (nats/token)'},
             color: modeColor, strokeDash: {field: 'kind', type: 'nominal'}, detail: {field: 'run'},
             tooltip: [{field: 'router'}, {field: 'kind'}, {field: 'dloss', format: '+.4f'}]}};
const ivHeats = document.getElementById('iv-heatmaps');
ivRuns.forEach((r, k) => {
  const div = chartDiv(ivHeats, 'chart-iv-heat-' + k);
  const values = ivPoints.filter(p => p.run === label(r));
  const m = Math.max(1e-9, ...values.map(p => Math.abs(p.dloss)));
  specs[div.id] = {
    title: r.mode + ': Δ loss with the source ablated, router × source (' + label(r) + '), beside the mean weight',
    hconcat: [
      {width: W / 2, height: {step: 12}, data: {values}, mark: 'rect',
       encoding: {x: {field: 'source', type: 'ordinal', sort: null}, y: {field: 'router', type: 'ordinal', sort: null},
                  color: {field: 'dloss', type: 'quantitative', title: 'Δ loss', scale: {scheme: 'blueorange', domain: [-m, m]}},
                  tooltip: [{field: 'router'}, {field: 'source'}, {field: 'dloss', format: '+.4f'}, {field: 'se', format: '.4f'}]}},
      {width: W / 2, height: {step: 12}, data: {values}, mark: 'rect',
       encoding: {x: {field: 'source', type: 'ordinal', sort: null}, y: {field: 'router', type: 'ordinal', sort: null, axis: null},
                  color: {field: 'mass', type: 'quantitative', title: 'weight', scale: {scheme: 'viridis', domain: [0, 1]}},
                  tooltip: [{field: 'router'}, {field: 'source'}, {field: 'mass', format: '.3f'}]}}],
    resolve: {scale: {color: 'independent'}}};
});
if (!ivRuns.length) ['chart-iv-scatter', 'chart-iv-depth'].forEach(id => {
  delete specs[id];
  document.getElementById(id).textContent = 'No interventions measured: attnres compare --interventions N, or attnres routing --interventions --json > RUN/interventions.json.';
  document.getElementById(id).className = 'chart empty';
});
// Routing heads (attnres_num_heads > 1): how far the heads' weights are from
// their consensus by depth, and per mode a heads × sources heatmap of its
// deepest router (the final router, or the last MLP's).
const multi = routed.filter(r => r.routing.heads > 1);
specs['chart-disagree'] = {
  title: "Routing heads' disagreement by depth (mean over heads and sources of |α_hi − mean_h α_hi|)", width: W, height: H,
  data: {values: multi.flatMap(r => r.routing.head_disagreement.map((v, i) => ({mode: r.mode, run: label(r), depth: i, router: r.routing.routers[i], value: v})))},
  mark: {type: 'line', point: true},
  encoding: {x: {field: 'depth', type: 'quantitative', title: 'router (depth)'}, y: {field: 'value', type: 'quantitative', title: 'disagreement'},
             color: modeColor, detail: {field: 'run'}, tooltip: [{field: 'router'}, {field: 'value', format: '.4f'}]}};
heatRuns.filter(r => r.routing.heads > 1).forEach((r, k) => {
  const div = chartDiv(heats, 'chart-heads-' + k);
  const i = r.routing.routers.length - 1;
  const values = r.routing.head_mean_weight[i].flatMap((row, h) => row.map((w, j) => ({head: 'head ' + h, source: j + ' ' + r.routing.sources[i][j], weight: w})));
  specs[div.id] = {
    title: r.mode + ': mean routing weight of each head, router ' + r.routing.routers[i] + ' (' + label(r) + ')', width: W, height: {step: 14},
    data: {values}, mark: 'rect',
    encoding: {x: {field: 'source', type: 'ordinal', sort: null}, y: {field: 'head', type: 'ordinal', sort: null},
               color: {field: 'weight', type: 'quantitative', scale: {scheme: 'viridis', domain: [0, 1]}},
               tooltip: [{field: 'head'}, {field: 'source'}, {field: 'weight', format: '.3f'}]}};
});
if (!multi.length) {
  delete specs['chart-disagree'];
  document.getElementById('chart-disagree').textContent = 'No run with routing heads (attnres_num_heads > 1): no disagreement to draw.';
  document.getElementById('chart-disagree').className = 'chart empty';
}
if (!routed.length) ['chart-depth', 'chart-entropy', 'chart-evolution', 'chart-maxdist'].forEach(id => {
  delete specs[id];
  document.getElementById(id).textContent = 'No routed run: nothing to draw.';
  document.getElementById(id).className = 'chart empty';
});
Promise.all(Object.entries(specs).map(([id, spec]) =>
  vegaEmbed('#' + id, spec, {renderer: 'svg', actions: false}).catch(e => fail(id + ': ' + e))))
  .then(() => { document.body.dataset.rendered = 'yes'; });
)JS";

// The page's head: its style and the Vega scripts, inlined (the page opens offline).
std::string page_head(const std::string& vega_dir) {
  std::string page = "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>attnres report</title>\n<style>"
                     "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
                     "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
                     "pre{background:#f6f6f6;padding:8px;overflow-x:auto}#errors{color:#b00;white-space:pre}"
                     ".chart{margin:1.5em 0}</style>\n";
  for (const char* s : kScripts) page += "<script>" + script_safe(read_file((fs::path(vega_dir) / s).string())) + "</script>\n";
  return page + "</head><body>\n";
}

// The depth study's charts: per mode, the paired difference to baseline
// (mean, its 95% interval as a bar) and the mean validation loss against the
// number of layers.
const char* kDepthScript = R"JS(
const errors = document.getElementById('errors');
function fail(what) { errors.textContent += what + '\n'; }
window.addEventListener('error', e => fail('script error: ' + e.message));
const palette = ['#4c78a8', '#f58518', '#54a24b', '#e45756', '#b279a2', '#72b7b2', '#eeca3b', '#ff9da6', '#9d755d', '#bab0ac'];
const shown = STUDY.modes;
const modeColor = {field: 'mode', type: 'nominal', scale: {domain: shown, range: shown.map(m => palette[ALL_MODES.indexOf(m) % palette.length])}};
const layers = STUDY.depths.map(d => d.layers);
const xDepth = {field: 'layers', type: 'quantitative', title: 'layers', scale: {domain: [Math.min(...layers) * 0.8, Math.max(...layers) * 1.1]}, axis: {values: layers, format: 'd'}};
const deltas = STUDY.deltas.map(e => ({mode: e.mode, layers: e.layers, d: e.vs_baseline,
  lo: e.ci95 ? e.ci95[0] : e.vs_baseline, hi: e.ci95 ? e.ci95[1] : e.vs_baseline, p: e.p_adjusted}));
const specs = {};
specs['chart-delta'] = {
  title: 'Validation loss minus baseline\'s, paired by seed (bars: 95% interval), against depth', width: 560, height: 300,
  layer: [
    {data: {values: [{y: 0}]}, mark: {type: 'rule', color: '#888', strokeDash: [4, 4]}, encoding: {y: {field: 'y', type: 'quantitative'}}},
    {data: {values: deltas}, mark: {type: 'rule', strokeWidth: 2}, encoding: {x: xDepth, y: {field: 'lo', type: 'quantitative', title: 'Δ val loss (nats)'}, y2: {field: 'hi'}, color: modeColor}},
    {data: {values: deltas}, mark: {type: 'line', point: true}, encoding: {x: xDepth, y: {field: 'd', type: 'quantitative'}, color: modeColor,
      tooltip: [{field: 'mode'}, {field: 'layers'}, {field: 'd', title: 'Δ'}, {field: 'lo'}, {field: 'hi'}, {field: 'p', title: 'p (Holm)'}]}}]};
const losses = STUDY.depths.flatMap(d => shown.filter(m => d.summary[m]).map(m => ({mode: m, layers: d.layers, loss: d.summary[m].val_loss})));
specs['chart-loss'] = {
  title: 'Validation loss (mean over seeds) against depth', width: 560, height: 300,
  data: {values: losses}, mark: {type: 'line', point: true},
  encoding: {x: xDepth, y: {field: 'loss', type: 'quantitative', scale: {zero: false}, title: 'val loss'}, color: modeColor}};
Promise.all(Object.entries(specs).map(([id, spec]) =>
  vegaEmbed('#' + id, spec, {renderer: 'svg', actions: false}).catch(e => fail(id + ': ' + e))))
  .then(() => { document.body.dataset.rendered = 'yes'; });
)JS";

}  // namespace

void write_depth_report(const json& study, const std::string& out_html, const std::string& vega_dir) {
  std::string page = page_head(vega_dir) + "<h1>attnres: routing modes against depth</h1>\n<div id=\"errors\"></div>\n";
  page += "<p>" + html_escape(cat("made by attnres at commit ", commit(), " on ", machine())) + "</p>\n";
  page += "<div id=\"chart-delta\" class=\"chart\"></div><div id=\"chart-loss\" class=\"chart\"></div>\n";
  page += "<h2>Results</h2><pre>" + html_escape(study.value("table", "")) + "</pre><ul class=\"notes\">";
  for (const auto& n : study["notes"])
    if (n.is_string()) page += "<li>" + html_escape(n.get<std::string>()) + "</li>";
  page += "</ul>\n<h2>Each depth</h2><ul>";
  const fs::path here = fs::path(out_html).parent_path();
  for (const auto& d : study["depths"]) {
    const std::string dir = d["dir"].get<std::string>();
    const std::string rel = fs::relative(fs::path(dir) / "report.html", here.empty() ? fs::path(".") : here).string();
    page += cat("<li><a href=\"", html_escape(rel), "\">", d["layers"].get<int64_t>(), " layers</a>: ",
                html_escape(dir), "</li>");
  }
  page += "</ul>\n<h2>Settings</h2><pre>" + html_escape(study["settings"].dump(2, ' ', false, json::error_handler_t::replace)) + "</pre>\n";
  json all_modes = json::array();
  for (const ModeName& m : mode_names()) all_modes.push_back(m.name);
  page += "<script>\nconst STUDY = " + json_safe(json_text(study)) + ";\nconst ALL_MODES = " + json_safe(json_text(all_modes)) +
          ";\n" + kDepthScript + "</script>\n</body></html>\n";
  write_file_atomic(out_html, page);
}

std::string find_vega_dir(const std::string& flag) {
  std::vector<std::string> tried;
  if (!flag.empty()) {
    tried.push_back(flag);
  } else if (const char* env = std::getenv("ATTNRES_VEGA_DIR")) {
    tried.push_back(env);
  } else {
    std::error_code ec;
    const fs::path exe = fs::canonical("/proc/self/exe", ec);
    if (!ec) tried.push_back((exe.parent_path().parent_path() / "share/attnres/node_modules").string());
#ifdef ATTNRES_VEGA_INSTALL_DIR
    tried.push_back(ATTNRES_VEGA_INSTALL_DIR);
#endif
#ifdef ATTNRES_VEGA_SOURCE_DIR
    tried.push_back(ATTNRES_VEGA_SOURCE_DIR);
#endif
    if (!ec) tried.push_back((exe.parent_path().parent_path() / "third_party/npm/node_modules").string());
  }
  for (const std::string& d : tried) {
    bool all = true;
    for (const char* s : kScripts) all = all && fs::exists(fs::path(d) / s);
    if (all) return d;
  }
  std::string where;
  for (const std::string& d : tried) where += (where.empty() ? "" : ", ") + d;
  fail("the report needs Vega, Vega-Lite and vega-embed (inlined into the page, so it opens offline): run "
       "scripts/fetch_vega.sh, or pass --vega-dir NODE_MODULES (looked in: ",
       where.empty() ? std::string("nothing") : where, ")");
}

json read_report_data(const std::vector<std::string>& dirs) {
  if (dirs.empty()) fail("name at least one run or comparison directory (attnres report DIR... --out FILE)");
  json data = {{"runs", json::array()}, {"comparisons", json::array()}, {"machine", machine()}, {"commit", commit()},
               {"tables", json::array()}, {"warnings", json::array()},
               {"sweeps", json::array()}};
  for (const std::string& dir : dirs) {
    if (fs::exists(dir + "/results.json")) {
      const std::string path = dir + "/results.json";
      const json r = parse_json(read_file(path), path);
      if (r.is_object() && r.contains("depths"))
        fail(dir, ": is a depth study (compare --layers): its page is ", dir, "/report.html, and each depth's "
             "comparison (", dir, "/layers-L) is one attnres report takes");
      if (!r.is_object() || !r.contains("runs") || !r["runs"].is_array())
        fail(path, ": has no 'runs' list (not the results of attnres compare)");
      for (size_t i = 0; i < r["runs"].size(); ++i) {
        check_run_record(r["runs"][i], cat(path, ": runs[", i, "]"));
        data["runs"].push_back(r["runs"][i]);
      }
      for (const char* k : {"settings", "notes"})
        if (!r.contains(k)) fail(path, ": '", k, "' is missing");
      data["comparisons"].push_back({{"dir", dir}, {"settings", r["settings"]}, {"notes", r["notes"]}});
      if (r.contains("sweep")) {  // compare --lrs: each rate's loss on the tuning split
        if (!r["sweep"].is_array()) fail(path, ": 'sweep' is not a list");
        for (size_t i = 0; i < r["sweep"].size(); ++i) {
          const json& w = r["sweep"][i];
          check_sweep_record(w, cat(path, ": sweep[", i, "]"));
          data["sweeps"].push_back({{"mode", w["mode"]}, {"lr", w["lr"]}, {"lr_routing", w["lr_routing"]},
                                    {"tuning_loss", w["val_loss"]}, {"diverged", w["diverged"]},
                                    {"chosen", w.value("chosen", false)}, {"comparison", dir}});
        }
      }
      if (fs::exists(dir + "/results.md")) data["tables"].push_back({{"dir", dir}, {"md", read_file(dir + "/results.md")}});
    } else if (fs::exists(dir + "/log.jsonl")) {
      data["runs"].push_back(single_run(dir, data["warnings"]));
    } else {
      fail(dir, ": neither a comparison (results.json) nor a training run (log.jsonl)");
    }
  }
  if (data["runs"].empty()) fail("no runs to report");
  return data;
}

void write_report(const json& data_in, const std::string& out_html, const std::string& vega_dir) {
  json data = data_in;
  // The results as one HTML table (results.md holds the same as Markdown),
  // each comparison's notes below it.
  std::string table, notes;
  for (const auto& c : data["comparisons"])
    if (c.contains("notes") && c["notes"].is_array())
      for (const auto& n : c["notes"])
        if (n.is_string()) notes += "<li>" + html_escape(n.get<std::string>()) + "</li>";
  data.erase("tables");
  // One colour per mode on the whole page, the same in every report: the
  // mode names in their order (model/config.h: the five, then the _mh ones), each with its colour.
  data["modes"] = json::array();
  for (const ModeName& m : mode_names()) data["modes"].push_back(m.name);
  // The table of every run.
  table += "<table><tr><th>run</th><th>mode</th><th>seed</th><th>steps</th><th>val loss</th><th>val ppl</th>"
           "<th>tok/s</th><th>peak RSS MiB</th><th>parameters</th></tr>";
  auto num = [](const json& j, const char* k, int digits) -> std::string {
    if (!j.contains(k) || !j[k].is_number()) return "-";
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", digits, j[k].get<double>());
    return b;
  };
  for (const auto& r : data["runs"])
    table += cat("<tr><td>", html_escape(r.value("dir", "")), "</td><td>", html_escape(r.value("mode", "")), "</td><td>",
                 r.value("seed", int64_t{0}), "</td><td>", r.value("steps", int64_t{0}),
                 r.value("cut", false) ? " (cut)" : "", "</td><td>", num(r, "val_loss", 4), "</td><td>",
                 num(r, "val_ppl", 2), "</td><td>", num(r, "tok_per_s", 0), "</td><td>",
                 r.contains("peak_rss_bytes") ? cat(r["peak_rss_bytes"].get<int64_t>() >> 20) : std::string("-"),
                 "</td><td>", r.value("params", int64_t{0}), "</td></tr>");
  table += "</table>";
  if (!notes.empty()) table += "<ul class=\"notes\">" + notes + "</ul>";

  std::string page = page_head(vega_dir) + "<h1>attnres: routing modes compared</h1>\n<div id=\"errors\"></div>\n";
  page += "<p>" + html_escape(cat(data["runs"].size(), " run(s); made by attnres at commit ", data["commit"].get<std::string>(),
                                  " on ", data["machine"].get<std::string>())) + "</p>\n";
  page += "<h2>Results</h2>\n" + table + "\n";
  page += "<h2>Validation</h2><div id=\"chart-val\" class=\"chart\"></div><div id=\"chart-ppl\" class=\"chart\"></div>\n";
  page += "<h2>First steps</h2><div id=\"chart-first\" class=\"chart\"></div>\n";
  page += "<h2>Learning rates</h2><div id=\"chart-sweep\" class=\"chart\"></div>\n";
  page += "<h2>Routing</h2><p>Per router: the per-token largest routing weight (mean over tokens), the entropy of the "
          "routing distribution, and the mean weight on each source; from each run's final model on validation "
          "tokens (attnres compare) or from the last training batches logged with --routing-every.</p>"
          "<div id=\"chart-depth\" class=\"chart\"></div><div id=\"chart-maxdist\" class=\"chart\"></div>"
          "<div id=\"chart-entropy\" class=\"chart\"></div>"
          "<div id=\"chart-evolution\" class=\"chart\"></div><div id=\"chart-disagree\" class=\"chart\"></div>"
          "<div id=\"heatmaps\"></div>\n";
  page += "<h2>Interventions</h2><p>What routing does, not only how it weighs: for each router and source, the "
          "change of the validation loss when the source is ablated there (it leaves the router's softmax, the "
          "other weights renormalised), and per router under mean routing (its weights replaced by their mean over "
          "the tokens) and uniform routing (docs/routing.md, \"Interventions\").</p>"
          "<div id=\"chart-iv-scatter\" class=\"chart\"></div><div id=\"chart-iv-depth\" class=\"chart\"></div>"
          "<div id=\"iv-heatmaps\"></div>\n";
  page += "<h2>Settings</h2><pre>" + html_escape(json({{"comparisons", data["comparisons"]}}).dump(2, ' ', false, json::error_handler_t::replace)) + "</pre>\n";
  page += "<script>\nconst DATA = " + json_safe(json_text(data)) + ";\n" + kPageScript + "</script>\n</body></html>\n";
  write_file_atomic(out_html, page);
}

}  // namespace attnres
