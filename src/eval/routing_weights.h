// routing_weights.h — the routing weights of every token: for each router of
// a model, α = softmax(z) per routing head over its sources, for every row
// of one forward (the statistics of eval/routing_stats.h are their sums over
// a file; this is the whole array, for analysis of single inputs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace attnres {

struct TokenRouting {
  std::string name;                  // "layers.3.attn", "final", a value router's name
  std::vector<std::string> sources;  // (S) "null", "embed", "layers.0.attn", "block.1", …
  int64_t heads = 1;                 // H
  std::vector<float> weights;        // (N, H, S): row n = b·T + t of the forward, each (n, h) summing to 1
};

// One forward over inputs (B, T) (B ≤ model.B(), T ≤ model.T()), every
// router's weights in forward order.  Each softmax is over float logits, in
// double, as the routing statistics are.
std::vector<TokenRouting> routing_weights(Model& model, const int32_t* inputs, int64_t B, int64_t T);

}  // namespace attnres
