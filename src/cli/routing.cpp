// routing.cpp — `attnres routing`: the routing statistics of a checkpoint
// (docs/routing.md, "Routing statistics") over the tokens of a file.
//
// For every router: the mean weight of each source, max_weight (the largest
// mean weight), token_max (the mean over tokens of the largest weight),
// entropy (nats) and the mean pairwise cosine similarity of its sources.
// The file is read in consecutive windows of T tokens, B windows per
// forward; only whole windows are used.  This is analysis only: no loss.
//
// With --interventions, instead: the causal probes of eval/interventions.h —
// for every router, Δ loss when each source is ablated, under mean routing
// and under uniform routing (and, with --whole-sources, when a source is
// removed from every router reading it), beside each source's routing mass.
#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "ops/context.h"
#include "core/progress.h"
#include "core/timer.h"
#include "infer/load.h"
#include "data/corpus.h"
#include "eval/interventions.h"
#include "eval/routing_stats.h"
#include "io/token_file.h"
#include "model/model.h"
#include "model/modes.h"
#include "model/overflow.h"

namespace attnres {

namespace {

std::string effect_text(const Effect& e) {
  char b[64];
  if (std::isfinite(e.se)) std::snprintf(b, sizeof b, "%+.4f ± %.4f", e.dloss, e.se);
  else std::snprintf(b, sizeof b, "%+.4f", e.dloss);
  return b;
}

void print_interventions(const InterventionResult& r, const std::string& model, const std::string& data, bool json,
                         const ContextOptions& co) {
  if (json) {
    nlohmann::json j = r.to_json();
    j["model"] = model;
    j["data"] = data;
    j["precision"] = precision_name(co.precision);
    j["device"] = co.device;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("%s (%s) on %s: %lld tokens in %lld windows, loss %.4f; %lld intervened forwards, %.1f s\n",
              model.c_str(), r.mode.c_str(), data.c_str(), static_cast<long long>(r.tokens),
              static_cast<long long>(r.windows), r.loss, static_cast<long long>(r.interventions), r.seconds);
  std::printf("Δ loss in nats per token (± standard error over windows); mass: the mean routing weight\n");
  for (const RouterEffects& re : r.routers) {
    std::printf("\n%-16s mean routing %s   uniform %s\n", re.name.c_str(), effect_text(re.mean).c_str(),
                effect_text(re.uniform).c_str());
    for (size_t i = 0; i < re.sources.size(); ++i)
      std::printf("  %-16s mass %.3f   ablated %s\n", re.sources[i].c_str(), re.mass[i],
                  effect_text(re.ablate[i]).c_str());
  }
  if (!r.whole_sources.empty()) {
    std::printf("\nwhole sources, removed from every router reading them:\n");
    for (const SourceEffect& s : r.whole_sources)
      std::printf("  %-16s %3lld routers   %s\n", s.name.c_str(), static_cast<long long>(s.routers),
                  effect_text(s.ablate).c_str());
  }
}

}  // namespace

int cmd_routing(int argc, char** argv) {
  struct {
    ModelFlags model;
    WindowOptions window;
    bool quiet = false, json = false;
    bool interventions = false, whole_sources = false;
    int64_t intervention_tokens = 0;
    std::string routers;
    ContextOptions context;
  } o;
  OptionList opts("routing",
                  "Routing statistics of a checkpoint (weights per source, max weight, entropy, source cosine).");
  add_model_options(opts, o.model, false);
  add_window_options(opts, o.window, "65536", "use at most the first N tokens (0 = all)");
  opts.add(o.quiet, {"quiet", "false", "no progress line on stderr"});
  opts.add(o.json, {"json", "false", "print one JSON object (per-router arrays) instead of a table"});
  opts.add(o.interventions, {"interventions", "false",
                             "causal probes instead of statistics: the change of the loss when each router loses "
                             "each source, and under mean and uniform routing (docs/routing.md, \"Interventions\")"});
  opts.add(o.intervention_tokens, {"intervention-tokens", "8192",
                                   "--interventions: predicted tokens to measure on (whole windows of --seq-len)"});
  opts.add(o.routers, {"routers", "",
                       "--interventions: only these routers (comma-separated names or indices; default all)"});
  opts.add(o.whole_sources, {"whole-sources", "false",
                             "--interventions: also remove each source from every router that reads it at once"});
  add_context_options(opts, o.context);
  if (!opts.parse(argc, argv)) return 0;
  const WindowOptions& w = o.window;
  const ContextOptions& co = o.context;
  const ModelSource src = open_model(o.model.model);
  const std::string& dir = src.dir;
  const Config& c = src.config;
  if (!mode_spec(c.mode).routed()) fail(dir, ": attnres_mode is baseline: the model has no depth routing");
  check_positions(c, w.seq_len, "--seq-len");
  if (opts.given("routers") && o.routers.empty())
    fail("--routers: an empty list (give router names or indices, or leave the flag out for every router)");
  const int64_t T = w.seq_len, B = w.batch, max_tokens = w.max_tokens;
  const TokenFile data(w.data);
  data.check_vocab(c.V);
  const int64_t n = max_tokens > 0 ? std::min<int64_t>(static_cast<int64_t>(data.size()), max_tokens)
                                   : static_cast<int64_t>(data.size());
  if (n / T == 0) fail(w.data, ": ", n, " tokens, fewer than one window of --seq-len ", T);
  if (!o.interventions && (opts.given("intervention-tokens") || opts.given("routers") || opts.given("whole-sources")))
    fail("--intervention-tokens, --routers and --whole-sources go with --interventions");
  if (o.interventions && o.intervention_tokens < T)
    fail("--intervention-tokens ", o.intervention_tokens, ": at least one window of --seq-len ", T);

  const std::unique_ptr<Context> ctx = open_context(co);
  // Buffers for the windows read, not for --batch (issue 48: --batch 100000 for 8 windows asked for 18 GiB).
  const int64_t windows = o.interventions ? std::max<int64_t>(1, std::min(o.intervention_tokens, n - 1) / T) : n / T;
  const std::unique_ptr<Model> model_ptr =
      load_model(src, *ctx, {.batch = std::min(B, windows), .seq_len = T}, co.precision);
  Model& model = *model_ptr;
  if (o.interventions) {
    InterventionOptions io{.batch = model.B(), .seq_len = T, .tokens = o.intervention_tokens,
                           .routers = o.routers.empty() ? std::vector<std::string>{} : split_commas(o.routers),
                           .whole_sources = o.whole_sources};
    const InterventionResult r = measure_interventions(model, data, io, o.quiet ? nullptr : stderr);
    print_interventions(r, dir, w.data, o.json, co);
    return 0;
  }
  const double t0 = now_seconds();
  Progress progress(o.quiet ? nullptr : stderr, "routing", static_cast<uint64_t>(n / T));
  const RoutingStats stats = measure_routing(model, data, T, model.B(), max_tokens, &progress);
  const double seconds = now_seconds() - t0;

  nlohmann::json j = stats.to_json();
  // Weights of NaN: the arithmetic overflowed, which no routing statistic may hide.
  std::function<bool(const nlohmann::json&)> finite = [&](const nlohmann::json& v) {
    if (v.is_array()) return std::all_of(v.begin(), v.end(), finite);
    return !v.is_number() || std::isfinite(v.get<double>());
  };
  for (const char* key : {"mean_weight", "token_max", "max_weight", "entropy"})
    if (!finite(j[key])) fail_overflow(model, cat(dir, ": the routing weights are not finite"));
  if (o.json) {
    j["model"] = dir;
    j["data"] = w.data;
    j["seq_len"] = T;
    j["seconds"] = seconds;
    j["precision"] = precision_name(co.precision);
    j["device"] = co.device;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s (%s) on %s: %lld tokens, T=%lld, %.1f s\n", dir.c_str(), c.mode_label(), w.data.c_str(),
              static_cast<long long>(j["tokens"].get<int64_t>()), static_cast<long long>(T), seconds);
  const bool heads = stats.heads > 1;  // then: the heads' disagreement, and each head's token max
  if (heads) std::printf("%lld routing heads per router\n", static_cast<long long>(stats.heads));
  std::printf("%-16s %3s %10s %9s %8s %7s  %s%s\n", "router", "S", "max_weight", "token_max", "entropy", "cosine",
              heads ? "disagree  token_max of each head  " : "", "mean weight per source");
  auto fixed3 = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", x);
    return std::string(b);
  };
  for (size_t r = 0; r < stats.routers.size(); ++r) {
    std::string weights;
    for (size_t i = 0; i < stats.sources[r].size(); ++i)
      weights += (i ? " " : "") + stats.sources[r][i] + "=" + fixed3(j["mean_weight"][r][i].get<double>());
    const auto& cs = j["cosine"][r];
    std::string per_head;
    if (heads) {
      per_head = cat("   ", fixed3(j["head_disagreement"][r].get<double>()), "  ");
      for (const auto& m : j["head_token_max"][r]) per_head += fixed3(m.get<double>()) + " ";
      per_head += " ";
    }
    std::printf("%-16s %3zu %10.3f %9.3f %8.3f %7s  %s%s\n", stats.routers[r].c_str(), stats.sources[r].size(),
                j["max_weight"][r].get<double>(), j["token_max"][r].get<double>(), j["entropy"][r].get<double>(),
                cs.is_null() ? "-" : fixed3(cs.get<double>()).c_str(), per_head.c_str(), weights.c_str());
  }
  return 0;
}

}  // namespace attnres
