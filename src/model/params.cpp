// params.cpp — see params.h.
#include "model/params.h"

#include <algorithm>

#include "core/error.h"
#include "core/shape.h"
#include "model/modes.h"

namespace attnres {

namespace {

// The one enumeration: calls fn(spec-without-offset, slot) for every tensor,
// where slot is the view pointer of `w` that the tensor binds to.
template <class Fn>
void visit_tensors(const Config& c, Weights& w, Fn&& fn) {
  const int64_t d = c.d;
  int unit = 0;  // of the tensors visited next
  auto t = [&](std::string name, std::vector<int64_t> shape, bool matrix, Init init, float*& slot) {
    TensorSpec s;
    s.unit = unit;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.numel = shape_numel(s.shape);
    s.matrix = matrix;
    s.init = init;
    fn(s, slot);
  };
  const ModeSpec& mode = mode_spec(c.mode);
  auto router = [&](const std::string& prefix, const std::string& kind, RouterWeights& r, bool with_extras) {
    t(prefix + kind + "_res_proj.weight", {1, d}, false, Init::kQuery, r.proj);
    t(prefix + kind + "_res_norm.weight", {d}, false, Init::kOnes, r.norm);
    if (with_extras && mode.null_source && c.null_source) t(prefix + kind + "_null_source", {d}, false, Init::kZeros, r.null_source);
    if (with_extras && c.gate == Gate::kLearnableAlpha)
      t(prefix + kind + "_res_alpha", {}, false, Init::kZeros, r.alpha);
    if (with_extras && c.gate == Gate::kSigmoidScalar)
      t(prefix + kind + "_res_gate_logit", {}, false, Init::kGateLogit, r.gate_logit);
    if (with_extras && mode.source_gates) {  // pre_gated: an nn.Linear(d, d) with W = 0, b = 0 at init (g = 0.5)
      t(prefix + kind + "_pre_gate.weight", {d, d}, true, Init::kZeros, r.pre_gate);
      t(prefix + kind + "_pre_gate.bias", {d}, false, Init::kZeros, r.pre_gate_bias);
    }
    if (with_extras && c.gate == Gate::kSigmoidVector) {  // an nn.Linear(d, d) with W = 0, b = −2 at init
      t(prefix + kind + "_res_gate_proj.weight", {d, d}, true, Init::kZeros, r.gate_proj);
      t(prefix + kind + "_res_gate_proj.bias", {d}, false, Init::kGateLogit, r.gate_bias);
    }
  };

  t("model.embed_tokens.weight", {c.V, d}, true, Init::kNormal, w.embed);
  w.layers.resize(static_cast<size_t>(c.L));
  for (int64_t i = 0; i < c.L; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    unit = static_cast<int>(1 + i);
    const std::string p = cat("model.layers.", i, ".");
    t(p + "input_layernorm.weight", {d}, false, Init::kOnes, l.ln1);
    t(p + "self_attn.q_proj.weight", {c.q_dim(), d}, true, Init::kNormal, l.wq);
    t(p + "self_attn.k_proj.weight", {c.kv_dim(), d}, true, Init::kNormal, l.wk);
    t(p + "self_attn.v_proj.weight", {c.kv_dim(), d}, true, Init::kNormal, l.wv);
    t(p + "self_attn.o_proj.weight", {d, c.q_dim()}, true, Init::kNormal, l.wo);
    t(p + "self_attn.q_norm.weight", {c.hd}, false, Init::kOnes, l.q_norm);
    t(p + "self_attn.k_norm.weight", {c.hd}, false, Init::kOnes, l.k_norm);
    t(p + "post_attention_layernorm.weight", {d}, false, Init::kOnes, l.ln2);
    t(p + "mlp.gate_proj.weight", {c.F, d}, true, Init::kNormal, l.wgate);
    t(p + "mlp.up_proj.weight", {c.F, d}, true, Init::kNormal, l.wup);
    t(p + "mlp.down_proj.weight", {d, c.F}, true, Init::kNormal, l.wdown);
    if (mode.routed()) {
      router(p, "attn", l.attn_router, true);
      router(p, "mlp", l.mlp_router, true);
      if (mode.value_router) router(p, "v", l.v_router, false);
    }
  }
  unit = static_cast<int>(c.L + 1);
  t("model.norm.weight", {d}, false, Init::kOnes, w.final_norm);
  if (c.final_router()) router("model.", "final", w.final_router, false);
  if (!c.tied) t("lm_head.weight", {c.V, d}, true, Init::kNormal, w.lm_head);
}

}  // namespace

ParamLayout::ParamLayout(const Config& c) : cfg_(c) {
  Weights scratch;
  visit_tensors(c, scratch, [&](TensorSpec s, float*&) {
    s.offset = total_;
    total_ += (s.numel + 15) / 16 * 16;  // 64-byte aligned tensors
    specs_.push_back(std::move(s));
  });
}

Weights ParamLayout::bind(float* base) const {
  Weights w;
  size_t i = 0;
  visit_tensors(cfg_, w, [&](const TensorSpec&, float*& slot) { slot = base + specs_[i++].offset; });
  if (cfg_.tied) w.lm_head = w.embed;
  for (LayerWeights& l : w.layers) {  // the value router shares the attention router's null source and gate
    if (!l.v_router.proj) continue;
    RouterWeights& v = l.v_router;
    const RouterWeights& a = l.attn_router;
    v.null_source = a.null_source;
    v.alpha = a.alpha;
    v.gate_logit = a.gate_logit;
    v.gate_proj = a.gate_proj;
    v.gate_bias = a.gate_bias;
  }
  return w;
}

void init_tensor(const TensorSpec& s, const Config& c, float* p, Rng& rng) {
  for (int64_t i = 0; i < s.numel; ++i) {
    switch (s.init) {
      case Init::kNormal: p[i] = static_cast<float>(0.02 * rng.normal()); break;
      case Init::kOnes: p[i] = 1.0f; break;
      case Init::kZeros: p[i] = 0.0f; break;
      case Init::kQuery: p[i] = c.query_init_normal ? static_cast<float>(0.02 * rng.normal()) : 0.0f; break;
      case Init::kGateLogit: p[i] = -2.0f; break;
    }
  }
}

void init_tensor_in_pieces(const TensorSpec& s, const Config& c, Rng& rng,
                           const std::function<void(int64_t first, std::span<const float> values)>& f) {
  constexpr int64_t kPiece = 1 << 16;
  std::vector<float> piece;
  for (int64_t i0 = 0; i0 < s.numel; i0 += kPiece) {
    TensorSpec part = s;
    part.numel = std::min(kPiece, s.numel - i0);
    piece.resize(static_cast<size_t>(part.numel));
    init_tensor(part, c, piece.data(), rng);
    f(i0, piece);
  }
}

// The routing tensors draw from a stream of their own (seeded from the
// generator's state, without drawing from it): the base tensors get the same
// values in every mode, so runs of different modes with one seed start from
// the same base model (matched comparisons, `attnres compare`).
Rng routing_stream(const Rng& rng) { return Rng(rng.state()[0] ^ 0x5851F42D4C957F2Dull); }

void init_params(const ParamLayout& layout, const Config& c, float* params, Rng& rng) {
  Rng routing = routing_stream(rng);
  for (const auto& s : layout.specs()) init_tensor(s, c, params + s.offset, s.routing() ? routing : rng);
}

void init_params(const ParamLayout& layout, const Config& c, float* params, Rng& rng,
                 std::span<const ArenaRange> keep) {
  Rng routing = routing_stream(rng);
  size_t first = 0;  // the first range that may meet the next tensor (both in arena order)
  for (const TensorSpec& s : layout.specs()) {
    Rng& r = s.routing() ? routing : rng;
    const int64_t a = s.offset, b = s.offset + s.numel;
    while (first < keep.size() && keep[first].hi <= a) ++first;
    if (first < keep.size() && keep[first].lo <= a && b <= keep[first].hi) {  // wholly kept
      init_tensor(s, c, params + a, r);
      continue;
    }
    // Drawn in pieces (every value, in order), each piece's kept floats stored.
    init_tensor_in_pieces(s, c, r, [&](int64_t i0, std::span<const float> piece) {
      const int64_t p0 = a + i0, p1 = p0 + static_cast<int64_t>(piece.size());
      for (size_t k = first; k < keep.size() && keep[k].lo < p1; ++k) {
        const int64_t x0 = std::max(p0, keep[k].lo), x1 = std::min(p1, keep[k].hi);
        if (x0 < x1) std::copy(piece.data() + (x0 - p0), piece.data() + (x1 - p0), params + x0);
      }
    });
  }
}

bool is_routing_param(const std::string& name) {
  for (const char* key : {"_res_proj.", "_res_norm.", "_null_source", "_res_alpha", "_res_gate_logit",
                          "_res_gate_proj.", "_pre_gate."})
    if (name.find(key) != std::string::npos) return true;
  return false;
}

bool TensorSpec::routing() const { return is_routing_param(name); }

}  // namespace attnres
