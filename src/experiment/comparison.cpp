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
#include "model/config.h"
#include "model/modes.h"
#include "model/params.h"
#include "report/report.h"
#include "report/run_log.h"

namespace attnres {

namespace fs = std::filesystem;

std::vector<std::string> split_modes(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t end = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, end - at);
    if (item.empty()) fail("--modes '", s, "': an empty name (two commas, or one at an end)");
    if (std::find(out.begin(), out.end(), item) != out.end())
      fail("--modes '", s, "' names ", item, " twice (each mode runs once per seed; --seeds N runs more)");
    out.push_back(item);
    if (end == s.size()) return out;
    at = end + 1;
  }
}

std::string fmt(double x, int digits) {
  if (std::isnan(x)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
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
      "deep max weight | steps |\n|---|---|---|---|---|---|---|---|---|\n";
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
    for (const auto& r : results)
      if (r["mode"] == m) {
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
                  {"steps", steps_min}, {"cut", cut}};
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
                 deep.empty() ? std::string("-") : fmt(dmw, 3), " | ", steps_min, cut ? " (cut)" : "", " |\n");
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
  for (auto it = o.settings.begin(); it != o.settings.end(); ++it)
    if (!was.contains(it.key()) || was[it.key()] != it.value())
      fail(o.out, ": holds a comparison with ", it.key(), " ", was.contains(it.key()) ? brief(was[it.key()]) : "unset",
           ", not ", brief(it.value()), " (resume it with its own flags, or use another --out)");
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
    check_run_record(r, done_path);
    if (r["mode"] != run.mode || r["seed"] != run.seed)
      fail(done_path, ": is the record of ", brief(r["mode"]), " seed ", brief(r["seed"]), ", not of ", run.mode,
           " seed ", run.seed);
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

// Trains a run (or resumes it; or, trained before, only evaluates it), then
// its record: the run log's figures, its routing and interventions.
// time_share: seconds this run may take under --minutes (none: no limit).
nlohmann::json train_and_record(const Comparison& o, const ComparisonRun& run, std::optional<double> time_share) {
  const int64_t steps = o.steps;
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
      args.insert(args.end(), {"--mode", run.mode, "--data", o.data, "--val-data", o.val_data, "--out",
                               run.dir, "--overwrite", "--steps", cat(steps), "--seed", cat(run.seed),
                               "--precision", o.precision});
      TrainOptions::each(o.t, [&](const auto&, const char* key, const char*, OnResume, const char*) {
        if (const auto it = o.computed.find(key); it != o.computed.end())
          args.insert(args.end(), {"--" + option_flag(key), it->second});
      });
      const std::vector<std::string> fixed = train_flags_for(o.passed_fixed, run.mode);
      args.insert(args.end(), fixed.begin(), fixed.end());
    }
    args.insert(args.end(), o.passed_free.begin(), o.passed_free.end());
    if (time_share) {
      if (*time_share < 10) fail("--minutes ", o.minutes, ": no time left for ", run.mode, " seed ", run.seed);
      args.insert(args.end(), {"--time-budget", cat(static_cast<int64_t>(*time_share))});
    }
    std::printf("compare: %s %s seed %lld (%lld steps of %lld tokens; log in %s/train.out)\n",
                resume ? "resuming" : "training", run.mode.c_str(), static_cast<long long>(run.seed),
                static_cast<long long>(steps), static_cast<long long>(o.B * o.T), run.dir.c_str());
    std::fflush(stdout);
    fs::create_directories(run.dir);
    child = run_self(args, run.dir + "/train.out", run.dir + "/train.err", o.launcher);
    if (child.exit_code != 0)
      fail(run.mode, " seed ", run.seed, ": attnres train failed (exit ", child.exit_code, "); see ", run.dir,
           "/train.err");
  }
  std::fflush(stdout);
  const RunLog log = read_run_log(run.dir + "/log.jsonl");
  nlohmann::json r = {{"mode", run.mode}, {"seed", run.seed}, {"dir", run.dir}, {"precision", o.precision},
                      {"steps", log.steps},
                      {"planned_steps", steps}, {"cut", log.steps < steps},
                      {"schedule_cut_at", log.schedule_cut_at},
                      {"tokens", log.steps * o.B * o.T}, {"val_loss", log.val_loss}, {"val_ppl", log.val_ppl},
                      {"tok_per_s", log.tok_per_s},
                      {"peak_rss_bytes", log.peak_rss_bytes > 0 ? log.peak_rss_bytes : child.peak_rss_bytes},
                      {"seconds", now_seconds() - t0}, {"val_curve", log.val_curve}, {"loss_curve", log.loss_curve},
                      {"routing_curve", log.routing_curve}};
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
void write_results(const Comparison& o, const nlohmann::json& results) {
  const int64_t steps = o.steps, B = o.B, T = o.T;
  const Matched match = match_runs(results, steps);
  const ModeTable mt = mode_table(o.modes, results, match, o.seeds, steps);
  std::vector<std::string> notes = mt.notes;
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
                                    {"notes", notes},
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

  std::vector<ComparisonRun> runs;
  for (const std::string& m : o.modes)
    for (int64_t k = 0; k < o.seeds; ++k)
      runs.push_back({m, cat(o.out, "/", m, "-seed", o.seed + k), static_cast<int64_t>(o.seed + k)});
  const double t_start = now_seconds(), limit_s = o.minutes * 60;
  nlohmann::json results = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    const ComparisonRun& run = runs[i];
    if (nlohmann::json r = finished_record(o, run); !r.is_null()) {
      results.push_back(std::move(r));
      continue;
    }
    // With --minutes, this run's share of what is left (the analysis after it takes a few seconds).
    std::optional<double> share;
    if (limit_s > 0) share = (limit_s - (now_seconds() - t_start)) / static_cast<double>(runs.size() - i) - 10;
    results.push_back(train_and_record(o, run, share));
  }
  write_results(o, results);
}

}  // namespace attnres
