// routing.h — the depth-routing kernel of attnres (DESIGN.md §2), forward and
// backward, shared by every routing mode (block, full, delta, delta_block).
//
// It is: one router over S sources, per token.  It is not: the choice of
// sources, the order of operations or the block bookkeeping of a mode — those
// live in model/model.cpp, which calls these functions.
//
// Dimension letters: N tokens (rows), d hidden size, S sources of one router.
// A router has a pseudo-query w (d) and an RMSNorm weight γ (d); for a token
// with source rows v_1..v_S (each d):
//
//   r_i = (mean(v_i²) + eps)^(-1/2)         per source and token, computed ONCE
//                                           when the source is made (source_rstd)
//                                           and shared by every router reading it
//   q   = w∘γ                               (d) folded once per router call
//   z_i = w·RMSNorm_γ(v_i) = r_i (q·v_i)    logits (N, S), kept for the backward;
//                                           normalised keys are never built
//   α   = softmax_i(z)                      recomputed from z where needed (S exps per token)
//   R   = Σ_i α_i v_i
//   out = a·base + c·R                      the combination:
//
//     combine   gate   a       c     meaning
//     kReplace  none   0       1     out = R                        (full, block)
//     kReplace  g      1 − g   g     out = (1−g)·base + g·R         (base = the router's last source)
//     kAdd      none   1       1     out = base + R                 (delta modes, base = stream x)
//     kAdd      g      1       g     out = base + g·R
//
// g is the raw learnable scalar (no sigmoid).  A source may instead be one (d)
// row broadcast to every token (the learned null source of the delta modes,
// source 0); its gradient is then summed over tokens.
//
// Gradient conventions (see route_backward): the gradients of sources, of the
// base and of the router parameters all ACCUMULATE (+=): a source feeds many
// routers (the first router of a backward may assign its sources' instead:
// accumulate_src = false, like matmul_backward's accumulate_dinp).  Token-sum reductions (dw, dγ, null source, gate) go through
// per-chunk partial sums over fixed 64-token chunks, added in chunk order in
// double, so results do not depend on the thread count or the schedule.
// Dot products over d are float SIMD within blocks of 64 elements, summed in
// double; token sums are double; the per-element updates (the weighted sum
// over sources, source gradients) are float SIMD.
#pragma once

#include <cstdint>
#include <vector>

namespace attnres {

struct RouteSource {
  const float* v = nullptr;     // (N, d) rows, or one (d) row when broadcast
  const float* rstd = nullptr;  // (N), or (1) when broadcast
  bool broadcast = false;       // allowed for source 0 only
};

enum class Combine { kReplace, kAdd };

// Routing statistics of one router, summed over the tokens of every forward
// while attached (DESIGN.md §2 "Routing statistics").
struct RouteStats {
  std::vector<double> weight_sum;  // (S)  Σ_tokens α_i
  double token_max_sum = 0;        // Σ_tokens max_i α_i
  double entropy_sum = 0;          // Σ_tokens −Σ_i α_i ln α_i          (nats)
  double cosine_sum = 0;           // Σ_tokens mean_{i<j} cos(v_i, v_j)  (S ≥ 2; a zero row has cos 0)
  int64_t tokens = 0;
};

// r[n] = (mean_c v[n,c]² + eps)^(-1/2), n < N.   (rstd (N), v (N, d))
void source_rstd(float* rstd, const float* v, int64_t N, int64_t d, float eps);

// Scratch for one call with S sources over N tokens, in floats, from a 64-byte
// aligned allocation (it holds double partial sums too).
int64_t route_scratch_floats(int64_t N, int64_t d, int64_t S);

// out (N, d) = a·base + c·Σ α_i v_i  (assigned); logits z (N, S) assigned.
// base (N, d) may be null for kReplace without gate; gate is a pointer to the
// scalar g or null.  stats, when non-null, accumulates this call's statistics
// (weight_sum must have S entries); null costs nothing.
// out must not alias base or a source.
void route_forward(float* out, float* logits, const RouteSource* src, int64_t S, const float* w, const float* gamma,
                   const float* base, const float* gate, Combine combine, int64_t N, int64_t d, float* scratch,
                   RouteStats* stats = nullptr);

// The combination alone from the stored logits: recomputes exactly the `out`
// of route_forward (same arithmetic, bit-identical).  out may alias base.
void route_mix(float* out, const float* logits, const RouteSource* src, int64_t S, const float* base,
               const float* gate, Combine combine, int64_t N, int64_t d, float* scratch);

// Delta's sublayer input rebuilt in one pass over the sources:
// out = x + g·Σ α_i v_i (kAdd), with x = ((v_j + v_j+1) + …) + v_S−1 the sum of
// the non-broadcast sources in order — the delta stream, bit-identical to the
// forward's running `x += out` — and the same bits as route_mix with that base.
void route_mix_stream(float* out, const float* logits, const RouteSource* src, int64_t S, const float* gate,
                      int64_t N, int64_t d, float* scratch);

// Optionally, route_backward also rebuilds another router's output in the
// same pass over the token rows: the backward walks the sublayers in reverse,
// and the input of sublayer k−1 (which the backward needs next) is made by a
// router whose sources are mostly this one's, already in cache.  Same bits as
// route_mix (stream = false) or route_mix_stream (stream = true).
struct RouteRebuild {
  float* out = nullptr;              // (N, d); must not alias anything route_backward reads
  const float* logits = nullptr;     // (N, S) that router's stored logits
  const RouteSource* src = nullptr;  // (S) its sources; S ≤ the backward's S
  int64_t S = 0;
  const float* base = nullptr;       // as route_mix (unused when stream)
  const float* gate = nullptr;
  Combine combine = Combine::kReplace;
  bool stream = false;               // kAdd, base = Σ of the non-broadcast sources (route_mix_stream)
};

// Given dout (N, d), the gradient of out:
//   dsrc[i] (N, d) or (d) if broadcast   += ∂/∂v_i        (accumulate; with
//                                        accumulate_src = false the (N, d) ones are
//                                        assigned: the first router of a backward)
//   dbase   (N, d)                       += a·dout        (accumulate; may be null; may alias dsrc[S−1])
//   dw, dgamma (d)                       += ∂/∂w, ∂/∂γ    (accumulate)
//   dgate   ()                           += ∂/∂g          (accumulate; only when gate)
// base is read only for kReplace with a gate (dg needs R − base).
void route_backward(float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate, const float* dout,
                    const float* logits, const RouteSource* src, int64_t S, const float* w, const float* gamma,
                    const float* base, const float* gate, Combine combine, int64_t N, int64_t d,
                    float* scratch, const RouteRebuild* rebuild = nullptr, bool accumulate_src = true);

// out = a − b over n elements (delta_block's block sources).
void sub(float* out, const float* a, const float* b, int64_t n);

}  // namespace attnres
