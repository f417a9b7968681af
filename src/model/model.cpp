// model.cpp — forward and backward of the Qwen3 decoder (docs/DESIGN.md §1)
// with depth routing (§2), and the KV-cached inference forward.
//
// Forward, per layer l, sublayers k = 2l (attention) and 2l+1 (MLP):
//   u    = sublayer_input_(k)                    the stream x (baseline), or a router's output
//   ln   = rmsnorm(u; ln1)                       (N, d)
//   q,k,v = ln·Wqᵀ, ln·Wkᵀ, ln·Wvᵀ               (N, H·hd), (N, KV·hd) ×2
//   qr,kr = rope(rmsnorm_head(q; q_norm)), rope(rmsnorm_head(k; k_norm))
//   (KV cache: kr, v written at the sequences' positions; attention reads the cache)
//   att  = causal_gqa(qr, kr, v)                 (N, H·hd)
//   out  = att·Woᵀ;  sublayer_output_(k)         x += out (baseline), or a new source, partial sum, …
//   u    = sublayer_input_(k+1)
//   ln   = rmsnorm(u; ln2)
//   out  = (silu(ln·Wgateᵀ) ∘ ln·Wupᵀ)·Wdownᵀ;  sublayer_output_(k+1)
// then h = final_input_() (the stream, or the final router), xf = rmsnorm(h; norm),
// logits = xf·Wheadᵀ, loss = CE(logits, targets).
// The backward walks the same list in reverse, recomputing the cheap
// elementwise results (ln, qr, kr, silu·up) instead of storing them, and in
// the modes that rebuild inputs also the routed sublayer inputs u (route_mix
// from the stored logits).
//
// The modes differ only in the small functions below the sublayers
// (embedding, sublayer input / output, final input, and their backward),
// and none of them asks which mode runs: each does the steps the routing
// plan (model/plan.h) gives sublayer k — which router makes its input,
// whether the input is stored, what block source, stream update, source or
// partial sum its output makes — a flat list of `if`s, each one op.  The
// plan derives those steps from the mode table (model/modes.h) and the
// sources, with the routers' source lists and the backward's bookkeeping,
// fixed at construction.
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/modes.h"

namespace attnres {

Model::Model(Context& ctx, const Config& c, const ModelOptions& o)
    : ctx_(ctx), ops_(ctx.ops()), cfg_(c), opt_(o), layout_(c), plan_(RoutingPlan::build(c, o)) {
  // The plan checked B, T, rows and cache_len (its arena is sized by them).
  const bool train = o.training;
  if (train && o.cache_len > 0) fail("a KV cache is for inference models only");
  ops_.check_supported(o.precision);
  if (o.entropy_lambda != 0.0 && !(std::isfinite(o.entropy_lambda) && o.entropy_lambda > 0.0 && train && plan_.routed()))
    fail("the routing entropy term needs a training model with depth routing (attnres_mode not baseline) and a "
         "finite lambda > 0, got ", o.entropy_lambda);
  if (o.recompute && (!train || c.F < c.d))
    fail("activation recomputation is for training models with intermediate_size >= hidden_size");

  const int64_t total = layout_.total();
  // In bf16 a second arena, laid out for every tensor, holds the matrices'
  // copies (lazily backed: the vectors' slots stay untouched).  An inference
  // model then holds only the vectors in the float32 arena (lazily backed too).
  const bool b16 = o.precision == Precision::kBF16;
  if (o.sharded_weights && !train) fail("sharded weights are for training models");
  params_ = ops_.alloc(static_cast<size_t>(total) * sizeof(float), /*lazy=*/(b16 && !train) || o.sharded_weights);
  if (b16) params16_ = ops_.alloc(static_cast<size_t>(total) * sizeof(bf16), /*lazy=*/true);
  w_ = layout_.bind(params_.data());
  if (o.freeze_base && (!train || !plan_.routed()))
    fail("freezing the base weights needs a training model with depth routing (attnres_mode not baseline)");
  if (train) {
    // Frozen tensors get no gradient: their views are null, so the backward
    // skips their weight-gradient products, and their part of the (lazily
    // backed) arena is never touched, so it costs no memory.
    grads_ = ops_.alloc(static_cast<size_t>(total) * sizeof(float), /*lazy=*/o.freeze_base || o.sharded_weights);
    g_ = layout_.bind(grads_.data());
    if (o.freeze_base) {
      g_.embed = g_.final_norm = g_.lm_head = nullptr;
      for (LayerWeights& g : g_.layers) {
        const LayerWeights routers{.attn_router = g.attn_router, .mlp_router = g.mlp_router, .v_router = g.v_router};
        g = routers;
      }
    }
  }
  attach_routers_();

  const int64_t N = plan_.rows, d = c.d, qd = c.q_dim(), F = c.F;
  // The activation arena: the plan's table of sizes (plan.h: arena), one
  // allocation, each buffer pointed at its offset.
  acts_ = ops_.alloc(static_cast<size_t>(plan_.arena_floats) * sizeof(float));
  layer_.resize(static_cast<size_t>(c.L));
  for (const ArenaEntry& e : plan_.arena) bind_(e, acts_.data() + e.offset);
  if (plan_.shares_layer_acts)
    for (LayerActs& a : layer_) {
      LayerActs shared = layer_[0];
      if (train) {  // the inputs stay the layer's own
        shared.x_attn = a.x_attn;
        shared.x_mlp = a.x_mlp;
        shared.x_attn_v = a.x_attn_v;
      }
      a = shared;
    }
  for (auto& r : routers_) {
    if (!r.logits_kept) r.logits = shared_logits_;
    if (shared_gate_g_ && r.w->gate_proj) r.gate_g = shared_gate_g_;
    if (shared_src_gate_ && r.w->pre_gate) r.src_gate = shared_src_gate_;
  }
  token_loss_ = ops_.alloc(static_cast<size_t>(N) * sizeof(float));
  token_greedy_ = ops_.alloc(static_cast<size_t>(N));
  ops_.rope_tables(rope_cos_, rope_sin_, plan_.positions, c.hd, c.rope_theta);

  // The workspace every op of this model may ask for.
  const int64_t widest = std::max({d, qd, F});
  int64_t ws = std::max({ops_.attention_workspace(plan_.positions, c.hd, o.precision),
                         ops_.lm_head_workspace(d, c.V, o.precision),
                         ops_.matmul_workspace(N, widest, widest, o.precision)});
  if (plan_.routed()) ws = std::max(ws, ops_.route_workspace(N, d, plan_.max_router_sources, cfg_.routing_heads));
  ctx_.reserve(ws);

  resolve_routers_();
  overrides_.assign(routers_.size(), nullptr);
}

// Points the buffer an arena entry names at p.
void Model::bind_(const ArenaEntry& e, float* p) {
  using Buf = ArenaEntry::Buffer;
  LayerActs* a = e.index >= 0 && e.index < static_cast<int64_t>(layer_.size()) ? &layer_[e.index] : nullptr;
  Source* s = e.index >= 0 && e.index < static_cast<int64_t>(sources_.size()) ? &sources_[e.index] : nullptr;
  switch (e.buffer) {
    case Buf::kTokens: tokens_ = reinterpret_cast<int32_t*>(p); return;
    case Buf::kTargets: targets_ = reinterpret_cast<int32_t*>(p); return;
    case Buf::kInputAttn: a->x_attn = p; return;
    case Buf::kInputMlp: a->x_mlp = p; return;
    case Buf::kInputAttnV: a->x_attn_v = p; return;
    case Buf::kRstd1: a->rstd1 = p; return;
    case Buf::kRstd1V: a->rstd1_v = p; return;
    case Buf::kQ: a->q = p; return;
    case Buf::kK: a->k = p; return;
    case Buf::kV: a->v = p; return;
    case Buf::kQRstd: a->q_rstd = p; return;
    case Buf::kKRstd: a->k_rstd = p; return;
    case Buf::kAtt: a->att = p; return;
    case Buf::kLse: a->lse = p; return;
    case Buf::kRstd2: a->rstd2 = p; return;
    case Buf::kGate: a->gate = p; return;
    case Buf::kUp: a->up = p; return;
    case Buf::kStream: stream_ = p; return;
    case Buf::kRstdFinal: rstd_f_ = p; return;
    case Buf::kXf: xf_ = p; return;
    case Buf::kRopeCos: rope_cos_ = p; return;
    case Buf::kRopeSin: rope_sin_ = p; return;
    case Buf::kLogits: logits_ = p; return;
    case Buf::kLn: ln_ = p; return;
    case Buf::kQr: qr_ = p; return;
    case Buf::kKr: kr_ = p; return;
    case Buf::kOut: out_ = p; return;
    case Buf::kH: h_ = p; return;
    case Buf::kDh: dh_ = p; return;
    case Buf::kDup: dup_ = p; return;
    case Buf::kDx: dx_ = p; return;
    case Buf::kDp: dp_ = p; return;
    case Buf::kDsum: dsum_ = p; return;
    case Buf::kDln: dln_ = p; return;
    case Buf::kDq: dq_ = p; return;
    case Buf::kDk: dk_ = p; return;
    case Buf::kDv: dv_ = p; return;
    case Buf::kDatt: datt_ = p; return;
    case Buf::kSourceV: s->v = p; return;
    case Buf::kSourceRstd: s->rstd = p; return;
    case Buf::kSourceDv: s->dv = p; return;
    case Buf::kU: u_ = p; return;
    case Buf::kDU: dU_ = p; return;
    case Buf::kDUv: dUv_ = p; return;
    case Buf::kSrcGate:
      if (e.index >= 0) routers_[e.index].src_gate = p;
      else shared_src_gate_ = p;
      return;
    case Buf::kSrcGateIn: routers_[e.index].src_gate_in = p; return;
    case Buf::kGatedV: gated_[e.index].v = p; return;
    case Buf::kGatedRstd: gated_[e.index].rstd = p; return;
    case Buf::kGatedDv: gated_[e.index].dv = p; return;
    case Buf::kXb: xb_ = p; return;
    case Buf::kNullRstd: null_rstd_ = p; return;
    case Buf::kRouterLogits: routers_[e.index].logits = p; return;
    case Buf::kSharedLogits: shared_logits_ = p; return;
    case Buf::kGateIn: routers_[e.index].gate_in = p; return;
    case Buf::kGateG:
      if (e.index >= 0) routers_[e.index].gate_g = p;
      else shared_gate_g_ = p;
      return;
    case Buf::kGateDiff: routers_[e.index].gate_diff = p; return;
    case Buf::kDGatePre: dgate_pre_ = p; return;
    case Buf::kDGateBase: dgate_base_ = p; return;
  }
}

// The routers' sources resolved to the carved buffers (the plan's indices to
// pointers, a source sharing the running gradient pointed at dx_), the
// gradients zeroed before each backward, and every router's lists in backend
// memory, where the routing ops read them: its sources, its gradient
// pointers, and the sums of its routing statistics.
void Model::resolve_routers_() {
  dpart_ = dp_ ? dp_ : dx_;
  for (auto& s : sources_)
    if (!s.dv) s.dv = dpart_;
  if (opt_.training)  // the gradients nobody assigns first (plan.h): zeroed at each backward's start
    for (int j : plan_.zeroed_gradients) zeroed_dv_.push_back(j < 0 ? dpart_ : sources_[j].dv);
  for (Router& R : routers_) {
    for (int j : R.index) {
      if (j < 0) {  // the router's own learned null source, one row broadcast to every token
        R.src.push_back({R.w->null_source, null_rstd_ + R.k, true});
        R.dsrc.push_back(opt_.training ? R.g->null_source : nullptr);
      } else {
        R.src.push_back({sources_[j].v, sources_[j].rstd, false});
        R.dsrc.push_back(sources_[j].dv);
      }
    }
    if (R.w->pre_gate) {  // pre_gated: the routing ops read the gated slots; the gate reads the sources
      R.raw_src = std::move(R.src);
      R.raw_dsrc = std::move(R.dsrc);
      R.src.clear();
      R.dsrc.clear();
      for (size_t q = 0; q < R.raw_src.size(); ++q) {
        R.src.push_back({gated_[q].v, gated_[q].rstd, false});
        R.dsrc.push_back(gated_[q].dv);
      }
    }
  }
  // The gates: learnable_alpha's α is a parameter; sigmoid_scalar's σ(θ) and
  // its gradient live in route_gates_ (made at each forward's start).
  if (cfg_.gate == Gate::kSigmoidScalar && !routers_.empty()) {
    const size_t n = routers_.size();
    route_gates_ = ops_.alloc(2 * n * sizeof(float));
    for (size_t r = 0; r < n; ++r)
      if (routers_[r].w->gate_logit) {
        routers_[r].gate = route_gates_.as<float>() + r;
        routers_[r].dgate = opt_.training ? route_gates_.as<float>() + n + r : nullptr;
      }
  } else {
    for (Router& R : routers_) {
      R.gate = R.w->alpha;
      R.dgate = R.g ? R.g->alpha : nullptr;
    }
  }
  if (opt_.entropy_lambda > 0.0) entropy_sum_ = ops_.alloc(sizeof(double));
  // The lists into backend memory, where the routing ops read them: every
  // router's sources, then every router's gradient pointers; and the sums of
  // the routing statistics.
  int64_t entries = 0, sums = 0;
  for (const Router& R : routers_) {
    entries += static_cast<int64_t>(R.src.size());
    sums += route_stats_size(static_cast<int64_t>(R.src.size()), cfg_.routing_heads);
  }
  if (entries > 0) {
    const size_t src_bytes = static_cast<size_t>(entries) * sizeof(RouteSource);
    route_lists_ = ops_.alloc(src_bytes + static_cast<size_t>(entries) * sizeof(float*));
    route_stats_ = ops_.alloc(static_cast<size_t>(sums) * sizeof(double));
    auto* src_at = route_lists_.as<RouteSource>();
    auto* dsrc_at = reinterpret_cast<float**>(route_lists_.as<char>() + src_bytes);
    double* stats_at = route_stats_.as<double>();
    for (Router& R : routers_) {
      const size_t S = R.src.size();
      ops_.upload(src_at, R.src.data(), S * sizeof(RouteSource));
      ops_.upload(dsrc_at, R.dsrc.data(), S * sizeof(float*));
      R.src_list = src_at;
      R.dsrc_list = dsrc_at;
      R.stats = stats_at;
      src_at += S;
      dsrc_at += S;
      stats_at += route_stats_size(static_cast<int64_t>(S), cfg_.routing_heads);
    }
  }
}

// The plan's routers with their weights (and, training, gradients); the
// plan's sources as empty slots, carved by the constructor.
void Model::attach_routers_() {
  sources_.resize(plan_.sources.size());
  gated_.resize(plan_.source_gates ? static_cast<size_t>(plan_.max_router_sources) : 0);
  for (const PlanRouter& p : plan_.routers) {
    Router R;
    R.name = p.name;
    R.k = p.k;
    R.index = p.index;
    R.source_names = p.source_names;
    R.logits_kept = p.keeps_logits;
    R.value = p.value;
    // Router k's tensors in a set of weights (or of their gradients).
    auto router_of = [&](Weights& set) {
      return p.k == plan_.K ? &set.final_router
             : p.k % 2      ? &set.layers[p.k / 2].mlp_router
             : p.value      ? &set.layers[p.k / 2].v_router
                            : &set.layers[p.k / 2].attn_router;
    };
    R.w = router_of(w_);
    if (opt_.training) R.g = router_of(g_);
    routers_.push_back(std::move(R));
  }
  combine_ = plan_.mode->combine;
}

void Model::collect_routing_stats(bool on) {
  if (on && route_stats_.bytes()) {
    const std::vector<char> zeros(route_stats_.bytes(), 0);
    ops_.upload(route_stats_.data(), zeros.data(), zeros.size());
  }
  collect_stats_ = on;
}

RoutingStats Model::routing_stats() const {
  RoutingStats s;
  s.mode = cfg_.mode_label();
  s.heads = cfg_.routing_heads;
  for (const auto& r : routers_) {
    s.routers.push_back(r.name);
    s.sources.push_back(r.source_names);
    RouteStats a;
    a.weight_sum.assign(r.index.size(), 0.0);
    if (s.heads > 1) {
      a.head_weight_sum.assign(r.index.size() * static_cast<size_t>(s.heads), 0.0);
      a.head_max_sum.assign(static_cast<size_t>(s.heads), 0.0);
      a.head_entropy_sum.assign(static_cast<size_t>(s.heads), 0.0);
    }
    s.acc.push_back(std::move(a));
  }
  // The sums are laid out as RoutingStats::values (route_stats_size per router, in order).
  std::vector<double> sums(route_stats_.bytes() / sizeof(double));
  if (!sums.empty()) ops_.download(sums.data(), route_stats_.data(), route_stats_.bytes());
  s.set_values(sums);
  return s;
}

int64_t Model::num_params() const {
  int64_t n = 0;
  for (const auto& s : layout_.specs()) n += s.numel;
  return n;
}

int64_t Model::weight_bytes() const {
  const bool b16 = opt_.precision == Precision::kBF16;
  int64_t bytes = 0;
  for (const auto& s : layout_.specs())
    bytes += s.numel * (!b16 || !s.matrix ? 4 : opt_.training ? 6 : 2);  // training: master + copy
  return bytes;
}

void Model::refresh_bf16(int64_t lo, int64_t hi) {
  if (!params16_.bytes()) return;
  ATTNRES_CHECK(opt_.training, "an inference model holds its matrices in bf16 only");
  if (hi < 0) hi = layout_.total();
  for (const TensorSpec& s : layout_.specs()) {
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel);
    if (s.matrix && a < b) ops_.to_bf16(params16_.as<bf16>() + a, params_.data() + a, b - a);
  }
}

void Model::init(Rng& rng) {
  const size_t n = static_cast<size_t>(layout_.total());
  if (opt_.training || opt_.precision == Precision::kF32) {
    {
      const HostView<float> params(ops_, params_.data(), n);
      init_params(layout_, cfg_, params.data(), rng);
    }
    refresh_bf16();
    return;
  }
  // The same draws as float32 (init_params: the routing tensors from their
  // own stream); the matrices are rounded to bf16 a piece at a time.
  const HostView<float> params(ops_, params_.data(), n);
  const HostView<bf16> params16(ops_, params16_.as<bf16>(), n);
  Rng routing = routing_stream(rng);
  for (const auto& s : layout_.specs()) {
    Rng& r = s.routing() ? routing : rng;
    if (!s.matrix) {
      init_tensor(s, cfg_, params.data() + s.offset, r);
      continue;
    }
    init_tensor_in_pieces(s, cfg_, r, [&](int64_t i0, std::span<const float> piece) {  // (sigmoid_vector's W: zeros)
      bf16* out = params16.data() + s.offset + i0;
      for (size_t i = 0; i < piece.size(); ++i) out[i] = float_to_bf16(piece[i]);
    });
  }
}


bool Model::trains(const TensorSpec& s) const { return !opt_.freeze_base || s.routing(); }

void Model::zero_grad() {
  if (!opt_.freeze_base) return ops_.fill(grads_.data(), 0.0f, layout_.total());
  for (const TensorSpec& s : layout_.specs())
    if (trains(s)) ops_.fill(grads_.data() + s.offset, 0.0f, s.numel);
}

std::vector<float> Model::token_losses() const {
  std::vector<float> out(static_cast<size_t>(rows()));
  ops_.download(out.data(), token_loss_.data(), out.size() * sizeof(float));
  return out;
}

std::vector<uint8_t> Model::token_greedy() const {
  std::vector<uint8_t> out(static_cast<size_t>(rows()));
  ops_.download(out.data(), token_greedy_.as<uint8_t>(), out.size());
  return out;
}

void Model::fill_gradient_buffers_for_testing(float value) {
  for (const ArenaEntry& e : plan_.arena) {
    // The gradient buffers by their names: the backward's scratch (d…) and the sources' gradients (….dv).
    const bool gradient = e.what[0] == 'd' || (e.what.size() > 3 && e.what.compare(e.what.size() - 3, 3, ".dv") == 0);
    if (gradient) ops_.fill(acts_.data() + e.offset, value, e.floats);
  }
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

Weight Model::W_(const float* matrix) const {
  // The tensor at this offset of the layout (specs are in offset order): its shape.
  const int64_t at = matrix - params_.data();
  const auto& specs = layout_.specs();
  const auto it = std::lower_bound(specs.begin(), specs.end(), at,
                                   [](const TensorSpec& t, int64_t off) { return t.offset < off; });
  ATTNRES_CHECK(it != specs.end() && it->offset == at && it->matrix, "W_: not a weight matrix of this model");
  const int64_t rows = it->shape[0], cols = it->shape[1];
  if (!params16_.bytes()) return {matrix, rows, cols};
  return {params16_.as<bf16>() + at, rows, cols};
}

RowsOut Model::rows_(float* buffer) const {
  if (!params16_.bytes()) return buffer;
  return reinterpret_cast<bf16*>(buffer);
}

// ---- sublayers --------------------------------------------------------------

void Model::attention_forward_(int64_t l, const float* x, float* out, const float* x_v) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerActs& a = layer_[l];
  const int64_t B = cur_B_, T = cur_T_, N = B * T, d = c.d, qd = c.q_dim(), kvd = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const RowsOut ln = rows_(ln_);  // (N, d)
  ops_.rmsnorm_forward(ln, a.rstd1, x, w.ln1, N, d, eps);
  ops_.matmul_forward(a.q, ln, W_(w.wq), N, d, qd);
  ops_.matmul_forward(a.k, ln, W_(w.wk), N, d, kvd);
  // V-stream routing: V from its own input, through the same input_layernorm.
  if (x_v) ops_.rmsnorm_forward(ln, a.rstd1_v, x_v, w.ln1, N, d, eps);
  ops_.matmul_forward(a.v, ln, W_(w.wv), N, d, kvd);
  ops_.rmsnorm_forward(qr_, a.q_rstd, a.q, w.q_norm, N * c.H, c.hd, eps);
  ops_.rmsnorm_forward(kr_, a.k_rstd, a.k, w.k_norm, N * c.KV, c.hd, eps);
  const int64_t* pos = cache_ ? cache_->pos : nullptr;  // null: positions 0 … T−1
  ops_.rope_forward(qr_, rope_cos_, rope_sin_, B, T, c.H, c.hd, pos);
  ops_.rope_forward(kr_, rope_cos_, rope_sin_, B, T, c.KV, c.hd, pos);
  KeyValues kv{kr_, a.v, T * kvd};  // the block's own keys
  if (cache_) {
    // Into the cache at each sequence's positions; attention reads the cache.
    const KvCacheView& C = *cache_;
    ops_.kv_cache_store(C.k[l], kr_, C.slot, C.pos, B, T, C.len, kvd);
    ops_.kv_cache_store(C.v[l], a.v, C.slot, C.pos, B, T, C.len, kvd);
    kv = {C.k[l], C.v[l], C.len * kvd, C.slot, C.pos};
  }
  ops_.attention_forward(a.att, a.lse, qr_, kv, B, T, c.H, c.KV, c.hd, opt_.precision);
  ops_.matmul_forward(out, a.att, W_(w.wo), N, qd, d);
}

void Model::mlp_forward_(int64_t l, const float* x, float* out) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerActs& a = layer_[l];
  const int64_t N = rows(), d = c.d, F = c.F;
  const RowsOut ln = rows_(ln_), h = rows_(h_);  // (N, d), (N, F)
  ops_.rmsnorm_forward(ln, a.rstd2, x, w.ln2, N, d, static_cast<float>(c.rms_norm_eps));
  ops_.matmul_forward(a.gate, ln, W_(w.wgate), N, d, F);
  ops_.matmul_forward(a.up, ln, W_(w.wup), N, d, F);
  ops_.swiglu_forward(h, a.gate, a.up, N * F);
  ops_.matmul_forward(out, h, W_(w.wdown), N, F, d);
}

// dout: gradient of the sublayer output (N, d); x: its input (N, d).
// dx = (accumulate ? += : =) gradient of x.
void Model::attention_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate,
                                const float* x_v, float* dx_v) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerWeights& g = g_.layers[l];
  const LayerActs& a = layer_[l];
  const int64_t B = cur_B_, T = cur_T_, N = B * T, d = c.d, qd = c.q_dim(), kvd = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Recompute ln, qr, kr (with the stored rstd they equal the forward's).
  const RowsOut ln = rows_(ln_);  // (N, d)
  ops_.rmsnorm_forward(ln, nullptr, x, w.ln1, N, d, eps);
  ops_.rmsnorm_forward(qr_, nullptr, a.q, w.q_norm, N * c.H, c.hd, eps);
  ops_.rmsnorm_forward(kr_, nullptr, a.k, w.k_norm, N * c.KV, c.hd, eps);
  ops_.rope_forward(qr_, rope_cos_, rope_sin_, B, T, c.H, c.hd);
  ops_.rope_forward(kr_, rope_cos_, rope_sin_, B, T, c.KV, c.hd);

  ops_.matmul_backward(datt_, g.wo, dout, a.att, W_(w.wo), N, qd, d);
  ops_.attention_backward(dq_, dk_, dv_, datt_, qr_, kr_, a.v, a.att, a.lse, B, T, c.H, c.KV, c.hd,
                          opt_.precision);
  ops_.rope_backward(dq_, rope_cos_, rope_sin_, B, T, c.H, c.hd);
  ops_.rope_backward(dk_, rope_cos_, rope_sin_, B, T, c.KV, c.hd);
  ops_.rmsnorm_backward(dq_, g.q_norm, dq_, a.q, w.q_norm, a.q_rstd, N * c.H, c.hd);  // in place
  ops_.rmsnorm_backward(dk_, g.k_norm, dk_, a.k, w.k_norm, a.k_rstd, N * c.KV, c.hd);
  ops_.matmul_backward(dln_, g.wq, dq_, ln, W_(w.wq), N, d, qd);
  ops_.matmul_backward(dln_, g.wk, dk_, ln, W_(w.wk), N, d, kvd, /*accumulate_dinp=*/true);
  if (!x_v) {
    ops_.matmul_backward(dln_, g.wv, dv_, ln, W_(w.wv), N, d, kvd, /*accumulate_dinp=*/true);
    ops_.rmsnorm_backward(dx, g.ln1, dln_, x, w.ln1, a.rstd1, N, d, accumulate);
    return;
  }
  // V-stream routing: ln = norm(x) fed Q and K, ln_v = norm(x_v) fed V, one γ:
  //   dx = norm'(x)ᵀ·(dq·Wq + dk·Wk),  dx_v = norm'(x_v)ᵀ·(dv·Wv),  dγ gets both.
  ops_.rmsnorm_backward(dx, g.ln1, dln_, x, w.ln1, a.rstd1, N, d, accumulate);
  ops_.rmsnorm_forward(ln, nullptr, x_v, w.ln1, N, d, eps);  // ln_v again
  ops_.matmul_backward(dln_, g.wv, dv_, ln, W_(w.wv), N, d, kvd);
  ops_.rmsnorm_backward(dx_v, g.ln1, dln_, x_v, w.ln1, a.rstd1_v, N, d, /*accumulate=*/false);
}

void Model::mlp_backward_(int64_t l, const float* dout, const float* x, float* dx, bool accumulate) {
  const Config& c = cfg_;
  const LayerWeights& w = w_.layers[l];
  LayerWeights& g = g_.layers[l];
  const LayerActs& a = layer_[l];
  const int64_t N = rows(), d = c.d, F = c.F;
  const RowsOut ln = rows_(ln_), h = rows_(h_);  // (N, d), (N, F)
  ops_.rmsnorm_forward(ln, nullptr, x, w.ln2, N, d, static_cast<float>(c.rms_norm_eps));
  ops_.swiglu_forward(h, a.gate, a.up, N * F);
  ops_.matmul_backward(dh_, g.wdown, dout, h, W_(w.wdown), N, F, d);
  const RowsOut dgate = rows_(h_), dup = rows_(dup_);  // (N, F) each; h is dead once wdown's gradient is taken
  ops_.swiglu_backward(dgate, dup, dh_, a.gate, a.up, N * F);
  ops_.matmul_backward(dln_, g.wgate, dgate, ln, W_(w.wgate), N, d, F);
  ops_.matmul_backward(dln_, g.wup, dup, ln, W_(w.wup), N, d, F, /*accumulate_dinp=*/true);
  ops_.rmsnorm_backward(dx, g.ln2, dln_, x, w.ln2, a.rstd2, N, d, accumulate);
}

// ---- the modes: what a sublayer reads and what its output becomes ----------------
//
// Notation as docs/DESIGN.md §2: e embedding output, x the stream, P the
// partial block sum, out_k the output of sublayer k, B layers per block.

float* Model::stored_input_(int64_t k) { return k % 2 ? layer_[k / 2].x_mlp : layer_[k / 2].x_attn; }

void Model::route_(int r, float* out, const float* base) {
  const Router& R = routers_[r];
  if (R.w->pre_gate) gate_sources_(r, base);  // the sources it reads, gated by the stream (base)
  if (const RouteOverride* o = overrides_[r]) {  // an intervention (eval/intervened_forward.h)
    const RouteOverride& a = *o;
    if (a.weights)
      ops_.route_mix_weights(out, a.weights, R.src_list, static_cast<int64_t>(R.src.size()), cfg_.routing_heads, base,
                             R.gate, combine_, rows(), cfg_.d);
    else
      ops_.route_forward(out, R.logits, a.src, a.S, cfg_.routing_heads, R.w->proj, R.w->norm, base, R.gate,
                         combine_, rows(), cfg_.d);
  } else {
    ops_.route_forward(out, R.logits, R.src_list, static_cast<int64_t>(R.src.size()), cfg_.routing_heads, R.w->proj,
                       R.w->norm, base, R.gate, combine_, rows(), cfg_.d, collect_stats_ ? R.stats : nullptr);
    // The entropy term reads the sublayer routers (not the final one, nor a value router).
    if (entropy_sum_.bytes() && R.k < plan_.K && !R.value)
      ops_.route_entropy(entropy_sum_.as<double>(), R.logits, static_cast<int64_t>(R.src.size()), cfg_.routing_heads,
                         rows());
    if (route_tap_) route_tap_(r, R.logits);
  }
  if (R.gate_g) vector_gate_(r, out, base);
}

// sigmoid_vector: out holds the router's ungated h (x + R, or R); the gate
// reads x_g (the stream, or the router's last source):
//   pre = x_g·Wᵀ (a product: bf16 under --precision bf16),  g = σ(pre + b),
//   out = x_g + g∘(h − x_g).
// Training keeps x_g (the stream moves on), g and h − x_g for the backward.
void Model::vector_gate_(int r, float* out, const float* x_g) {
  const Router& R = routers_[r];
  const int64_t N = rows(), d = cfg_.d;
  if (R.gate_in) {
    ops_.copy(R.gate_in, x_g, N * d);
    x_g = R.gate_in;
  }
  ops_.matmul_forward(R.gate_g, x_g, W_(R.w->gate_proj), N, d, d);
  ops_.gate_vector_forward(out, R.gate_g, R.gate_diff, R.w->gate_bias, x_g, N, d);
}

// pre_gated: router r reads its sources gated by the stream x,
//   pre = x·Wᵀ (a product: bf16 under --precision bf16),  g = σ(pre + b),
//   y_i = g∘v_i and their rstd (the keys are normalised from the gated values),
// into the shared slots gated_.  Training keeps x and g for the backward.
void Model::gate_sources_(int r, const float* x) {
  const Router& R = routers_[r];
  const int64_t N = rows(), d = cfg_.d;
  if (R.src_gate_in) ops_.copy(R.src_gate_in, x, N * d);
  ops_.matmul_forward(R.src_gate, x, W_(R.w->pre_gate), N, d, d);
  ops_.sigmoid_gate_forward(R.src_gate, R.src_gate, R.w->pre_gate_bias, N, d);
  for (size_t q = 0; q < R.raw_src.size(); ++q)
    ops_.gated_source_forward(gated_[q].v, gated_[q].rstd, R.src_gate, R.raw_src[q].v, N, d,
                              static_cast<float>(cfg_.rms_norm_eps));
}

// Its backward, with each dy_i in gated_[i].dv (the router's backward):
//   dv_i (= or +=) g∘dy_i,  dg = Σ_i v_i∘dy_i,  d(pre) = dg∘g(1 − g),  db += Σ_n d(pre),
//   dW += d(pre)ᵀ·x,  dx += d(pre)·W.
void Model::gate_sources_backward_(int r, bool first) {
  const Router& R = routers_[r];
  const int64_t N = rows(), d = cfg_.d;
  ops_.fill(dgate_pre_, 0.0f, N * d);
  for (size_t q = 0; q < R.raw_src.size(); ++q)
    ops_.gated_source_backward(R.raw_dsrc[q], dgate_pre_, gated_[q].dv, R.src_gate, R.raw_src[q].v, N, d,
                               /*accumulate_dv=*/!first);
  ops_.sigmoid_gate_backward(dgate_pre_, R.g->pre_gate_bias, dgate_pre_, R.src_gate, N, d);
  ops_.matmul_backward(dgate_base_, R.g->pre_gate, dgate_pre_, R.src_gate_in, W_(R.w->pre_gate), N, d, d);
  ops_.add_inplace(dx_, dgate_base_, N * d);
}

void Model::route_mix_(int r, float* out, const float* base) {
  const Router& R = routers_[r];
  if (!R.logits_kept) {  // the forward again (its logits into the shared buffer): route_mix's bits
    ops_.route_forward(out, R.logits, R.src_list, static_cast<int64_t>(R.src.size()), cfg_.routing_heads, R.w->proj,
                       R.w->norm, base, R.gate, combine_, rows(), cfg_.d);
    return;
  }
  ops_.route_mix(out, R.logits, R.src_list, static_cast<int64_t>(R.src.size()), cfg_.routing_heads, base, R.gate, combine_,
                 rows(), cfg_.d);
}

// dU_ holds the gradient of the router's output.  The base is the stream x in
// the additive modes (its gradient dx_), and the router's last source in a
// gated replacement (its gradient that source's).  In the modes that rebuild
// inputs the same pass over the rows also rebuilds into u_ the input of the
// sublayer before this router's (the backward's next), saving a pass over the
// sources.
void Model::route_backward_(int r, bool first, float* dU) {
  const Router& R = routers_[r];
  float* dbase = combine_ == Combine::kAdd ? dx_ : (R.gate ? R.dsrc.back() : nullptr);
  RouteRebuild rb;
  const int64_t j = R.k - 1;  // the sublayer whose input comes next
  const int rj = j >= 0 ? plan_.sublayers[j].router : -1;
  if (plan_.rebuilds_inputs() && rj >= 0) {
    const Router& P = routers_[rj];
    rb = {u_, P.logits_kept ? P.logits : nullptr, P.src_list, static_cast<int64_t>(P.src.size()), cfg_.routing_heads,
          gate_base_(rj), P.gate, combine_, false, P.w->proj, P.w->norm};
    if (plan_.rebuilt_input_adds_stream()) {  // delta: u = x + g·R, x the stream (e alone before the first output)
      if (j == 0) rb.base = sources_[0].v;
      else rb.stream = true;
    }
  }
  const bool sigmoid_gate = R.w->gate_logit != nullptr;
  if (sigmoid_gate) ops_.fill(R.dgate, 0.0f, 1);  // d(σ(θ)), which route_backward adds to
  // sigmoid_vector, u = x_g + g∘(h − x_g):  dh = g∘du (into dU_, for the
  // router),  d(pre) = du∘(h − x_g)∘g(1 − g),  db += Σ_n d(pre),
  // d(x_g) = (1 − g)∘du + d(pre)·W,  dW += d(pre)ᵀ·x_g.
  const int64_t N = rows(), d = cfg_.d;
  if (R.gate_g)
    ops_.gate_vector_backward(dU, dgate_pre_, R.g->gate_bias, dgate_base_, dU, R.gate_g, R.gate_diff, N, d);
  // The entropy term's weight per token, head and router (sublayer routers only, not a value router).
  const float entropy_scale = R.k < plan_.K && !R.value ? entropy_scale_ : 0.0f;
  // pre_gated: the gated sources again (from the kept g), their gradients
  // assigned into the slots, then sent on through the gate.
  if (R.w->pre_gate)
    for (size_t q = 0; q < R.raw_src.size(); ++q)
      ops_.gated_source_forward(gated_[q].v, gated_[q].rstd, R.src_gate, R.raw_src[q].v, N, d,
                                static_cast<float>(cfg_.rms_norm_eps));
  ops_.route_backward(R.dsrc_list, dbase, R.g->proj, R.g->norm, R.dgate, dU, R.logits_kept ? R.logits : nullptr,
                      R.src_list,
                      static_cast<int64_t>(R.src.size()), cfg_.routing_heads, R.w->proj, R.w->norm, gate_base_(r), R.gate,
                      combine_,
                      rows(), cfg_.d, rb.out ? &rb : nullptr, /*accumulate_src=*/!first && !R.w->pre_gate,
                      entropy_scale);
  if (R.w->pre_gate) gate_sources_backward_(r, first);
  // sigmoid_scalar: dθ += d(σ(θ))·σ(θ)(1 − σ(θ))
  if (sigmoid_gate) ops_.sigmoid_backward(R.g->gate_logit, R.dgate, R.gate, 1);
  if (R.gate_g) {  // after the router's backward, which may assign its last source's gradient
    ops_.matmul_backward(dgate_base_, R.g->gate_proj, dgate_pre_, R.gate_in, W_(R.w->gate_proj), N, d, d,
                         /*accumulate_dinp=*/true);
    ops_.add_inplace(combine_ == Combine::kAdd ? dx_ : R.dsrc.back(), dgate_base_, N * d);
  }
  rebuilt_ = rb.out ? j : -1;
}

const float* Model::gate_base_(int r) const {
  const Router& R = routers_[r];
  return combine_ == Combine::kReplace && (R.gate || R.w->gate_proj) ? R.src.back().v : nullptr;
}

// e, and the rstd of the sources that exist before layer 0 (e, null sources).
void Model::embed_() {
  const int64_t N = rows(), d = cfg_.d;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const Weight table = W_(w_.embed);
  const int e = plan_.embedding_source;
  if (e < 0) {  // e starts the stream only
    ops_.embedding_forward(plan_.stream_in_inputs ? stored_input_(0) : stream_, tokens_, table, N, d);
  } else {  // e is a source (full, delta, block's P_0), and the stream's start where there is one
    ops_.embedding_forward(sources_[e].v, tokens_, table, N, d);
    ops_.source_rstd(sources_[e].rstd, sources_[e].v, N, d, eps);
    if (plan_.mode->stream) ops_.copy(stream_, sources_[e].v, N * d);
  }
  for (const Router& R : routers_)
    if (!R.index.empty() && R.index[0] < 0) ops_.source_rstd(null_rstd_ + R.k, R.w->null_source, 1, d, eps);
}

// The input u of sublayer k (N, d).
const float* Model::sublayer_input_(int64_t k) {
  if (plan_.stream_in_inputs) return stored_input_(k);  // u = x, stored
  const PlanSublayer& s = plan_.sublayers[k];
  float* u = s.stores_input ? stored_input_(k) : u_;
  if (s.router < 0) {  // u = x (delta, delta_block: layer 0's attention without a null source)
    if (!s.stores_input) return stream_;
    ops_.copy(u, stream_, rows() * cfg_.d);
    return u;
  }
  // u = x + g·R (add), or R, or (1−g)·last + g·R (replace)
  route_(s.router, u, combine_ == Combine::kAdd ? stream_ : gate_base_(s.router));
  return u;
}

// V-stream routing: the value projection's input u_v of attention sublayer k
// (N, d), made by its value router over the same sources (stored); null
// where the sublayer has none (its V reads u).
const float* Model::value_input_(int64_t k) {
  const PlanSublayer& s = plan_.sublayers[k];
  if (s.v_router < 0) return nullptr;
  float* uv = layer_[k / 2].x_attn_v;
  route_(s.v_router, uv, combine_ == Combine::kAdd ? stream_ : gate_base_(s.v_router));
  return uv;
}

// Where sublayer k writes its output.
float* Model::sublayer_out_(int64_t k) {
  const int j = plan_.sublayers[k].output_source;
  return j >= 0 ? sources_[j].v : out_;
}

// After sublayer k wrote its output: what it makes (plan.h: PlanSublayer).
void Model::sublayer_output_(int64_t k) {
  const int64_t N = rows(), d = cfg_.d, K = 2 * cfg_.L;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  if (plan_.stream_in_inputs) {  // x_{k+1} = x_k + out
    ops_.add(k + 1 < K ? stored_input_(k + 1) : stream_, stored_input_(k), out_, N * d);
    return;
  }
  const PlanSublayer& s = plan_.sublayers[k];
  const float* out = sublayer_out_(k);
  if (s.makes_block >= 0) {
    // A block starts: before x += out, its source is made from x: "true"
    // x − x_at_previous_start, "reference" x − last_source; x itself for the first.
    const int b = s.makes_block;
    Source& src = sources_[b];
    if (b == 0) ops_.copy(src.v, stream_, N * d);
    else ops_.sub(src.v, stream_, cfg_.block_delta == BlockDelta::kTrue ? xb_ : sources_[b - 1].v, N * d);
    if (xb_) ops_.copy(xb_, stream_, N * d);
    ops_.source_rstd(src.rstd, src.v, N, d, eps);
  }
  if (s.adds_to_stream) ops_.add_inplace(stream_, out, N * d);  // x += out
  if (s.makes_state >= 0) {  // full_additive: S_{k+1} = x
    Source& st = sources_[s.makes_state];
    ops_.copy(st.v, stream_, N * d);
    ops_.source_rstd(st.rstd, st.v, N, d, eps);
  }
  if (s.output_source < 0) return;
  Source& o = sources_[s.output_source];
  if (s.previous_partial >= 0) ops_.add_inplace(o.v, sources_[s.previous_partial].v, N * d);  // P_{k+1} = P_k + out
  ops_.source_rstd(o.rstd, o.v, N, d, eps);
}

// The input of the final norm, in stream_: the stream already, or the final
// router; block without a final router (block_mh) reads the last partial sum
// P_2L (so the final norm's backward writes its gradient, dx_).
void Model::final_input_() {
  if (plan_.final_router >= 0) route_(plan_.final_router, stream_, nullptr);
  else if (plan_.final_reads_last_partial())
    ops_.copy(stream_, sources_[2 * cfg_.L].v, rows() * cfg_.d);
}

// ---- the same, backward -----------------------------------------------------------

// The gradient of sublayer k's output (N, d); every router reading it has run its backward.
float* Model::sublayer_output_backward_(int64_t k) {
  const int64_t N = rows(), d = cfg_.d;
  const PlanSublayer& s = plan_.sublayers[k];
  // full_additive: x_{k+1} = x_k + out is also the source S_{k+1}, whose
  // routers' gradient joins the stream's: d(out) = dx_{k+1} + dS_{k+1}.
  if (s.makes_state >= 0) ops_.add_inplace(dx_, sources_[s.makes_state].dv, N * d);
  if (s.output_source < 0) return dx_;  // x_next = x + out: d(out) = dx
  Source& o = sources_[s.output_source];
  if (!s.output_is_partial_sum) {  // out is a source (full), and x += out (delta): d(out) = dv (+ dx)
    if (s.adds_to_stream) ops_.add_inplace(o.dv, dx_, N * d);
    return o.dv;
  }
  // dpart_ is the running d(P).  If P_{k+1} is a block, its gradient is its
  // own buffer (the reset cut it from P_{k+2}): restart the running one from it.
  if (o.dv != dpart_) ops_.copy(dpart_, o.dv, N * d);
  if (!s.adds_to_stream) return dpart_;
  ops_.add(dsum_, dx_, dpart_, N * d);  // out fed the stream too: d(out) = dx + d(P_{k+1})
  return dsum_;
}

// The input u of sublayer k again: stored, or rebuilt from the stored logits.
const float* Model::sublayer_input_recompute_(int64_t k) {
  if (plan_.stream_in_inputs) return stored_input_(k);
  const PlanSublayer& s = plan_.sublayers[k];
  if (s.stores_input) return stored_input_(k);
  if (rebuilt_ == k) return u_;  // done by the previous router backward
  const int r = s.router;
  if (combine_ == Combine::kReplace) {  // u = R, or (1−g)·last + g·R
    route_mix_(r, u_, gate_base_(r));
    return u_;
  }
  // u = x + g·R, with the stream x = e + out_0 + … + out_{k−1}: the sources
  // (modes.h: rebuilt_streams_are_sums).  Layer 0's attention: x = e.
  if (k == 0) {
    if (r < 0) return sources_[0].v;  // u = e
    route_mix_(r, u_, sources_[0].v);  // u = e + g·R
    return u_;
  }
  // x is the router's sources after the null one, summed in the same pass as
  // the mix, in the forward stream's order.
  ATTNRES_CHECK(r >= 0 && routers_[r].logits_kept, "sublayer ", k, ": a rebuilt input x + g·R needs its router's logits");
  const Router& R = routers_[r];
  ops_.route_mix_stream(u_, R.logits, R.src_list, static_cast<int64_t>(R.src.size()), cfg_.routing_heads, R.gate,
                        rows(), cfg_.d);
  return u_;
}

// dU_ holds the gradient of sublayer k's input; send it on to what made it.
void Model::sublayer_input_backward_(int64_t k) {
  const int64_t N = rows(), d = cfg_.d;
  if (plan_.stream_in_inputs) return;  // the sublayer accumulated into dx_ itself
  const PlanSublayer& s = plan_.sublayers[k];
  if (s.makes_block >= 0) {
    // Block source b was made from the x this sublayer read:
    //   "true":      s_b = x − x_{b−1}  ⇒  dx += ds_b − ds_{b+1}
    //   "reference": s_b = x − s_{b−1}  ⇒  ds_b(total) = ds_b − ds_{b+1}(total);  dx += ds_b
    const int b = s.makes_block;
    const bool next = b + 1 < static_cast<int>(sources_.size());
    if (cfg_.block_delta == BlockDelta::kTrue) {
      ops_.add_inplace(dx_, sources_[b].dv, N * d);
      if (next) ops_.sub(dx_, dx_, sources_[b + 1].dv, N * d);
    } else {
      if (next) ops_.sub(sources_[b].dv, sources_[b].dv, sources_[b + 1].dv, N * d);
      ops_.add_inplace(dx_, sources_[b].dv, N * d);
    }
  }
  if (s.router < 0) ops_.add_inplace(dx_, dU_, N * d);  // u = x
  else {
    // V-stream routing: the value router ran after the attention router, so
    // its backward runs first; neither is the backward's first router.
    if (s.v_router >= 0) route_backward_(s.v_router, false, dUv_);
    route_backward_(s.router, s.router == plan_.first_backward_router, dU_);  // u = x + g·R: dx += dU there
  }
}

void Model::final_input_backward_() {
  if (plan_.final_router >= 0) route_backward_(plan_.final_router, /*first=*/true, dU_);
}

// The gradient of e into the embedding table.
void Model::embed_backward_() {
  if (!g_.embed) return;  // frozen
  const int64_t N = rows(), d = cfg_.d;
  const int e = plan_.embedding_source;
  const float* de = dx_;  // e started the stream
  if (e >= 0 && !plan_.mode->stream) de = sources_[e].dv;  // e is a source only
  else if (e >= 0) ops_.add_inplace(dx_, sources_[e].dv, N * d);  // both: the stream's start and a source
  ops_.embedding_backward(g_.embed, de, tokens_, N, d);
}

// ---- whole model --------------------------------------------------------------

void Model::begin_forward(const int32_t* inputs, int64_t B, int64_t T, const KvCacheView* cache) {
  const int64_t max_rows = plan_.rows;
  ATTNRES_CHECK(B > 0 && B <= opt_.batch && T > 0 && T <= opt_.seq_len && B * T <= max_rows, "a forward of B=", B,
                " T=", T, " exceeds the model's ", opt_.batch, " x ", opt_.seq_len, " (", max_rows, " rows)");
  if (cache && cache->len > plan_.positions)
    fail("a KV cache of ", cache->len, " positions, but the model's RoPE tables cover ", plan_.positions,
         " (ModelOptions::cache_len)");
  const int64_t N = B * T;
  for (int64_t i = 0; i < N; ++i)
    if (inputs[i] < 0 || inputs[i] >= cfg_.V)
      fail("token id ", inputs[i], " at position ", i, " is outside [0, vocab_size=", cfg_.V, ")");
  ops_.upload(tokens_, inputs, static_cast<size_t>(N) * sizeof(int32_t));
  std::fill(overrides_.begin(), overrides_.end(), nullptr);
  cache_ = cache;
  ++forwards_;
  cur_B_ = B;
  cur_T_ = T;
  for (const Router& R : routers_)  // sigmoid_scalar: g = σ(θ), once per forward
    if (R.w->gate_logit) ops_.sigmoid_forward(const_cast<float*>(R.gate), R.w->gate_logit, 1);
  if (entropy_sum_.bytes()) {
    const double zero = 0.0;
    ops_.upload(entropy_sum_.data(), &zero, sizeof zero);
  }
  need_(0);
  embed_();
  if (units_) units_->forward_done(0);
}

void Model::run_sublayer_(int64_t k) {
  const int64_t l = k / 2;
  if (k % 2 == 0) need_(static_cast<int>(1 + l));
  if (k % 2 == 0) {
    const float* u = sublayer_input_(k);  // before the value router: the router order of the plan
    attention_forward_(l, u, sublayer_out_(k), value_input_(k));
  } else {
    mlp_forward_(l, sublayer_input_(k), sublayer_out_(k));
  }
  sublayer_output_(k);
  if (k % 2 == 1 && units_) units_->forward_done(static_cast<int>(1 + l));
}

void Model::run_sublayers(int64_t from, int64_t to) {
  ATTNRES_CHECK(0 <= from && from <= to && to <= 2 * cfg_.L, "sublayers ", from, " to ", to, " of ", 2 * cfg_.L);
  for (int64_t k = from; k < to; ++k) run_sublayer_(k);
}

void Model::finish_forward() {
  need_(static_cast<int>(cfg_.L + 1));
  final_input_();
  ops_.rmsnorm_forward(xf_, rstd_f_, stream_, w_.final_norm, rows(), cfg_.d, static_cast<float>(cfg_.rms_norm_eps));
}

void Model::forward(const int32_t* inputs, int64_t B, int64_t T) {
  begin_forward(inputs, B, T);
  run_sublayers(0, 2 * cfg_.L);
  finish_forward();
}

std::vector<float*> Model::carried_state() const {
  std::vector<float*> state{stream_};
  if (xb_) state.push_back(xb_);
  return state;
}

void Model::set_route_override(int r, const RouteOverride* o) {
  ATTNRES_CHECK(r >= 0 && static_cast<size_t>(r) < routers_.size(), "router ", r, " of ", routers_.size());
  ATTNRES_CHECK(!o || (o->weights != nullptr) != (o->src != nullptr), "a route override sets src or weights");
  overrides_[r] = o;
}

// Checks targets (N) against the vocabulary, uploads them, returns how many count (≥ 0).
int64_t Model::upload_targets_(const int32_t* targets, int64_t N) {
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] >= cfg_.V) fail("target token id ", targets[i], " at position ", i, " is >= vocab_size ", cfg_.V);
    count += targets[i] >= 0;
  }
  ops_.upload(targets_, targets, static_cast<size_t>(N) * sizeof(int32_t));
  return count;
}

Model::LossSum Model::loss_sum(const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T) {
  forward(inputs, B, T);
  return loss_of_forward(targets);
}

Model::LossSum Model::loss_of_forward(const int32_t* targets) {
  const int64_t N = rows();
  LossSum r;
  r.count = upload_targets_(targets, N);
  r.sum = ops_.lm_head_loss(nullptr, nullptr, xf_, W_(w_.lm_head), targets_, N, cfg_.d, cfg_.V, 1.0f,
                            token_loss_.data(), token_greedy_.as<uint8_t>());
  if (units_) units_->forward_done(static_cast<int>(cfg_.L + 1));
  return r;
}

double Model::forward_backward(const int32_t* inputs, const int32_t* targets, bool backward, float grad_scale) {
  ATTNRES_CHECK(!backward || opt_.training, "a backward needs a training model");
  const int64_t B = opt_.batch, T = opt_.seq_len, N = B * T;
  forward(inputs, B, T);
  const int64_t count = upload_targets_(targets, N);
  if (count == 0 && !(units_ && backward)) {
    if (units_) units_->forward_done(static_cast<int>(cfg_.L + 1));
    return 0.0;
  }
  // d(mean loss)/d(logits) = (softmax − onehot)/count, times the accumulation scale
  // (0 when no target counts: a sharded run's backward that adds nothing).
  const float scale = count > 0 ? grad_scale / static_cast<float>(count) : 0.0f;
  const double sum = ops_.lm_head_loss(backward ? dln_ : nullptr, g_.lm_head, xf_, W_(w_.lm_head), targets_, N,
                                       cfg_.d, cfg_.V, scale, token_loss_.data());
  // The entropy term: −λ·E with E the mean over the 2L sublayers, the N
  // tokens and the routing heads, so each (router, token, head) weighs
  // λ / (2L·N·H), times the accumulation scale.
  entropy_scale_ = static_cast<float>(grad_scale * opt_.entropy_lambda /
                                      (static_cast<double>(plan_.K) * static_cast<double>(N) * cfg_.routing_heads));
  if (backward) this->backward();
  else if (units_) units_->forward_done(static_cast<int>(cfg_.L + 1));
  return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

double Model::route_entropy() const {
  ATTNRES_CHECK(entropy_sum_.bytes(), "route_entropy: the model was built without the entropy term");
  double sum = 0.0;
  ops_.download(&sum, entropy_sum_.data(), sizeof sum);
  return sum / (static_cast<double>(plan_.K) * static_cast<double>(rows()));
}

void Model::backward() {
  const Config& c = cfg_;
  const int64_t N = rows(), d = c.d;
  const bool routed = plan_.routed();
  // Source gradients accumulate over the routers reading them; the first
  // router assigns those it reads, the others start at zero.
  for (float* dv : zeroed_dv_) ops_.fill(dv, 0.0f, N * d);
  rebuilt_ = -1;
  // dln_ holds d(xf) from the fused head.  Through the final norm into the
  // stream (dx_), or into the final router's output (dU_):
  ops_.rmsnorm_backward(plan_.final_router >= 0 ? dU_ : dx_, g_.final_norm, dln_, stream_, w_.final_norm, rstd_f_, N, d);
  final_input_backward_();
  if (units_) units_->backward_done(static_cast<int>(c.L + 1));
  // Baseline: the sublayer adds the gradient of its input straight into dx_
  // (it reads dout = dx_ in its first op, before it accumulates, so the alias
  // is safe).  Routed: it writes dU_, which sublayer_input_backward_ sends on.
  float* dinp = routed ? dU_ : dx_;
  // With recompute, each sublayer's forward runs again from its input just
  // before its backward, to refill the shared activations (its output goes
  // to a scratch buffer that is dead at that point: dh_, then h_); the
  // kernels are deterministic, so the gradients are the same bits.
  for (int64_t l = c.L - 1; l >= 0; --l) {
    need_(static_cast<int>(1 + l));
    const float* dout = sublayer_output_backward_(2 * l + 1);
    const float* x = sublayer_input_recompute_(2 * l + 1);
    if (opt_.recompute) mlp_forward_(l, x, dh_);
    mlp_backward_(l, dout, x, dinp, !routed);
    sublayer_input_backward_(2 * l + 1);
    dout = sublayer_output_backward_(2 * l);
    x = sublayer_input_recompute_(2 * l);
    const float* xv = plan_.sublayers[2 * l].v_router >= 0 ? layer_[l].x_attn_v : nullptr;  // stored
    if (opt_.recompute) attention_forward_(l, x, h_, xv);
    attention_backward_(l, dout, x, dinp, !routed, xv, xv ? dUv_ : nullptr);
    sublayer_input_backward_(2 * l);
    if (units_) units_->backward_done(static_cast<int>(1 + l));
  }
  embed_backward_();
  if (units_) units_->backward_done(0);
}

// Logits of `count` rows of the last forward, rows first_row + i·row_stride,
// into host memory (count, V), B() rows at a time through logits_.
void Model::head_logits_(int64_t first_row, int64_t row_stride, int64_t count, float* host_out) {
  const int64_t d = cfg_.d, V = cfg_.V;
  for (int64_t i0 = 0; i0 < count; i0 += opt_.batch) {
    const int64_t n = std::min(opt_.batch, count - i0);
    if (row_stride == 1) {
      ops_.matmul_forward(logits_, xf_ + (first_row + i0) * d, W_(w_.lm_head), n, d, V);
    } else {
      for (int64_t i = 0; i < n; ++i)  // gather the rows first: one product for all of them
        ops_.copy(ln_ + i * d, xf_ + (first_row + (i0 + i) * row_stride) * d, d);
      ops_.matmul_forward(logits_, ln_, W_(w_.lm_head), n, d, V);
    }
    ops_.download(host_out + i0 * V, logits_, static_cast<size_t>(n * V) * sizeof(float));
  }
}

void Model::forward_logits(const int32_t* inputs, float* logits) {
  forward_logits(inputs, opt_.batch, opt_.seq_len, logits);
}

void Model::forward_logits(const int32_t* inputs, int64_t B, int64_t T, float* logits) {
  forward(inputs, B, T);
  head_logits_(0, 1, rows(), logits);
}

void Model::last_logits(float* logits) { head_logits_(cur_T_ - 1, cur_T_, cur_B_, logits); }

}  // namespace attnres
