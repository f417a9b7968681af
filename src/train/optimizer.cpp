// optimizer.cpp — see optimizer.h.
#include "train/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace attnres {

double lr_at(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
  if (step < warmup) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
  double p = static_cast<double>(step - warmup) / static_cast<double>(total - warmup > 1 ? total - warmup : 1);
  p = p < 0 ? 0 : (p > 1 ? 1 : p);
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + std::cos(M_PI * p));
}

void clip_gradients(Backend& ops, float* g, int64_t n, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  ops.scale(g, static_cast<float>(coef), n);
}

double sum_squares(Backend& ops, const AdamW& adamw, const float* g) {
  // The whole range in one call when every tensor trains (fixed chunks: the same bits as before sharding).
  if (!adamw.freeze_base() && adamw.owned().empty()) return ops.sum_squares(g + adamw.lo(), adamw.hi() - adamw.lo());
  double sum = 0;
  adamw.for_each_range([&](const TensorSpec&, int64_t at, int64_t n) { sum += ops.sum_squares(g + at, n); });
  return sum;
}

void clip_gradients(Backend& ops, const AdamW& adamw, float* g, double norm, double max_norm) {
  if (!adamw.freeze_base() && adamw.owned().empty()) return clip_gradients(ops, g + adamw.lo(), adamw.hi() - adamw.lo(), norm, max_norm);
  adamw.for_each_range([&](const TensorSpec&, int64_t at, int64_t n) { clip_gradients(ops, g + at, n, norm, max_norm); });
}

AdamW::AdamW(Backend& ops, const ParamLayout& layout, AdamWConfig cfg, bool freeze_base, int64_t lo, int64_t hi)
    : ops_(ops),
      layout_(layout),
      cfg_(cfg),
      freeze_base_(freeze_base),
      lo_(lo),
      hi_(hi < 0 ? layout.total() : hi),
      m_(ops.alloc(static_cast<size_t>(hi_ - lo_) * sizeof(float), /*lazy=*/freeze_base)),
      v_(ops.alloc(static_cast<size_t>(hi_ - lo_) * sizeof(float), /*lazy=*/freeze_base)) {
  ATTNRES_CHECK(0 <= lo_ && lo_ <= hi_ && hi_ <= layout.total(), "optimizer range outside the arena");
  if (freeze_base) {  // lazily backed: zero the moments that are used
    for_each_range([&](const TensorSpec&, int64_t at, int64_t n) {
      ops.fill(m_.data() + (at - lo_), 0.0f, n);
      ops.fill(v_.data() + (at - lo_), 0.0f, n);
    });
  }
}

AdamW::AdamW(Backend& ops, const ParamLayout& layout, AdamWConfig cfg, bool freeze_base, std::vector<ArenaRange> owned)
    : ops_(ops),
      layout_(layout),
      cfg_(cfg),
      freeze_base_(freeze_base),
      lo_(0),
      hi_(layout.total()),
      owned_(std::move(owned)),
      m_(ops.alloc(static_cast<size_t>(hi_) * sizeof(float), /*lazy=*/true)),
      v_(ops.alloc(static_cast<size_t>(hi_) * sizeof(float), /*lazy=*/true)) {
  for (size_t k = 0; k < owned_.size(); ++k)
    ATTNRES_CHECK(0 <= owned_[k].lo && owned_[k].lo < owned_[k].hi && owned_[k].hi <= hi_ &&
                      (k == 0 || owned_[k - 1].hi <= owned_[k].lo),
                  "sharded optimizer: ranges not sorted and disjoint within the arena");
  for_each_range([&](const TensorSpec&, int64_t at, int64_t n) {  // lazily backed: zero the moments that are used
    ops.fill(m_.data() + at, 0.0f, n);
    ops.fill(v_.data() + at, 0.0f, n);
  });
}

void AdamW::step(float* params, const float* grads, double lr_base, int64_t t, double lr_routing, bf16* params16) {
  if (lr_routing < 0) lr_routing = lr_base;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t));
  AdamWUpdate u;
  u.beta1 = static_cast<float>(cfg_.beta1);
  u.beta2 = static_cast<float>(cfg_.beta2);
  u.eps = static_cast<float>(cfg_.eps);
  u.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  for_each_range([&](const TensorSpec& s, int64_t at, int64_t n) {
    const double lr = s.routing() ? lr_routing : lr_base;
    u.step_size = static_cast<float>(lr / bc1);
    u.decay = s.decay() ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.0f;
    ops_.adamw_update(params + at, grads + at, m_.data() + (at - lo_), v_.data() + (at - lo_), n, u,
                      params16 && s.matrix ? params16 + at : nullptr);
  });
}

}  // namespace attnres
