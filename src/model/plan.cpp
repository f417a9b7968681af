// plan.cpp — see plan.h.  The sources and routers of each mode are those of
// docs/DESIGN.md §2 and tests/oracle/README.md §3.
#include "model/plan.h"

#include <algorithm>

#include "core/error.h"

namespace attnres {

namespace {

std::string sublayer_name(int64_t k) { return cat("layers.", k / 2, k % 2 ? ".mlp" : ".attn"); }

// The activation arena of a model of plan p (plan.h: arena).  The sizes
// follow the buffers' shapes in model.h; every entry starts 64-byte aligned.
void carve_arena(RoutingPlan& p, const Config& c, const ModelOptions& o) {
  using Buf = ArenaEntry::Buffer;
  const ModeSpec& mode = *p.mode;
  const bool train = o.training;
  const int64_t B = o.batch, T = o.seq_len;
  batch_tokens(B, T);
  if (o.rows > B * T || (o.rows > 0 && o.rows < std::max(B, T)))
    fail("ModelOptions: rows ", o.rows, " must lie between max(batch, seq_len) and batch x seq_len");
  // The RoPE tables cover the KV cache's positions: bounded first.
  if (o.cache_len > 0 && o.cache_len > c.max_position_embeddings)
    fail("a KV cache of ", o.cache_len, " positions exceeds max_position_embeddings ", c.max_position_embeddings);
  p.rows = o.rows > 0 ? o.rows : B * T;
  p.positions = std::max(T, o.cache_len);
  const int64_t N = p.rows, positions = p.positions, d = c.d, qd = c.q_dim(), kvd = c.kv_dim(), F = c.F;
  auto take = [&](Buf b, int64_t index, const std::string& what, int64_t floats) {
    p.arena.push_back({what, b, index, floats, p.arena_floats});
    p.arena_floats += (floats + 15) / 16 * 16;
  };
  take(Buf::kTokens, -1, "tokens", N);
  take(Buf::kTargets, -1, "targets", N);
  // Per-layer activations: training keeps every layer's, inference one set
  // that all layers share.  With recompute, training keeps every layer's
  // inputs (stores_inputs modes) and one shared set of the rest, rebuilt per
  // layer in the backward.
  p.shares_layer_acts = !train || o.recompute;
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string at = cat("layers.", l, ".");
    const bool inputs = p.stores_inputs && (train || l == 0);
    if (inputs) {
      take(Buf::kInputAttn, l, at + "x_attn", N * d);
      take(Buf::kInputMlp, l, at + "x_mlp", N * d);
      if (mode.value_router) take(Buf::kInputAttnV, l, at + "x_attn_v", N * d);
    }
    if (l > 0 && p.shares_layer_acts) continue;
    take(Buf::kRstd1, l, at + "rstd1", N);
    if (mode.value_router) take(Buf::kRstd1V, l, at + "rstd1_v", N);
    take(Buf::kQ, l, at + "q", N * qd);
    take(Buf::kK, l, at + "k", N * kvd);
    take(Buf::kV, l, at + "v", N * kvd);
    take(Buf::kQRstd, l, at + "q_rstd", N * c.H);
    take(Buf::kKRstd, l, at + "k_rstd", N * c.KV);
    take(Buf::kAtt, l, at + "att", N * qd);
    if (train) take(Buf::kLse, l, at + "lse", N * c.H);
    take(Buf::kRstd2, l, at + "rstd2", N);
    take(Buf::kGate, l, at + "gate", N * F);
    take(Buf::kUp, l, at + "up", N * F);
  }
  take(Buf::kStream, -1, "stream", N * d);
  take(Buf::kRstdFinal, -1, "rstd_f", N);
  take(Buf::kXf, -1, "xf", N * d);
  take(Buf::kRopeCos, -1, "rope_cos", positions * c.hd / 2);
  take(Buf::kRopeSin, -1, "rope_sin", positions * c.hd / 2);
  take(Buf::kLogits, -1, "logits", B * c.V);
  take(Buf::kLn, -1, "ln", N * d);
  take(Buf::kQr, -1, "qr", N * qd);
  take(Buf::kKr, -1, "kr", N * kvd);
  if (!mode.outputs_are_sources()) take(Buf::kOut, -1, "out", N * d);
  take(Buf::kH, -1, "h", N * F);
  if (train) {
    take(Buf::kDh, -1, "dh", N * F);
    take(Buf::kDup, -1, "dup", N * F);
    if (mode.running_gradient()) take(Buf::kDx, -1, "dx", N * d);  // full has none
    if (p.partials_beside_stream()) {
      take(Buf::kDp, -1, "dp", N * d);
      take(Buf::kDsum, -1, "dsum", N * d);
    }
    take(Buf::kDln, -1, "dln", N * d);
    take(Buf::kDq, -1, "dq", N * qd);
    take(Buf::kDk, -1, "dk", N * kvd);
    take(Buf::kDv, -1, "dv", N * kvd);
    take(Buf::kDatt, -1, "datt", N * qd);
  }
  // Depth routing.
  for (size_t j = 0; j < p.sources.size(); ++j) {
    const std::string src = cat("sources.", j, ".");
    const int64_t i = static_cast<int64_t>(j);
    take(Buf::kSourceV, i, src + "v", N * d);
    take(Buf::kSourceRstd, i, src + "rstd", N);
    // block: only the blocks (the P_k at block starts) own a gradient buffer;
    // the other partial sums share the running one.
    if (train && p.sources[j].owns_gradient) take(Buf::kSourceDv, i, src + "dv", N * d);
  }
  if (!p.routed()) return;
  if (!p.stores_inputs) take(Buf::kU, -1, "u", N * d);
  if (train) take(Buf::kDU, -1, "dU", N * d);
  if (train && mode.value_router) take(Buf::kDUv, -1, "dU_v", N * d);
  if (mode.block_deltas() && c.block_delta == BlockDelta::kTrue && p.sources.size() > 1) take(Buf::kXb, -1, "xb", N * d);
  take(Buf::kNullRstd, -1, "null_rstd", p.K);
  // The routers' logits: kept for the backward where the plan says so (not
  // in full), else one buffer that every router's forward shares.
  bool shares_logits = false;
  for (size_t r = 0; r < p.routers.size(); ++r) {
    const PlanRouter& R = p.routers[r];
    const int64_t S = static_cast<int64_t>(R.index.size());
    if (R.keeps_logits) take(Buf::kRouterLogits, static_cast<int64_t>(r), "routers." + R.name + ".logits", N * c.routing_heads * S);
    shares_logits |= !R.keeps_logits;
    p.max_router_sources = std::max(p.max_router_sources, S);
  }
  if (shares_logits) take(Buf::kSharedLogits, -1, "shared_logits", N * c.routing_heads * p.max_router_sources);
  // pre_gated: the gated sources' slots (a router's y_i = g∘v_i and their
  // rstd, and in training their gradients), and per router its g and its x
  // (training; inference one g that every router shares).
  if (p.source_gates) {
    for (int64_t i = 0; i < p.max_router_sources; ++i) {
      const std::string at = cat("gated.", i, ".");
      take(Buf::kGatedV, i, at + "v", N * d);
      take(Buf::kGatedRstd, i, at + "rstd", N);
      if (train) take(Buf::kGatedDv, i, at + "dv", N * d);
    }
    if (!train) take(Buf::kSrcGate, -1, "source_gate", N * d);
    for (size_t r = 0; train && r < p.routers.size(); ++r) {
      const std::string at = "routers." + p.routers[r].name + ".";
      take(Buf::kSrcGate, static_cast<int64_t>(r), at + "source_gate", N * d);
      take(Buf::kSrcGateIn, static_cast<int64_t>(r), at + "source_gate_in", N * d);
    }
    if (train) {
      take(Buf::kDGatePre, -1, "dgate_pre", N * d);
      take(Buf::kDGateBase, -1, "dgate_base", N * d);
    }
    return;
  }
  // sigmoid_vector: per sublayer router (the final router has no gate) its
  // gate's input x_g, g and h − x_g for the backward; inference one g that
  // every router shares.  The backward's two scratch rows: d(pre) and d(x_g).
  if (!p.vector_gates) return;
  if (!train) {
    take(Buf::kGateG, -1, "gate_g", N * d);
    return;
  }
  for (size_t r = 0; r < p.routers.size(); ++r) {
    if (p.routers[r].k == p.K) continue;
    const std::string at = "routers." + p.routers[r].name + ".";
    const int64_t i = static_cast<int64_t>(r);
    take(Buf::kGateIn, i, at + "gate_in", N * d);
    take(Buf::kGateG, i, at + "gate_g", N * d);
    take(Buf::kGateDiff, i, at + "gate_diff", N * d);
  }
  take(Buf::kDGatePre, -1, "dgate_pre", N * d);
  take(Buf::kDGateBase, -1, "dgate_base", N * d);
}

}  // namespace

RoutingPlan RoutingPlan::build(const Config& c, const ModelOptions& o) {
  // A Config changed in code after it was read (a mode set on it directly)
  // is held to the same rules as one read from a file.
  c.validate("the model's config");
  RoutingPlan p;
  const ModeSpec& mode = mode_spec(c.mode);
  p.mode = &mode;
  p.K = 2 * c.L;
  p.layers_per_block = c.layers_per_block();
  const int64_t K = p.K, Bl = p.layers_per_block;
  p.sublayers.assign(static_cast<size_t>(K), {});
  p.vector_gates = mode.routed() && c.gate == Gate::kSigmoidVector;
  p.source_gates = mode.source_gates;
  p.stores_inputs = mode.stores_inputs || p.vector_gates;
  if (!mode.routed()) {  // the residual stream alone, kept as the sublayers' inputs
    p.stream_in_inputs = true;
    carve_arena(p, c, o);
    return p;
  }

  // The sources, and what makes each.
  using Made = PlanSource::Made;
  switch (mode.sources) {
    case Sources::kOutputs:  // e, then the output of sublayer k as source k+1
      p.sources.push_back({"embed", Made::kEmbedding, -1, true});
      for (int64_t k = 0; k < K; ++k) p.sources.push_back({sublayer_name(k), Made::kOutput, k, true});
      break;
    case Sources::kPartialSums:  // P_0 = e, P_{k+1} = (reset ? 0 : P_k) + out_k; the P_k at block starts are the blocks
      for (int64_t j = 0; j <= K; ++j) {
        const bool block = j < K && p.starts_block(j);
        p.sources.push_back({block ? cat("block.", j / 2 / Bl) : "partial", j == 0 ? Made::kEmbedding : Made::kPartialSum,
                             j - 1, mode.source_owns_gradient(block)});
      }
      break;
    case Sources::kBlockDeltas:  // one per block, made at its start
      for (int64_t b = 0; b * Bl < c.L; ++b) p.sources.push_back({cat("block.", b), Made::kBlockDelta, 2 * b * Bl, true});
      break;
    case Sources::kStates:  // S_{k+1} = the stream after sublayer k, for k < K − 1 (no router reads the last one)
      for (int64_t k = 0; k + 1 < K; ++k) p.sources.push_back({sublayer_name(k) + ".state", Made::kState, k, true});
      break;
    case Sources::kOutputsAndStream:  // S_0 = e, then out_k and S_{k+1} for k < K − 1 (no router reads out_{K−1}, S_K)
      p.sources.push_back({"embed", Made::kEmbedding, -1, true});
      for (int64_t k = 0; k + 1 < K; ++k) {
        p.sources.push_back({sublayer_name(k), Made::kOutput, k, true});
        p.sources.push_back({sublayer_name(k) + ".state", Made::kState, k, true});
      }
      break;
    case Sources::kStreamAndA1:  // a_1 (sublayer 2), then S_k for 4 <= k < K: the stream before sublayer k
      p.sources.push_back({sublayer_name(2), Made::kOutput, 2, true});
      for (int64_t k = 4; k < K; ++k) p.sources.push_back({sublayer_name(k - 1) + ".state", Made::kState, k - 1, true});
      break;
    case Sources::kCumulativeStates:  // S_0 = e, then S_k, the stream after sublayer k − 1, for k < K
      p.sources.push_back({"embed", Made::kEmbedding, -1, true});
      for (int64_t k = 1; k < K; ++k) p.sources.push_back({sublayer_name(k - 1) + ".state", Made::kState, k - 1, true});
      break;
    case Sources::kSublayerOutputs:  // out_k as source k, for k < K − 1 (no router reads out_{K−1})
      for (int64_t k = 0; k + 1 < K; ++k) p.sources.push_back({sublayer_name(k), Made::kOutput, k, true});
      break;
    case Sources::kNone: break;
  }

  // The routers, in forward order: the sources that exist just before each runs.
  const bool null = mode.null_source && c.null_source;
  for (int64_t k = 0; k <= K; ++k) {
    if (k == K && !c.final_router()) break;
    std::vector<int> index;
    switch (c.mode) {
      case Mode::kFull:  // every source so far: e, a_0, m_0, …, out_{k−1}
        for (int64_t j = 0; j <= k; ++j) index.push_back(static_cast<int>(j));
        break;
      case Mode::kDelta:  // [null] + e, a_0, …, out_{k−1}; layer 0's attention: [null] only
        if (null) index.push_back(-1);
        if (k >= 1)
          for (int64_t j = 0; j <= k; ++j) index.push_back(static_cast<int>(j));
        break;
      case Mode::kBlockAdd:  // [null] + block's sources
        if (null) index.push_back(-1);
        [[fallthrough]];
      case Mode::kBlock:  // the blocks pushed before this router, then the current partial sum
        for (int64_t j = 0; j < k; j += 2)
          if (p.starts_block(j)) index.push_back(static_cast<int>(j));
        index.push_back(static_cast<int>(k));
        break;
      case Mode::kDeltaBlock:  // [null] + the blocks started before (attention) / up to (MLP) this layer
        if (null) index.push_back(-1);
        for (int64_t j = 0; j < k; j += 2)
          if (p.starts_block(j)) index.push_back(static_cast<int>(j / 2 / Bl));
        break;
      case Mode::kFullAdditive:  // [null] + S_1 … S_k, the stream after each sublayer so far
        if (null) index.push_back(-1);
        for (int64_t j = 0; j < k; ++j) index.push_back(static_cast<int>(j));
        break;
      case Mode::kDeltaReplace:  // out_0 … out_{k−1}, then the stream S_k (S_0 = e)
        for (int64_t j = 0; j < k; ++j) index.push_back(static_cast<int>(1 + 2 * j));
        index.push_back(static_cast<int>(k == 0 ? 0 : 2 * k));
        break;
      case Mode::kFirstLayer:  // from layer 2 on: the stream S_k, then a_1
        if (k < 4) break;
        index.push_back(static_cast<int>(k - 3));
        index.push_back(0);
        break;
      case Mode::kPreGated:  // out_0 … out_{k−1} (each gated as the router runs); layer 0's attention: none
      case Mode::kDeltaV:  // [null] + out_0 … out_{k−1}; layer 0's attention: [null] only
        if (null) index.push_back(-1);
        for (int64_t j = 0; j < k; ++j) index.push_back(static_cast<int>(j));
        break;
      case Mode::kFullV:  // S_1 … S_k, then the stream S_k again; layer 0's attention: e alone
        for (int64_t j = 1; j <= k; ++j) index.push_back(static_cast<int>(j));
        index.push_back(static_cast<int>(k));
        break;
      case Mode::kBaseline: break;
    }
    if (index.empty()) continue;  // delta / delta_block, layer 0's attention without a null source: input = x
    PlanRouter r;
    r.k = k;
    r.name = k == K ? "final" : sublayer_name(k);
    // block: the last source is the partial sum, whatever it becomes;
    // delta_replace and first_layer read the stream as it is there.
    for (size_t q = 0; q < index.size(); ++q) {
      const bool last = q + 1 == index.size();
      r.source_names.push_back(index[q] < 0                                              ? "null"
                               : mode.sources == Sources::kPartialSums && last            ? "partial"
                               : mode.last_source_is_stream() && last                     ? "stream"
                               : mode.sources == Sources::kStreamAndA1 && q == 0          ? "stream"
                                                                                          : p.sources[index[q]].name);
    }
    r.index = std::move(index);
    // Training keeps each router's logits for the backward, except in full,
    // whose routers read every earlier output: (N, H, S) of them per router
    // add up to (N, H, K²/2), so its backward computes them again from the
    // source rows it reads anyway.
    r.keeps_logits = o.training && mode.keeps_logits;
    if (k == K) p.final_router = static_cast<int>(p.routers.size());
    else p.sublayers[k].router = static_cast<int>(p.routers.size());
    p.routers.push_back(r);
    // V-stream routing: after an attention sublayer's router, its value
    // router over the same sources (the reference runs them in this order).
    if (mode.value_router && k < K && k % 2 == 0) {
      r.name = cat("layers.", k / 2, ".v");
      r.value = true;
      p.sublayers[k].v_router = static_cast<int>(p.routers.size());
      p.routers.push_back(std::move(r));
    }
  }

  // Each sublayer's steps, from what makes each source.
  for (PlanSublayer& s : p.sublayers) {
    s.stores_input = p.stores_inputs;
    s.adds_to_stream = mode.stream;
  }
  for (int j = 0; j < static_cast<int>(p.sources.size()); ++j) {
    const PlanSource& src = p.sources[j];
    PlanSublayer* s = src.sublayer >= 0 ? &p.sublayers[src.sublayer] : nullptr;
    switch (src.made) {
      case Made::kEmbedding: p.embedding_source = j; break;
      case Made::kOutput: s->output_source = j; break;
      case Made::kPartialSum:
        s->output_source = j;
        s->output_is_partial_sum = true;
        if (!p.starts_block(src.sublayer)) s->previous_partial = j - 1;
        break;
      case Made::kBlockDelta: s->makes_block = j; break;
      case Made::kState: s->makes_state = j; break;
    }
  }

  // The backward's bookkeeping (training).  Source gradients accumulate over
  // the routers reading them; the first router assigns those it reads.
  if (p.final_router >= 0) p.first_backward_router = p.final_router;
  else if (mode.sources != Sources::kPartialSums) p.first_backward_router = p.sublayers[K - 1].router;
  // A router that reads a source twice (full_v: the stream, also the last
  // state) adds its two gradients into one buffer: it cannot assign it.
  if (p.first_backward_router >= 0) {
    std::vector<int> seen = p.routers[p.first_backward_router].index;
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) p.first_backward_router = -1;
  }
  // else none (block_mh, block_add): every router accumulates, into the
  // gradients zeroed first (zeroed_gradients) and, in block_mh, the last
  // partial sum's, which the final norm's backward writes.
  auto buffer = [&](int j) { return p.sources[j].owns_gradient ? j : -1; };  // −1: the partials' running gradient
  for (int j = 0; j < static_cast<int>(p.sources.size()); ++j) {
    const int b = buffer(j);
    // block_mh: the final norm's backward assigns the partials' running gradient (dx, the last partial's)
    bool covered = b < 0 && p.final_router < 0 && !mode.stream;
    if (p.first_backward_router >= 0)
      for (int i : p.routers[p.first_backward_router].index) covered |= i >= 0 && buffer(i) == b;
    if (!covered && std::find(p.zeroed_gradients.begin(), p.zeroed_gradients.end(), b) == p.zeroed_gradients.end())
      p.zeroed_gradients.push_back(b);
  }
  carve_arena(p, c, o);
  return p;
}

}  // namespace attnres
