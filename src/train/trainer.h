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
#include "train/options.h"

namespace attnres {

struct TrainResult {
  int64_t steps_done = 0;
  int64_t schedule_steps = 0;  // where the learning-rate schedule ended (< --steps: the time budget cut the run)
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
