// route_types.h — the types of the depth-routing ops (ops/backend.h), shared
// with the model's table of modes (model/modes.h).
#pragma once

#include <cstdint>
#include <array>
#include <vector>

namespace attnres {

// A routing source: (N, d) rows, or one (d) row broadcast to every token
// (the learned null source of the delta modes, allowed as source 0 only).
// The routing ops read a router's sources as a list of these in backend
// memory (uploaded once, when a model carves its buffers), as a GPU kernel
// would: the list is data, not a host argument.
struct RouteSource {
  const float* v = nullptr;     // (N, d) rows, or one (d) row when broadcast
  const float* rstd = nullptr;  // (N), or (1) when broadcast
  bool broadcast = false;
};

// How a router's result R makes the sublayer input (see route_forward).
enum class Combine { kReplace, kAdd };

// Routing heads of one router at most (their per-token sums sit on the stack of the backward).
constexpr int64_t kMaxRoutingHeads = 64;

// Bins of the per-token max weight: [b/kMaxWeightBins, (b+1)/kMaxWeightBins), the last one closed.
constexpr int kMaxWeightBins = 20;

// The routing statistics of one router (docs/routing.md) as route_forward
// sums them in backend memory over the tokens of every call given them:
// route_stats_size(S, H) doubles,
//   [0, S)      Σ_tokens α_i                       per source
//   S           Σ_tokens max_i α_i
//   S + 1       Σ_tokens −Σ_i α_i ln α_i           (nats)
//   S + 2       Σ_tokens mean_{i<j} cos(v_i, v_j)  (S ≥ 2; a zero row has cos 0)
//   S + 3       tokens
//   S + 4 + b   tokens whose max_i α_i falls in bin b (kMaxWeightBins bins)
// Counts are whole numbers in double (exact below 2⁵³).  With H routing heads
// each per-token term is the mean over the heads (α_i: ᾱ_i = mean_h α_hi; max
// and entropy: each head's, averaged; a head adds 1/H to its max's bin); the
// cosine is of the whole vectors.  With H > 1 each head's own terms follow,
// from P = S + 4 + kMaxWeightBins:
//   P + h·S + i   Σ_tokens α_hi                    per head and source
//   P + H·S + h   Σ_tokens max_i α_hi              per head
//   P + H·S+H+h   Σ_tokens −Σ_i α_hi ln α_hi       per head
//   P + H·S + 2H  Σ_tokens mean_{h,i} |α_hi − ᾱ_i| the heads' disagreement
//                 (mean absolute deviation from the heads' consensus; 0 when they agree)
constexpr int64_t route_head_stats_size(int64_t S, int64_t H) { return H > 1 ? H * S + 2 * H + 1 : 0; }
constexpr int64_t route_stats_size(int64_t S, int64_t H) {
  return S + 4 + kMaxWeightBins + route_head_stats_size(S, H);
}

// The same statistics read back on the host (Model::routing_stats).
struct RouteStats {
  std::vector<double> weight_sum;  // (S)  Σ_tokens α_i
  double token_max_sum = 0;        // Σ_tokens max_i α_i
  std::array<int64_t, kMaxWeightBins> token_max_hist{};  // tokens per bin of max_i α_i
  double entropy_sum = 0;          // Σ_tokens −Σ_i α_i ln α_i          (nats)
  double cosine_sum = 0;           // Σ_tokens mean_{i<j} cos(v_i, v_j)
  int64_t tokens = 0;
  // With H > 1 routing heads (else empty / 0):
  std::vector<double> head_weight_sum;     // (H, S)  Σ_tokens α_hi
  std::vector<double> head_max_sum;        // (H)     Σ_tokens max_i α_hi
  std::vector<double> head_entropy_sum;    // (H)     Σ_tokens −Σ_i α_hi ln α_hi
  double disagreement_sum = 0;             // Σ_tokens mean_{h,i} |α_hi − ᾱ_i|
};

// route_backward may also rebuild another router's output in the same pass
// over the token rows: the backward walks the sublayers in reverse, and the
// input of sublayer k−1 (which the backward needs next) is made by a router
// whose sources are mostly this one's, already in cache.  Same bits as
// route_mix (stream = false) or route_mix_stream (stream = true).
// The struct is the op's argument (host); what it points to is backend memory.
struct RouteRebuild {
  float* out = nullptr;              // (N, d); must not alias anything route_backward reads
  const float* logits = nullptr;     // (N, H, S) that router's stored logits, or null: computed again (w, gamma)
  const RouteSource* src = nullptr;  // (S) its source list (backend memory); S ≤ the backward's S
  int64_t S = 0;
  int64_t H = 1;                     // its routing heads
  const float* base = nullptr;       // as route_mix (unused when stream)
  const float* gate = nullptr;
  Combine combine = Combine::kReplace;
  bool stream = false;               // kAdd, base = Σ of the non-broadcast sources (route_mix_stream)
  // Its query and norm weight (d each): with logits null the logits are
  // computed again from them, as route_backward's own (see there).
  const float* w = nullptr;
  const float* gamma = nullptr;
};

}  // namespace attnres
