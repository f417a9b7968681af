// model.h — a Qwen3 decoder-only transformer with depth routing: parameters,
// gradients, activations, the forward and backward passes.  What keeps state
// across forwards is built on the forward's steps elsewhere: the KV cache
// (infer/kv_cache.h) and the routing interventions (eval/intervened_forward.h).
//
// Shapes: a forward runs B sequences of T positions, N = B·T token rows, up
// to the B, T and N the model was built for; every activation is row-major
// (N, ·).  The 2L sublayers are numbered k = 2l (attention of layer l) and
// k = 2l+1 (its MLP).  The forward is a flat list of op calls per layer
// (model.cpp); the backward is the same list in reverse.  Every op goes
// through the Context's backend (ops/backend.h).  All memory is allocated
// once, when the model is built; a forward or a step allocates nothing.
//
// Two kinds of model, by ModelOptions::training:
//  - training: keeps, per layer, what the backward needs, and a gradient
//    arena.  What each mode keeps (bench-small: N·d floats = 4 MiB):
//      baseline     the input of every sublayer (2L·N·d);
//      full, delta  every source — e and each sublayer output (2L+1) — and their
//                   gradients; sublayer inputs are NOT stored but rebuilt in
//                   the backward from the logits and the sources (delta's
//                   stream x rebuilt by summing its sources in the forward's
//                   order, in the same pass, so bit-identically);
//      block        every partial block sum P_k (2L+1: the blocks are the P_k at
//                   block starts, no copies), gradients for the blocks only;
//                   inputs rebuilt;
//      delta_block  the sublayer inputs (2L, as baseline) and the block sources
//                   with their gradients;
//      block_add    the sublayer inputs and every partial sum, gradients for
//                   the blocks only, and a running gradient of the partial
//                   sums (dp_) beside the stream's (dx_);
//      full_additive  the sublayer inputs and the stream after each sublayer
//                   but the last (its states S_1 … S_2L−1), each with its
//                   gradient, which joins dx_ where the walk crosses it.
//    The plan carves them (RoutingPlan::arena, model/plan.cpp).
//    Plus the logits z (N·H·S floats per router) and r (N per source) —
//    except in full, whose routers read every earlier output: its backward
//    computes each router's z again from the rows it reads anyway
//    (route_backward with null logits), and the forward's share one buffer.
//  - inference: one layer's activations, shared by all layers, no gradients;
//    only the routing sources (which later routers read) are kept across
//    depth.  Its RoPE tables cover the positions of the longest KV cache it
//    will serve (ModelOptions::cache_len).
//
// Precision (ModelOptions::precision, core/precision.h): in bf16 every weight
// matrix has a bfloat16 copy, and the products, the embedding lookup and the
// LM head read that copy (W_ below: the one place that chooses).  A training
// model keeps the float32 master weights beside it and refreshes the copy in
// each AdamW update (refresh_bf16 for weights written any other way); an
// inference model holds the matrices in bf16 only (half the bytes read per
// decoded token).  Both compute the same function.
//    Depth routing is per position — each router mixes the sources of the
//    same token — so decoding needs no routing state across time: only
//    attention looks at other positions, through the cache.
//
// The backward's gradient bookkeeping (training), in one place:
//  - Source gradients (Source::dv) ACCUMULATE: every router that reads a
//    source adds (+=) its part — except the first router the backward runs
//    (RoutingPlan::first_backward_router: the final router, or, without one,
//    the last MLP's), which reads almost every source and ASSIGNS (=) theirs.
//    The sources it does not read (RoutingPlan::zeroed_gradients) are zeroed
//    at the start of each backward.  So no gradient buffer needs zeroing
//    between steps, and none is read before this backward wrote it.
//  - dx_, the running gradient of the stream (baseline, delta, delta_block:
//    d(x) as the backward walks down) or, in block mode, of the current
//    partial sum: the partial sums inside a block have no dv of their own —
//    their Source::dv IS dx_ — and only block starts own one, into which dx_
//    is folded when the walk crosses a block boundary.  It is first written
//    by the final norm's backward (modes with a stream) or by the first
//    router's backward, which assigns the sources it reads (block: the last
//    partial sum among them).
//  - dU_, the gradient of a router's output: of the final router (written by
//    the final norm's backward) or of the sublayer input a router built
//    (written by that sublayer's backward), read by the router's backward.
//  - rebuilt_: modes that do not store sublayer inputs rebuild them in the
//    backward; a router's backward leaves u_ holding the input of sublayer
//    rebuilt_, so the next sublayer down need not rebuild it again.  Reset to
//    −1 at the start of each backward.
// Routing.GradientBookkeepingReadsNoBufferBeforeWritingIt (model_test.cpp)
// checks all of it: NaN in every gradient buffer before a backward changes no
// gradient bit, in every mode and variant.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/buffer.h"
#include "ops/context.h"
#include "core/precision.h"
#include "model/config.h"
#include "model/model_options.h"
#include "model/params.h"
#include "model/plan.h"
#include "model/routing_stats.h"
#include "ops/backend.h"

namespace attnres {

// Activations of one layer.  Training keeps one per layer for the backward;
// inference shares one among all layers.
struct LayerActs {
  float* x_attn = nullptr;   // (N, d)      input of the attention sublayer (stores_inputs modes; else null)
  float* rstd1 = nullptr;    // (N)         input_layernorm rstd
  float* x_attn_v = nullptr; // (N, d)      V-stream routing: the value projection's input u_v (stored)
  float* rstd1_v = nullptr;  // (N)         its input_layernorm rstd
  float* q = nullptr;        // (N, H·hd)   q_proj output, before q_norm
  float* k = nullptr;        // (N, KV·hd)  k_proj output, before k_norm
  float* v = nullptr;        // (N, KV·hd)
  float* q_rstd = nullptr;   // (N, H)
  float* k_rstd = nullptr;   // (N, KV)
  float* att = nullptr;      // (N, H·hd)   attention output, before o_proj
  float* lse = nullptr;      // (B, H, T)   softmax log-sum-exp per query row (training)
  float* x_mlp = nullptr;    // (N, d)      input of the MLP sublayer (stores_inputs modes; else null)
  float* rstd2 = nullptr;    // (N)         post_attention_layernorm rstd
  float* gate = nullptr;     // (N, F)      gate_proj output
  float* up = nullptr;       // (N, F)      up_proj output
};

// A routing source tensor of the mode (see the header comment).
struct Source {
  float* v = nullptr;     // (N, d)
  float* rstd = nullptr;  // (N)      r = (mean(v²) + eps)^-½, computed when v is made
  float* dv = nullptr;    // (N, d)   its gradient (training); accumulates over the routers reading it
};

// What replaces one router's learned routing in a forward (set_route_override;
// the interventions of eval/intervened_forward.h make them), in backend memory:
//   src, S:   route over these sources (a subset of the router's, in order)
//             with the router's own logits, renormalised over them;
//   weights:  (H, S) fixed weights for every token, S the router's own count.
// Exactly one of src and weights is set.  Only the routed sum changes: a
// gated replacement's base (its last source) stays what it was.
struct RouteOverride {
  const RouteSource* src = nullptr;
  int64_t S = 0;
  const double* weights = nullptr;
};

// Where a forward's attention keeps its keys and values: a KV cache's memory
// (infer/kv_cache.h owns it) and where each of the forward's B sequences sits
// in it.  All pointers in backend memory.
struct KvCacheView {
  float* const* k = nullptr;      // (L) each (seqs, len, KV·hd): keys after k_norm and RoPE
  float* const* v = nullptr;      // (L) each (seqs, len, KV·hd)
  int64_t len = 0;                // positions per sequence
  const int64_t* slot = nullptr;  // (B) each sequence's row of the cache
  const int64_t* pos = nullptr;   // (B) its first position in this forward
};

// One router, fixed at construction: its sources are buffers of the arena.
struct Router {
  std::string name;                       // "layers.3.attn", "layers.3.mlp", "final"
  int64_t k = 0;                          // the sublayer whose input it makes; 2L for the final router
  std::vector<std::string> source_names;  // (S) "null", "embed", "layers.0.attn", "block.1", "partial", ...
  const RouterWeights* w = nullptr;       // parameters (proj, norm, null_source, alpha or gate_logit)
  RouterWeights* g = nullptr;             // their gradients (training)
  // The gate g the routing ops read (backend memory; null: no gate): the
  // learnable_alpha α itself, or sigmoid_scalar's σ(θ), made from θ at each
  // forward's start; and where its gradient goes: α's gradient, or σ(θ)'s
  // (then sent on to θ through the sigmoid's backward).
  const float* gate = nullptr;            // ()
  float* dgate = nullptr;                 // () training
  // sigmoid_vector (docs/routing.md "Gates"): g = σ(x_g·Wᵀ + b) per token and
  // channel; training keeps x_g, g and h − x_g for the backward (inference: g
  // only, shared by every router).  Null without that gate and for the final router.
  float* gate_in = nullptr;               // (N, d)
  float* gate_g = nullptr;                // (N, d)
  float* gate_diff = nullptr;             // (N, d)
  std::vector<int> index;                 // (S) index in Model::sources_, −1 for the null source
  std::vector<RouteSource> src;           // (S) in order; the null source, if any, first
  std::vector<float*> dsrc;               // (S) gradient buffers of src (accumulate; training)
  // The same two lists in backend memory, uploaded once: what the routing ops read.
  const RouteSource* src_list = nullptr;  // (S)
  float* const* dsrc_list = nullptr;      // (S) training
  float* logits = nullptr;                // (N, H, S) routing logits z of the last forward (α = softmax(z), per head)
  bool logits_kept = false;               // training keeps them for the backward; else every router's
                                          // share one buffer and the backward computes them again
  double* stats = nullptr;                // route_stats_size(S) sums of its routing statistics (backend memory)
  bool value = false;                     // V-stream routing: the value router of attention sublayer k
  // pre_gated: the router reads its sources gated, y_i = g∘v_i with
  // g = σ(x·Wᵀ + b), made into the model's shared slots (src/dsrc above point
  // there) as it runs; raw_src / raw_dsrc are the sources themselves.
  float* src_gate = nullptr;              // (N, d) g (training: this router's; inference: shared)
  float* src_gate_in = nullptr;           // (N, d) x, the gate's input (training)
  std::vector<RouteSource> raw_src;       // (S)
  std::vector<float*> raw_dsrc;           // (S) training
};

// A sharded run's weights (ZeRO stage 3, distributed/zero3.h).  The passes
// of a training model say when they are about to read the weights of a unit
// (TensorSpec::unit: 0 the embedding, 1 + l layer l, L + 1 the head) and
// when they are done with them, so that only the units in use are held whole:
//   forward:  need(0) … forward_done(0), need(1) … forward_done(1), …,
//             need(L + 1) (the head, and the tied embedding when tied);
//             then forward_done(L + 1) when no backward follows;
//   backward: backward_done(L + 1), need(L) … backward_done(L), …,
//             need(1) … backward_done(1), backward_done(0) (the embedding's
//             gradient; its weights are not read).
// backward_done(u) comes once u's gradients are all added (this micro-batch's).
class WeightUnits {
 public:
  virtual ~WeightUnits() = default;
  virtual void need(int unit) = 0;
  virtual void forward_done(int unit) = 0;
  virtual void backward_done(int unit) = 0;
};

class Model {
 public:
  Model(Context& ctx, const Config& c, const ModelOptions& o);
  // A training model for micro-batches of B × T.
  Model(Context& ctx, const Config& c, int64_t B, int64_t T) : Model(ctx, c, ModelOptions{B, T}) {}
  Model(const Model&) = delete;  // routers point into this object
  Model& operator=(const Model&) = delete;

  const Config& config() const { return cfg_; }
  Backend& ops() const { return ops_; }  // where its memory lives (downloads of what a tap is given)
  const ParamLayout& layout() const { return layout_; }
  const ModelOptions& options() const { return opt_; }
  Context& context() const { return ctx_; }
  int64_t B() const { return opt_.batch; }
  int64_t T() const { return opt_.seq_len; }
  Precision precision() const { return opt_.precision; }
  // The float32 parameter arena (layout offsets).  An inference model in bf16
  // holds the vectors only there; its matrices are in params_bf16().
  float* params() { return params_.data(); }
  // bf16: the bfloat16 copies of the matrices, at the same offsets (the slots
  // of vectors unused); null in fp32.
  bf16* params_bf16() { return params16_.as<bf16>(); }
  // A training model in bf16: rounds the matrices' master weights within the
  // arena range [lo, hi) (default: all) into their bf16 copies — after the
  // weights were written other than by an AdamW update that writes the copy
  // (a load, a resume, an all-gather).  Does nothing in fp32.
  void refresh_bf16(int64_t lo = 0, int64_t hi = -1);
  float* grads() { return grads_.data(); }  // null in inference
  // Whether a parameter gets a gradient: all of them, or with freeze_base the
  // routing parameters only (frozen ones' gradient arena is never touched).
  bool trains(const TensorSpec& s) const;
  const Weights& w() const { return w_; }
  const Weights& g() const { return g_; }
  int64_t num_params() const;          // distinct parameters (the tied head counted once)
  int64_t weight_bytes() const;        // bytes of parameters as held in memory

  // Random init (params.h); in bf16 the matrices' copies are rounded from it.
  void init(Rng& rng);
  // Weights from files: load_weights (io/checkpoint.h).
  void zero_grad();
  // A sharded run's hooks (null: none; see WeightUnits).  With them, a
  // micro-batch whose targets are all ignored still runs its backward (zero
  // gradients), so that every rank takes part in the same collectives.
  void set_weight_units(WeightUnits* units) { units_ = units; }
  // The activation arena's bytes (a memory plan's working set).
  int64_t activation_bytes() const { return static_cast<int64_t>(acts_.bytes()); }

  // ---- training (at the built B × T) ----
  // Forward on inputs (B, T); returns the mean cross-entropy over targets
  // (B, T) (targets < 0 are ignored).  With backward = true it also adds
  // grad_scale · ∂loss/∂θ into the gradient arena.
  double forward_backward(const int32_t* inputs, const int32_t* targets, bool backward, float grad_scale = 1.0f);

  // The routing entropy E of the last forward (ModelOptions::entropy_lambda > 0):
  // the mean over the 2L sublayers, tokens and routing heads of −Σ α ln(α + 1e−8).
  double route_entropy() const;

  // ---- any B ≤ B(), T ≤ T(), no backward (host arrays) ----
  // Forward over inputs (B, T) at positions 0 … T−1; no logits (routing statistics).
  void forward(const int32_t* inputs, int64_t B, int64_t T);
  // Forward, then the summed cross-entropy over targets (B, T) ≥ 0 and their count.
  struct LossSum {
    double sum = 0;
    int64_t count = 0;
  };
  LossSum loss_sum(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T);
  // Forward at the built (B, T), writing logits (B, T, V) to host memory.
  void forward_logits(const int32_t* inputs, float* logits);
  // The same over inputs (B, T), any B ≤ B(), T ≤ T().
  void forward_logits(const int32_t* inputs, int64_t B, int64_t T, float* logits);
  // Per-token losses (B, T) of the last loss computation, downloaded to host memory.
  std::vector<float> token_losses() const;
  // Per token (B, T) of the last loss_sum, downloaded: 1 where the target is
  // the argmax of the logits (greedy decoding would have chosen it), else 0.
  std::vector<uint8_t> token_greedy() const;

  // ---- the forward in steps ----
  // What the KV cache (infer/kv_cache.h) and the routing interventions
  // (eval/intervened_forward.h) are made of: begin_forward uploads inputs
  // (B, T) and embeds them; run_sublayers runs sublayers [from, to) — 2L of
  // them, k = 2l attention and 2l+1 MLP; finish_forward runs the final router
  // (or takes the stream) and the final norm; then loss_of_forward or
  // last_logits read the head.  forward() and loss_sum() are these steps in
  // order.  With a cache view, attention stores this forward's keys and
  // values into it and reads the cache, each sequence at its positions
  // (view.pos[b] … + T − 1); without one, positions 0 … T−1 of this forward.
  // The view must outlive the forward.
  void begin_forward(const int32_t* inputs, int64_t B, int64_t T, const KvCacheView* cache = nullptr);
  void run_sublayers(int64_t from, int64_t to);
  void finish_forward();
  LossSum loss_of_forward(const int32_t* targets);  // the summed loss over targets (B, T) ≥ 0, and their count
  void last_logits(float* logits);                  // (B, V) host: each sequence's last position
  // Counts begin_forward calls: a caller that keeps state between the steps
  // (a prefix) knows from it whether another forward has run since.
  uint64_t forwards() const { return forwards_; }
  // The buffers a forward carries from sublayer to sublayer besides the
  // sources (which later sublayers do not overwrite): the stream, and
  // delta_block's stream at the last block start.  Each (rows of the current
  // forward, d), backend memory.  A copy of them taken before sublayer k and
  // put back lets the forward run from k again.
  std::vector<float*> carried_state() const;
  // Replaces router r's routing in the forwards that follow (null: its own
  // again) until the next begin_forward, which clears every override.  The
  // override must outlive its use.
  void set_route_override(int r, const RouteOverride* o);
  // Called, while set, as each router has routed in a forward (not under an
  // override): its index and its logits z (rows of the forward, H, S), backend
  // memory, valid until the next router runs (α = softmax(z) per head).  What
  // eval/routing_weights.h reads the routing of every token with.
  using RouteTap = std::function<void(int r, const float* logits)>;
  void set_route_tap(RouteTap tap) { route_tap_ = std::move(tap); }

  // Routing statistics (docs/routing.md; no routers in baseline), summed in
  // backend memory by every forward while collecting: collect_routing_stats(true)
  // starts them from zero, routing_stats() downloads the sums so far, and
  // collect_routing_stats(false) stops — the forward then does no statistics work.
  void collect_routing_stats(bool on);
  RoutingStats routing_stats() const;
  const std::vector<Router>& routers() const { return routers_; }
  const RoutingPlan& plan() const { return plan_; }

  // The activation arena's table of sizes, in carving order; the header's
  // "what each mode keeps" is this table (Plan.TheArenaKeepsWhatTheModelHeaderSays).
  const std::vector<ArenaEntry>& arena() const { return plan_.arena; }

  // Training FLOPs per token of one forward+backward (6·matmul params + attention).
  double flops_per_token(int64_t T) const;

  // Tests: fills every activation-gradient buffer of arena() — the source
  // gradients, dx_, dU_ and the backward's scratch — with `value`.  A backward that reads
  // one of them before it assigns it (a source whose first writer
  // accumulates, a stale rebuilt input) then shows it in the gradients.
  void fill_gradient_buffers_for_testing(float value);

 private:
  Context& ctx_;
  Backend& ops_;
  Config cfg_;
  ModelOptions opt_;
  ParamLayout layout_;
  RoutingPlan plan_;  // what routes what (plan.h): the sources, the routers, the backward's bookkeeping
  Buffer params_, params16_, grads_;
  Weights w_, g_;

  // Activations (arena).
  Buffer acts_;
  std::vector<LayerActs> layer_;  // (L); in inference every entry points at the same buffers
  int32_t* tokens_ = nullptr;     // (N)      the inputs, in backend memory
  int32_t* targets_ = nullptr;    // (N)
  // (N, d) the residual stream x, updated by every sublayer (modes with a
  // stream: x += out), which the final norm reads; in modes without one
  // (block, full), the final router's output, the final norm's input.
  float* stream_ = nullptr;
  float* rstd_f_ = nullptr;   // (N)
  float* xf_ = nullptr;       // (N, d)  final norm output
  float* rope_cos_ = nullptr; // (P, hd/2)  P = max(T, cache_len) positions
  float* rope_sin_ = nullptr; // (P, hd/2)
  float* logits_ = nullptr;   // (B, V)  logits of one row per sequence
  // Scratch, reused by every layer.
  float* ln_ = nullptr;       // (N, d)
  float* qr_ = nullptr;       // (N, H·hd)   normed + rotated q
  float* kr_ = nullptr;       // (N, KV·hd)
  float* out_ = nullptr;      // (N, d)      sublayer output (modes whose outputs are not sources)
  float* h_ = nullptr;        // (N, F)      silu(gate)·up, then dgate
  // Gradient scratch (training).
  float* dh_ = nullptr;       // (N, F)
  float* dup_ = nullptr;      // (N, F)
  float* dx_ = nullptr;       // (N, d)      gradient of the residual stream (block: of the partial sum)
  float* dp_ = nullptr;       // (N, d)      block_add: gradient of the current partial sum (beside dx_'s stream)
  float* dsum_ = nullptr;     // (N, d)      block_add: a sublayer output's gradient, dx_ + dp_
  float* dpart_ = nullptr;    //             the partial sums' running gradient: dx_ (block) or dp_ (block_add)
  float* dln_ = nullptr;      // (N, d)
  float* dq_ = nullptr;       // (N, H·hd)
  float* dk_ = nullptr;       // (N, KV·hd)
  float* dv_ = nullptr;       // (N, KV·hd)
  float* datt_ = nullptr;     // (N, H·hd)
  Buffer token_loss_;         // (N)
  Buffer token_greedy_;       // (N) bytes

  // Depth routing (empty / null in baseline).
  std::vector<Source> sources_;   // full, delta: e, then output of sublayer k at k+1   (2L+1)
                                  // block: partial sums P_0 = e, P_{k+1} after sublayer k (2L+1)
                                  // delta_block: the block sources, one per block
  std::vector<Router> routers_;   // the routers that run, in forward order
  Combine combine_ = Combine::kReplace;
  float* u_ = nullptr;            // (N, d)   sublayer input built by a router (modes that rebuild inputs)
  float* dU_ = nullptr;           // (N, d)   gradient of a routed input (training)
  float* dUv_ = nullptr;          // (N, d)   V-stream routing: gradient of the value input u_v (training)
  std::vector<Source> gated_;     // pre_gated: the slots of a router's gated sources (max sources of a router)
  float* shared_src_gate_ = nullptr;  // (N, d) pre_gated, inference: every router's g
  float* xb_ = nullptr;           // (N, d)   delta_block "true": stream at the last block start
  float* null_rstd_ = nullptr;    // (2L)     rstd of each router's null source
  float* shared_logits_ = nullptr;  // (N, H, S_max) the logits of every router that does not keep its own
  float* shared_gate_g_ = nullptr;  // (N, d) sigmoid_vector, inference: every router's g
  float* dgate_pre_ = nullptr;      // (N, d) sigmoid_vector, training: d(x_g·Wᵀ + b)
  float* dgate_base_ = nullptr;     // (N, d) sigmoid_vector, training: d(x_g) through the gate
  Buffer route_lists_;            // every router's src_list and dsrc_list (backend memory)
  Buffer route_stats_;            // every router's stats (doubles), zeroed when collecting starts
  Buffer route_gates_;            // sigmoid_scalar: (routers) g = σ(θ), then (routers) their gradients
  Buffer entropy_sum_;            // entropy term: one double, Σ over the forward's routers and tokens (route_entropy)
  bool collect_stats_ = false;
  float entropy_scale_ = 0.0f;    // the entropy term's weight in route_backward (forward_backward sets it)
  int64_t rebuilt_ = -1;          // the sublayer whose input u_ already holds (rebuilt by a router backward)
  std::vector<float*> zeroed_dv_;   // source gradients it does not cover: zeroed at each backward's start

  // The shape of the last forward, its cache (null: none), the routing
  // overrides in force (per router; null: its own), and the forwards so far.
  int64_t cur_B_ = 0, cur_T_ = 0;
  const KvCacheView* cache_ = nullptr;
  std::vector<const RouteOverride*> overrides_;  // (routers)
  RouteTap route_tap_;
  uint64_t forwards_ = 0;
  WeightUnits* units_ = nullptr;
  void need_(int u) {
    if (units_) units_->need(u);
  }
  int64_t rows() const { return cur_B_ * cur_T_; }

  // A weight matrix as its products read it: the float32 master, or in bf16
  // its bfloat16 copy (same offset in params16_).  Every product, the
  // embedding lookup and the LM head take their weights from here.
  Weight W_(const float* matrix) const;
  // A scratch buffer of activation rows that only products read (ln, h, and
  // SwiGLU's gradients), as the op that makes them writes it: in bf16 where
  // the products are bf16 (the rows rounded once, as they are made, into the
  // first half of the buffer), else float32.
  RowsOut rows_(float* buffer) const;
  int64_t upload_targets_(const int32_t* targets, int64_t N);
  void run_sublayer_(int64_t k);  // sublayer k's input, the sublayer, what its output makes
  // x_v: the value projection's own input (V-stream routing), or null: x.
  void attention_forward_(int64_t l, const float* x, float* out, const float* x_v = nullptr);
  void mlp_forward_(int64_t l, const float* x, float* out);
  // dout: gradient of the sublayer output; x: its input; dx = (accumulate ? += : =) gradient of x;
  // with V-stream routing x_v the value input and dx_v = its gradient.
  void attention_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate,
                           const float* x_v = nullptr, float* dx_v = nullptr);
  void mlp_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate);
  void backward();
  void head_logits_(int64_t first_row, int64_t row_stride, int64_t count, float* host_out);

  // The per-mode steps of the layer loop (model.cpp).
  void attach_routers_();
  void bind_(const ArenaEntry& e, float* p);  // the buffer e names, pointed at p
  void resolve_routers_();
  void embed_();
  void embed_backward_();
  void final_input_();
  void final_input_backward_();
  float* stored_input_(int64_t k);
  float* sublayer_out_(int64_t k);
  const float* sublayer_input_(int64_t k);
  const float* value_input_(int64_t k);  // V-stream routing: u_v of attention sublayer k, or null
  void sublayer_output_(int64_t k);
  float* sublayer_output_backward_(int64_t k);
  const float* sublayer_input_recompute_(int64_t k);
  void sublayer_input_backward_(int64_t k);
  void route_(int r, float* out, const float* base);
  void route_mix_(int r, float* out, const float* base);
  void route_backward_(int r, bool first, float* dU);  // dU: the gradient of its output (dU_ or dUv_)
  const float* gate_base_(int r) const;  // kReplace with gate: the router's last source
  void vector_gate_(int r, float* u, const float* x_g);  // sigmoid_vector: u = x_g + g∘(h − x_g), u holding h
  void gate_sources_(int r, const float* x);  // pre_gated: router r's gated sources into gated_
  void gate_sources_backward_(int r, bool first);  // their gradients into the sources, W, b and dx_
};

}  // namespace attnres
