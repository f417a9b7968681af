// model_options.h — what kind of model to build from a Config: the shapes of
// its forwards, training or inference, a KV cache's length, the products' precision.
// The routing plan (model/plan.h) and the Model (model/model.h) are both
// built from a Config and these.
#pragma once

#include <cstdint>

#include "core/precision.h"

namespace attnres {

struct ModelOptions {
  int64_t batch = 1;      // B: the most sequences of one forward
  int64_t seq_len = 1;    // T: the most positions per sequence in one forward
  int64_t rows = 0;       // the most tokens (B·T) of one forward; 0 = batch × seq_len
  bool training = true;   // keep what the backward needs; allocate gradients
  int64_t cache_len = 0;  // inference: the most positions of a KV cache it serves (infer/kv_cache.h; 0 = none),
                          // which its RoPE tables cover
  Precision precision = Precision::kF32;  // of the products (model/model.h, the top); Error where the backend cannot
  bool freeze_base = false;  // training: only the routing parameters get gradients (--freeze-base)
  // Training: keep one layer's activations (plus every layer's inputs where
  // the mode stores them) and rerun each sublayer's forward in the backward
  // (--recompute): a third more compute, a fraction of the memory.
  bool recompute = false;
};

}  // namespace attnres
