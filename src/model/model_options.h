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
  // Training: the routing entropy term of the reference code (docs/routing.md
  // "The entropy term"): the backward takes the gradient of
  //   loss − λ·E,  E = the mean over the 2L sublayer routers (a sublayer with
  //   no router counts 0), tokens and routing heads of −Σ_i α_i ln(α_i + 1e−8),
  // while the loss a forward returns stays the cross-entropy (E: route_entropy()).
  // 0 = none; needs a routed mode.
  double entropy_lambda = 0.0;
  // Training: a sharded run's model (ZeRO stage 3, distributed/zero3.h): the
  // weight, bf16-copy and gradient arenas are lazily backed, so that a rank
  // holds only what it owns and the units in use (Model::set_weight_units).
  bool sharded_weights = false;
};

}  // namespace attnres
