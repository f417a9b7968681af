// model.h — a Qwen3 decoder-only transformer with depth routing: parameters,
// gradients, activations, and the forward and backward passes.
//
// Shapes: N = B·T token rows; every activation is row-major (N, ·).
// The forward is a flat list of op calls per layer (model.cpp); the backward
// is the same list in reverse.  All memory is allocated once, in the
// constructor, from (config, B, T); the step loop allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "model/config.h"
#include "model/params.h"

namespace attnres {

// Activations kept from the forward for the backward, per layer.
struct LayerActs {
  float* x_attn = nullptr;   // (N, d)      input of the attention sublayer
  float* rstd1 = nullptr;    // (N)         input_layernorm rstd
  float* q = nullptr;        // (N, H·hd)   q_proj output, before q_norm
  float* k = nullptr;        // (N, KV·hd)  k_proj output, before k_norm
  float* v = nullptr;        // (N, KV·hd)
  float* q_rstd = nullptr;   // (N, H)
  float* k_rstd = nullptr;   // (N, KV)
  float* att = nullptr;      // (N, H·hd)   attention output, before o_proj
  float* lse = nullptr;      // (B, H, T)   softmax log-sum-exp per query row
  float* x_mlp = nullptr;    // (N, d)      input of the MLP sublayer
  float* rstd2 = nullptr;    // (N)         post_attention_layernorm rstd
  float* gate = nullptr;     // (N, F)      gate_proj output
  float* up = nullptr;       // (N, F)      up_proj output
};

class Model {
 public:
  // B, T: the largest micro-batch the activations are sized for.
  Model(const Config& c, int64_t B, int64_t T);

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
  // Per-token losses (B, T) of the last forward (forward_backward).
  const float* token_losses() const { return token_loss_.data(); }

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
  float* x_final_ = nullptr;  // (N, d)  stream before the final norm
  float* rstd_f_ = nullptr;   // (N)
  float* xf_ = nullptr;       // (N, d)  final norm output
  float* rope_cos_ = nullptr; // (T, hd/2)
  float* rope_sin_ = nullptr; // (T, hd/2)
  // Scratch, reused by every layer.
  float* ln_ = nullptr;       // (N, d)
  float* qr_ = nullptr;       // (N, H·hd)   normed + rotated q
  float* kr_ = nullptr;       // (N, KV·hd)
  float* out_ = nullptr;      // (N, d)      sublayer output
  float* h_ = nullptr;        // (N, F)      silu(gate)·up, then dgate
  float* dh_ = nullptr;       // (N, F)
  float* dup_ = nullptr;      // (N, F)
  float* dx_ = nullptr;       // (N, d)      gradient of the residual stream
  float* dln_ = nullptr;      // (N, d)
  float* dq_ = nullptr;       // (N, H·hd)
  float* dk_ = nullptr;       // (N, KV·hd)
  float* dv_ = nullptr;       // (N, KV·hd)
  float* datt_ = nullptr;     // (N, H·hd)
  float* attn_scratch_ = nullptr;  // (threads, attention_scratch_floats(T))
  float* head_scratch_ = nullptr;  // lm_head_scratch_floats(V)
  Buffer token_loss_;              // (N)

  int64_t cur_B_ = 0;  // micro-batch of the last forward
  void forward(const int32_t* inputs, int64_t B);
  void attention_forward_(int64_t l, const float* x, float* out);
  void mlp_forward_(int64_t l, const float* x, float* out);
  void attention_backward_(int64_t l, const float* dout, float* dx_acc);
  void mlp_backward_(int64_t l, const float* dout, float* dx_acc);
  void backward(const int32_t* inputs);
};

}  // namespace attnres
