// optimizer.h — AdamW (PyTorch semantics), the learning-rate schedule, and
// global-norm gradient clipping, over the parameter arena of a ParamLayout;
// the loops over the arena run as ops of the backend (ops/backend.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "model/params.h"
#include "ops/backend.h"

namespace attnres {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// Linear warmup over `warmup` steps to lr_max, then cosine decay to lr_min at
// step `total`:  lr(s) = lr_max·(s+1)/warmup for s < warmup, else
// lr_min + ½(lr_max − lr_min)(1 + cos(π·p)), p = (s − warmup)/max(1, total − warmup) ∈ [0, 1].
double lr_at(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min);

class AdamW;

// g *= min(1, max_norm / (norm + 1e-6)) when max_norm > 0 (torch clip_grad_norm_).
void clip_gradients(Backend& ops, float* g, int64_t n, double norm, double max_norm);
// Σ g² over what this optimizer updates: the tensors it trains (all of the
// arena unless the base is frozen) within its range.  With one rank that is
// the square of the global norm; with N ranks, each adds its range's.
// (In double, deterministic for a given thread count.)
double sum_squares(Backend& ops, const AdamW& adamw, const float* g);
// Clips what this optimizer updates by the global `norm`.
void clip_gradients(Backend& ops, const AdamW& adamw, float* g, double norm, double max_norm);

// Two parameter groups, as the reference fine-tuning script has them: the
// routing parameters (TensorSpec::routing) and the base.  The routing group
// may run at its own rate, and the base may be frozen: then it is neither
// updated nor decayed, and its moments — in a lazily backed arena — are
// never touched, so they cost no memory.
//
// Sharded (ZeRO stage 1): an optimizer of the arena range [lo, hi) keeps the
// moments of that range only (m()[0] is element lo's) and updates only those
// parameters; each rank of a data-parallel run owns one range, and the
// updated parameters are then all-gathered (distributed/comm.h).
class AdamW {
 public:
  AdamW(Backend& ops, const ParamLayout& layout, AdamWConfig cfg, bool freeze_base = false, int64_t lo = 0,
        int64_t hi = -1);
  // Sharded (ZeRO stage 3, distributed/zero3.h): an optimizer of the arena
  // ranges `owned` (sorted, disjoint) updates those parameters only, and keeps
  // their moments at the arena's own offsets (lo() = 0: m()[at] is element
  // at's) in lazily backed arenas, so that only the owned ranges cost memory.
  AdamW(Backend& ops, const ParamLayout& layout, AdamWConfig cfg, bool freeze_base, std::vector<ArenaRange> owned);
  // One update at 1-based step t, at rate lr (lr_routing for the routing
  // group; < 0: lr), of every trained tensor:  p ← p·(1 − lr·wd) (decayed tensors only);
  // m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;
  // p ← p − lr · (m / (1 − β1ᵗ)) / (sqrt(v / (1 − β2ᵗ)) + eps).
  // params16 (a bf16 model's copies, Model::params_bf16): the updated
  // matrices are rounded into it in the same pass.
  void step(float* params, const float* grads, double lr, int64_t t, double lr_routing = -1,
            bf16* params16 = nullptr);
  bool trains(const TensorSpec& s) const { return !freeze_base_ || s.routing(); }
  bool freeze_base() const { return freeze_base_; }
  int64_t lo() const { return lo_; }
  int64_t hi() const { return hi_; }
  // The ranges of a sharded optimizer (empty: [lo, hi)).
  const std::vector<ArenaRange>& owned() const { return owned_; }
  // Calls f(offset, count) for each trained tensor's part within [lo, hi)
  // (a sharded optimizer: within its ranges), in layout order.
  template <class F>
  void for_each_range(F&& f) const {
    size_t k = 0;
    for (const TensorSpec& s : layout_.specs()) {
      if (!trains(s)) continue;
      const int64_t a = std::max(lo_, s.offset), b = std::min(hi_, s.offset + s.numel);
      if (owned_.empty()) {
        if (a < b) f(s, a, b - a);
        continue;
      }
      while (k < owned_.size() && owned_[k].hi <= a) ++k;
      for (size_t j = k; j < owned_.size() && owned_[j].lo < b; ++j) {
        const int64_t x0 = std::max(a, owned_[j].lo), x1 = std::min(b, owned_[j].hi);
        if (x0 < x1) f(s, x0, x1 - x0);
      }
    }
  }
  float* m() { return m_.data(); }  // (hi − lo) moments of the range
  float* v() { return v_.data(); }
  const AdamWConfig& config() const { return cfg_; }

 private:
  Backend& ops_;
  const ParamLayout& layout_;
  AdamWConfig cfg_;
  bool freeze_base_ = false;
  int64_t lo_, hi_;
  std::vector<ArenaRange> owned_;
  Buffer m_, v_;
};

}  // namespace attnres
