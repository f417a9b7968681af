// params.h — the parameters of a model: one list of tensors, one arena.
//
// One enumeration in params.cpp lists every parameter (name, shape, whether
// it is a matrix, initialisation) in a fixed order.  ParamLayout is what the
// rest of attnres sees of it: specs() (names, shapes, offsets in the arena)
// and bind() (the typed views); init, load/save, the optimizer and the tests
// all walk specs(), so there is no second list to keep in sync.
// Gradients and AdamW moments use the same layout in arenas of their own.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/rng.h"
#include "model/config.h"

namespace attnres {

// kGateLogit: −2 (σ(−2) ≈ 0.12), the reference's init of a sigmoid gate's logit and of its bias.
enum class Init { kNormal, kOnes, kZeros, kQuery, kGateLogit };

struct TensorSpec {
  std::string name;            // HF / reference safetensors name
  std::vector<int64_t> shape;  // PyTorch shape; linear weights are [out, in]
  int64_t offset = 0;          // in floats, within an arena
  int64_t numel = 0;
  // A weight matrix (embedding, projection, head): what bf16 products read
  // as bfloat16, and what a bf16 inference model holds in bfloat16 only.
  bool matrix = false;
  Init init = Init::kNormal;
  // Which part of the model reads it (a sharded run gathers a unit's
  // matrices before it runs, distributed/zero3.h): 0 the embedding, 1 + l
  // layer l (its routers included), L + 1 the head (the final norm and
  // router, an untied lm_head).
  int unit = 0;
  // AdamW weight decay applies: exactly to the matrices of the base model
  // (no decay of norms, routing vectors and gates, sigmoid_vector's matrix included).
  bool decay() const { return matrix && !routing(); }
  // A depth-routing parameter (pseudo-query, its norm, null source, gate):
  // what --lr-routing schedules and --freeze-base keeps training.
  bool routing() const;
};

// True for the names of parameters that exist only with depth routing.
bool is_routing_param(const std::string& name);

// A router's parameters (docs/DESIGN.md §2); null where the config has none.
struct RouterWeights {
  float* proj = nullptr;         // (d)  pseudo-query w  ([1, d] on disk)
  float* norm = nullptr;         // (d)  RMSNorm weight γ
  float* null_source = nullptr;  // (d)  learned null source (delta modes)
  float* alpha = nullptr;        // ()   learnable_alpha's gate g, a 0-dim scalar on disk
  float* gate_logit = nullptr;   // ()   sigmoid_scalar's θ, g = σ(θ), a 0-dim scalar on disk
  float* gate_proj = nullptr;    // (d, d) sigmoid_vector's W, g = σ(x_g·Wᵀ + b) per token and dimension
  float* gate_bias = nullptr;    // (d)    its b
  float* pre_gate = nullptr;     // (d, d) pre_gated's source gate W, g = σ(x·Wᵀ + b) multiplies each source
  float* pre_gate_bias = nullptr;  // (d)  its b
};

struct LayerWeights {
  float* ln1 = nullptr;     // (d)          input_layernorm
  float* wq = nullptr;      // (H·hd, d)
  float* wk = nullptr;      // (KV·hd, d)
  float* wv = nullptr;      // (KV·hd, d)
  float* wo = nullptr;      // (d, H·hd)
  float* q_norm = nullptr;  // (hd)
  float* k_norm = nullptr;  // (hd)
  float* ln2 = nullptr;     // (d)          post_attention_layernorm
  float* wgate = nullptr;   // (F, d)
  float* wup = nullptr;     // (F, d)
  float* wdown = nullptr;   // (d, F)
  RouterWeights attn_router, mlp_router;
  // V-stream routing (delta_v): the value router's own query and norm
  // (v_res_proj, v_res_norm); its null source and gate are the attention
  // router's (the same tensors: ParamLayout::bind points them there).
  RouterWeights v_router;
};

// Typed views into one arena (parameters, gradients or moments alike).
struct Weights {
  float* embed = nullptr;       // (V, d)
  float* final_norm = nullptr;  // (d)
  float* lm_head = nullptr;     // (V, d)  == embed when tied
  RouterWeights final_router;
  std::vector<LayerWeights> layers;
};

class ParamLayout {
 public:
  explicit ParamLayout(const Config& c);
  const std::vector<TensorSpec>& specs() const { return specs_; }
  int64_t total() const { return total_; }
  // The units of TensorSpec::unit: L + 2.
  int units() const { return static_cast<int>(cfg_.L) + 2; }
  const Config& config() const { return cfg_; }
  Weights bind(float* base) const;  // typed views of an arena with this layout

 private:
  Config cfg_;
  std::vector<TensorSpec> specs_;
  int64_t total_ = 0;
};

// A range [lo, hi) of floats of an arena.
struct ArenaRange {
  int64_t lo = 0, hi = 0;
};

// Initialises parameters: matrices N(0, 0.02), norms 1, null sources and
// gates 0, pseudo-queries 0 or N(0, 0.02) (attnres_query_init).
void init_params(const ParamLayout& layout, const Config& c, float* params, Rng& rng);
// The same draws as init_params, storing only the floats within `keep`
// (sorted, disjoint): a rank of a sharded run initialises the part it holds,
// with the values one process would give it.
void init_params(const ParamLayout& layout, const Config& c, float* params, Rng& rng,
                 std::span<const ArenaRange> keep);
// The generator the routing tensors draw from: seeded from rng's state
// without drawing from it (init_params says why).  Every initialisation
// (float32, or a bf16 inference model's a piece at a time) takes it.
Rng routing_stream(const Rng& rng);
// One tensor of that init, into p (s.numel floats), drawing from rng in the same order.
void init_tensor(const TensorSpec& s, const Config& c, float* p, Rng& rng);
// The same draws a piece of at most 2^16 floats at a time: f(first, values)
// for each piece, in order (a tensor made where it is not held whole).
void init_tensor_in_pieces(const TensorSpec& s, const Config& c, Rng& rng,
                           const std::function<void(int64_t first, std::span<const float> values)>& f);

}  // namespace attnres
