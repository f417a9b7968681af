// optimizer.cpp — see optimizer.h.
#include "train/optimizer.h"

#include <cmath>

namespace attnres {

double lr_at(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
  if (step < warmup) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
  double p = static_cast<double>(step - warmup) / static_cast<double>(total - warmup > 1 ? total - warmup : 1);
  p = p < 0 ? 0 : (p > 1 ? 1 : p);
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + std::cos(M_PI * p));
}

double global_norm(Backend& ops, const float* g, int64_t n) { return std::sqrt(ops.sum_squares(g, n)); }

void clip_gradients(Backend& ops, float* g, int64_t n, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  ops.scale(g, static_cast<float>(coef), n);
}

double global_norm(Backend& ops, const AdamW& adamw, const ParamLayout& layout, const float* g) {
  if (!adamw.freeze_base()) return global_norm(ops, g, layout.total());
  double sum = 0;
  for (const TensorSpec& s : layout.specs())
    if (adamw.trains(s)) sum += ops.sum_squares(g + s.offset, s.numel);
  return std::sqrt(sum);
}

void clip_gradients(Backend& ops, const AdamW& adamw, const ParamLayout& layout, float* g, double norm,
                    double max_norm) {
  if (!adamw.freeze_base()) return clip_gradients(ops, g, layout.total(), norm, max_norm);
  for (const TensorSpec& s : layout.specs())
    if (adamw.trains(s)) clip_gradients(ops, g + s.offset, s.numel, norm, max_norm);
}

AdamW::AdamW(Backend& ops, const ParamLayout& layout, AdamWConfig cfg, bool freeze_base)
    : ops_(ops),
      layout_(layout),
      cfg_(cfg),
      freeze_base_(freeze_base),
      m_(ops.alloc(static_cast<size_t>(layout.total()) * sizeof(float), /*lazy=*/freeze_base)),
      v_(ops.alloc(static_cast<size_t>(layout.total()) * sizeof(float), /*lazy=*/freeze_base)) {
  if (freeze_base) {  // lazily backed: zero the moments that are used
    for (const TensorSpec& s : layout.specs())
      if (trains(s)) {
        ops.fill(m_.data() + s.offset, 0.0f, s.numel);
        ops.fill(v_.data() + s.offset, 0.0f, s.numel);
      }
  }
}

void AdamW::step(float* params, const float* grads, double lr_base, int64_t t, double lr_routing) {
  if (lr_routing < 0) lr_routing = lr_base;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t));
  AdamWUpdate u;
  u.beta1 = static_cast<float>(cfg_.beta1);
  u.beta2 = static_cast<float>(cfg_.beta2);
  u.eps = static_cast<float>(cfg_.eps);
  u.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  for (const auto& s : layout_.specs()) {
    if (!trains(s)) continue;
    const double lr = s.routing() ? lr_routing : lr_base;
    u.step_size = static_cast<float>(lr / bc1);
    u.decay = s.decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.0f;
    ops_.adamw_update(params + s.offset, grads + s.offset, m_.data() + s.offset, v_.data() + s.offset, s.numel, u);
  }
}

}  // namespace attnres
