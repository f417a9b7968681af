// compare.cpp — `attnres compare`: its flags (compare's own and every option
// of `attnres train`), checked and resolved into a Comparison, which
// experiment/comparison.h runs: matched training runs of several routing
// modes (× seeds), then their table and report.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/api.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/precision.h"
#include "experiment/comparison.h"
#include "experiment/depth_study.h"
#include "io/token_file.h"
#include "model/config.h"
#include "model/modes.h"
#include "model/presets.h"
#include "ops/backend.h"
#include "ops/context.h"
#include "train/options.h"

namespace attnres {

namespace {

namespace fs = std::filesystem;

// The train options compare decides for each run itself, from flags of its
// own (never passed through as given): the run's output, length, seed, time,
// precision, and the data and init compare reads itself.
const std::set<std::string> kSetPerRun = {"init", "data", "val_data", "out", "steps", "seed", "time_budget",
                                          "precision"};

// The train options whose default differs in compare, with the reason (in --help).
struct CompareDefault {
  const char* key;
  const char* value;
  const char* why;
};
const CompareDefault kCompareDefaults[] = {
    {"warmup", "0", "0 = a twentieth of each run, whatever its length"},
    {"val_every", "0", "0 = four times per run"},
    {"ckpt_every", "0", "0 = at every validation, so an interrupted comparison loses little"},
    {"keep_checkpoints", "1", "a comparison keeps each run's newest checkpoint only"},
    {"routing_every", "0", "0 = twenty times per run"},
    {"val_tokens", "262144", "validation in seconds rather than minutes; 0 = the whole file"},
};
const CompareDefault* compare_default(const std::string& key) {
  for (const CompareDefault& d : kCompareDefaults)
    if (key == d.key) return &d;
  return nullptr;
}

void add_compare_options(OptionList& opts, Comparison& o) {
  opts.add(o.modes_flag, {"modes", compared_modes(),
                          cat("comma-separated attnres modes (", mode_name_list(false), ", ", mode_name_list(true), ")")});
  opts.add(o.config, {"config", "tiny", "preset or config.json (its attnres_mode is replaced by each mode)"});
  opts.add(o.init, {"init", "", "convert this checkpoint into each mode instead of training from scratch"});
  opts.add(o.data, {"data", "", "training tokens (required)"});
  opts.add(o.val_data, {"val-data", "", "validation tokens (required)"});
  opts.add(o.tokens, {"tokens", "0", "training tokens per run (required unless --steps)"});
  opts.add(o.steps_flag, {"steps", "0", "optimizer steps per run (instead of --tokens)"});
  opts.add(o.minutes, {"minutes", "0",
                       "time limit of the whole comparison; a run that would pass its share is cut, with its "
                       "learning-rate decay completed (0 = none)"});
  opts.add(o.seeds, {"seeds", "1", "runs per mode, with seeds --seed, --seed + 1, ..."});
  opts.add(o.seed, {"seed", "1337", "first seed"});
  opts.add(o.precision, {"precision", "auto", kPrecisionAutoHelp});
  opts.add(o.ranks, {"ranks", "1",
                     "train each run data parallel over this many MPI ranks (mpirun -np N; --batch is "
                     "then the global micro-batch, B / N per rank)"});
  opts.add(o.routing_tokens, {"routing-tokens", "65536", "validation tokens the final routing analysis reads"});
  opts.add(o.interventions, {"interventions", "0",
                             "after each routed run, its routing interventions (attnres routing --interventions) on "
                             "this many validation tokens, for results.json and the report; a finished run "
                             "without them gets them on a rerun (0 = none)"});
  opts.add(o.lrs_flag, {"lrs", "",
                        "sweep the learning rate: comma-separated peak rates; each mode trains one short run per rate "
                        "and its seeds at the rate of the lowest loss on the tuning split (instead of --lr)"});
  opts.add(o.lrs_routing_flag, {"lrs-routing", "",
                                "sweep the routing parameters' peak rate likewise, in the modes with routing "
                                "(with --lrs: every pair; instead of --lr-routing)"});
  opts.add(o.sweep_fraction, {"sweep-fraction", "0.25", "each sweep run's share of a run's steps"});
  opts.add(o.tuning_tokens, {"tuning-tokens", "65536",
                             "the tuning split the sweep is judged on: the validation file's last N tokens, which "
                             "the reported validation then never reads"});
  opts.add(o.layers_flag, {"layers", "",
                           "a depth study: the same comparison at each of these numbers of layers (--config's "
                           "num_hidden_layers replaced; width and tokens fixed), each in OUT/layers-L/, and the "
                           "difference to baseline against depth"});
  opts.add(o.out, {"out", "", "output directory (required); rerun with the same flags to resume"});
  opts.add(o.vega_dir, {"vega-dir", "",
                        "node_modules holding vega, vega-lite, vega-embed for the report (default: "
                        "scripts/fetch_vega.sh's)"});
  add_train_options(opts, o.t, [](const std::string& key, FlagSpec& spec) {
    if (kSetPerRun.count(key)) return false;
    spec.help = "train: " + spec.help;
    if (key == "batch") spec.help = "micro-batch size B of each step (with --ranks N: the global one, B / N per rank)";
    if (const CompareDefault* d = compare_default(key)) {
      spec.default_value = d->value;
      spec.help += cat("; in compare: ", d->why);
    }
    return true;
  });
}

// The learning-rate sweep's flags checked; its runs' length and options, and
// the split of the validation file between the reported loss and the tuning.
void resolve_sweep(Comparison& o, const OptionList& opts) {
  TrainOptions& t = o.t;
  o.lrs = parse_rates(o.lrs_flag, "--lrs");
  o.lrs_routing = parse_rates(o.lrs_routing_flag, "--lrs-routing");
  if (!o.sweeping()) return;
  if (!o.lrs.empty() && opts.given("lr")) fail("--lr and --lrs: give one (--lrs sweeps the rate --lr would fix)");
  if (!o.lrs_routing.empty() && opts.given("lr-routing"))
    fail("--lr-routing and --lrs-routing: give one (--lrs-routing sweeps the rate --lr-routing would fix)");
  if (o.lrs.size() == 1 && o.lrs_routing.size() <= 1)
    fail("--lrs ", o.lrs_flag, ": a sweep needs two rates or more (--lr sets one)");
  if (o.lrs_routing.size() == 1 && o.lrs.size() <= 1)
    fail("--lrs-routing ", o.lrs_routing_flag, ": a sweep needs two rates or more (--lr-routing sets one)");
  for (double lr : o.lrs)
    if (opts.given("lr-min") && lr < t.lr_min)
      fail("--lrs: ", lr, " is below --lr-min ", t.lr_min, " (each rate decays to --lr-min; leave it out to decay "
           "each to a tenth of its own)");
  for (double lr : o.lrs_routing)
    if (opts.given("lr-min-routing") && lr < t.lr_min_routing)
      fail("--lrs-routing: ", lr, " is below --lr-min-routing ", t.lr_min_routing);
  bool any_routed = false;
  for (const std::string& m : o.modes) any_routed = any_routed || mode_spec(parse_mode_name(m).mode).routed();
  if (!o.lrs_routing.empty() && !any_routed) fail("--lrs-routing: none of --modes ", o.modes_flag, " has routing");
  if (!(o.sweep_fraction > 0 && o.sweep_fraction <= 1))
    fail("--sweep-fraction must be above 0 and at most 1, got ", o.sweep_fraction);
  o.sweep_steps = std::max<int64_t>(1, std::llround(static_cast<double>(o.steps) * o.sweep_fraction));
  // Evaluation reads the first val_tokens + 1 tokens (eval/perplexity.h);
  // the tuning split is the last tuning_tokens, after them.
  const int64_t T = t.seq_len, n = static_cast<int64_t>(TokenFile(o.val_data).size());
  o.val_file_tokens = n;
  if (o.tuning_tokens < T + 1)
    fail("--tuning-tokens must hold a window of --seq-len ", T, " and its next token (", T + 1, " or more), got ",
         o.tuning_tokens);
  const int64_t room = n - o.tuning_tokens - 1;  // the most val_tokens disjoint from the tuning split
  if (room < T)
    fail(o.val_data, ": holds ", n, " tokens: after the tuning split's ", o.tuning_tokens, " fewer than a window of --seq-len ",
         T, " are left for the reported validation (use a larger validation file or fewer --tuning-tokens)");
  const int64_t asked = t.val_tokens > 0 ? t.val_tokens : n - 1;
  if (asked > room)
    std::printf("compare: the reported validation reads the first %lld tokens of %s (%s): its last %lld are the "
                "tuning split\n",
                static_cast<long long>(room + 1), o.val_data.c_str(),
                t.val_tokens > 0 ? cat("not ", t.val_tokens + 1).c_str() : "not all", static_cast<long long>(o.tuning_tokens));
  t.val_tokens = std::min(asked, room);
  const int64_t ss = o.sweep_steps, val_every = std::max<int64_t>(1, ss / 2);  // at its middle and end
  o.sweep_computed = {{"batch", cat(t.batch / o.ranks)},
                      {"warmup", cat(t.warmup > 0 ? std::max<int64_t>(1, std::llround(t.warmup * o.sweep_fraction))
                                                  : std::max<int64_t>(1, ss / 20))},
                      {"val_every", cat(val_every)},
                      {"ckpt_every", cat(val_every)},
                      {"routing_every", cat(std::max<int64_t>(1, ss / 20))},
                      {"keep_checkpoints", "1"},
                      {"val_tokens", "0"}};
}

// The flags checked, and what every run shares worked out from them.
void resolve_comparison(Comparison& o, const OptionList& opts) {
  TrainOptions& t = o.t;
  if (opts.given("lr") && !opts.given("lr-min")) t.lr_min = TrainOptions::default_lr_min(t.lr);
  const std::string& out = o.out;
  if (out.empty() || o.data.empty() || o.val_data.empty()) fail("--out, --data and --val-data are required");
  {
    std::error_code ec;
    if (fs::exists(out, ec) && !fs::is_directory(out, ec))
      fail(out, ": is a file; --out names the comparison's directory (new, or one to resume)");
  }
  o.modes = split_modes(o.modes_flag);
  if (!o.layers_flag.empty()) {
    o.layers = parse_layers(o.layers_flag);
    if (!o.init.empty())
      fail("--layers trains each depth from scratch; --init converts a checkpoint of one depth (give one or the other)");
    load_config(o.config);  // an Error names a bad one before any work
  }
  if (!(o.minutes >= 0) || !std::isfinite(o.minutes))
    fail("--minutes must be 0 (no limit) or a positive number of minutes, got ", o.minutes);
  for (const std::string& m : o.modes) parse_mode_name(m);  // an Error names a bad one
  const int64_t seeds = o.seeds, B = t.batch, T = t.seq_len;
  constexpr int64_t kMostRuns = 1000;  // a bound checked before any work (issue 33: --seeds 99999999999 grew to 1.17 GB)
  if (seeds < 1 || seeds > kMostRuns) fail("--seeds must be from 1 to ", kMostRuns, ", got ", seeds);
  if (static_cast<int64_t>(o.modes.size()) * seeds > kMostRuns)
    fail(o.modes.size(), " modes × --seeds ", seeds, " is more than ", kMostRuns, " runs");
  if (o.routing_tokens < 0) fail("--routing-tokens must be 0 or positive, got ", o.routing_tokens);
  if (o.interventions < 0 || (o.interventions > 0 && o.interventions < t.seq_len))
    fail("--interventions must be 0 (none) or at least one window of --seq-len ", t.seq_len, ", got ",
         o.interventions);
  if (B <= 0 || T <= 0) fail("--batch and --seq-len must be positive");
  const int64_t ranks = o.ranks;
  if (ranks < 1) fail("--ranks must be at least 1");
  if (B % ranks != 0) fail("--batch ", B, " does not split over --ranks ", ranks, " (each rank takes B / ranks windows)");
  o.B = B;
  o.T = T;
  // Each run under mpirun: the same global batch, split over the ranks (docs/distributed.md).
  if (ranks > 1) o.launcher = {"mpirun", "-np", cat(ranks)};
  o.steps = o.steps_flag;
  if (o.steps <= 0) {
    if (o.tokens <= 0) fail("give the work per run: --tokens N (or --steps N)");
    o.steps = (o.tokens + B * T - 1) / (B * T);
  }
  const int64_t steps = o.steps;
  resolve_sweep(o, opts);
  // The precision of every run: auto resolves here, once, and is stored with the settings.
  o.precision_given = opts.given("precision");
  {
    const std::unique_ptr<Context> probe = open_context({1, t.device, Precision::kF32});
    const bool bf16_here = probe->ops().unsupported(Precision::kBF16).empty();
    if (o.precision == "auto") o.precision = bf16_here ? "bf16" : "fp32";
    const Precision p = parse_precision(o.precision);
    open_context({1, t.device, p});  // an Error where the device cannot run p
    o.precision = precision_name(p);
  }
  const int64_t val_every = t.val_every > 0 ? t.val_every : std::max<int64_t>(1, steps / 4);
  const int64_t routing_every = t.routing_every > 0 ? t.routing_every : std::max<int64_t>(1, steps / 20);
  const int64_t warmup = t.warmup > 0 ? t.warmup : std::max<int64_t>(1, steps / 20);
  const int64_t ckpt_every = t.ckpt_every > 0 ? t.ckpt_every : val_every;
  // Each run's flags from compare's: those it sets per run or by its own
  // rules, and every other training option given here, as given.
  o.computed = {{"batch", cat(B / ranks)},          {"warmup", cat(warmup)},
                {"val_every", cat(val_every)},      {"ckpt_every", cat(ckpt_every)},
                {"routing_every", cat(routing_every)}, {"keep_checkpoints", cat(t.keep_checkpoints)},
                {"val_tokens", cat(t.val_tokens)}};
  nlohmann::json given_options = nlohmann::json::object();  // those that shape a run: a rerun must give the same
  TrainOptions::each(t, [&](const auto& field, const char* key, const char*, OnResume rule, const char*) {
    const std::string flag = option_flag(key);
    if (kSetPerRun.count(key) || o.computed.count(key) || !opts.given(flag)) return;
    auto& into = rule == OnResume::kFree ? o.passed_free : o.passed_fixed;
    into.push_back(cat("--", flag, "=", option_text(field)));  // "=": a switch takes its value inline
    if (rule != OnResume::kFree) given_options[key] = option_text(field);
  });
  for (const std::string& m : o.modes)
    if (!mode_spec(parse_mode_name(m).mode).routed() && !routing_only_flags(o.passed_fixed).empty()) {
      std::string flags;
      for (const std::string& a : routing_only_flags(o.passed_fixed)) flags += cat(flags.empty() ? "" : ", ", a);
      std::printf("compare: %s runs without %s (options of the routing, which it has none of)\n", m.c_str(),
                  flags.c_str());
    }
  o.settings = {{"modes", o.modes}, {"config", o.config}, {"init", o.init},
                {"data", fs::absolute(o.data).string()},
                {"val_data", fs::absolute(o.val_data).string()},
                {"steps", steps}, {"batch", B}, {"seq_len", T}, {"seeds", seeds},
                {"seed", o.seed}, {"lr", t.lr}, {"lr_min", t.lr_min},
                {"val_every", val_every}, {"val_tokens", t.val_tokens},
                {"routing_every", routing_every}, {"precision", o.precision},
                {"train_options", given_options}};
  if (!o.layers.empty()) o.settings["layers"] = o.layers;
  if (o.sweeping()) {  // keys a comparison without a sweep does not have: its compare.json stays as it was
    if (!o.lrs.empty()) o.settings["lr"] = o.settings["lr_min"] = nullptr;
    o.settings["lrs"] = o.lrs;
    o.settings["lrs_routing"] = o.lrs_routing;
    o.settings["sweep_steps"] = o.sweep_steps;
    o.settings["tuning_tokens"] = o.tuning_tokens;
    o.settings["val_file_tokens"] = o.val_file_tokens;
  }
}

// compare's flags, each bound to its field.
struct CompareCommand {
  Comparison o;
  OptionList opts{"compare",
                  "Matched training runs of several routing modes (the same data windows in the same order, the same "
                  "base\ninitialisation or the same --init checkpoint, the same schedule and tokens), then a table of "
                  "validation\nloss, speed, memory and routing.  An interrupted comparison resumes: finished runs are "
                  "not rerun.\nEvery option of attnres train is one of compare too, passed on to each run when given "
                  "(train's\ndefaults apply otherwise, except where its help says compare's default and why)."};
  CompareCommand() { add_compare_options(opts, o); }
  // Runs the comparison once the flags are read (the words of OptionList::parse); false after --help.
  template <class... Words>
  bool run(Words&&... words) {
    if (!opts.parse(std::forward<Words>(words)...)) return false;
    resolve_comparison(o, opts);
    // The start-up table: every option as this comparison reads it (0 = compare's rule, as --help says).
    std::printf("attnres compare\n%s", opts.table().c_str());
    std::fflush(stdout);
    if (o.layers.empty()) run_comparison(o);
    else run_depth_study(o);
    return true;
  }
};

}  // namespace

std::string compare_help() { return CompareCommand().opts.help(); }

std::string compare_command(const std::vector<std::string>& args) {
  CompareCommand c;
  return c.run(args) ? c.o.out : "";
}

int cmd_compare(int argc, char** argv) {
  CompareCommand().run(argc, argv);
  return 0;
}

}  // namespace attnres
