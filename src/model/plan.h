// plan.h — what routes what in a model, as one value: the routing sources
// and what makes each, every router and the sources it reads, each
// sublayer's steps around it (where its input comes from, what its output
// makes), where blocks start, the final router (or its absence), the
// bookkeeping of the backward (which router runs first and assigns its
// sources' gradients, which gradients start at zero, which routers keep their
// logits), and the activation arena (every buffer a forward and backward
// use, what a training forward stores).  Built from the Config and
// ModelOptions alone, so it is tested without a backend or a model
// (model/plan_test.cpp); Model makes the arena's one allocation, points its
// buffers into it, and runs the steps.
//
// Notation as docs/DESIGN.md §2: sublayer k = 2l (attention of layer l) or
// 2l + 1 (its MLP), K = 2L sublayers; "router k" makes sublayer k's input,
// router K (when present) the final norm's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model_options.h"
#include "model/modes.h"

namespace attnres {

// One buffer of a model's activation arena (llm.c's habit): its name
// ("layers.3.q", "sources.5.dv", "dx", ...; the gradient buffers are the
// names that begin with d or end in .dv), which of the model's buffers it is,
// its floats, and where it starts.  The plan lists them in carving order;
// Model makes one allocation of arena_floats and points each buffer at its
// offset.
struct ArenaEntry {
  enum class Buffer {
    kTokens, kTargets,                                                             // int32s, as many as floats
    kInputAttn, kInputMlp, kInputAttnV,                                            // a layer's stored sublayer inputs
    kRstd1, kRstd1V, kQ, kK, kV, kQRstd, kKRstd, kAtt, kLse, kRstd2, kGate, kUp,   // a layer's activations
    kStream, kRstdFinal, kXf, kRopeCos, kRopeSin, kLogits, kLn, kQr, kKr, kOut, kH,  // one of each
    kDh, kDup, kDx, kDp, kDsum, kDln, kDq, kDk, kDv, kDatt, kDUv,                  // the backward's scratch
    kSourceV, kSourceRstd, kSourceDv,                                              // a routing source's
    kU, kDU, kXb, kNullRstd, kRouterLogits, kSharedLogits,                         // routing's own
    kGateIn, kGateG, kGateDiff, kDGatePre, kDGateBase,                             // sigmoid_vector's gates
    kSrcGate, kSrcGateIn, kGatedV, kGatedRstd, kGatedDv,                           // pre_gated's source gates
  };
  std::string what;
  Buffer buffer = Buffer::kTokens;
  int64_t index = -1;  // its layer, source or router; −1 for one of a kind
  int64_t floats = 0;
  int64_t offset = 0;  // floats from the arena's start (a multiple of 16)
};

// One routing source tensor (N, d) of the mode.
struct PlanSource {
  enum class Made {
    kEmbedding,     // e (full, delta, block's P_0)
    kOutput,        // sublayer `sublayer`'s output (full, delta)
    kPartialSum,    // block's P_{k+1} = (reset ? 0 : P_k) + out_k, k = `sublayer`
    kBlockDelta,    // delta_block's block source, made at the block start `sublayer` (an attention sublayer)
    kState,         // S_{k+1}: the stream after sublayer k = `sublayer` (x += out, then copied; full_additive,
                    // delta_replace, first_layer)
  };
  std::string name;     // "embed", "layers.3.attn", "block.1", "partial"
  Made made;
  int64_t sublayer;     // see Made (−1 for the embedding)
  bool owns_gradient;   // training: its own gradient buffer; else it shares the running gradient (block's partials)
};

// One router, in the order the forward runs them.
struct PlanRouter {
  std::string name;                       // "layers.3.attn", "layers.3.mlp", "final"
  int64_t k = 0;                          // the sublayer whose input it makes; K for the final router
  std::vector<int> index;                 // (S) sources read, in order: an index in sources, −1 the null source
  std::vector<std::string> source_names;  // (S) "null", "embed", "layers.0.attn", "block.1", "partial"
  bool keeps_logits = false;              // training keeps its (N, H, S) logits for the backward
  bool value = false;                     // the V-stream router of attention sublayer k ("layers.3.v"): its
                                          // input feeds the value projection alone
};

// What sublayer k does around the sublayer itself, as the forward runs it
// (the backward mirrors it): where its input u comes from, and what its
// output makes.  Each field is one op of model.cpp's sublayer_input_ /
// sublayer_output_ (and their backward); the plan fills them from the
// sources (what makes each), so a mode is wired by its table row alone.
struct PlanSublayer {
  int router = -1;                     // in `routers`: the router that makes u; −1: u is the stream x
  bool stores_input = false;           // u is kept for the backward (else rebuilt there from the router)
  int makes_block = -1;                // after the sublayer, before x += out: this block source is made from x (delta_block)
  bool adds_to_stream = false;         // x += out
  int output_source = -1;              // the sublayer writes its output into this source; −1: into a scratch buffer
  bool output_is_partial_sum = false;  // that source is the partial sum P_{k+1}, with a running gradient (block, block_add)
  int previous_partial = -1;           // P_{k+1} = P_k + out: the source P_k; −1 at a block start (P restarts at out)
  int makes_state = -1;                // after x += out: this source is a copy of the stream (full_additive, …)
  int v_router = -1;                   // in `routers`: the router whose output feeds the value projection
                                       // alone (V-stream routing; an attention sublayer), stored as u_v
};

struct RoutingPlan {
  const ModeSpec* mode = nullptr;  // the row of the mode table
  int64_t K = 0;                   // sublayers
  int64_t layers_per_block = 1;
  std::vector<PlanSource> sources;
  std::vector<PlanRouter> routers;  // forward order
  std::vector<PlanSublayer> sublayers;  // (K) what each sublayer reads and what its output makes
  int embedding_source = -1;        // e is this source (0), or −1: e only starts the stream
  // The stream x_k is kept as the stored input of sublayer k and the next one
  // written out of place, x_{k+1} = x_k + out (baseline: no router reads it).
  bool stream_in_inputs = false;
  int final_router = -1;            // in `routers`, or −1: the final norm reads the stream (or block_mh's last partial sum)
  // Training: the backward's first router (the final one, else the last MLP's;
  // none where the sources are partial sums and there is no final router:
  // block_mh, whose last partial sum's gradient the final norm writes, and
  // block_add).  It assigns the gradients of the sources it reads.
  int first_backward_router = -1;
  // Training: the gradient buffers the backward zeroes before it starts, those
  // nobody assigns first: source indices, −1 the running gradient of the
  // partial sums that own none (block's dx; block_add's own, beside the stream's).
  std::vector<int> zeroed_gradients;

  // The activation arena, in carving order, and its size.  Training keeps
  // every layer's activations (with recompute only their stored inputs and
  // one shared set of the rest); inference carves one layer's, which every
  // layer shares (Model points the others at them: shares_layer_acts).
  std::vector<ArenaEntry> arena;
  int64_t arena_floats = 0;
  int64_t rows = 0;       // the most token rows of one forward: ModelOptions::rows, else batch × seq_len
  int64_t positions = 0;  // the RoPE tables' positions: max(seq_len, cache_len)
  bool shares_layer_acts = false;
  int64_t max_router_sources = 1;  // the most sources one router reads (the shared logits' and workspace's S)
  // Training keeps each sublayer input: the mode's rule, and always with
  // sigmoid_vector's gates (the routing ops' rebuild knows scalar gates only).
  bool stores_inputs = false;
  // sigmoid_vector: each sublayer router's gate g = σ(x_g·Wᵀ + b) per token
  // and channel; training keeps, per router, its x_g, g and h − x_g (N, d each).
  bool vector_gates = false;
  // pre_gated: each router's sources gated, σ(x·Wᵀ + b)∘v_i, into shared
  // scratch slots (max_router_sources of them) that the router reads;
  // training keeps, per router, its g and x (N, d each).
  bool source_gates = false;

  // Sublayer k starts a block: an attention sublayer whose layer is a block's first.
  bool starts_block(int64_t k) const { return k % 2 == 0 && (k / 2) % layers_per_block == 0; }
  bool routed() const { return !routers.empty(); }
  // The modes that do not store each sublayer input rebuild it in the backward
  // (from the stored logits, or from the sources again).
  bool rebuilds_inputs() const { return routed() && !stores_inputs; }
  // Whether that rebuilt input adds the routed sum to the stream (delta) or is
  // the routed sum (full, block, delta_replace: its stream is a source).
  bool rebuilt_input_adds_stream() const { return rebuilds_inputs() && mode->combine == Combine::kAdd; }
  // block_add: partial sums beside a stream, each with a running gradient of its own.
  bool partials_beside_stream() const { return mode->stream && mode->sources == Sources::kPartialSums; }
  // Without a final router or a stream, block (block_mh) feeds the final norm its last partial sum.
  bool final_reads_last_partial() const {
    return final_router < 0 && !mode->stream && mode->sources == Sources::kPartialSums;
  }

  static RoutingPlan build(const Config& c, const ModelOptions& o);
};

}  // namespace attnres
