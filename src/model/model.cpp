// model.cpp — forward and backward of the Qwen3 decoder (DESIGN.md §1).
//
// Forward, per layer l (baseline residual):
//   ln   = rmsnorm(x; ln1)                       (N, d)
//   q,k,v = ln·Wqᵀ, ln·Wkᵀ, ln·Wvᵀ               (N, H·hd), (N, KV·hd) ×2
//   qr,kr = rope(rmsnorm_head(q; q_norm)), rope(rmsnorm_head(k; k_norm))
//   att  = causal_gqa(qr, kr, v)                 (N, H·hd)
//   x   += att·Woᵀ
//   ln   = rmsnorm(x; ln2)
//   x   += (silu(ln·Wgateᵀ) ∘ ln·Wupᵀ)·Wdownᵀ
// then xf = rmsnorm(x; norm), logits = xf·Wheadᵀ, loss = CE(logits, targets).
// The backward walks the same list in reverse, recomputing the cheap
// elementwise results (ln, qr, kr, silu·up) instead of storing them.
#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/ops.h"

namespace attnres {

Model::Model(const Config& c, int64_t B, int64_t T)
    : cfg_(c), layout_(c), B_(B), T_(T), N_(B * T) {
  ATTNRES_CHECK(B > 0 && T > 0, "B=", B, " T=", T);
  if (c.mode != Mode::kBaseline) fail("attnres_mode ", mode_name(c.mode), " is not implemented yet");
  params_.resize(static_cast<size_t>(layout_.total()));
  grads_.resize(static_cast<size_t>(layout_.total()));
  w_ = layout_.bind(params_.data());
  g_ = layout_.bind(grads_.data());

  const int64_t N = N_, d = c.d, qd = c.q_dim(), kvd = c.kv_dim(), F = c.F;
  // Two passes over the same list: count, then carve.
  std::vector<std::pair<float**, int64_t>> plan;
  auto take = [&](float*& p, int64_t n) { plan.push_back({&p, (n + 15) / 16 * 16}); };
  layer_.resize(static_cast<size_t>(c.L));
  for (auto& a : layer_) {
    take(a.x_attn, N * d);
    take(a.rstd1, N);
    take(a.q, N * qd);
    take(a.k, N * kvd);
    take(a.v, N * kvd);
    take(a.q_rstd, N * c.H);
    take(a.k_rstd, N * c.KV);
    take(a.att, N * qd);
    take(a.lse, N * c.H);
    take(a.x_mlp, N * d);
    take(a.rstd2, N);
    take(a.gate, N * F);
    take(a.up, N * F);
  }
  take(x_final_, N * d);
  take(rstd_f_, N);
  take(xf_, N * d);
  take(rope_cos_, T * c.hd / 2);
  take(rope_sin_, T * c.hd / 2);
  take(ln_, N * d);
  take(qr_, N * qd);
  take(kr_, N * kvd);
  take(out_, N * d);
  take(h_, N * F);
  take(dh_, N * F);
  take(dup_, N * F);
  take(dx_, N * d);
  take(dln_, N * d);
  take(dq_, N * qd);
  take(dk_, N * kvd);
  take(dv_, N * kvd);
  take(datt_, N * qd);
  take(attn_scratch_, attention_scratch_floats(T) * num_threads());
  take(head_scratch_, lm_head_scratch_floats(c.V));
  int64_t total = 0;
  for (auto& [p, n] : plan) total += n;
  acts_.resize(static_cast<size_t>(total));
  float* cursor = acts_.data();
  for (auto& [p, n] : plan) {
    *p = cursor;
    cursor += n;
  }
  token_loss_.resize(static_cast<size_t>(N));
  rope_tables(rope_cos_, rope_sin_, T, c.hd, c.rope_theta);
}

int64_t Model::num_params() const {
  int64_t n = 0;
  for (const auto& s : layout_.specs()) n += s.numel;
  return n;
}

double Model::flops_per_token(int64_t T) const {
  const Config& c = cfg_;
  // Matmul parameters touched per token: every projection and the LM head.
  const double per_layer = static_cast<double>(c.d) * (2 * c.q_dim() + 2 * c.kv_dim()) + 3.0 * c.d * c.F;
  const double matmul_params = per_layer * c.L + static_cast<double>(c.V) * c.d;
  // Causal attention: QKᵀ and PV, 2·hd·(T+1)/2 multiply-adds per head on average.
  const double attn = static_cast<double>(c.L) * c.H * c.hd * (T + 1) * 2.0;
  return 6.0 * matmul_params + 3.0 * attn;
}

// ---- sublayers --------------------------------------------------------------

void Model::attention_forward_(int64_t l, const float* x, float* out) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerActs& a = layer_[l];
  const int64_t B = cur_B_, T = T_, N = B * T, d = c.d, qd = c.q_dim(), kvd = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  rmsnorm_forward(ln_, a.rstd1, x, w.ln1, N, d, eps);
  matmul_forward(a.q, ln_, w.wq, N, d, qd);
  matmul_forward(a.k, ln_, w.wk, N, d, kvd);
  matmul_forward(a.v, ln_, w.wv, N, d, kvd);
  rmsnorm_forward(qr_, a.q_rstd, a.q, w.q_norm, N * c.H, c.hd, eps);
  rmsnorm_forward(kr_, a.k_rstd, a.k, w.k_norm, N * c.KV, c.hd, eps);
  rope_forward(qr_, rope_cos_, rope_sin_, B, T, c.H, c.hd);
  rope_forward(kr_, rope_cos_, rope_sin_, B, T, c.KV, c.hd);
  attention_forward(a.att, a.lse, qr_, kr_, a.v, B, T, c.H, c.KV, c.hd, attn_scratch_);
  matmul_forward(out, a.att, w.wo, N, qd, d);
}

void Model::mlp_forward_(int64_t l, const float* x, float* out) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerActs& a = layer_[l];
  const int64_t N = cur_B_ * T_, d = c.d, F = c.F;
  rmsnorm_forward(ln_, a.rstd2, x, w.ln2, N, d, static_cast<float>(c.rms_norm_eps));
  matmul_forward(a.gate, ln_, w.wgate, N, d, F);
  matmul_forward(a.up, ln_, w.wup, N, d, F);
  swiglu_forward(h_, a.gate, a.up, N * F);
  matmul_forward(out, h_, w.wdown, N, F, d);
}

// dout: gradient of the sublayer output (N, d).  dx_acc += gradient of its input.
void Model::attention_backward_(int64_t l, const float* dout, float* dx_acc) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerWeights& g = g_.layers[l];
  const LayerActs& a = layer_[l];
  const int64_t B = cur_B_, T = T_, N = B * T, d = c.d, qd = c.q_dim(), kvd = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Recompute ln, qr, kr (with the stored rstd they equal the forward's).
  rmsnorm_forward(ln_, nullptr, a.x_attn, w.ln1, N, d, eps);
  rmsnorm_forward(qr_, nullptr, a.q, w.q_norm, N * c.H, c.hd, eps);
  rmsnorm_forward(kr_, nullptr, a.k, w.k_norm, N * c.KV, c.hd, eps);
  rope_forward(qr_, rope_cos_, rope_sin_, B, T, c.H, c.hd);
  rope_forward(kr_, rope_cos_, rope_sin_, B, T, c.KV, c.hd);

  matmul_backward(datt_, g.wo, dout, a.att, w.wo, N, qd, d);
  attention_backward(dq_, dk_, dv_, datt_, qr_, kr_, a.v, a.att, a.lse, B, T, c.H, c.KV, c.hd, attn_scratch_);
  rope_backward(dq_, rope_cos_, rope_sin_, B, T, c.H, c.hd);
  rope_backward(dk_, rope_cos_, rope_sin_, B, T, c.KV, c.hd);
  rmsnorm_backward(dq_, g.q_norm, dq_, a.q, w.q_norm, a.q_rstd, N * c.H, c.hd);  // in place
  rmsnorm_backward(dk_, g.k_norm, dk_, a.k, w.k_norm, a.k_rstd, N * c.KV, c.hd);
  matmul_backward(dln_, g.wq, dq_, ln_, w.wq, N, d, qd);
  matmul_backward(dln_, g.wk, dk_, ln_, w.wk, N, d, kvd, /*accumulate_dinp=*/true);
  matmul_backward(dln_, g.wv, dv_, ln_, w.wv, N, d, kvd, /*accumulate_dinp=*/true);
  rmsnorm_backward(dx_acc, g.ln1, dln_, a.x_attn, w.ln1, a.rstd1, N, d, /*accumulate_dinp=*/true);
}

void Model::mlp_backward_(int64_t l, const float* dout, float* dx_acc) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerWeights& g = g_.layers[l];
  const LayerActs& a = layer_[l];
  const int64_t N = cur_B_ * T_, d = c.d, F = c.F;
  rmsnorm_forward(ln_, nullptr, a.x_mlp, w.ln2, N, d, static_cast<float>(c.rms_norm_eps));
  swiglu_forward(h_, a.gate, a.up, N * F);
  matmul_backward(dh_, g.wdown, dout, h_, w.wdown, N, F, d);
  float* dgate = h_;  // h is dead once wdown's gradient is taken
  swiglu_backward(dgate, dup_, dh_, a.gate, a.up, N * F);
  matmul_backward(dln_, g.wgate, dgate, ln_, w.wgate, N, d, F);
  matmul_backward(dln_, g.wup, dup_, ln_, w.wup, N, d, F, /*accumulate_dinp=*/true);
  rmsnorm_backward(dx_acc, g.ln2, dln_, a.x_mlp, w.ln2, a.rstd2, N, d, /*accumulate_dinp=*/true);
}

// ---- whole model --------------------------------------------------------------

void Model::forward(const int32_t* inputs, int64_t B) {
  const Config& c = cfg_;
  ATTNRES_CHECK(B > 0 && B <= B_, "micro-batch ", B, " exceeds the allocated ", B_);
  cur_B_ = B;
  const int64_t N = B * T_, d = c.d;
  for (int64_t i = 0; i < N; ++i)
    if (inputs[i] < 0 || inputs[i] >= c.V) fail("token id ", inputs[i], " at position ", i, " is outside [0, vocab_size=", c.V, ")");
  embedding_forward(layer_[0].x_attn, inputs, w_.embed, N, d);
  for (int64_t l = 0; l < c.L; ++l) {
    LayerActs& a = layer_[l];
    attention_forward_(l, a.x_attn, out_);
    add(a.x_mlp, a.x_attn, out_, N * d);
    mlp_forward_(l, a.x_mlp, out_);
    add(l + 1 < c.L ? layer_[l + 1].x_attn : x_final_, a.x_mlp, out_, N * d);
  }
  rmsnorm_forward(xf_, rstd_f_, x_final_, w_.final_norm, N, d, static_cast<float>(c.rms_norm_eps));
}

double Model::forward_backward(const int32_t* inputs, const int32_t* targets, bool backward, float grad_scale) {
  const int64_t B = B_;
  forward(inputs, B);
  const int64_t N = B * T_;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] >= cfg_.V) fail("target token id ", targets[i], " at position ", i, " is >= vocab_size ", cfg_.V);
    count += targets[i] >= 0;
  }
  if (count == 0) return 0.0;
  // d(mean loss)/d(logits) = (softmax − onehot)/count, times the accumulation scale.
  const float scale = grad_scale / static_cast<float>(count);
  const double sum = lm_head_loss(backward ? dln_ : nullptr, g_.lm_head, xf_, w_.lm_head, targets, N, cfg_.d,
                                  cfg_.V, scale, head_scratch_, token_loss_.data());
  if (backward) this->backward(inputs);
  return sum / static_cast<double>(count);
}

void Model::backward(const int32_t* inputs) {
  const Config& c = cfg_;
  const int64_t N = cur_B_ * T_, d = c.d;
  // dln_ holds d(xf) from the fused head.  Through the final norm into the stream:
  rmsnorm_backward(dx_, g_.final_norm, dln_, x_final_, w_.final_norm, rstd_f_, N, d);
  for (int64_t l = c.L - 1; l >= 0; --l) {
    // x_next = x + sublayer(x): dx is the gradient of the sublayer output, and
    // the sublayer adds the gradient of its input into dx.  (The sublayer reads
    // dout in its first op, before it accumulates, so the alias is safe.)
    mlp_backward_(l, dx_, dx_);
    attention_backward_(l, dx_, dx_);
  }
  embedding_backward(g_.embed, dx_, inputs, N, d);
}

void Model::forward_logits(const int32_t* inputs, float* logits) {
  forward(inputs, B_);
  matmul_forward(logits, xf_, w_.lm_head, B_ * T_, cfg_.d, cfg_.V);
}

}  // namespace attnres
