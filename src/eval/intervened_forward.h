// intervened_forward.h — a model's forward with some routers' routing
// replaced, run from a shared prefix: the causal probes of `attnres routing
// --interventions` (docs/routing.md, "Interventions"; eval/interventions.h
// measures them over a file).
//
// A forward stopped before sublayer k (2L: before the final router) is a
// prefix; the rest of the forward can run from it any number of times, with
// different interventions, and the sublayers before k are shared by every
// intervention at k or later.  The prefix is the sources made so far (later
// sublayers never overwrite them) and the state the forward carries from
// sublayer to sublayer (Model::carried_state: the stream, delta_block's xb),
// copied aside.  The forward is the model's own, in steps (model/model.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "model/model.h"

namespace attnres {

// One router's routing replaced:
//   kAblate:  the sources not in `keep` leave the router's softmax; the
//             remaining weights are renormalised per token (and per routing
//             head), i.e. the router routes over `keep` alone.  With none
//             left the routed sum is 0 (an additive router adds nothing);
//   kWeights: α fixed to `weights` (H, S) for every token (mean routing,
//             uniform routing): routing that does not depend on the token.
// Only the routed sum changes: a gated replacement's base (its last source)
// stays what it was.
struct RouteIntervention {
  enum class Kind { kAblate, kWeights };
  int router = -1;               // index in Model::routers()
  Kind kind = Kind::kAblate;
  std::vector<int> keep;         // kAblate: positions in the router's source list, ascending
  std::vector<double> weights;   // kWeights: (H, S)
  static RouteIntervention ablate(int router, std::vector<int> keep) {
    return {router, Kind::kAblate, std::move(keep), {}};
  }
  static RouteIntervention fixed(int router, std::vector<double> weights) {
    return {router, Kind::kWeights, {}, std::move(weights)};
  }
};

class IntervenedForward {
 public:
  // A model with routers (Error otherwise); its memory for the prefix and
  // the interventions' lists is allocated here, once.
  explicit IntervenedForward(Model& model);
  IntervenedForward(const IntervenedForward&) = delete;  // the model points at its overrides
  IntervenedForward& operator=(const IntervenedForward&) = delete;

  // begin uploads inputs (B, T) and embeds them (the prefix at k = 0);
  // advance runs the plain forward on to sublayer k ≥ the current one; loss
  // runs from the prefix to the loss with `iv` applied (each router at most
  // once, none before the prefix) and returns Model::loss_sum's result — with
  // no interventions, loss_sum's bits.  Model::token_losses() then holds its
  // per-token losses.  The prefix is unchanged by it; any other forward of
  // the model ends it.
  void begin(const int32_t* inputs, int64_t B, int64_t T);
  void advance(int64_t k);
  Model::LossSum loss(const int32_t* targets, const std::vector<RouteIntervention>& iv);
  int64_t prefix() const;  // the prefix's sublayer; −1: none

 private:
  Model& model_;
  int64_t prefix_k_ = -1;
  uint64_t forward_ = 0;                // the model's forward the prefix belongs to
  int64_t n_ = 0;                       // floats of one carried buffer in that forward: B·T·d
  Buffer state_;                        // (carried buffers, N, d): the carried state at the prefix
  Buffer lists_;                        // every router's room for kept sources, then for weights
  std::vector<RouteSource*> src_slot_;  // (routers) S entries each, in lists_
  std::vector<double*> w_slot_;         // (routers) H·S each, in lists_
  std::vector<RouteOverride> override_;  // (routers)
  void save_();
  void restore_();
};

}  // namespace attnres
