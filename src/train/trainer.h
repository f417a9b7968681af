// trainer.h — the training loop: micro-batches with gradient accumulation,
// clipping, AdamW with warmup+cosine, periodic validation, checkpoints, and
// exact resume.  One human line per step on stdout, the same fields as JSONL.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "train/optimizer.h"

namespace attnres {

struct TrainOptions {
  Config model;
  std::string init_from;   // model dir to fine-tune from ("" = random init)
  std::string data;        // token file or glob
  std::string data_order = "random";  // "random" windows or "sequential" (llm.c)
  std::string val_data;    // "" = no validation
  std::string out_dir;     // checkpoints and log.jsonl
  std::string resume;      // checkpoint (or run) dir to continue from
  std::string tokenizer;   // tokenizer.json copied into every checkpoint; "" = the one beside
                           // the data (prepare writes it), else the one of --init / --resume
  int64_t steps = 100, batch = 8, seq_len = 256, accum = 1;
  double lr = 3e-3, lr_min = 3e-4;
  // The routing parameters' own peak and final rate (< 0: lr, lr_min); each
  // group warms up and decays on the same schedule (train/optimizer.h lr_at).
  double lr_routing = -1, lr_min_routing = -1;
  bool freeze_base = false;  // train the routing parameters only
  bool recompute = false;    // rerun each sublayer's forward in the backward (less memory)
  int64_t warmup = 10;
  AdamWConfig adamw;
  double clip = 1.0;
  uint64_t seed = 1337;
  int64_t val_every = 0, val_tokens = 0;  // 0: validate only at the end; 0 tokens = whole file
  int64_t ckpt_every = 0;                 // 0: only at the end
  int64_t keep_checkpoints = 3;           // newest step_* checkpoints kept (the last one included); 0 = all
  bool save_optimizer = true;             // false: weights-only checkpoints (no resume)
  bool save_bf16 = false;                 // checkpoint weights in BF16
  double peak_flops = 160e9;              // for MFU; <= 0: measure this machine's SGEMM at start
  double time_budget_s = 0;               // stop early (checkpointing) when exceeded; 0 = none
  int64_t routing_every = 0;              // log routing statistics of every N-th step to log.jsonl; 0 = off
  int threads = 0;                        // 0 = every core
  bool quiet = false;

  // Settings that must match for a bit-identical resume.
  nlohmann::json resume_settings() const;
};

struct TrainResult {
  int64_t steps_done = 0;
  double final_loss = 0;
  double val_loss = 0, val_ppl = 0;
  int64_t val_tokens = 0;
  std::string last_checkpoint;
};

TrainResult train(const TrainOptions& opt);

class Model;
class AdamW;
// One optimizer step: `accum` micro-batches from next_batch(inputs, targets),
// gradients averaged, clipped to `clip`, AdamW at 1-based step t with rate lr
// (lr_routing for the routing parameters; < 0: lr).
// Returns the mean loss and the gradient norm before clipping.
struct StepStats {
  double loss = 0, grad_norm = 0;
};
StepStats train_step(Model& model, AdamW& adamw, const std::function<void(int32_t*, int32_t*)>& next_batch,
                     int64_t accum, double lr, int64_t t, double clip, double lr_routing = -1);

}  // namespace attnres
