// comparison.cpp — see comparison.h.
#include "experiment/comparison.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "core/spawn.h"
#include "core/timer.h"
#include "experiment/paired_stats.h"
#include "io/checkpoint.h"
#include "io/token_file.h"
#include "model/config.h"
#include "model/modes.h"
#include "model/params.h"
#include "report/report.h"
#include "report/run_log.h"

namespace attnres {

namespace fs = std::filesystem;

std::vector<std::string> list_items(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t end = std::min(s.find(',', at), s.size());
    out.push_back(s.substr(at, end - at));
    if (end == s.size()) return out;
    at = end + 1;
  }
}

std::vector<std::string> split_modes(const std::string& s) {
  std::vector<std::string> out;
  for (const std::string& item : list_items(s)) {
    if (item.empty()) fail("--modes '", s, "': an empty name (two commas, or one at an end)");
    if (std::find(out.begin(), out.end(), item) != out.end())
      fail("--modes '", s, "' names ", item, " twice (each mode runs once per seed; --seeds N runs more)");
    out.push_back(item);
  }
  return out;
}

std::string fmt(double x, int digits) {
  if (std::isnan(x)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}

std::vector<double> parse_rates(const std::string& s, const char* flag) {
  std::vector<double> out;
  if (s.empty()) return out;
  for (const std::string& item : list_items(s)) {
    double x = 0;
    size_t used = 0;
    try {
      x = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || !std::isfinite(x) || x <= 0)
      fail(flag, " '", s, "': '", item, "' is not a positive learning rate");
    if (std::find(out.begin(), out.end(), x) != out.end())
      fail(flag, " '", s, "' names ", item, " twice (each rate is one run of the sweep)");
    out.push_back(x);
  }
  return out;
}

std::string fmt_rate(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

namespace {

bool given(const Comparison& o, const char* flag) {  // "--lr-min=": given to compare, passed to every run
  for (const std::string& a : o.passed_fixed)
    if (a.rfind(flag, 0) == 0) return true;
  return false;
}

}  // namespace

std::vector<std::string> Rates::flags(const Comparison& o) const {
  std::vector<std::string> out;
  if (!o.lrs.empty()) {  // lr swept (else the run's --lr, passed as given)
    out.push_back("--lr=" + fmt_rate(lr));
    if (!given(o, "--lr-min=")) out.push_back("--lr-min=" + fmt_rate(TrainOptions::default_lr_min(lr)));
  }
  if (lr_routing) {
    out.push_back("--lr-routing=" + fmt_rate(*lr_routing));
    if (!given(o, "--lr-min-routing="))
      out.push_back("--lr-min-routing=" + fmt_rate(TrainOptions::default_lr_min(*lr_routing)));
  }
  return out;
}

std::string Rates::text() const {
  return cat("lr ", fmt_rate(lr), lr_routing ? cat(", routing ", fmt_rate(*lr_routing)) : std::string());
}

std::vector<Rates> sweep_points(const Comparison& o, const std::string& mode) {
  const bool routed = mode_spec(parse_mode_name(mode).mode).routed();
  const std::vector<double> lrs = o.lrs.empty() ? std::vector<double>{o.t.lr} : o.lrs;
  std::vector<Rates> out;
  for (double lr : lrs) {
    if (!routed || o.lrs_routing.empty()) out.push_back({lr, std::nullopt});
    else
      for (double r : o.lrs_routing) out.push_back({lr, r});
  }
  return out;
}

std::vector<ComparisonRun> sweep_runs(const Comparison& o) {
  std::vector<ComparisonRun> runs;
  if (!o.sweeping()) return runs;
  for (const std::string& m : o.modes) {
    const std::vector<Rates> points = sweep_points(o, m);
    if (points.size() < 2) continue;  // nothing to choose (baseline under --lrs-routing alone)
    for (const Rates& p : points) {
      ComparisonRun r{m, cat(o.out, "/sweep/", m, "-lr", fmt_rate(p.lr),
                             p.lr_routing ? "-routing" + fmt_rate(*p.lr_routing) : std::string()),
                      static_cast<int64_t>(o.seed)};
      r.steps = o.sweep_steps;
      r.val_data = o.out + "/tuning.bin";
      r.computed = o.sweep_computed;
      r.rates = p;
      r.sweep = true;
      runs.push_back(std::move(r));
    }
  }
  return runs;
}

std::vector<ComparisonRun> seed_runs(const Comparison& o) {
  std::vector<ComparisonRun> runs;
  for (const std::string& m : o.modes)
    for (int64_t k = 0; k < o.seeds; ++k) {
      ComparisonRun r{m, cat(o.out, "/", m, "-seed", o.seed + k), static_cast<int64_t>(o.seed + k)};
      r.steps = o.steps;
      r.val_data = o.val_data;
      r.computed = o.computed;
      runs.push_back(std::move(r));
    }
  return runs;
}

namespace {

Rates rates_of(const nlohmann::json& r) {
  Rates x;
  x.lr = r["lr"].get<double>();
  if (r.contains("lr_routing") && r["lr_routing"].is_number()) x.lr_routing = r["lr_routing"].get<double>();
  return x;
}

}  // namespace

RateChoice choose_rate(const std::string& mode, const nlohmann::json& sweep_records, int64_t sweep_steps) {
  nlohmann::json live = nlohmann::json::array();
  std::string diverged;
  for (const auto& r : sweep_records) {
    if (r["mode"] != mode) continue;
    if (r.value("diverged", false)) diverged += cat(diverged.empty() ? "" : "; ", rates_of(r).text());
    else live.push_back(r);
  }
  if (live.empty()) fail(mode, ": every rate of its sweep diverged (", diverged, "): sweep lower --lrs");
  const Matched m = match_runs(live, sweep_steps);
  if (!m.comparable)
    fail(mode, ": --minutes cut its sweep before its runs shared a validation, so no rate can be chosen; rerun "
               "with more --minutes (the finished runs are kept)");
  RateChoice c;
  c.tuning_loss = INFINITY;
  for (const auto& r : live)  // in the order listed: a tie keeps the first
    if (const double loss = m.loss_of(r); loss < c.tuning_loss) c.tuning_loss = loss, c.rates = rates_of(r);
  if (!std::isfinite(c.tuning_loss)) fail(mode, ": no rate of its sweep has a finite tuning loss");
  c.step = m.step;
  c.at_matched_step = !m.cut_runs.empty();
  return c;
}

// The mean of the per-token max weight over the deepest third of a run's routers.
double deep_max_weight(const nlohmann::json& routing) {
  if (!routing.is_object() || !routing.contains("token_max")) return NAN;
  const auto& tm = routing["token_max"];
  const size_t n = tm.size(), from = n - std::max<size_t>(1, n / 3);
  double s = 0;
  for (size_t i = from; i < n; ++i) s += tm[i].get<double>();
  return n ? s / static_cast<double>(n - from) : NAN;
}

Matched match_runs(const nlohmann::json& results, int64_t steps) {
  Matched m;
  int64_t same_until = steps;  // every run trained as planned up to this step
  for (const auto& r : results)
    if (r["cut"].get<bool>()) {
      m.cut_runs.push_back(cat(r["mode"].get<std::string>(), " seed ", r["seed"].get<int64_t>(), " at step ",
                               r["steps"].get<int64_t>()));
      const int64_t at = r.value("schedule_cut_at", int64_t{0});
      same_until = std::min(same_until, at > 0 ? at : int64_t{0});
    }
  m.step = m.cut_runs.empty() ? steps : 0;
  if (!m.cut_runs.empty())
    for (const auto& v : results.front()["val_curve"]) {  // the latest step ≤ same_until that every run validated at
      const int64_t k = v["step"].get<int64_t>();
      if (k > same_until || k <= m.step) continue;
      bool everyone = true;
      for (const auto& r : results) {
        bool has = false;
        for (const auto& w : r["val_curve"]) has = has || w["step"].get<int64_t>() == k;
        everyone = everyone && has;
      }
      if (everyone) m.step = k;
    }
  m.comparable = m.cut_runs.empty() || m.step > 0;
  return m;
}

ModeTable mode_table(const std::vector<std::string>& modes, const nlohmann::json& results, const Matched& match,
                     int64_t seeds, int64_t steps) {
  ModeTable out;
  std::string& table = out.table;
  nlohmann::json& summary = out.summary;
  std::vector<std::string>& notes = out.notes;
  const bool comparable = match.comparable;
  const int64_t matched_step = match.step;
  table =
      "| mode | val loss (mean ± spread) | val ppl | vs baseline (95% CI; Holm p) | tok/s | peak RSS MiB | parameters | "
      "deep max weight | steps | lr |\n|---|---|---|---|---|---|---|---|---|---|\n";
  // Each mode against baseline seed by seed (the runs of a seed share their
  // initial weights and data order): the paired differences, their interval,
  // and p corrected over the modes compared (experiment/paired_stats.h).
  std::map<int64_t, double> base_by_seed;
  for (const auto& r : results)
    if (r["mode"] == "baseline") base_by_seed[r["seed"].get<int64_t>()] = match.loss_of(r);
  std::map<std::string, PairedDifference> paired;
  std::vector<std::string> tested;  // the modes with a p-value, in order
  std::vector<double> p_raw;
  if (match.comparable && !base_by_seed.empty())
    for (const std::string& m : modes) {
      if (m == "baseline") continue;
      std::vector<double> diffs;
      for (const auto& r : results)
        if (r["mode"] == m)
          if (auto b = base_by_seed.find(r["seed"].get<int64_t>()); b != base_by_seed.end())
            diffs.push_back(match.loss_of(r) - b->second);
      if (diffs.empty()) continue;
      paired[m] = paired_difference(diffs);
      if (paired[m].p) tested.push_back(m), p_raw.push_back(*paired[m].p);
    }
  std::map<std::string, double> p_adjusted;
  const std::vector<double> adj = holm(p_raw);
  for (size_t i = 0; i < tested.size(); ++i) p_adjusted[tested[i]] = adj[i];
  for (const std::string& m : modes) {
    std::vector<double> losses, speeds, deep, matched;
    int64_t rss = 0, params = 0, steps_min = steps, heads = 0;
    bool cut = false;
    std::string lr = "-";  // the rate the mode's runs trained at (one for all its seeds)
    double lr_value = NAN;
    for (const auto& r : results)
      if (r["mode"] == m) {
        if (r.contains("lr") && r["lr"].is_number()) lr = rates_of(r).text().substr(3), lr_value = r["lr"].get<double>();
        losses.push_back(r["val_loss"].get<double>());
        matched.push_back(match.loss_of(r));
        speeds.push_back(r["tok_per_s"].get<double>());
        rss = std::max(rss, r["peak_rss_bytes"].get<int64_t>());
        params = r["params"].get<int64_t>();
        heads = std::max(heads, r.value("routing_heads", int64_t{0}));
        steps_min = std::min(steps_min, r["steps"].get<int64_t>());
        cut = cut || r["cut"].get<bool>();
        if (r.contains("routing")) deep.push_back(deep_max_weight(r["routing"]));
      }
    double mean = 0, lo = INFINITY, hi = -INFINITY, speed = 0, dmw = 0;
    for (double x : losses) mean += x / static_cast<double>(losses.size()), lo = std::min(lo, x), hi = std::max(hi, x);
    for (double x : speeds) speed += x / static_cast<double>(speeds.size());
    for (double x : deep) dmw += x / static_cast<double>(deep.size());
    const double spread = (hi - lo) / 2;
    // What "vs baseline" compares: the final losses when every run trained as
    // planned, else those at matched_step (its mean and spread).
    double cmp = 0;
    for (double x : matched) cmp += x / static_cast<double>(matched.size());
    summary[m] = {{"val_loss", mean}, {"val_loss_min", lo}, {"val_loss_max", hi}, {"val_ppl", std::exp(mean)},
                  {"tok_per_s", speed}, {"peak_rss_bytes", rss}, {"params", params}, {"seeds", losses.size()},
                  {"deep_max_weight", deep.empty() ? nlohmann::json(nullptr) : nlohmann::json(dmw)},
                  {"steps", steps_min}, {"cut", cut},
                  {"lr", std::isnan(lr_value) ? nlohmann::json(nullptr) : nlohmann::json(lr_value)}};
    if (!match.cut_runs.empty())
      summary[m]["val_loss_at_matched_step"] = comparable ? nlohmann::json(cmp) : nlohmann::json(nullptr);
    std::string vs = "-";
    if (m != "baseline" && !comparable) {
      vs = "not comparable";
    } else if (m != "baseline" && paired.count(m)) {
      const PairedDifference& pd = paired[m];
      const double d = pd.mean;
      const std::string diff = cat(d >= 0 ? "+" : "", fmt(d, 4));
      const bool at_step = !match.cut_runs.empty();  // compared at matched_step, not at the end
      const std::string dv = cat(diff, " nats", at_step ? cat(" at step ", matched_step) : std::string());
      nlohmann::json& sm = summary[m];
      sm["vs_baseline"] = d;
      sm["paired_seeds"] = pd.n;
      sm["ci95"] = pd.lo ? nlohmann::json::array({*pd.lo, *pd.hi}) : nlohmann::json(nullptr);
      sm["p"] = pd.p ? nlohmann::json(*pd.p) : nlohmann::json(nullptr);
      sm["p_adjusted"] = pd.p ? nlohmann::json(p_adjusted[m]) : nlohmann::json(nullptr);
      if (!pd.lo) {
        vs = at_step ? cat(diff, " @", matched_step) : diff;
        notes.push_back(cat(m, " vs baseline: ", dv,
                            " from one seed each; seed noise is not measured (--seeds 3 gives an interval and a "
                            "corrected p)"));
      } else {
        const double pa = p_adjusted[m];
        const std::string ci = cat("[", fmt(*pd.lo, 4), ", ", fmt(*pd.hi, 4), "]");
        vs = cat(diff, " ", ci, "; p ", fmt(pa, 3), at_step ? cat(" @", matched_step) : std::string());
        const std::string held = tested.size() > 1 ? cat("Holm-adjusted over ", tested.size(), " modes")
                                                   : std::string("one mode compared");
        notes.push_back(cat(m, " vs baseline: ", dv, ", 95% interval ", ci, " (paired t over ", pd.n, " seeds), p ",
                            fmt(pa, 3), " (", held, "): ",
                            pa < 0.05 ? "a difference at the 5% level" : "no difference shown at this size",
                            pd.n == 2 ? cat("; with 2 seeds the interval is wide (±", fmt(*pd.hi - pd.mean, 4),
                                            ": t on one degree of freedom is 12.7)")
                                      : std::string()));
      }
    }
    // Routing heads beside the name when they are not the name's own (1, or 8 for the _mh names).
    const int64_t named_heads = parse_mode_name(m).heads;
    const bool say_heads = heads > 0 && heads != named_heads;
    table += cat("| ", m, say_heads ? cat(" (", heads, " routing heads)") : std::string(), " | ", fmt(mean, 4), seeds > 1 ? cat(" ± ", fmt(spread, 4)) : std::string(), " | ",
                 fmt(std::exp(mean), 2), " | ", vs, " | ", fmt(speed, 0), " | ", rss >> 20, " | ", params, " | ",
                 deep.empty() ? std::string("-") : fmt(dmw, 3), " | ", steps_min, cut ? " (cut)" : "", " | ", lr, " |\n");
  }
  return out;
}

void check_or_write_settings(const Comparison& o) {
  const std::string settings_path = o.out + "/compare.json";
  if (!fs::exists(settings_path)) {
    write_file_atomic(settings_path, o.settings.dump(2) + "\n");
    return;
  }
  nlohmann::json was = parse_json(read_file(settings_path), settings_path);
  if (!was.contains("precision")) was["precision"] = "fp32";  // a comparison from before --precision
  if (!was.contains("train_options")) was["train_options"] = nlohmann::json::object();  // from before they passed
  // The same modes in another order are the same comparison (a run per mode and seed).
  auto sorted = [](nlohmann::json m) {
    if (m.is_array()) std::sort(m.begin(), m.end());
    return m;
  };
  if (was.contains("modes") && sorted(was["modes"]) == sorted(o.settings["modes"])) was["modes"] = o.settings["modes"];
  // The settings asked for are named before those derived from them
  // (val_every and routing_every follow --steps unless given): a rerun with
  // another --steps is refused naming steps.
  for (const bool derived : {false, true})
    for (auto it = o.settings.begin(); it != o.settings.end(); ++it) {
      if ((it.key() == "val_every" || it.key() == "routing_every") != derived) continue;
      if (!was.contains(it.key()) || was[it.key()] != it.value())
        fail(o.out, ": holds a comparison with ", it.key(), " ", was.contains(it.key()) ? brief(was[it.key()]) : "unset",
             ", not ", brief(it.value()), " (resume it with its own flags, or use another --out)");
    }
}

// With --interventions, a routed run's record gets its routing interventions
// on the validation tokens (once; true when it got them now).
namespace {

bool add_interventions(const Comparison& o, nlohmann::json& r, const std::string& mode, int64_t seed) {
  if (o.interventions == 0 || r.value("routing_heads", int64_t{0}) == 0) return false;
  if (r.contains("interventions") && r["interventions"].value("requested", int64_t{0}) == o.interventions)
    return false;  // measured before, on as many tokens
  std::printf("compare: %s seed %lld: routing interventions on %lld validation tokens\n", mode.c_str(),
              static_cast<long long>(seed), static_cast<long long>(o.interventions));
  std::fflush(stdout);
  const ChildResult iv = run_self({"routing", "--model", r["dir"].get<std::string>(), "--data", o.val_data,
                                   "--seq-len", cat(o.T), "--interventions", "--intervention-tokens",
                                   cat(o.interventions), "--whole-sources", "--threads", cat(o.t.threads),
                                   "--device", o.t.device, "--precision", o.precision, "--json", "--quiet"});
  if (iv.exit_code != 0) fail(mode, " seed ", seed, ": the routing interventions failed");
  r["interventions"] = nlohmann::json::parse(iv.out);
  r["interventions"]["requested"] = o.interventions;
  return true;
}

}  // namespace

std::vector<std::string> routing_only_flags(const std::vector<std::string>& passed) {
  std::vector<std::string> out;
  for (const std::string& a : passed)
    for (const char* flag : {"--entropy-lambda=", "--freeze-base="})
      if (a.rfind(flag, 0) == 0) out.push_back(a);
  return out;
}

std::vector<std::string> train_flags_for(const std::vector<std::string>& passed, const std::string& mode) {
  if (mode_spec(parse_mode_name(mode).mode).routed()) return passed;
  const std::vector<std::string> drop = routing_only_flags(passed);
  std::vector<std::string> out;
  for (const std::string& a : passed)
    if (std::find(drop.begin(), drop.end(), a) == drop.end()) out.push_back(a);
  return out;
}

nlohmann::json finished_record(const Comparison& o, const ComparisonRun& run) {
  const std::string done_path = run.dir + "/done.json";
  if (!fs::exists(done_path)) return nullptr;
  try {
    nlohmann::json r = parse_json(read_file(done_path), done_path);
    if (run.sweep) check_sweep_record(r, done_path);
    else check_run_record(r, done_path);
    if (r["mode"] != run.mode || r["seed"] != run.seed)
      fail(done_path, ": is the record of ", brief(r["mode"]), " seed ", brief(r["seed"]), ", not of ", run.mode,
           " seed ", run.seed);
    if (run.rates && !(r.contains("lr") && r["lr"].is_number() && rates_of(r) == *run.rates))
      fail(done_path, ": is the record of a run at ", r.contains("lr") ? brief(r["lr"]) : "another rate", ", not at ",
           run.rates->text());
    if (run.sweep) {
      std::printf("compare: sweep %s %s finished before; not rerun\n", run.mode.c_str(), run.rates->text().c_str());
      return r;
    }
    std::printf("compare: %s seed %lld finished before; not rerun\n", run.mode.c_str(), static_cast<long long>(run.seed));
    if (add_interventions(o, r, run.mode, run.seed)) write_file_atomic(done_path, r.dump() + "\n");
    return r;
  } catch (const Error& e) {
    std::printf("compare: %s; the run is evaluated again\n", e.what());
    fs::remove(done_path);
  }
  return nullptr;
}

namespace {

// A sweep run's record: its rates and its loss on the tuning split (null where it diverged).
nlohmann::json sweep_record(const Comparison& o, const ComparisonRun& run, const RunLog& log, bool diverged) {
  return {{"mode", run.mode},
          {"seed", run.seed},
          {"dir", run.dir},
          {"lr", run.rates->lr},
          {"lr_routing", run.rates->lr_routing ? nlohmann::json(*run.rates->lr_routing) : nlohmann::json(nullptr)},
          {"steps", log.steps},
          {"planned_steps", run.steps},
          {"cut", !diverged && (log.steps < run.steps || log.schedule_cut_at > 0)},
          {"schedule_cut_at", log.schedule_cut_at},
          {"tokens", log.steps * o.B * o.T},
          {"diverged", diverged},
          {"val_loss", diverged || std::isnan(log.val_loss) ? nlohmann::json(nullptr) : nlohmann::json(log.val_loss)},
          {"val_curve", log.val_curve}};
}

// Trains a run (or resumes it; or, trained before, only evaluates it), then
// its record: the run log's figures, its routing and interventions.
// time_share: seconds this run may take under --minutes (none: no limit).
nlohmann::json train_and_record(const Comparison& o, const ComparisonRun& run, std::optional<double> time_share) {
  const int64_t steps = run.steps;
  const std::string what = run.sweep ? cat("sweep ", run.mode, " ", run.rates->text())
                                     : cat(run.mode, " seed ", run.seed);
  const bool resume = fs::exists(run.dir + "/latest");
  // A run whose training finished (its checkpoint is at the planned step, or
  // at the step a time budget cut it to) but whose evaluation did not — a
  // comparison killed in between — is evaluated, not trained again.
  bool trained = false;
  if (resume) {
    const int64_t at = read_trainer_state(resolve_model_dir(run.dir)).step;
    const int64_t cut_to = fs::exists(run.dir + "/log.jsonl") ? read_run_log(run.dir + "/log.jsonl").schedule_steps : 0;
    trained = at >= steps || (cut_to > 0 && at >= cut_to);
  }
  const double t0 = now_seconds();
  ChildResult child;
  if (trained) {
    std::printf("compare: %s seed %lld trained before, not evaluated: evaluating it\n", run.mode.c_str(),
                static_cast<long long>(run.seed));
  } else {
    std::vector<std::string> args = {"train"};
    if (resume) {
      args.insert(args.end(), {"--resume", run.dir});
    } else {
      if (!o.init.empty()) args.insert(args.end(), {"--init", o.init});
      else args.insert(args.end(), {"--config", o.config});
      // --overwrite: what a start of this run killed before its first checkpoint left (its log) goes.
      args.insert(args.end(), {"--mode", run.mode, "--data", o.data, "--val-data", run.val_data, "--out",
                               run.dir, "--overwrite", "--steps", cat(steps), "--seed", cat(run.seed),
                               "--precision", o.precision});
      TrainOptions::each(o.t, [&](const auto&, const char* key, const char*, OnResume, const char*) {
        if (const auto it = run.computed.find(key); it != run.computed.end())
          args.insert(args.end(), {"--" + option_flag(key), it->second});
      });
      const std::vector<std::string> fixed = train_flags_for(o.passed_fixed, run.mode);
      args.insert(args.end(), fixed.begin(), fixed.end());
      if (run.rates) {
        const std::vector<std::string> rates = run.rates->flags(o);
        args.insert(args.end(), rates.begin(), rates.end());
      }
    }
    args.insert(args.end(), o.passed_free.begin(), o.passed_free.end());
    if (time_share) {
      if (*time_share < 10) fail("--minutes ", o.minutes, ": no time left for ", what);
      args.insert(args.end(), {"--time-budget", cat(static_cast<int64_t>(*time_share))});
    }
    std::printf("compare: %s %s (%lld steps of %lld tokens; log in %s/train.out)\n", resume ? "resuming" : "training",
                what.c_str(), static_cast<long long>(steps), static_cast<long long>(o.B * o.T), run.dir.c_str());
    std::fflush(stdout);
    fs::create_directories(run.dir);
    child = run_self(args, run.dir + "/train.out", run.dir + "/train.err", o.launcher);
    // A rate of the sweep may diverge: that is its result, not the comparison's failure.
    const bool diverged = child.exit_code != 0 && run.sweep &&
                          read_file(run.dir + "/train.err").find("training diverged") != std::string::npos;
    if (child.exit_code != 0 && !diverged)
      fail(what, ": attnres train failed (exit ", child.exit_code, "); see ", run.dir, "/train.err");
    if (diverged) {
      const RunLog log = fs::exists(run.dir + "/log.jsonl") ? read_run_log(run.dir + "/log.jsonl") : RunLog{};
      const nlohmann::json r = sweep_record(o, run, log, true);
      write_file_atomic(run.dir + "/done.json", r.dump() + "\n");
      std::printf("compare: %s: diverged at step %lld (never chosen)\n", what.c_str(),
                  static_cast<long long>(log.steps));
      return r;
    }
  }
  std::fflush(stdout);
  const RunLog log = read_run_log(run.dir + "/log.jsonl");
  if (run.sweep) {  // its record is its tuning loss: no routing analysis
    const nlohmann::json r = sweep_record(o, run, log, false);
    write_file_atomic(run.dir + "/done.json", r.dump() + "\n");
    std::printf("compare: %s: tuning loss %s%s\n", what.c_str(), fmt(log.val_loss, 4).c_str(),
                log.steps < steps ? cat(" (cut at step ", log.steps, " of ", steps, " by --minutes)").c_str() : "");
    std::fflush(stdout);
    return r;
  }
  nlohmann::json r = {{"mode", run.mode}, {"seed", run.seed}, {"dir", run.dir}, {"precision", o.precision},
                      {"steps", log.steps},
                      {"planned_steps", steps}, {"cut", log.steps < steps || log.schedule_cut_at > 0},
                      {"schedule_cut_at", log.schedule_cut_at},
                      {"tokens", log.steps * o.B * o.T}, {"val_loss", log.val_loss}, {"val_ppl", log.val_ppl},
                      {"tok_per_s", log.tok_per_s},
                      {"peak_rss_bytes", log.peak_rss_bytes > 0 ? log.peak_rss_bytes : child.peak_rss_bytes},
                      {"seconds", now_seconds() - t0}, {"val_curve", log.val_curve}, {"loss_curve", log.loss_curve},
                      {"routing_curve", log.routing_curve}};
  const Rates rates = run.rates ? *run.rates : Rates{o.t.lr, std::nullopt};
  r["lr"] = rates.lr;
  if (rates.lr_routing) r["lr_routing"] = *rates.lr_routing;
  else if (o.t.lr_routing >= 0) r["lr_routing"] = o.t.lr_routing;
  const Config c = Config::load(resolve_model_dir(run.dir) + "/config.json");
  r["params"] = ParamLayout(c).total();
  r["routing_heads"] = mode_spec(c.mode).routed() ? c.routing_heads : 0;
  if (mode_spec(c.mode).routed()) {  // the routing of the final model, on validation tokens
    const ChildResult rt = run_self({"routing", "--model", run.dir, "--data", o.val_data, "--seq-len",
                                     cat(o.T), "--max-tokens", cat(o.routing_tokens), "--threads",
                                     cat(o.t.threads), "--device", o.t.device, "--precision", o.precision,
                                     "--json", "--quiet"});
    if (rt.exit_code != 0) fail(run.mode, " seed ", run.seed, ": the routing analysis failed");
    r["routing"] = nlohmann::json::parse(rt.out);
  }
  add_interventions(o, r, run.mode, run.seed);
  write_file_atomic(run.dir + "/done.json", r.dump() + "\n");
  std::printf("compare: %s seed %lld: val loss %s, perplexity %s, %s tok/s, peak RSS %lld MiB%s\n",
              run.mode.c_str(), static_cast<long long>(run.seed), fmt(log.val_loss, 4).c_str(),
              fmt(log.val_ppl, 2).c_str(), fmt(log.tok_per_s, 0).c_str(),
              static_cast<long long>(child.peak_rss_bytes >> 20),
              log.steps < steps ? cat(" (cut at step ", log.steps, " of ", steps, " by --minutes)").c_str() : "");
  std::fflush(stdout);
  return r;
}

// The table, its notes, results.md and results.json; then the report.
// sweep: the sweep runs' records (marked "chosen" where a mode's rate came
// from them); chosen: each swept mode's choice.
void write_results(const Comparison& o, const nlohmann::json& results, const nlohmann::json& sweep,
                   const std::map<std::string, RateChoice>& chosen) {
  const int64_t steps = o.steps, B = o.B, T = o.T;
  const Matched match = match_runs(results, steps);
  ModeTable mt = mode_table(o.modes, results, match, o.seeds, steps);
  std::vector<std::string> notes = mt.notes;
  if (o.sweeping()) {
    std::string list;
    for (const std::string& m : o.modes) {
      const auto it = chosen.find(m);
      if (it == chosen.end()) {
        list += cat(list.empty() ? "" : "; ", m, " ", Rates{o.t.lr, std::nullopt}.text(), " (not swept)");
        continue;
      }
      const RateChoice& c = it->second;
      mt.summary[m]["chosen_lr"] = c.rates.lr;
      if (c.rates.lr_routing) mt.summary[m]["chosen_lr_routing"] = *c.rates.lr_routing;
      mt.summary[m]["tuning_loss"] = c.tuning_loss;
      list += cat(list.empty() ? "" : "; ", m, " ", c.rates.text(), " (tuning loss ", fmt(c.tuning_loss, 4),
                  c.at_matched_step ? cat(" at step ", c.step) : std::string(), ")");
    }
    std::string grid;
    if (!o.lrs.empty()) grid += "--lrs " + o.lrs_flag;
    if (!o.lrs_routing.empty()) grid += cat(grid.empty() ? "" : " × ", "--lrs-routing ", o.lrs_routing_flag,
                                            " (modes with routing)");
    notes.insert(notes.begin(),
                 cat("Learning rates: each mode trained its seeds at the best rate of a sweep over ", grid, ", ",
                     sweep.size(), " runs of ", o.sweep_steps, " steps each (", fmt(100 * o.sweep_fraction, 0),
                     "% of a run's, seed ", o.seed, ", each decaying to ",
                     given(o, "--lr-min=") ? "--lr-min" : "a tenth of its rate", "), chosen by the loss on "
                     "the tuning split (the last ", o.tuning_tokens, " of the ", o.val_file_tokens, " tokens of ",
                     o.val_data, ", which the reported validation — its first ", o.t.val_tokens + 1,
                     " tokens — never reads): ", list, "."));
  }
  std::string text = mt.table + "\n";
  text += cat("Each run: ", steps, " steps of ", B * T, " tokens (", steps * B * T, " tokens), ", o.seeds,
              " seed(s) per mode, ",
              o.precision == "bf16" ? "bf16 products (bfloat16 inputs, float32 sums; the rest float32)"
                                    : "fp32 arithmetic",
              o.precision_given ? "" : " (--precision auto)", "; validation loss on ",
              o.t.val_tokens > 0 ? cat("the first ", o.t.val_tokens, " tokens of ") : std::string("all of "),
              o.val_data,
              ". deep max weight: the per-token max routing weight, mean over the deepest third of the routers.\n");
  if (!match.cut_runs.empty()) {
    std::string list;
    for (const std::string& c : match.cut_runs) list += (list.empty() ? "" : ", ") + c;
    notes.insert(notes.begin(),
                 cat(match.cut_runs.size(), " of ", results.size(), " runs were cut by --minutes before their ", steps,
                     " planned steps (", list, "; each completed its learning-rate decay early): their final losses "
                     "are not matched with the others' and are not compared. ",
                     match.comparable ? cat("The modes are compared at step ", match.step,
                                            ", the last validation every run made before any schedule was shortened.")
                                      : std::string("No validation step precedes every cut: the modes are not compared."),
                     " To compare them as planned, remove the cut runs' directories and run the same command again "
                     "with more --minutes (or none) on a quiet machine: the finished runs are kept."));
  }
  for (const std::string& n : notes) text += cat("- ", n, "\n");
  std::printf("\n%s", text.c_str());
  const std::string& out = o.out;
  write_file_atomic(out + "/results.md", text);
  write_file_atomic(out + "/results.json",
                    nlohmann::json({{"settings", o.settings}, {"runs", results}, {"summary", mt.summary},
                                    {"notes", notes}, {"sweep", sweep},
                                    {"matched", {{"comparable", match.comparable},
                                                 {"step", match.comparable ? nlohmann::json(match.step) : nlohmann::json(nullptr)},
                                                 {"cut_runs", match.cut_runs}}}})
                            .dump(1) +
                        "\n");
  std::printf("results: %s/results.json, %s/results.md\n", out.c_str(), out.c_str());
  const nlohmann::json data = read_report_data({out});
  std::string vega;
  try {
    vega = find_vega_dir(o.vega_dir);
  } catch (const Error& e) {  // the table stands without the pictures
    std::printf("report: not written: %s\n", e.what());
    return;
  }
  write_report(data, out + "/report.html", vega);
  std::printf("report: %s/report.html\n", out.c_str());
}

// OUT/tuning.bin: the last --tuning-tokens of the validation file, which the
// sweep validates on.  Written once; a rerun finds the same tokens there, or
// the validation file changed under the comparison (an Error).
void write_tuning_split(const Comparison& o) {
  const TokenFile val(o.val_data);
  if (static_cast<int64_t>(val.size()) != o.val_file_tokens)
    fail(o.val_data, ": holds ", val.size(), " tokens, not the ", o.val_file_tokens, " it held when the comparison "
         "was set up");
  std::vector<int32_t> tail(static_cast<size_t>(o.tuning_tokens));
  val.read(val.size() - tail.size(), tail);
  const std::string path = o.out + "/tuning.bin";
  if (fs::exists(path)) {
    const TokenFile was(path);
    std::vector<int32_t> held(was.size());
    was.read(0, held);
    if (held != tail)
      fail(path, ": is not the last ", o.tuning_tokens, " tokens of ", o.val_data, " (the validation file changed "
           "since the comparison began; use another --out)");
    return;
  }
  write_token_file(path, std::vector<uint32_t>(tail.begin(), tail.end()));
}

}  // namespace

void run_comparison(const Comparison& o) {
  {
    std::error_code ec;
    fs::create_directories(o.out, ec);
    if (ec) fail(o.out, ": cannot create the comparison's directory: ", ec.message());
  }
  // One comparison at a time in a directory: a second one on a running
  // comparison's --out is refused up front (and never writes into its files).
  const DirLock lock(o.out);
  check_or_write_settings(o);

  if (o.sweeping()) write_tuning_split(o);

  // The sweep's runs, then the seeds'; with --minutes, each run's share of
  // the time left is in proportion to its steps.
  std::vector<ComparisonRun> sweep = sweep_runs(o), seeds = seed_runs(o);
  int64_t steps_left = 0;
  for (const auto* list : {&sweep, &seeds})
    for (const ComparisonRun& r : *list) steps_left += r.steps;
  const double t_start = now_seconds(), limit_s = o.minutes * 60;
  auto run_all = [&](const std::vector<ComparisonRun>& runs) {
    nlohmann::json records = nlohmann::json::array();
    for (const ComparisonRun& run : runs) {
      nlohmann::json r = finished_record(o, run);
      if (r.is_null()) {
        std::optional<double> share;  // the analysis after a run takes a few seconds
        if (limit_s > 0)
          share = (limit_s - (now_seconds() - t_start)) * static_cast<double>(run.steps) /
                      static_cast<double>(steps_left) - 10;
        r = train_and_record(o, run, share);
      }
      steps_left -= run.steps;
      records.push_back(std::move(r));
    }
    return records;
  };
  nlohmann::json sweep_records = run_all(sweep);
  std::map<std::string, RateChoice> chosen;
  for (const std::string& m : o.modes)
    if (sweep_points(o, m).size() > 1) {
      const RateChoice c = chosen[m] = choose_rate(m, sweep_records, o.sweep_steps);
      std::printf("compare: %s trains at %s (tuning loss %s)\n", m.c_str(), c.rates.text().c_str(),
                  fmt(c.tuning_loss, 4).c_str());
      for (auto& r : sweep_records)
        if (r["mode"] == m) r["chosen"] = rates_of(r) == c.rates;
      for (ComparisonRun& run : seeds)
        if (run.mode == m) run.rates = c.rates;
    }
  std::fflush(stdout);
  const nlohmann::json results = run_all(seeds);
  write_results(o, results, sweep_records, chosen);
}

}  // namespace attnres
