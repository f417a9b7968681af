// perplexity.cpp — see perplexity.h.
#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/timer.h"

namespace attnres {

EvalResult evaluate(Model& model, const TokenFile& file, int64_t max_tokens) {
  const double t0 = now_seconds();
  const int64_t B = model.B(), T = model.T();
  int64_t n = static_cast<int64_t>(file.size());
  if (max_tokens > 0) n = std::min(n, max_tokens + 1);
  if (n < 2) fail(file.path(), ": ", n, " tokens; evaluation needs at least 2");
  const int64_t windows = (n - 1 + T - 1) / T;
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  std::vector<int32_t> window(static_cast<size_t>(T + 1));
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t w0 = 0; w0 < windows; w0 += B) {
    std::fill(inputs.begin(), inputs.end(), 0);
    std::fill(targets.begin(), targets.end(), -1);
    for (int64_t b = 0; b < B && w0 + b < windows; ++b) {
      const int64_t begin = (w0 + b) * T, len = std::min(T + 1, n - begin);
      file.read(static_cast<size_t>(begin), {window.data(), static_cast<size_t>(len)});
      for (int64_t t = 0; t + 1 < len; ++t) {
        inputs[b * T + t] = window[t];
        targets[b * T + t] = window[t + 1];
      }
    }
    int64_t c = 0;
    for (int32_t t : targets) c += t >= 0;
    const double mean = model.forward_backward(inputs.data(), targets.data(), /*backward=*/false);
    sum += mean * static_cast<double>(c);
    count += c;
  }
  EvalResult r;
  r.tokens = count;
  r.loss = sum / static_cast<double>(count);
  r.ppl = std::exp(r.loss);
  r.seconds = now_seconds() - t0;
  return r;
}

}  // namespace attnres
