// sampler.cpp — see sampler.h.
#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace attnres {

void SamplingOptions::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    fail("the sampling temperature must be >= 0 (0 = greedy), got ", temperature);
  if (top_k < 0) fail("top-k sampling's k must be >= 0 (0 = no limit), got ", top_k);
  if (!(top_p > 0 && top_p <= 1)) fail("top-p sampling's p must be in (0, 1], got ", top_p);
}

SamplingOptions sampling_over(SamplingOptions s, std::optional<double> temperature, std::optional<int64_t> top_k,
                              std::optional<double> top_p) {
  if (temperature) s.temperature = *temperature;
  if (top_k) s.top_k = *top_k;
  if (top_p) s.top_p = *top_p;
  s.validate();
  return s;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

int32_t Sampler::next(std::span<const float> logits, Rng& rng) {
  if (opt_.temperature < kGreedyBelow) return argmax(logits);  // 0, and the limit of a tiny temperature
  const int64_t V = static_cast<int64_t>(logits.size());
  // Candidates by logit, largest first (ties: lower id first), cut to top_k.
  order_.resize(static_cast<size_t>(V));
  std::iota(order_.begin(), order_.end(), 0);
  const int64_t k = opt_.top_k > 0 ? std::min(opt_.top_k, V) : V;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (k < V) {
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_logit);
    order_.resize(static_cast<size_t>(k));
  } else if (opt_.top_p < 1.0) {
    std::sort(order_.begin(), order_.end(), by_logit);
  }
  // Softmax of logits / temperature over the candidates, in double.
  prob_.resize(order_.size());
  const double inv_t = 1.0 / opt_.temperature;
  double mx = -INFINITY;
  for (int32_t id : order_) mx = std::max(mx, logits[id] * inv_t);
  double sum = 0.0;
  for (size_t i = 0; i < order_.size(); ++i) sum += prob_[i] = std::exp(logits[order_[i]] * inv_t - mx);
  // Nucleus: the most probable candidates up to cumulative top_p (order_ is sorted then).
  size_t keep = order_.size();
  if (opt_.top_p < 1.0) {
    double cum = 0.0;
    for (size_t i = 0; i < order_.size(); ++i) {
      cum += prob_[i] / sum;
      if (cum >= opt_.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = 0.0;
    for (size_t i = 0; i < keep; ++i) sum += prob_[i];
  }
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < keep; ++i) {
    u -= prob_[i];
    if (u < 0) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace attnres
