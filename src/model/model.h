// model.h — a Qwen3 decoder-only transformer with depth routing: parameters,
// gradients, activations, and the forward and backward passes.
//
// Shapes: N = B·T token rows; every activation is row-major (N, ·).  The 2L
// sublayers are numbered k = 2l (attention of layer l) and k = 2l+1 (its MLP).
// The forward is a flat list of op calls per layer (model.cpp); the backward
// is the same list in reverse.  All memory is allocated once, in the
// constructor, from (config, B, T) and the routing mode; the step loop
// allocates nothing.
//
// Depth routing (DESIGN.md §2).  Each mode is a choice of sources, of how a
// router's result is combined (replacement or additive), of block resets and
// of a final router; the per-mode choices live in a few small functions of
// model.cpp (embedding, sublayer input and output, final input, and their
// backward mirrors), each a switch over the mode.  What each mode
// keeps for the backward (bench-small: N·d floats = 4 MiB):
//   baseline     the input of every sublayer (2L·N·d), as before;
//   full, delta  every source — e and each sublayer output (2L+1) — and their
//                gradients (2L+1); sublayer inputs are NOT stored but rebuilt
//                in the backward from the stored logits and the sources (delta's
//                stream x rebuilt by summing its sources in the forward's order,
//                in the same pass, so bit-identically);
//   block        every partial block sum P_k (2L+1: the blocks are the P_k at
//                block starts, no copies), gradients for the blocks only (the
//                running partial's gradient is one buffer); inputs rebuilt;
//   delta_block  the sublayer inputs (2L, as baseline) and the block sources
//                with their gradients.
// Plus the logits z (N·S floats per router) and r (N per source).
//
// Gradient buffers that ACCUMULATE across routers: every source gradient
// (Source::dv) and, in block mode, the running partial-sum gradient dx_ —
// both receive += from every router that reads the source, except from the
// first router the backward runs (the final router, or the last MLP's), which
// reads every source and assigns (=); the few it does not read are zeroed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/buffer.h"
#include "model/config.h"
#include "model/params.h"
#include "ops/routing.h"

namespace attnres {

// Activations kept from the forward for the backward, per layer.
struct LayerActs {
  float* x_attn = nullptr;   // (N, d)      input of the attention sublayer (baseline, delta_block; else null)
  float* rstd1 = nullptr;    // (N)         input_layernorm rstd
  float* q = nullptr;        // (N, H·hd)   q_proj output, before q_norm
  float* k = nullptr;        // (N, KV·hd)  k_proj output, before k_norm
  float* v = nullptr;        // (N, KV·hd)
  float* q_rstd = nullptr;   // (N, H)
  float* k_rstd = nullptr;   // (N, KV)
  float* att = nullptr;      // (N, H·hd)   attention output, before o_proj
  float* lse = nullptr;      // (B, H, T)   softmax log-sum-exp per query row
  float* x_mlp = nullptr;    // (N, d)      input of the MLP sublayer (baseline, delta_block; else null)
  float* rstd2 = nullptr;    // (N)         post_attention_layernorm rstd
  float* gate = nullptr;     // (N, F)      gate_proj output
  float* up = nullptr;       // (N, F)      up_proj output
};

// A routing source tensor of the mode (see the header comment).
struct Source {
  float* v = nullptr;     // (N, d)
  float* rstd = nullptr;  // (N)      r = (mean(v²) + eps)^-½, computed when v is made
  float* dv = nullptr;    // (N, d)   its gradient; accumulates over the routers reading it
};

// One router, fixed at construction: its sources are buffers of the arena.
struct Router {
  std::string name;                       // "layers.3.attn", "layers.3.mlp", "final"
  int64_t k = 0;                          // the sublayer whose input it makes; 2L for the final router
  std::vector<std::string> source_names;  // (S) "null", "embed", "layers.0.attn", "block.1", "partial", ...
  const RouterWeights* w = nullptr;       // parameters (proj, norm, null_source, alpha)
  RouterWeights* g = nullptr;             // their gradients
  std::vector<int> index;                 // (S) index in Model::sources_, −1 for the null source
  std::vector<RouteSource> src;           // (S) in order; the null source, if any, first
  std::vector<float*> dsrc;               // (S) gradient buffers of src (accumulate)
  float* logits = nullptr;                // (N, S) routing logits z of the last forward (α = softmax(z))
};

// Routing statistics per router (DESIGN.md §2), accumulated by every forward
// while attached to a model; to_json gives one object of per-router arrays.
struct RoutingStats {
  std::string mode;
  std::vector<std::string> routers;               // router names
  std::vector<std::vector<std::string>> sources;  // per router, its source names
  std::vector<RouteStats> acc;                    // per router
  nlohmann::json to_json() const;
  void clear();
};

class Model {
 public:
  // B, T: the largest micro-batch the activations are sized for.
  Model(const Config& c, int64_t B, int64_t T);
  Model(const Model&) = delete;  // routers point into this object
  Model& operator=(const Model&) = delete;

  const Config& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t B() const { return B_; }
  int64_t T() const { return T_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const Weights& w() const { return w_; }
  const Weights& g() const { return g_; }
  int64_t num_params() const;  // distinct parameters (the tied head counted once)

  void init(Rng& rng) { init_params(layout_, cfg_, params_.data(), rng); }
  void zero_grad() { grads_.zero(); }

  // Forward on inputs (B, T); returns the mean cross-entropy over targets
  // (B, T) (targets < 0 are ignored).  With backward = true it also adds
  // grad_scale · ∂loss/∂θ into the gradient arena.
  double forward_backward(const int32_t* inputs, const int32_t* targets, bool backward, float grad_scale = 1.0f);
  // Forward only, writing logits (B, T, V).
  void forward_logits(const int32_t* inputs, float* logits);
  // Forward only, over a micro-batch of B ≤ B() rows of inputs (B, T): for
  // routing statistics; no logits.
  void forward_only(const int32_t* inputs, int64_t B) { forward(inputs, B); }
  // Per-token losses (B, T) of the last forward (forward_backward).
  const float* token_losses() const { return token_loss_.data(); }

  // Routing statistics: an empty accumulator shaped for this model's routers
  // (none in baseline), and attaching one (nullptr detaches) makes every
  // forward add into it.  Detached, the forward does no statistics work.
  RoutingStats make_routing_stats() const;
  void attach_routing_stats(RoutingStats* s);
  const std::vector<Router>& routers() const { return routers_; }

  // Training FLOPs per token of one forward+backward (6·matmul params + attention).
  double flops_per_token(int64_t T) const;

 private:
  Config cfg_;
  ParamLayout layout_;
  int64_t B_, T_, N_;
  Buffer params_, grads_;
  Weights w_, g_;

  // Activations (arena).
  Buffer acts_;
  std::vector<LayerActs> layer_;
  float* x_final_ = nullptr;  // (N, d)  input of the final norm: the stream (baseline, delta modes;
                              //         the running stream of the forward), or the final router's output
  float* rstd_f_ = nullptr;   // (N)
  float* xf_ = nullptr;       // (N, d)  final norm output
  float* rope_cos_ = nullptr; // (T, hd/2)
  float* rope_sin_ = nullptr; // (T, hd/2)
  // Scratch, reused by every layer.
  float* ln_ = nullptr;       // (N, d)
  float* qr_ = nullptr;       // (N, H·hd)   normed + rotated q
  float* kr_ = nullptr;       // (N, KV·hd)
  float* out_ = nullptr;      // (N, d)      sublayer output (baseline, delta_block)
  float* h_ = nullptr;        // (N, F)      silu(gate)·up, then dgate
  float* dh_ = nullptr;       // (N, F)
  float* dup_ = nullptr;      // (N, F)
  float* dx_ = nullptr;       // (N, d)      gradient of the residual stream (block: of the partial sum)
  float* dln_ = nullptr;      // (N, d)
  float* dq_ = nullptr;       // (N, H·hd)
  float* dk_ = nullptr;       // (N, KV·hd)
  float* dv_ = nullptr;       // (N, KV·hd)
  float* datt_ = nullptr;     // (N, H·hd)
  float* attn_scratch_ = nullptr;  // (threads, attention_scratch_floats(T))
  float* head_scratch_ = nullptr;  // lm_head_scratch_floats(V)
  Buffer token_loss_;              // (N)

  // Depth routing (empty / null in baseline).
  std::vector<Source> sources_;   // full, delta: e, then output of sublayer k at k+1   (2L+1)
                                  // block: partial sums P_0 = e, P_{k+1} after sublayer k (2L+1)
                                  // delta_block: the block sources, one per block
  std::vector<Router> routers_;   // the routers that run, in forward order
  std::vector<int> router_of_;    // (2L) index in routers_ of sublayer k's router, −1 if none
  int final_router_ = -1;         // index in routers_ (full, block)
  Combine combine_ = Combine::kReplace;
  float* u_ = nullptr;            // (N, d)   sublayer input built by a router (full, block, delta)
  float* dU_ = nullptr;           // (N, d)   gradient of a routed input
  float* xb_ = nullptr;           // (N, d)   delta_block "true": stream at the last block start
  float* null_rstd_ = nullptr;    // (2L)     rstd of each router's null source
  float* route_scratch_ = nullptr;  // route_scratch_floats(N, d, S_max)
  RoutingStats* stats_ = nullptr;
  int64_t rebuilt_ = -1;          // the sublayer whose input u_ already holds (rebuilt by a router backward)
  int first_backward_router_ = -1;  // the first router the backward runs; it assigns its sources' gradients
  std::vector<float*> zeroed_dv_;   // source gradients it does not cover: zeroed at each backward's start

  int64_t cur_B_ = 0;  // micro-batch of the last forward
  void forward(const int32_t* inputs, int64_t B);
  void attention_forward_(int64_t l, const float* x, float* out);
  void mlp_forward_(int64_t l, const float* x, float* out);
  // dout: gradient of the sublayer output; x: its input; dx = (accumulate ? += : =) gradient of x.
  void attention_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate);
  void mlp_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate);
  void backward(const int32_t* inputs);

  // The per-mode steps of the layer loop (model.cpp).
  void build_routers_();
  void embed_(const int32_t* inputs);
  void embed_backward_(const int32_t* inputs);
  void final_input_();
  void final_input_backward_();
  float* stored_input_(int64_t k);
  float* sublayer_out_(int64_t k);
  const float* sublayer_input_(int64_t k);
  void sublayer_output_(int64_t k);
  float* sublayer_output_backward_(int64_t k);
  const float* sublayer_input_recompute_(int64_t k);
  void sublayer_input_backward_(int64_t k);
  bool block_start_(int64_t l) const { return l % cfg_.layers_per_block() == 0; }
  void route_(int r, float* out, const float* base);
  void route_mix_(int r, float* out, const float* base);
  void route_backward_(int r, bool first = false);
  const float* gate_base_(int r) const;  // kReplace with gate: the router's last source
};

}  // namespace attnres
