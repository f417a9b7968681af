// options.cpp — see options.h.
#include "train/options.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/precision.h"
#include "model/modes.h"
#include "ops/backend.h"
#include "core/json_util.h"
#include "io/checkpoint.h"
#include "train/data_loader.h"

namespace attnres {

namespace fs = std::filesystem;

namespace {

// A path as stored: absolute, so that a resume from another directory finds it.
std::string absolute_path(const std::string& p) {
  return p.empty() ? p : fs::absolute(p).lexically_normal().string();
}

// The same directory, by identity when both exist, else by absolute path.
bool same_place(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return a.empty() && b.empty();
  std::error_code ec;
  const bool eq = fs::equivalent(a, b, ec);
  return ec ? absolute_path(a) == absolute_path(b) : eq;
}

}  // namespace

std::string option_flag(const std::string& key) {
  std::string f = key;
  for (char& ch : f) ch = ch == '_' ? '-' : ch;
  return f;
}

TrainOptions::TrainOptions() {
  each(*this, [](auto& field, const char* key, const char* def, OnResume, const char*) { parse_option(field, key, def); });
}

ModelOptions TrainOptions::model_options() const {
  ModelOptions mo{batch, seq_len};
  mo.precision = parse_precision(precision);
  mo.freeze_base = freeze_base;
  mo.recompute = recompute;
  mo.entropy_lambda = entropy_lambda;
  mo.sharded_weights = zero == 3;
  return mo;
}

void TrainOptions::validate() const {
  if (steps <= 0) fail("--steps must be positive");
  if (batch <= 0 || seq_len <= 0 || accum <= 0) fail("--batch, --seq-len and --accum must be positive");
  check_positions(model, seq_len, "--seq-len");
  if (warmup < 0) fail("--warmup must be 0 or more");
  if (lr <= 0 || lr_min < 0) fail("--lr must be positive and --lr-min not negative");
  if (lr_min > lr) fail("--lr-min ", lr_min, " is above --lr ", lr, ": the cosine decays from --lr down to --lr-min");
  if (lr_min_routing >= 0 && lr_routing < 0) fail("--lr-min-routing needs --lr-routing");
  if (lr_routing >= 0 && lr_min_routing > lr_routing)
    fail("--lr-min-routing ", lr_min_routing, " is above --lr-routing ", lr_routing);
  // AdamW's settings mean what they say (issue 33: β = 1 divided by zero in
  // the bias correction, β > 1 or ε ≤ 0 trained silently): β ∈ [0, 1), ε > 0.
  if (!(beta1 >= 0 && beta1 < 1)) fail("--beta1 must be in [0, 1), got ", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) fail("--beta2 must be in [0, 1), got ", beta2);
  if (!(eps > 0)) fail("--eps must be positive, got ", eps);
  if (weight_decay < 0) fail("--weight-decay must be 0 (none) or positive, got ", weight_decay);
  if (clip < 0) fail("--clip must be 0 (off) or positive, got ", clip);
  // Counts: 0 is the documented "off" or "all"; a negative one means nothing.
  for (const auto& [flag, v] : {std::pair<const char*, int64_t>{"--val-every", val_every}, {"--val-tokens", val_tokens},
                                {"--ckpt-every", ckpt_every}, {"--routing-every", routing_every}})
    if (v < 0) fail(flag, " must be 0 or positive, got ", v);
  if (time_budget < 0) fail("--time-budget must be 0 (none) or a positive number of seconds, got ", time_budget);
  if (peak_gflops < 0) fail("--peak-gflops must be 0 (measure) or positive, got ", peak_gflops);
  // A step's work is bounded before it starts (issue 33: --accum 999999999999
  // ran for ever): at most 2^40 tokens per optimizer step and rank.
  // (A micro-batch above 2^30 tokens is refused where the model is sized.)
  constexpr int64_t kMostStepTokens = int64_t{1} << 40;
  if (batch <= (int64_t{1} << 30) / seq_len && accum > kMostStepTokens / (batch * seq_len))
    fail("--accum ", accum, " × --batch ", batch, " × --seq-len ", seq_len, " is more than 2^40 tokens per step");
  if (!(std::isfinite(entropy_lambda) && entropy_lambda >= 0))
    fail("--entropy-lambda must be 0 (off) or a finite positive number, got ", entropy_lambda);
  if (entropy_lambda > 0 && !mode_spec(model.mode).routed())
    fail("--entropy-lambda weighs the routing entropy, and a baseline model has no routing (set --mode)");
  if (freeze_base && !mode_spec(model.mode).routed())
    fail("--freeze-base trains the routing parameters only, and a baseline model has none (set --mode)");
  if (keep_checkpoints < 0) fail("--keep-checkpoints must be 0 (all) or positive");
  parse_save_dtype(save_dtype, "--save-dtype");
  if (data_order != "random" && data_order != "sequential")
    fail("--data-order must be random or sequential, got '", data_order, "'");
  check_threads(threads, "--threads");
  check_device(device);
  parse_precision(precision);  // an Error naming the flag
  if (on_nan != "stop" && on_nan != "skip") fail("--on-nan must be stop or skip, got '", on_nan, "'");
  if (collective_timeout < 0) fail("--collective-timeout must be 0 (none) or positive");
  if (zero != 1 && zero != 3) fail("--zero must be 1 or 3, got ", zero);
  if (!(max_memory >= 0 && std::isfinite(max_memory))) fail("--max-memory must be 0 (the machine's) or a positive GiB count");
  if (data.empty()) fail("--data is required (a token file; see attnres train --help)");
  if (out.empty()) fail("--out is required");
}

nlohmann::json run_settings(const TrainOptions& o) {
  nlohmann::json j;
  TrainOptions::each(o, [&](const auto& field, const char* key, const char*, OnResume r, const char*) {
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, std::string>) {
      const bool path = r == OnResume::kSameData || r == OnResume::kSamePlace ||
                        std::string(key) == "val_data" || std::string(key) == "out" ||
                        std::string(key) == "tokenizer";
      j[key] = path ? absolute_path(field) : field;
    } else {
      j[key] = field;
    }
  });
  j["model"] = o.model.to_json();
  j["data_files"] = data_fingerprint(o.data);
  j["world_size"] = o.world;
  return j;
}

std::string options_table(const TrainOptions& o) {
  const Config& c = o.model;
  std::string out = cat("  model = ", c.mode_label(), ", d ", c.d, ", L ", c.L, ", H ", c.H, ", KV ", c.KV,
                        ", head_dim ", c.hd, ", F ", c.F, ", V ", c.V, c.tied ? ", tied" : "", "\n");
  if (!o.resume.empty()) out += cat("  resume = ", o.resume, "\n");
  TrainOptions::each(o, [&](const auto& field, const char* key, const char*, OnResume, const char*) {
    out += cat("  ", option_flag(key), " = ", option_text(field), "\n");
  });
  return out;
}

void take_run_settings(TrainOptions& o, const nlohmann::json& stored, const std::set<std::string>& given) {
  TrainOptions::each(o, [&](auto& field, const char* key, const char*, OnResume, const char*) {
    if (given.count(key) || !stored.contains(key)) return;
    using T = std::decay_t<decltype(field)>;
    const nlohmann::json& v = stored[key];
    bool ok = true;  // a number means what it says: an integer field takes a whole number in its range
    if constexpr (std::is_same_v<T, uint64_t>)
      ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
    else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      ok = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) &&
           v.get<int64_t>() >= std::numeric_limits<T>::min() && v.get<int64_t>() <= std::numeric_limits<T>::max();
    else if constexpr (std::is_same_v<T, double>)
      ok = v.is_number() && std::isfinite(v.get<double>());
    if (!ok)
      fail("the run's trainer_state.json: setting '", key, "' is ", brief(v), ", not a valid --", option_flag(key));
    try {
      field = v.get<T>();
    } catch (const nlohmann::json::exception&) {
      fail("the run's trainer_state.json: setting '", key, "' is ", brief(stored[key]), ", not a valid --",
           option_flag(key));
    }
  });
  // Another number of ranks: the run's global batch G = ranks × batch × accum
  // is kept by taking the micro-batch (then the accumulation) not given.
  const int64_t W = stored.value("world_size", int64_t{1});
  if (W == o.world || !stored.contains("batch") || !stored.contains("accum")) return;
  const int64_t G = W * stored["batch"].get<int64_t>() * stored["accum"].get<int64_t>();
  const bool batch_given = given.count("batch") > 0, accum_given = given.count("accum") > 0;
  if (!batch_given && G % (o.world * o.accum) == 0) {
    o.batch = G / (o.world * o.accum);
  } else if (!accum_given && G % (o.world * o.batch) == 0) {
    o.accum = G / (o.world * o.batch);
  } else if (!batch_given && !accum_given && G % o.world == 0) {
    o.accum = 1;
    o.batch = G / o.world;
  }  // else check_resume names the mismatch
}

std::vector<std::string> check_resume(const TrainOptions& o, const nlohmann::json& now, const nlohmann::json& stored,
                                      int64_t step_done, const std::string& where) {
  std::vector<std::string> notes;
  const std::string refuse = cat(where, ": cannot resume: ");
  const std::string fresh = " (a resume continues the run as it was; to change it, start a new run from this "
                            "checkpoint with --init)";

  // The model, compared as a Config: how it is spelled in JSON (model_type,
  // key order, a newer writer's extra keys) does not matter.
  if (stored.contains("model")) {
    nlohmann::json was = stored["model"];
    try {
      was = Config::from_json(was, where + "/trainer_state.json").to_json();
    } catch (const Error&) {
    }
    const nlohmann::json& model = now.at("model");  // o.model as run_settings wrote it
    for (auto it = model.begin(); it != model.end(); ++it) {
      const std::string& k = it.key();
      if (k == "model_type" || k == "architectures" || k == "torch_dtype") continue;  // follow from the rest
      if (!was.contains(k) || was[k] != it.value())
        fail(refuse, "the flags ask for a model with ", it.key(), " ", brief(it.value()), "; the run's model has ",
             was.contains(it.key()) ? brief(was[it.key()]) : std::string("none"), fresh);
    }
  }

  // The global batch: the same windows per step whatever the ranks.
  if (stored.contains("batch") && stored.contains("accum")) {
    const int64_t W = stored.value("world_size", int64_t{1}), b = stored["batch"].get<int64_t>(),
                  a = stored["accum"].get<int64_t>();
    if (W * b * a != o.world * o.batch * o.accum)
      fail(refuse, "the global batch (ranks x --batch x --accum) is ", o.world, " x ", o.batch, " x ", o.accum, " = ",
           o.world * o.batch * o.accum, " windows, the run's was ", W, " x ", b, " x ", a, " = ", W * b * a,
           " (with another number of ranks, give a --batch or --accum that keeps the run's)");
    if (W != o.world || b != o.batch || a != o.accum)
      notes.push_back(cat("the run's global batch of ", W * b * a, " windows, now as ", o.world, " rank",
                          o.world == 1 ? "" : "s", " x --batch ", o.batch, " x --accum ", o.accum, " (the run's: ", W,
                          " x ", b, " x ", a, ")"));
  }

  // A run stored before an option existed ran as its default does: a
  // trajectory option absent from the settings is compared with its default.
  nlohmann::json defaults;
  const TrainOptions default_options;
  TrainOptions::each(default_options, [&](const auto& field, const char* key, const char*, OnResume, const char*) {
    defaults[key] = field;
  });
  TrainOptions::each(o, [&](const auto&, const char* key, const char*, OnResume r, const char*) {
    const std::string flag = "--" + option_flag(key);
    if (!stored.contains(key) && r != OnResume::kFixed) return;
    const nlohmann::json& was = stored.contains(key) ? stored[key] : defaults[key];
    switch (r) {
      case OnResume::kFixed:
        if (was != now[key]) fail(refuse, flag, " is ", brief(now[key]), ", the run's was ", brief(was), fresh);
        break;
      case OnResume::kExtend: {
        const int64_t steps = now[key].get<int64_t>();
        if (steps <= step_done)
          fail(where, ": the run is at step ", step_done, " and ", flag, " is ", steps,
               ": nothing to train (a larger --steps extends the run)");
        if (was != now[key]) {
          const int64_t s = step_done, w = o.warmup;
          notes.push_back(cat(flag, " ", steps, " (the run's: ", brief(was),
                              "): the learning rate now follows the schedule of a ", steps, "-step run; at step ",
                              s + 1, " it is ", lr_at(s, w, steps, o.lr, o.lr_min), " (was ",
                              lr_at(s, w, was.get<int64_t>(), o.lr, o.lr_min), ")"));
        }
        break;
      }
      case OnResume::kSameData: {
        if (stored.contains("data_files")) {
          if (stored["data_files"] != now["data_files"])
            fail(refuse, flag, " ", o.data, " does not hold the run's tokens (", brief(was),
                 "): the shards' token counts or contents differ");
        } else if (was != now[key]) {  // a run stored before fingerprints: the path must match
          fail(refuse, flag, " is ", brief(now[key]), ", the run's was ", brief(was));
        }
        if (was != now[key]) notes.push_back(cat(flag, " ", o.data, ": the run's tokens, under another path"));
        break;
      }
      case OnResume::kSamePlace:
        if (!was.is_string() || !same_place(now[key].get<std::string>(), was.get<std::string>()))
          fail(refuse, flag, " is ", brief(now[key]), ", the run's was ", brief(was), fresh);
        break;
      case OnResume::kGlobalBatch:  // checked above, as a product
        break;
      case OnResume::kFree:
        if (was != now[key]) notes.push_back(cat(flag, " ", brief(now[key]), " (the run's: ", brief(was), ")"));
        break;
    }
  });
  return notes;
}

}  // namespace attnres
