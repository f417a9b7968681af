// routing.cpp — `attnres routing`: the routing statistics of a checkpoint
// (docs/routing.md, "Routing statistics") over the tokens of a file.
//
// For every router: the mean weight of each source, max_weight (the largest
// mean weight), token_max (the mean over tokens of the largest weight),
// entropy (nats) and the mean pairwise cosine similarity of its sources.
// The file is read in consecutive windows of T tokens, B windows per
// forward; only whole windows are used.  This is analysis only: no loss.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/context.h"
#include "core/progress.h"
#include "core/timer.h"
#include "infer/load.h"
#include "eval/routing_stats.h"
#include "io/token_file.h"
#include "model/model.h"
#include "model/modes.h"

namespace attnres {

int cmd_routing(int argc, char** argv) {
  struct {
    ModelFlags model;
    WindowOptions window;
    bool quiet = false, json = false;
    ContextOptions context;
  } o;
  OptionList opts("routing",
                  "Routing statistics of a checkpoint (weights per source, max weight, entropy, source cosine).");
  add_model_options(opts, o.model, false);
  add_window_options(opts, o.window, "65536", "use at most the first N tokens (0 = all)");
  opts.add(o.quiet, {"quiet", "false", "no progress line on stderr"});
  opts.add(o.json, {"json", "false", "print one JSON object (per-router arrays) instead of a table"});
  add_context_options(opts, o.context);
  if (!opts.parse(argc, argv)) return 0;
  const WindowOptions& w = o.window;
  const ContextOptions& co = o.context;
  const ModelSource src = open_model(o.model.model);
  const std::string& dir = src.dir;
  const Config& c = src.config;
  if (!mode_spec(c.mode).routed()) fail(dir, ": attnres_mode is baseline: the model has no depth routing");
  const int64_t T = w.seq_len, B = w.batch, max_tokens = w.max_tokens;
  const TokenFile data(w.data);
  data.check_vocab(c.V);
  const int64_t n = max_tokens > 0 ? std::min<int64_t>(static_cast<int64_t>(data.size()), max_tokens)
                                   : static_cast<int64_t>(data.size());
  if (n / T == 0) fail(w.data, ": ", n, " tokens, fewer than one window of --seq-len ", T);

  const std::unique_ptr<Context> ctx = open_context(co);
  const std::unique_ptr<Model> model_ptr = load_model(src, *ctx, {.batch = B, .seq_len = T}, co.precision);
  Model& model = *model_ptr;
  const double t0 = now_seconds();
  Progress progress(o.quiet ? nullptr : stderr, "routing", static_cast<uint64_t>(n / T));
  const RoutingStats stats = measure_routing(model, data, T, B, max_tokens, &progress);
  const double seconds = now_seconds() - t0;

  nlohmann::json j = stats.to_json();
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
