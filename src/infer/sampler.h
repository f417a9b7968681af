// sampler.h — the next token from a row of logits: greedy, or sampled with
// temperature, top-k and top-p (nucleus), as Hugging Face's generate applies
// them: logits / temperature, then keep the k largest, then the smallest set
// of the most probable tokens whose probability reaches top_p (at least one),
// then draw from the renormalised softmax.
//
// Greedy (temperature 0) is the argmax, the lowest id on ties (torch.argmax).
// A temperature below kGreedyBelow is greedy too: it is the limit of sampling
// as the temperature goes to 0, and logits / 1e-310 would be infinities.
// Not a beam search.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/rng.h"

namespace attnres {

inline constexpr double kGreedyBelow = 1e-6;

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  double top_p = 1.0;        // in (0, 1]; 1: all tokens
  // Throws Error naming the flag for a temperature < 0, top_k < 0 or top_p outside (0, 1].
  void validate() const;
};

// A model's sampling defaults (its generation_config.json's) with the values
// given laid over them (an unset one keeps the default), checked (validate).
SamplingOptions sampling_over(SamplingOptions defaults, std::optional<double> temperature,
                              std::optional<int64_t> top_k, std::optional<double> top_p);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : opt_(o) {}
  int32_t next(std::span<const float> logits, Rng& rng);

 private:
  SamplingOptions opt_;
  std::vector<int32_t> order_;  // candidate ids, by probability
  std::vector<double> prob_;    // (V) scratch
};

int32_t argmax(std::span<const float> logits);

}  // namespace attnres
