// options.h — the options of a training run, in one list.
//
// TrainOptions::each() names every option once: its field, its key (the flag
// is the key with '-' for '_', the key of the run's stored settings is the
// key), its default, what a resume may do with it, and its help.  The flags
// and --help of `attnres train`, the start-up table, the settings stored in
// every checkpoint and the checks of a resume all come from that list (the
// gemma.cpp habit), so none of them can disagree with another.
//
// Not here: the model's shape and routing (a Config, stored whole with the
// settings; the train command's --config/--mode/... flags build it) and the
// training loop itself (train/trainer.h).
#pragma once

#include <charconv>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/parse_value.h"
#include "core/precision.h"
#include "model/config.h"
#include "model/model_options.h"
#include "ops/backend.h"
#include "train/optimizer.h"

namespace attnres {

// What `--resume` allows an option to do.
enum class OnResume {
  kFixed,     // part of the trajectory: must equal the run's (a new run can change it: --init)
  kExtend,    // --steps: may grow, to extend a run (the schedule then ends at the new step)
  kSameData,  // --data: the shards must hold the run's tokens, however their paths are spelled
  kSamePlace, // --init: the same directory (by file identity), however its path is spelled
  kGlobalBatch, // --batch, --accum: ranks × batch × accum must equal the run's (each may change with the ranks)
  kFree,      // may change: frequencies, logging, output, threads, memory
};

struct TrainOptions {
  Config model;             // the model trained (stored whole with the settings)
  std::string resume;       // checkpoint or run directory to continue from ("" = a new run)
  bool quiet = false;       // no stdout (tests)
  bool overwrite = false;   // a new run may replace the run in `out` (train --overwrite; not a setting of the run)
  bool profile = false;     // time the ops by family (train --profile; not a setting of the run)

  std::string init;         // model dir to fine-tune from ("" = random init)
  std::string data;         // token file or glob of shards
  std::string data_order;   // "random" windows or "sequential" (llm.c)
  std::string val_data;     // "" = no validation
  std::string out;          // checkpoints and log.jsonl
  std::string tokenizer;    // copied into every checkpoint ("" = beside --data, else --init's / --resume's)
  int64_t steps, batch, seq_len, accum, warmup;
  double lr, lr_min;
  double lr_routing, lr_min_routing;  // the routing group's own peak and end (< 0: lr, lr_min)
  bool freeze_base;                   // train the routing parameters only
  double entropy_lambda;              // the routing entropy term's λ (0 = off; ModelOptions::entropy_lambda)
  double weight_decay, beta1, beta2, eps, clip;
  uint64_t seed;
  int64_t val_every, val_tokens, ckpt_every, keep_checkpoints, routing_every;
  bool save_optimizer;
  std::string save_dtype;   // "f32" or "bf16"
  double time_budget;       // seconds; 0 = none
  bool recompute;           // rerun each sublayer's forward in the backward (same bits, less memory)
  std::string precision;    // "fp32" or "bf16": of the matrix products (core/precision.h)
  int64_t threads;          // 0 = every core, else 1 to 1024 (check_threads, ops/context.h)
  std::string device;       // the backend the model runs on (ops/backend.h: backend_names)
  double peak_gflops;       // MFU's denominator; 0 = measure this machine's products (of the precision) at start
  std::string on_nan;       // "stop" or "skip" a step whose loss or gradient is not finite
  double collective_timeout;  // seconds a rank waits for the others (0 = forever)
  int64_t zero;               // ZeRO stage of a data-parallel run: 1 (moments sharded) or 3 (everything; train/zero3.h)
  double max_memory;          // GiB one rank may plan to use (0 = the machine's available memory shared by its ranks)

  int world = 1;  // ranks of the run (not a flag: mpirun -np says it); the global batch is world × batch × accum

  TrainOptions();  // every option at its default

  // The list.  visit(field, key, default, on_resume, help) for each option, in
  // the order of --help.  An empty default of a number means "not set" (-1).
  template <class Self, class Visit>
  static void each(Self& o, Visit&& visit) {
    using R = OnResume;
    static const std::string device_help_text = device_help();  // a help the visitors may keep a pointer to
    visit(o.init, "init", "", R::kSamePlace, "model or run directory to fine-tune from (default: random init)");
    visit(o.data, "data", "", R::kSameData, "training tokens: a .bin token file or a glob of shards (required)");
    visit(o.data_order, "data_order", "random", R::kFixed,
          "random: windows at random offsets; sequential: llm.c order");
    visit(o.val_data, "val_data", "", R::kFree, "validation token file");
    visit(o.out, "out", "", R::kFree,
          "output directory for checkpoints and log.jsonl (required; with --resume: the run's)");
    visit(o.tokenizer, "tokenizer", "", R::kFree,
          "tokenizer.json copied into every checkpoint (default: the one beside --data, else --init's / --resume's)");
    visit(o.steps, "steps", "200", R::kExtend, "optimizer steps (with --resume: a larger number extends the run)");
    visit(o.batch, "batch", "8", R::kGlobalBatch,
          "micro-batch size B of each rank (a step reads ranks x B x accum windows)");
    visit(o.seq_len, "seq_len", "256", R::kFixed, "sequence length T");
    visit(o.accum, "accum", "1", R::kGlobalBatch, "micro-batches per optimizer step, per rank");
    visit(o.lr, "lr", "3e-3", R::kFixed, "peak learning rate");
    visit(o.lr_min, "lr_min", "3e-4", R::kFixed,
          "final learning rate of the cosine decay (with --lr given: --lr / 10 unless given)");
    visit(o.lr_routing, "lr_routing", "", R::kFixed, "peak learning rate of the routing parameters (default: --lr)");
    visit(o.lr_min_routing, "lr_min_routing", "", R::kFixed,
          "final learning rate of the routing parameters (default: --lr-min, as the reference script)");
    visit(o.freeze_base, "freeze_base", "false", R::kFixed,
          "train the routing parameters only (no gradients or moments for the rest)");
    visit(o.entropy_lambda, "entropy_lambda", "0", R::kFixed,
          "the reference code's routing entropy term: train on loss - lambda x E, E the mean over the sublayer "
          "routers, tokens and routing heads of -sum a ln(a + 1e-8) (0 = off; logged as route_entropy)");
    visit(o.warmup, "warmup", "20", R::kFixed, "linear warmup steps");
    visit(o.weight_decay, "weight_decay", "0.1", R::kFixed, "AdamW weight decay (matrices and embeddings only)");
    visit(o.beta1, "beta1", "0.9", R::kFixed, "AdamW beta1");
    visit(o.beta2, "beta2", "0.95", R::kFixed, "AdamW beta2");
    visit(o.eps, "eps", "1e-8", R::kFixed, "AdamW epsilon");
    visit(o.clip, "clip", "1.0", R::kFixed, "global gradient-norm clip (0 = off)");
    visit(o.seed, "seed", "1337", R::kFixed, "random seed (init and data)");
    visit(o.val_every, "val_every", "0", R::kFree, "validate every N steps (0 = at the end only)");
    visit(o.val_tokens, "val_tokens", "0", R::kFree, "validate on the first N tokens (0 = the whole file)");
    visit(o.ckpt_every, "ckpt_every", "0", R::kFree, "checkpoint every N steps (0 = at the end only)");
    visit(o.keep_checkpoints, "keep_checkpoints", "3", R::kFree,
          "keep the newest N checkpoints, the final one included (0 = all)");
    visit(o.save_optimizer, "save_optimizer", "true", R::kFree,
          "write the AdamW moments (false: weights-only checkpoints, no resume)");
    visit(o.save_dtype, "save_dtype", "f32", R::kFree, "checkpoint weights as f32 or bf16");
    visit(o.time_budget, "time_budget", "0", R::kFree,
          "stop (checkpoint) after this many seconds of this process (0 = none)");
    visit(o.routing_every, "routing_every", "0", R::kFree, "log routing statistics to log.jsonl every N steps (0 = off)");
    visit(o.recompute, "recompute", "false", R::kFree,
          "keep one layer's activations and recompute the rest in the backward (a third more compute; the same "
          "gradients)");
    visit(o.precision, "precision", "fp32", R::kFixed, kPrecisionHelp);
    visit(o.threads, "threads", "0", R::kFree,
          "threads (0 = all cores); sums are taken in a fixed order, so the count does not change the result");
    visit(o.device, "device", "cpu", R::kFree, device_help_text.c_str());
    visit(o.peak_gflops, "peak_gflops", "0", R::kFree,
          "peak GFLOP/s of one rank that MFU is against (0 = measure 2048^3 products of the --precision at start: "
          "SGEMM, or oneDNN's bf16 matmul)");
    visit(o.on_nan, "on_nan", "stop", R::kFree,
          "a step whose loss or gradient is not finite (on any rank): stop (error, no checkpoint of it) or skip "
          "its update (10 in a row stop the run)");
    visit(o.collective_timeout, "collective_timeout", "300", R::kFree,
          "seconds a rank waits for the others in a collective before it stops with an error (a rank died or "
          "hangs; 0 = forever); must exceed a checkpoint save");
    visit(o.zero, "zero", "1", R::kFree,
          "ZeRO stage over the ranks: 1 shards the AdamW moments; 3 also the weights, their bf16 copies and "
          "gradients, gathering each layer's while it runs (docs/distributed.md); checkpoints are the same either way");
    visit(o.max_memory, "max_memory", "0", R::kFree,
          "GiB a rank may use by the start-up memory plan, which refuses a run beyond it before allocating (0 = the "
          "machine's available memory, shared by the ranks on it)");
  }

  AdamWConfig adamw() const { return {beta1, beta2, eps, weight_decay}; }
  // The training model these options build (micro-batch, precision, what it keeps).
  ModelOptions model_options() const;
  // --lr without --lr-min: the cosine ends a tenth of the way down from the
  // peak given (the defaults' 3e-3 → 3e-4), never above it (a fine-tune at
  // --lr 5e-5 used to "decay" up to the default 3e-4).  train and compare
  // both take it from here.
  static double default_lr_min(double peak) { return peak / 10; }
  // Checks the options alone (ranges, combinations); throws an Error naming the flag.
  void validate() const;
};

// The flag of an option's key: "seq-len" for "seq_len".
std::string option_flag(const std::string& key);

// One option's text (a flag's value, or its default) into its field, checked
// (core/parse_value.h); an empty text of a number that may be unset
// (lr_routing: "default: --lr") is -1.  An Error names --flag.
template <class T>
void parse_option(T& field, const std::string& key, const std::string& text) {
  if constexpr (std::is_same_v<T, double>)
    if (text.empty()) {
      field = -1;
      return;
    }
  parse_value(field, "--" + option_flag(key), text);
}
// The text of a field that parse_option reads back to the same value.
template <class T>
std::string option_text(const T& field) {
  if constexpr (std::is_same_v<T, bool>) return field ? "true" : "false";
  else if constexpr (std::is_same_v<T, double>) {
    if (field < 0) return "";
    char buf[32];  // the shortest text that reads back to the same double
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, field).ptr);
  }
  else return cat(field);
}

// The run's settings as stored in trainer_state.json: every option by key,
// paths made absolute, "model" (the Config) and "data_files" (a fingerprint of
// each shard, so a resume can tell the same file under another path).
nlohmann::json run_settings(const TrainOptions& o);

// "key = value" lines of every option (and the model), for the start of a run.
std::string options_table(const TrainOptions& o);

// --resume: every option not in `given` (keys set explicitly) takes the run's
// stored value, so `attnres train --resume DIR` alone continues the run.
void take_run_settings(TrainOptions& o, const nlohmann::json& stored, const std::set<std::string>& given);

// Whether options `o` (whose run_settings are `now`) may continue a run
// stored with `stored` at `step_done`: throws an Error naming the first option
// that would change the run's trajectory; returns one note per allowed change
// (printed by the trainer).
std::vector<std::string> check_resume(const TrainOptions& o, const nlohmann::json& now, const nlohmann::json& stored,
                                      int64_t step_done, const std::string& where);

}  // namespace attnres
