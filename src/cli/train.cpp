// train.cpp — `attnres train`: train from scratch, fine-tune, or resume.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "model/presets.h"
#include "train/trainer.h"

namespace attnres {

int cmd_train(int argc, char** argv) {
  Flags f("train", "Train a Qwen3 model (any attnres_mode) on token files; checkpoints go to --out.",
          {
              {"config", "tiny", "preset name (tiny, bench-small) or path to a config.json "
                                 "(default with --init/--resume: the checkpoint's)"},
              {"mode", "", "override attnres_mode: baseline, block, full, delta, delta_block"},
              {"num-blocks", "", "override attnres_num_blocks (block modes)"},
              {"block-delta", "", "override attnres_block_delta: true (the paper's) or reference (the released code's)"},
              {"null-source", "", "override attnres_use_null_source: true or false (delta modes)"},
              {"gate", "", "override attnres_gate_type: bias or learnable_alpha (0 at init: an exact conversion "
                           "in the delta modes)"},
              {"query-init", "", "override attnres_query_init: zero or normal"},
              {"init", "", "model or run directory to fine-tune from (default: random init)"},
              {"data", "", "training tokens: a .bin token file or a glob of shards (required)"},
              {"data-order", "random", "random: windows at random offsets; sequential: llm.c order"},
              {"val-data", "", "validation token file"},
              {"out", "", "output directory for checkpoints and log.jsonl (required)"},
              {"resume", "", "checkpoint or run directory to continue from, bit-identically"},
              {"tokenizer", "", "tokenizer.json copied into every checkpoint (default: the one beside --data, "
                                "else --init's / --resume's)"},
              {"steps", "200", "optimizer steps"},
              {"batch", "8", "micro-batch size B"},
              {"seq-len", "256", "sequence length T"},
              {"accum", "1", "micro-batches per optimizer step"},
              {"lr", "3e-3", "peak learning rate"},
              {"lr-min", "3e-4", "final learning rate of the cosine decay"},
              {"lr-routing", "", "peak learning rate of the routing parameters (default: --lr)"},
              {"lr-min-routing", "", "final learning rate of the routing parameters (default: --lr-min, as the "
                                     "reference script)"},
              {"freeze-base", "false", "train the routing parameters only (no gradients or moments for the rest)"},
              {"warmup", "20", "linear warmup steps"},
              {"weight-decay", "0.1", "AdamW weight decay (matrices and embeddings only)"},
              {"beta1", "0.9", "AdamW beta1"},
              {"beta2", "0.95", "AdamW beta2"},
              {"eps", "1e-8", "AdamW epsilon"},
              {"clip", "1.0", "global gradient-norm clip (0 = off)"},
              {"seed", "1337", "random seed (init and data)"},
              {"val-every", "0", "validate every N steps (0 = at the end only)"},
              {"val-tokens", "0", "validate on the first N tokens (0 = the whole file)"},
              {"ckpt-every", "0", "checkpoint every N steps (0 = at the end only)"},
              {"keep-checkpoints", "3", "keep the newest N checkpoints, the final one included (0 = all)"},
              {"save-optimizer", "true", "write the AdamW moments (false: weights-only checkpoints, no resume)"},
              {"save-dtype", "f32", "checkpoint weights as f32 or bf16"},
              {"time-budget", "0", "stop (validate, checkpoint) after this many seconds (0 = none)"},
              {"routing-every", "0", "log routing statistics to log.jsonl every N steps (0 = off)"},
              {"recompute", "false", "keep one layer's activations and recompute the rest in the backward "
                                     "(a third more compute; the same gradients)"},
              {"threads", "0", "threads (0 = all cores)"},
              {"peak-gflops", "0", "peak GFLOP/s that MFU is against (0 = measure SGEMM 2048^3 at start)"},
          });
  if (!f.parse(argc, argv)) return 0;
  TrainOptions o;
  o.threads = static_cast<int>(f.i64("threads"));
  // The model shape comes from --config, else from the checkpoint being
  // resumed or fine-tuned.
  const std::string from = !f.str("resume").empty() ? f.str("resume") : f.str("init");
  o.model = f.given("config") || from.empty() ? load_config(f.str("config"))
                                              : Config::load(resolve_model_dir(from) + "/config.json");
  // attnres_* overrides: converting a plain Qwen3 needs no hand-written config.
  nlohmann::json j = o.model.to_json();
  if (!f.str("mode").empty()) j["attnres_mode"] = f.str("mode");
  if (!f.str("num-blocks").empty()) j["attnres_num_blocks"] = f.i64("num-blocks");
  if (!f.str("block-delta").empty()) j["attnres_block_delta"] = f.str("block-delta");
  if (!f.str("null-source").empty()) j["attnres_use_null_source"] = f.on("null-source");
  if (!f.str("gate").empty()) j["attnres_gate_type"] = f.str("gate");
  if (!f.str("query-init").empty()) j["attnres_query_init"] = f.str("query-init");
  o.model = Config::from_json(j, "the train flags");
  o.init_from = f.str("init");
  o.data = f.str("data");
  o.data_order = f.str("data-order");
  o.val_data = f.str("val-data");
  o.out_dir = f.str("out");
  o.resume = f.str("resume");
  o.tokenizer = f.str("tokenizer");
  if (o.data.empty()) fail("--data is required (a token file; see attnres train --help)");
  if (o.out_dir.empty()) fail("--out is required");
  o.steps = f.i64("steps");
  o.batch = f.i64("batch");
  o.seq_len = f.i64("seq-len");
  o.accum = f.i64("accum");
  o.lr = f.f64("lr");
  o.lr_min = f.f64("lr-min");
  o.warmup = f.i64("warmup");
  if (!f.str("lr-routing").empty()) o.lr_routing = f.f64("lr-routing");
  if (!f.str("lr-min-routing").empty()) o.lr_min_routing = f.f64("lr-min-routing");
  if (o.lr_min_routing >= 0 && o.lr_routing < 0) fail("--lr-min-routing needs --lr-routing");
  o.freeze_base = f.on("freeze-base");
  o.recompute = f.on("recompute");
  if (o.freeze_base && o.model.mode == Mode::kBaseline)
    fail("--freeze-base trains the routing parameters only, and a baseline model has none (set --mode)");
  o.keep_checkpoints = f.i64("keep-checkpoints");
  if (o.keep_checkpoints < 0) fail("--keep-checkpoints must be 0 (all) or positive");
  o.save_optimizer = f.on("save-optimizer");
  const std::string sd = f.str("save-dtype");
  if (sd != "f32" && sd != "bf16") fail("--save-dtype must be f32 or bf16, got '", sd, "'");
  o.save_bf16 = sd == "bf16";
  o.adamw.weight_decay = f.f64("weight-decay");
  o.adamw.beta1 = f.f64("beta1");
  o.adamw.beta2 = f.f64("beta2");
  o.adamw.eps = f.f64("eps");
  o.clip = f.f64("clip");
  o.seed = static_cast<uint64_t>(f.i64("seed"));
  o.val_every = f.i64("val-every");
  o.val_tokens = f.i64("val-tokens");
  o.ckpt_every = f.i64("ckpt-every");
  o.time_budget_s = f.f64("time-budget");
  o.routing_every = f.i64("routing-every");
  o.peak_flops = f.f64("peak-gflops") * 1e9;
  std::printf("attnres train\n%s", f.table().c_str());
  std::fflush(stdout);  // before any error line on stderr, also when piped
  TrainResult r = train(o);
  if (r.val_tokens > 0)
    std::printf("final: %lld steps, train loss %.4f, val loss %.4f, val perplexity %.2f\n",
                static_cast<long long>(r.steps_done), r.final_loss, r.val_loss, r.val_ppl);
  return 0;
}

}  // namespace attnres
