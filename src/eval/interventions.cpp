// interventions.cpp — see interventions.h.
#include "eval/interventions.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"

namespace attnres {

namespace {

// One forward with interventions, and what it is for: router `router`'s
// source `source` ablated, its mean or uniform routing, or whole source
// `whole` (an index in InterventionResult::whole_sources) everywhere.
struct Job {
  enum class What { kAblate, kMean, kUniform, kWhole };
  What what;
  int result = 0;   // kWhole: the whole source; else the position in InterventionResult::routers
  int source = 0;   // kAblate: the position in the router's list
  int64_t start = 0;  // the first sublayer it changes: the prefix it runs from
  std::vector<RouteIntervention> iv;
  // Σ over windows of the window's Δ (mean over its tokens), and of its square;
  // Σ over tokens of the difference.
  double sum_w = 0, sum_w2 = 0, sum_tokens = 0;
};

// The routers chosen by name or index, in forward order; all when none are named.
std::vector<int> chosen_routers(const std::vector<Router>& routers, const std::vector<std::string>& names) {
  std::vector<int> out;
  if (names.empty()) {
    for (size_t r = 0; r < routers.size(); ++r) out.push_back(static_cast<int>(r));
    return out;
  }
  for (const std::string& n : names) {
    int found = -1;
    for (size_t r = 0; r < routers.size(); ++r)
      if (routers[r].name == n || std::to_string(r) == n) found = static_cast<int>(r);
    if (found < 0)
      fail("--routers: no router '", visible(n), "' in this model (0 to ", routers.size() - 1, ", or names ",
           routers.front().name, " ... ", routers.back().name, ")");
    if (std::find(out.begin(), out.end(), found) == out.end()) out.push_back(found);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Router r ablating the source at position p of its list: every other one kept.
RouteIntervention ablate_one(const std::vector<Router>& routers, int r, int p) {
  std::vector<int> keep;
  for (int q = 0; q < static_cast<int>(routers[r].src.size()); ++q)
    if (q != p) keep.push_back(q);
  return RouteIntervention::ablate(r, std::move(keep));
}

// Router r with every position that reads source j (an index in the model)
// removed: a router may list one source twice (full_v: the stream is also
// the last state), and removing a source removes all of it.
RouteIntervention ablate_source(const std::vector<Router>& routers, int r, int j) {
  std::vector<int> keep;
  for (int q = 0; q < static_cast<int>(routers[r].index.size()); ++q)
    if (routers[r].index[q] != j) keep.push_back(q);
  return RouteIntervention::ablate(r, std::move(keep));
}

Effect effect_of(const Job& j, int64_t windows, int64_t tokens) {
  Effect e;
  e.dloss = j.sum_tokens / static_cast<double>(tokens);
  if (windows < 2) {
    e.se = std::numeric_limits<double>::quiet_NaN();
  } else {
    const double W = static_cast<double>(windows), m = j.sum_w / W;
    const double var = std::max(0.0, (j.sum_w2 - W * m * m) / (W - 1));
    e.se = std::sqrt(var / W);
  }
  return e;
}

}  // namespace

InterventionResult measure_interventions(Model& model, const TokenFile& data, const InterventionOptions& o,
                                         FILE* progress_out) {
  const std::vector<Router>& routers = model.routers();
  if (routers.empty()) fail("routing interventions need a model with depth routing; this one is baseline");
  const int64_t T = o.seq_len, B = o.batch, H = model.config().routing_heads;
  ATTNRES_CHECK(T > 0 && B > 0 && B <= model.B() && T <= model.T(), "interventions: windows of B=", B, " T=", T,
                " for a model of ", model.B(), " x ", model.T());
  if (o.tokens < T) fail("--intervention-tokens ", o.tokens, ": the budget must cover at least one window of ", T);
  const int64_t file_windows = (static_cast<int64_t>(data.size()) - 1) / T;  // whole windows of T+1 tokens
  if (file_windows < 1)
    fail(data.path(), ": ", data.size(), " tokens, fewer than one window of ", T, " + 1");
  const int64_t W = std::min(o.tokens / T, file_windows);
  const std::vector<int> chosen = chosen_routers(routers, o.routers);
  const double t0 = now_seconds();

  // The windows, read once: inputs and targets (W, T).
  std::vector<int32_t> inputs(static_cast<size_t>(W * T)), targets(static_cast<size_t>(W * T));
  {
    std::vector<int32_t> window(static_cast<size_t>(T + 1));
    for (int64_t w = 0; w < W; ++w) {
      data.read(static_cast<size_t>(w * T), {window.data(), window.size()});
      std::copy(window.begin(), window.end() - 1, inputs.begin() + w * T);
      std::copy(window.begin() + 1, window.end(), targets.begin() + w * T);
    }
  }

  // Pass 1: the plain model's per-token losses, and each router's weights.
  std::vector<float> plain(static_cast<size_t>(W * T));
  double plain_sum = 0;
  model.collect_routing_stats(true);
  for (int64_t w0 = 0; w0 < W; w0 += B) {
    const int64_t nb = std::min(B, W - w0);
    plain_sum += model.loss_sum(inputs.data() + w0 * T, targets.data() + w0 * T, nb, T).sum;
    const std::vector<float> l = model.token_losses();
    std::copy(l.begin(), l.begin() + nb * T, plain.begin() + w0 * T);
  }
  const RoutingStats stats = model.routing_stats();
  model.collect_routing_stats(false);

  InterventionResult res;
  res.mode = model.config().mode_label();
  res.heads = H;
  res.windows = W;
  res.tokens = W * T;
  res.loss = plain_sum / static_cast<double>(W * T);

  // The jobs: per chosen router its ablations, mean and uniform routing.
  std::vector<Job> jobs;
  for (int r : chosen) {
    const Router& R = routers[r];
    const RouteStats& a = stats.acc[r];
    const int64_t S = static_cast<int64_t>(R.src.size());
    const double n = static_cast<double>(std::max<int64_t>(a.tokens, 1));
    RouterEffects re;
    re.name = R.name;
    re.sublayer = R.k;
    re.sources = R.source_names;
    for (int64_t i = 0; i < S; ++i) re.mass.push_back(a.weight_sum[i] / n);
    re.ablate.resize(static_cast<size_t>(S));
    const int at = static_cast<int>(res.routers.size());
    res.routers.push_back(std::move(re));
    for (int i = 0; i < static_cast<int>(S); ++i)
      jobs.push_back({Job::What::kAblate, at, i, R.k, {ablate_one(routers, r, i)}});
    std::vector<double> mean;  // (H, S): each head's own mean weights
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) mean.push_back((H > 1 ? a.head_weight_sum[h * S + i] : a.weight_sum[i]) / n);
    jobs.push_back({Job::What::kMean, at, 0, R.k, {RouteIntervention::fixed(r, mean)}});
    const std::vector<double> uniform(static_cast<size_t>(H * S), 1.0 / static_cast<double>(S));
    jobs.push_back({Job::What::kUniform, at, 0, R.k, {RouteIntervention::fixed(r, uniform)}});
  }
  if (o.whole_sources) {  // every source tensor that more than one router reads, from all of them at once
    struct Readers {
      std::string name;
      std::vector<std::pair<int, int>> at;  // (router, position in its list)
    };
    std::map<int, Readers> readers;  // by the source's index in the model (null sources are one router's own)
    for (size_t r = 0; r < routers.size(); ++r)
      for (size_t p = 0; p < routers[r].index.size(); ++p) {
        const int j = routers[r].index[p];
        if (j < 0) continue;
        Readers& e = readers[j];
        // block's "partial" is the running sum; at a block start it is the block that later routers name
        if (e.name.empty() || e.name == "partial") e.name = routers[r].source_names[p];
        e.at.push_back({static_cast<int>(r), static_cast<int>(p)});
      }
    for (const auto& [index, e] : readers) {
      Job j{Job::What::kWhole, static_cast<int>(res.whole_sources.size()), 0, 2 * model.config().L, {}};
      for (const auto& [r, p] : e.at) {
        if (!j.iv.empty() && j.iv.back().router == r) continue;  // its other positions: removed with the first
        j.iv.push_back(ablate_source(routers, r, index));
        j.start = std::min(j.start, routers[r].k);
      }
      if (j.iv.size() < 2) continue;  // one router's: its per-router ablation says it
      res.whole_sources.push_back({e.name, static_cast<int64_t>(j.iv.size()), {}});
      jobs.push_back(std::move(j));
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.start < b.start; });

  // Pass 2: per batch of windows, the forward up to each job's router once,
  // then the rest of it per job.
  const int64_t batches = (W + B - 1) / B;
  const uint64_t total = static_cast<uint64_t>(batches * static_cast<int64_t>(jobs.size()));
  Progress progress(progress_out, "interventions", total);
  IntervenedForward run(model);
  for (int64_t w0 = 0; w0 < W; w0 += B) {
    const int64_t nb = std::min(B, W - w0);
    run.begin(inputs.data() + w0 * T, nb, T);
    for (Job& j : jobs) {
      run.advance(j.start);
      run.loss(targets.data() + w0 * T, j.iv);
      const std::vector<float> l = model.token_losses();
      for (int64_t b = 0; b < nb; ++b) {
        double dw = 0;
        for (int64_t t = 0; t < T; ++t)
          dw += static_cast<double>(l[b * T + t]) - static_cast<double>(plain[(w0 + b) * T + t]);
        j.sum_tokens += dw;
        dw /= static_cast<double>(T);
        j.sum_w += dw;
        j.sum_w2 += dw * dw;
      }
      const uint64_t done = static_cast<uint64_t>(++res.interventions);
      progress.update(done, progress.rate(done, "forwards"));
    }
  }
  progress.finish(progress.rate(static_cast<uint64_t>(res.interventions), "forwards"));

  for (const Job& j : jobs) {
    const Effect e = effect_of(j, W, W * T);
    switch (j.what) {
      case Job::What::kAblate: res.routers[j.result].ablate[j.source] = e; break;
      case Job::What::kMean: res.routers[j.result].mean = e; break;
      case Job::What::kUniform: res.routers[j.result].uniform = e; break;
      case Job::What::kWhole: res.whole_sources[j.result].ablate = e; break;
    }
  }
  res.seconds = now_seconds() - t0;
  return res;
}

// The records as `routing --interventions --json` writes them: one
// conversion per type (nlohmann's to_json, found by argument-dependent
// lookup), each key once.
void to_json(nlohmann::json& j, const Effect& e) {
  j = {{"dloss", e.dloss}, {"se", std::isfinite(e.se) ? nlohmann::json(e.se) : nlohmann::json(nullptr)}};
}

void to_json(nlohmann::json& j, const RouterEffects& r) {
  j = {{"router", r.name},   {"sublayer", r.sublayer},       {"sources", r.sources},        {"mass", r.mass},
       {"ablate", r.ablate}, {"mean_routing", r.mean}, {"uniform_routing", r.uniform}};
}

void to_json(nlohmann::json& j, const SourceEffect& s) {
  j = s.ablate;
  j["source"] = s.name;
  j["routers"] = s.routers;
}

void to_json(nlohmann::json& j, const InterventionResult& r) {
  j = {{"mode", r.mode},       {"routing_heads", r.heads},         {"tokens", r.tokens},
       {"windows", r.windows}, {"loss", r.loss},                   {"interventions", r.interventions},
       {"seconds", r.seconds}, {"routers", r.routers},             {"whole_sources", r.whole_sources}};
}

nlohmann::json InterventionResult::to_json() const { return *this; }

}  // namespace attnres
