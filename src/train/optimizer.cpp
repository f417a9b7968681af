// optimizer.cpp — see optimizer.h.
#include "train/optimizer.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"

namespace attnres {

double lr_at(int64_t step, int64_t warmup, int64_t total, double lr_max, double lr_min) {
  if (step < warmup) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
  double p = static_cast<double>(step - warmup) / static_cast<double>(total - warmup > 1 ? total - warmup : 1);
  p = p < 0 ? 0 : (p > 1 ? 1 : p);
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + std::cos(M_PI * p));
}

double global_norm(const float* g, int64_t n) {
  std::vector<double> partial(static_cast<size_t>(num_threads()), 0.0);
#pragma omp parallel
  {
    const auto [b, e] = thread_range(n);
    double s = 0.0;
    for (int64_t i = b; i < e; ++i) s += static_cast<double>(g[i]) * g[i];
    partial[static_cast<size_t>(omp_get_thread_num())] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;  // fixed order: deterministic
  return std::sqrt(total);
}

void clip_gradients(float* g, int64_t n, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  const float c = static_cast<float>(coef);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] *= c;
}

AdamW::AdamW(const ParamLayout& layout, AdamWConfig cfg)
    : layout_(layout), cfg_(cfg), m_(static_cast<size_t>(layout.total())), v_(static_cast<size_t>(layout.total())) {}

void AdamW::step(float* params, const float* grads, double lr, int64_t t) {
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t));
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(cfg_.eps);
  for (const auto& s : layout_.specs()) {
    const float decay = s.decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.0f;
    float* p = params + s.offset;
    const float* g = grads + s.offset;
    float* m = m_.data() + s.offset;
    float* v = v_.data() + s.offset;
#pragma omp parallel for simd schedule(static) if (s.numel > 65536)
    for (int64_t i = 0; i < s.numel; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
      p[i] = p[i] * decay - step_size * m[i] / denom;
    }
  }
}

}  // namespace attnres
