// model.cpp — forward and backward of the Qwen3 decoder (DESIGN.md §1) with
// depth routing (§2).
//
// Forward, per layer l, sublayers k = 2l (attention) and 2l+1 (MLP):
//   u    = sublayer_input_(k)                    the stream x (baseline), or a router's output
//   ln   = rmsnorm(u; ln1)                       (N, d)
//   q,k,v = ln·Wqᵀ, ln·Wkᵀ, ln·Wvᵀ               (N, H·hd), (N, KV·hd) ×2
//   qr,kr = rope(rmsnorm_head(q; q_norm)), rope(rmsnorm_head(k; k_norm))
//   att  = causal_gqa(qr, kr, v)                 (N, H·hd)
//   out  = att·Woᵀ;  sublayer_output_(k)         x += out (baseline), or a new source, partial sum, …
//   u    = sublayer_input_(k+1)
//   ln   = rmsnorm(u; ln2)
//   out  = (silu(ln·Wgateᵀ) ∘ ln·Wupᵀ)·Wdownᵀ;  sublayer_output_(k+1)
// then h = final_input_() (the stream, or the final router), xf = rmsnorm(h; norm),
// logits = xf·Wheadᵀ, loss = CE(logits, targets).
// The backward walks the same list in reverse, recomputing the cheap
// elementwise results (ln, qr, kr, silu·up) instead of storing them, and in
// full / block / delta also the routed sublayer inputs u (route_mix from the
// stored logits).
//
// The modes differ only in the small functions below the sublayers
// (embedding, sublayer input / output, final input, and their backward),
// each a switch over the mode; the sources each router reads are fixed once
// in build_routers_().
#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/ops.h"
#include "ops/routing.h"

namespace attnres {

Model::Model(const Config& c, int64_t B, int64_t T)
    : cfg_(c), layout_(c), B_(B), T_(T), N_(B * T) {
  ATTNRES_CHECK(B > 0 && T > 0, "B=", B, " T=", T);
  params_.resize(static_cast<size_t>(layout_.total()));
  grads_.resize(static_cast<size_t>(layout_.total()));
  w_ = layout_.bind(params_.data());
  g_ = layout_.bind(grads_.data());
  build_routers_();

  const Mode mode = c.mode;
  const int64_t N = N_, d = c.d, qd = c.q_dim(), kvd = c.kv_dim(), F = c.F, K = 2 * c.L;
  // What each mode keeps (see model.h).
  const bool stores_inputs = mode == Mode::kBaseline || mode == Mode::kDeltaBlock;
  const bool routed = mode != Mode::kBaseline;
  const bool rebuilds_inputs = mode == Mode::kFull || mode == Mode::kBlock || mode == Mode::kDelta;
  const bool outputs_are_sources = rebuilds_inputs;  // sublayers write straight into a source
  // Two passes over the same list: count, then carve.
  std::vector<std::pair<float**, int64_t>> plan;
  auto take = [&](float*& p, int64_t n) { plan.push_back({&p, (n + 15) / 16 * 16}); };
  layer_.resize(static_cast<size_t>(c.L));
  for (auto& a : layer_) {
    if (stores_inputs) take(a.x_attn, N * d);
    take(a.rstd1, N);
    take(a.q, N * qd);
    take(a.k, N * kvd);
    take(a.v, N * kvd);
    take(a.q_rstd, N * c.H);
    take(a.k_rstd, N * c.KV);
    take(a.att, N * qd);
    take(a.lse, N * c.H);
    if (stores_inputs) take(a.x_mlp, N * d);
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
  if (!outputs_are_sources) take(out_, N * d);
  take(h_, N * F);
  take(dh_, N * F);
  take(dup_, N * F);
  if (mode != Mode::kFull) take(dx_, N * d);  // full has no stream
  take(dln_, N * d);
  take(dq_, N * qd);
  take(dk_, N * kvd);
  take(dv_, N * kvd);
  take(datt_, N * qd);
  take(attn_scratch_, attention_scratch_floats(T) * num_threads());
  take(head_scratch_, lm_head_scratch_floats(c.V));
  // Depth routing.
  for (size_t j = 0; j < sources_.size(); ++j) {
    Source& s = sources_[j];
    take(s.v, N * d);
    take(s.rstd, N);
    // block: only the blocks (the P_k at block starts) own a gradient buffer;
    // the other partial sums share the running dx_ (set below).
    const bool own_grad = mode != Mode::kBlock || (j % 2 == 0 && j < static_cast<size_t>(K) && block_start_(j / 2));
    if (own_grad) take(s.dv, N * d);
  }
  if (rebuilds_inputs) take(u_, N * d);
  if (routed) take(dU_, N * d);
  if (mode == Mode::kDeltaBlock && c.block_delta == BlockDelta::kTrue && sources_.size() > 1) take(xb_, N * d);
  if (routed) take(null_rstd_, K);
  int64_t S_max = 1;
  for (auto& r : routers_) {
    const int64_t S = static_cast<int64_t>(r.index.size());
    take(r.logits, N * S);
    S_max = std::max(S_max, S);
  }
  if (routed) take(route_scratch_, route_scratch_floats(N, d, S_max));
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

  // Resolve the routers' sources to the carved buffers.
  for (auto& s : sources_)
    if (!s.dv) s.dv = dx_;
  // The backward's first router: the final one, else the last MLP's.  It
  // assigns the gradients of the sources it reads; the rest are zeroed.
  first_backward_router_ = final_router_ >= 0 ? final_router_ : (routed ? router_of_[K - 1] : -1);
  for (const Source& s : sources_) {
    bool covered = false;
    if (first_backward_router_ >= 0)
      for (int j : routers_[first_backward_router_].index) covered |= j >= 0 && sources_[j].dv == s.dv;
    if (!covered && std::find(zeroed_dv_.begin(), zeroed_dv_.end(), s.dv) == zeroed_dv_.end())
      zeroed_dv_.push_back(s.dv);
  }
  for (Router& R : routers_) {
    for (int j : R.index) {
      if (j < 0) {  // the router's own learned null source, one row broadcast to every token
        R.src.push_back({R.w->null_source, null_rstd_ + R.k, true});
        R.dsrc.push_back(R.g->null_source);
      } else {
        R.src.push_back({sources_[j].v, sources_[j].rstd, false});
        R.dsrc.push_back(sources_[j].dv);
      }
    }
  }
}

// The sources each router reads, per mode (DESIGN.md §2, tests/oracle/README.md §3).
// Sublayer k's router sees the sources that exist just before it runs.
void Model::build_routers_() {
  const Config& c = cfg_;
  const int64_t L = c.L, K = 2 * L, Bl = c.layers_per_block();
  router_of_.assign(static_cast<size_t>(K), -1);
  if (c.mode == Mode::kBaseline) return;
  const bool delta = c.mode == Mode::kDelta || c.mode == Mode::kDeltaBlock;
  combine_ = delta ? Combine::kAdd : Combine::kReplace;
  auto sublayer = [](int64_t k) { return cat("layers.", k / 2, k % 2 ? ".mlp" : ".attn"); };

  // Source tensors.
  int64_t num_sources = 0;
  std::vector<std::string> names;
  switch (c.mode) {
    case Mode::kFull:
    case Mode::kDelta:  // e, then the output of sublayer k as source k+1
      num_sources = K + 1;
      names.push_back("embed");
      for (int64_t k = 0; k < K; ++k) names.push_back(sublayer(k));
      break;
    case Mode::kBlock:  // partial sums P_0 = e, P_{k+1} = (reset ? 0 : P_k) + out_k
      num_sources = K + 1;
      for (int64_t k = 0; k <= K; ++k)
        names.push_back(k % 2 == 0 && k < K && block_start_(k / 2) ? cat("block.", k / 2 / Bl) : "partial");
      break;
    case Mode::kDeltaBlock:  // one block source per block start
      num_sources = (L + Bl - 1) / Bl;
      for (int64_t b = 0; b < num_sources; ++b) names.push_back(cat("block.", b));
      break;
    case Mode::kBaseline: break;
  }
  sources_.resize(static_cast<size_t>(num_sources));

  auto add_router = [&](int64_t k, std::vector<int> index) {  // k = K: the final router
    if (index.empty()) return;  // delta layer 0 attention without a null source: input = x
    Router R;
    R.k = k;
    if (k == K) {
      R.name = "final";
      R.w = &w_.final_router;
      R.g = &g_.final_router;
      final_router_ = static_cast<int>(routers_.size());
    } else {
      R.name = sublayer(k);
      R.w = k % 2 ? &w_.layers[k / 2].mlp_router : &w_.layers[k / 2].attn_router;
      R.g = k % 2 ? &g_.layers[k / 2].mlp_router : &g_.layers[k / 2].attn_router;
      router_of_[k] = static_cast<int>(routers_.size());
    }
    for (size_t p = 0; p < index.size(); ++p)  // block: the last source is the partial sum, whatever it becomes
      R.source_names.push_back(index[p] < 0                                      ? "null"
                               : c.mode == Mode::kBlock && p + 1 == index.size() ? "partial"
                                                                                 : names[index[p]]);
    R.index = std::move(index);
    routers_.push_back(std::move(R));
  };
  for (int64_t k = 0; k <= K; ++k) {
    std::vector<int> index;
    const int64_t l = k / 2;
    switch (c.mode) {
      case Mode::kFull:  // every source so far: e, a_0, m_0, …, out_{k−1}
        for (int64_t j = 0; j <= k; ++j) index.push_back(static_cast<int>(j));
        break;
      case Mode::kDelta:  // [null] + e, a_0, …, out_{k−1}; layer 0's attention: [null] only
        if (k == K) break;
        if (c.null_source) index.push_back(-1);
        if (k >= 1)
          for (int64_t j = 0; j <= k; ++j) index.push_back(static_cast<int>(j));
        break;
      case Mode::kBlock:  // the blocks pushed before this router, then the current partial sum
        for (int64_t i = 0; 2 * i < k; ++i)
          if (block_start_(i)) index.push_back(static_cast<int>(2 * i));
        index.push_back(static_cast<int>(k));
        break;
      case Mode::kDeltaBlock:  // [null] + blocks started before (attention) / up to (MLP) layer l
        if (k == K) break;
        if (c.null_source) index.push_back(-1);
        for (int64_t i = 0; i < (k % 2 ? l + 1 : l); ++i)
          if (block_start_(i)) index.push_back(static_cast<int>(i / Bl));
        break;
      case Mode::kBaseline: break;
    }
    if (k < K || c.mode == Mode::kFull || c.mode == Mode::kBlock) add_router(k, std::move(index));
  }
}

RoutingStats Model::make_routing_stats() const {
  RoutingStats s;
  s.mode = mode_name(cfg_.mode);
  for (const auto& r : routers_) {
    s.routers.push_back(r.name);
    s.sources.push_back(r.source_names);
    RouteStats a;
    a.weight_sum.assign(r.index.size(), 0.0);
    s.acc.push_back(std::move(a));
  }
  return s;
}

void Model::attach_routing_stats(RoutingStats* s) {
  ATTNRES_CHECK(!s || s->acc.size() == routers_.size(), "routing statistics made for another model");
  stats_ = s;
}

void RoutingStats::clear() {
  for (auto& a : acc) {
    std::fill(a.weight_sum.begin(), a.weight_sum.end(), 0.0);
    a.token_max_sum = a.entropy_sum = a.cosine_sum = 0;
    a.tokens = 0;
  }
}

nlohmann::json RoutingStats::to_json() const {
  nlohmann::json mean_weight = nlohmann::json::array(), max_weight = nlohmann::json::array(),
                 token_max = nlohmann::json::array(), entropy = nlohmann::json::array(),
                 cosine = nlohmann::json::array();
  int64_t tokens = 0;
  for (const auto& a : acc) {
    const double n = a.tokens > 0 ? static_cast<double>(a.tokens) : 1.0;
    tokens = std::max(tokens, a.tokens);
    std::vector<double> mw;
    double mx = 0;
    for (double w : a.weight_sum) {
      mw.push_back(w / n);
      mx = std::max(mx, w / n);
    }
    mean_weight.push_back(mw);
    max_weight.push_back(mx);
    token_max.push_back(a.token_max_sum / n);
    entropy.push_back(a.entropy_sum / n);
    if (a.weight_sum.size() >= 2) cosine.push_back(a.cosine_sum / n);
    else cosine.push_back(nullptr);  // one source: no pair
  }
  return {{"mode", mode},           {"tokens", tokens},         {"routers", routers},
          {"sources", sources},     {"mean_weight", mean_weight}, {"max_weight", max_weight},
          {"token_max", token_max}, {"entropy", entropy},       {"cosine", cosine}};
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

// dout: gradient of the sublayer output (N, d); x: its input (N, d).
// dx = (accumulate ? += : =) gradient of x.
void Model::attention_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerWeights& g = g_.layers[l];
  const LayerActs& a = layer_[l];
  const int64_t B = cur_B_, T = T_, N = B * T, d = c.d, qd = c.q_dim(), kvd = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Recompute ln, qr, kr (with the stored rstd they equal the forward's).
  rmsnorm_forward(ln_, nullptr, x, w.ln1, N, d, eps);
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
  rmsnorm_backward(dx, g.ln1, dln_, x, w.ln1, a.rstd1, N, d, accumulate);
}

void Model::mlp_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerWeights& g = g_.layers[l];
  const LayerActs& a = layer_[l];
  const int64_t N = cur_B_ * T_, d = c.d, F = c.F;
  rmsnorm_forward(ln_, nullptr, x, w.ln2, N, d, static_cast<float>(c.rms_norm_eps));
  swiglu_forward(h_, a.gate, a.up, N * F);
  matmul_backward(dh_, g.wdown, dout, h_, w.wdown, N, F, d);
  float* dgate = h_;  // h is dead once wdown's gradient is taken
  swiglu_backward(dgate, dup_, dh_, a.gate, a.up, N * F);
  matmul_backward(dln_, g.wgate, dgate, ln_, w.wgate, N, d, F);
  matmul_backward(dln_, g.wup, dup_, ln_, w.wup, N, d, F, /*accumulate_dinp=*/true);
  rmsnorm_backward(dx, g.ln2, dln_, x, w.ln2, a.rstd2, N, d, accumulate);
}

// ---- the modes: what a sublayer reads and what its output becomes ----------------
//
// Notation as DESIGN.md §2: e embedding output, x the stream, P the partial
// block sum, out_k the output of sublayer k, B layers per block.

float* Model::stored_input_(int64_t k) { return k % 2 ? layer_[k / 2].x_mlp : layer_[k / 2].x_attn; }

void Model::route_(int r, float* out, const float* base) {
  const Router& R = routers_[r];
  route_forward(out, R.logits, R.src.data(), static_cast<int64_t>(R.src.size()), R.w->proj, R.w->norm, base,
                R.w->alpha, combine_, cur_B_ * T_, cfg_.d, route_scratch_, stats_ ? &stats_->acc[r] : nullptr);
}

void Model::route_mix_(int r, float* out, const float* base) {
  const Router& R = routers_[r];
  route_mix(out, R.logits, R.src.data(), static_cast<int64_t>(R.src.size()), base, R.w->alpha, combine_,
            cur_B_ * T_, cfg_.d, route_scratch_);
}

// dU_ holds the gradient of the router's output.  The base is the stream x in
// the delta modes (its gradient dx_), and the router's last source in a gated
// replacement (its gradient that source's).  In full / block / delta the same
// pass over the rows also rebuilds into u_ the input of the sublayer before
// this router's (the backward's next), saving a pass over the sources.
void Model::route_backward_(int r, bool first) {
  const Router& R = routers_[r];
  float* dbase = combine_ == Combine::kAdd ? dx_ : (R.w->alpha ? R.dsrc.back() : nullptr);
  RouteRebuild rb;
  const int64_t j = R.k - 1;  // the sublayer whose input comes next
  const int rj = j >= 0 ? router_of_[j] : -1;
  const bool rebuilds = cfg_.mode == Mode::kFull || cfg_.mode == Mode::kBlock || cfg_.mode == Mode::kDelta;
  if (rebuilds && rj >= 0) {
    const Router& P = routers_[rj];
    rb = {u_, P.logits, P.src.data(), static_cast<int64_t>(P.src.size()), gate_base_(rj), P.w->alpha, combine_,
          false};
    if (cfg_.mode == Mode::kDelta) {  // u = x + g·R: x the stream (e alone before the first output)
      if (j == 0) rb.base = sources_[0].v;
      else rb.stream = true;
    }
  }
  route_backward(R.dsrc.data(), dbase, R.g->proj, R.g->norm, R.g->alpha, dU_, R.logits, R.src.data(),
                 static_cast<int64_t>(R.src.size()), R.w->proj, R.w->norm, gate_base_(r), R.w->alpha, combine_,
                 cur_B_ * T_, cfg_.d, route_scratch_, rb.out ? &rb : nullptr, /*accumulate_src=*/!first);
  rebuilt_ = rb.out ? j : -1;
}

const float* Model::gate_base_(int r) const {
  const Router& R = routers_[r];
  return combine_ == Combine::kReplace && R.w->alpha ? R.src.back().v : nullptr;
}

// e, and the rstd of the sources that exist before layer 0 (e, null sources).
void Model::embed_(const int32_t* inputs) {
  const int64_t N = cur_B_ * T_, d = cfg_.d;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  switch (cfg_.mode) {
    case Mode::kBaseline: embedding_forward(layer_[0].x_attn, inputs, w_.embed, N, d); return;
    case Mode::kDeltaBlock: embedding_forward(x_final_, inputs, w_.embed, N, d); break;  // x = e
    case Mode::kFull:
    case Mode::kBlock:  // source 0 = e = P_0
      embedding_forward(sources_[0].v, inputs, w_.embed, N, d);
      source_rstd(sources_[0].rstd, sources_[0].v, N, d, eps);
      break;
    case Mode::kDelta:  // source 0 = e, and the stream x = e
      embedding_forward(sources_[0].v, inputs, w_.embed, N, d);
      source_rstd(sources_[0].rstd, sources_[0].v, N, d, eps);
      std::memcpy(x_final_, sources_[0].v, static_cast<size_t>(N * d) * sizeof(float));
      break;
  }
  for (const Router& R : routers_)
    if (!R.index.empty() && R.index[0] < 0) source_rstd(null_rstd_ + R.k, R.w->null_source, 1, d, eps);
}

// The input u of sublayer k (N, d).
const float* Model::sublayer_input_(int64_t k) {
  const int r = router_of_[k];
  switch (cfg_.mode) {
    case Mode::kBaseline: return stored_input_(k);  // u = x
    case Mode::kFull:
    case Mode::kBlock: route_(r, u_, gate_base_(r)); return u_;  // u = R, or (1−g)·last + g·R
    case Mode::kDelta:
      if (r < 0) return x_final_;  // layer 0, no null source: u = x = e
      route_(r, u_, x_final_);     // u = x + g·R
      return u_;
    case Mode::kDeltaBlock: {
      float* u = stored_input_(k);  // kept for the backward
      if (r < 0) std::memcpy(u, x_final_, static_cast<size_t>(cur_B_ * T_ * cfg_.d) * sizeof(float));
      else route_(r, u, x_final_);
      return u;
    }
  }
  return nullptr;
}

// Where sublayer k writes its output.
float* Model::sublayer_out_(int64_t k) {
  return cfg_.mode == Mode::kBaseline || cfg_.mode == Mode::kDeltaBlock ? out_ : sources_[k + 1].v;
}

// After sublayer k wrote its output.
void Model::sublayer_output_(int64_t k) {
  const int64_t N = cur_B_ * T_, d = cfg_.d, K = 2 * cfg_.L;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  switch (cfg_.mode) {
    case Mode::kBaseline:  // x_next = x + out
      add(k + 1 < K ? stored_input_(k + 1) : x_final_, stored_input_(k), out_, N * d);
      break;
    case Mode::kFull:  // out is source k+1
      source_rstd(sources_[k + 1].rstd, sources_[k + 1].v, N, d, eps);
      break;
    case Mode::kDelta:  // out is source k+1, and x += out
      source_rstd(sources_[k + 1].rstd, sources_[k + 1].v, N, d, eps);
      add_inplace(x_final_, sources_[k + 1].v, N * d);
      break;
    case Mode::kBlock:  // P_{k+1} = P_k + out, or out alone after a block start's reset
      if (!(k % 2 == 0 && block_start_(k / 2))) add_inplace(sources_[k + 1].v, sources_[k].v, N * d);
      source_rstd(sources_[k + 1].rstd, sources_[k + 1].v, N, d, eps);
      break;
    case Mode::kDeltaBlock:
      // At a block start, after the attention ran and before x += a, a block
      // source is appended: "true" x − x_at_previous_start, "reference"
      // x − last_source; x itself for the first.
      if (k % 2 == 0 && block_start_(k / 2)) {
        const int64_t b = k / 2 / cfg_.layers_per_block();
        Source& s = sources_[b];
        if (b == 0) std::memcpy(s.v, x_final_, static_cast<size_t>(N * d) * sizeof(float));
        else sub(s.v, x_final_, cfg_.block_delta == BlockDelta::kTrue ? xb_ : sources_[b - 1].v, N * d);
        if (xb_) std::memcpy(xb_, x_final_, static_cast<size_t>(N * d) * sizeof(float));
        source_rstd(s.rstd, s.v, N, d, eps);
      }
      add_inplace(x_final_, out_, N * d);
      break;
  }
}

// The input of the final norm: the stream already (baseline, delta modes), or the final router.
void Model::final_input_() {
  if (final_router_ >= 0) route_(final_router_, x_final_, nullptr);
}

// ---- the same, backward -----------------------------------------------------------

// The gradient of sublayer k's output (N, d); every router reading it has run its backward.
float* Model::sublayer_output_backward_(int64_t k) {
  const int64_t N = cur_B_ * T_, d = cfg_.d;
  switch (cfg_.mode) {
    case Mode::kBaseline:
    case Mode::kDeltaBlock: return dx_;  // x_next = x + out: d(out) = dx
    case Mode::kFull: return sources_[k + 1].dv;
    case Mode::kDelta:  // out feeds the stream and its routers
      add_inplace(sources_[k + 1].dv, dx_, N * d);
      return sources_[k + 1].dv;
    case Mode::kBlock:
      // dx_ is the running d(P).  If P_{k+1} is a block, its gradient is its
      // own buffer (the reset cut it from P_{k+2}): restart the running one from it.
      if (sources_[k + 1].dv != dx_)
        std::memcpy(dx_, sources_[k + 1].dv, static_cast<size_t>(N * d) * sizeof(float));
      return dx_;
  }
  return nullptr;
}

// The input u of sublayer k again: stored, or rebuilt from the stored logits.
const float* Model::sublayer_input_recompute_(int64_t k) {
  const int r = router_of_[k];
  if (rebuilt_ == k) return u_;  // done by the previous router backward
  switch (cfg_.mode) {
    case Mode::kBaseline:
    case Mode::kDeltaBlock: return stored_input_(k);
    case Mode::kFull:
    case Mode::kBlock: route_mix_(r, u_, gate_base_(r)); return u_;
    case Mode::kDelta:
      if (r < 0) return sources_[0].v;                       // u = e
      if (k == 0) route_mix_(r, u_, sources_[0].v);          // u = e + g·null
      else {
        // u = x + g·R with x = e + out_0 + … + out_{k−1}: the router's sources
        // after the null one, summed in one pass as the forward's stream was.
        const Router& R = routers_[r];
        route_mix_stream(u_, R.logits, R.src.data(), static_cast<int64_t>(R.src.size()), R.w->alpha,
                         cur_B_ * T_, cfg_.d, route_scratch_);
      }
      return u_;
  }
  return nullptr;
}

// dU_ holds the gradient of sublayer k's input; send it on to what made it.
void Model::sublayer_input_backward_(int64_t k) {
  const int64_t N = cur_B_ * T_, d = cfg_.d;
  const int r = router_of_[k];
  switch (cfg_.mode) {
    case Mode::kBaseline: return;  // the sublayer accumulated into dx_ itself
    case Mode::kFull:
    case Mode::kBlock: route_backward_(r); return;  // the final router ran first
    case Mode::kDeltaBlock:
      if (k % 2 == 0 && block_start_(k / 2)) {
        // Block source b was made from the x this sublayer read:
        //   "true":      s_b = x − x_{b−1}  ⇒  dx += ds_b − ds_{b+1}
        //   "reference": s_b = x − s_{b−1}  ⇒  ds_b(total) = ds_b − ds_{b+1}(total);  dx += ds_b
        const int64_t b = k / 2 / cfg_.layers_per_block();
        const bool next = b + 1 < static_cast<int64_t>(sources_.size());
        if (cfg_.block_delta == BlockDelta::kTrue) {
          add_inplace(dx_, sources_[b].dv, N * d);
          if (next) sub(dx_, dx_, sources_[b + 1].dv, N * d);
        } else {
          if (next) sub(sources_[b].dv, sources_[b].dv, sources_[b + 1].dv, N * d);
          add_inplace(dx_, sources_[b].dv, N * d);
        }
      }
      [[fallthrough]];
    case Mode::kDelta:  // u = x + g·R: dx += dU (inside route_backward_)
      if (r < 0) add_inplace(dx_, dU_, N * d);
      else route_backward_(r, r == first_backward_router_);
      return;
  }
}

void Model::final_input_backward_() {
  if (final_router_ >= 0) route_backward_(final_router_, /*first=*/true);
}

// The gradient of e into the embedding table.
void Model::embed_backward_(const int32_t* inputs) {
  const int64_t N = cur_B_ * T_, d = cfg_.d;
  switch (cfg_.mode) {
    case Mode::kBaseline:
    case Mode::kDeltaBlock: embedding_backward(g_.embed, dx_, inputs, N, d); return;
    case Mode::kFull:
    case Mode::kBlock: embedding_backward(g_.embed, sources_[0].dv, inputs, N, d); return;
    case Mode::kDelta:  // e is the stream's start and source 0
      add_inplace(dx_, sources_[0].dv, N * d);
      embedding_backward(g_.embed, dx_, inputs, N, d);
      return;
  }
}

// ---- whole model --------------------------------------------------------------

void Model::forward(const int32_t* inputs, int64_t B) {
  const Config& c = cfg_;
  ATTNRES_CHECK(B > 0 && B <= B_, "micro-batch ", B, " exceeds the allocated ", B_);
  cur_B_ = B;
  const int64_t N = B * T_, d = c.d;
  for (int64_t i = 0; i < N; ++i)
    if (inputs[i] < 0 || inputs[i] >= c.V) fail("token id ", inputs[i], " at position ", i, " is outside [0, vocab_size=", c.V, ")");
  embed_(inputs);
  for (int64_t l = 0; l < c.L; ++l) {
    attention_forward_(l, sublayer_input_(2 * l), sublayer_out_(2 * l));
    sublayer_output_(2 * l);
    mlp_forward_(l, sublayer_input_(2 * l + 1), sublayer_out_(2 * l + 1));
    sublayer_output_(2 * l + 1);
  }
  final_input_();
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
  const bool routed = c.mode != Mode::kBaseline;
  // Source gradients accumulate over the routers reading them; the first
  // router assigns those it reads, the others start at zero.
  for (float* dv : zeroed_dv_) std::memset(dv, 0, static_cast<size_t>(N * d) * sizeof(float));
  rebuilt_ = -1;
  // dln_ holds d(xf) from the fused head.  Through the final norm into the
  // stream (dx_), or into the final router's output (dU_):
  rmsnorm_backward(final_router_ >= 0 ? dU_ : dx_, g_.final_norm, dln_, x_final_, w_.final_norm, rstd_f_, N, d);
  final_input_backward_();
  // Baseline: the sublayer adds the gradient of its input straight into dx_
  // (it reads dout = dx_ in its first op, before it accumulates, so the alias
  // is safe).  Routed: it writes dU_, which sublayer_input_backward_ sends on.
  float* dinp = routed ? dU_ : dx_;
  for (int64_t l = c.L - 1; l >= 0; --l) {
    const float* dout = sublayer_output_backward_(2 * l + 1);
    mlp_backward_(l, dout, sublayer_input_recompute_(2 * l + 1), dinp, !routed);
    sublayer_input_backward_(2 * l + 1);
    dout = sublayer_output_backward_(2 * l);
    attention_backward_(l, dout, sublayer_input_recompute_(2 * l), dinp, !routed);
    sublayer_input_backward_(2 * l);
  }
  embed_backward_(inputs);
}

void Model::forward_logits(const int32_t* inputs, float* logits) {
  forward(inputs, B_);
  matmul_forward(logits, xf_, w_.lm_head, B_ * T_, cfg_.d, cfg_.V);
}

}  // namespace attnres
