// perplexity.cpp — see perplexity.h.
#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/progress.h"
#include "core/timer.h"

namespace attnres {

EvalResult evaluate_windows(Model& model, int64_t windows, const WindowReader& read, const EvalOptions& o) {
  const double t0 = now_seconds();
  const int64_t B = o.batch > 0 ? o.batch : model.B(), T = o.seq_len > 0 ? o.seq_len : model.T();
  ATTNRES_CHECK(B <= model.B() && T <= model.T(), "evaluation windows larger than the model was built for");
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  std::vector<int32_t> window(static_cast<size_t>(T + 1));
  Progress progress(o.progress ? stderr : nullptr, "eval", static_cast<uint64_t>(windows));
  double sum = 0.0;
  int64_t count = 0;
  const int64_t batches = (windows + B - 1) / B;
  // With lockstep, every part takes as many turns as the part with the most.
  const int64_t turns = o.lockstep ? (batches + o.parts - 1) / o.parts * o.parts : batches;
  for (int64_t k = 0; k < turns; ++k) {
    if (k % o.parts != o.part) continue;
    const int64_t w0 = k * B;
    const int64_t nb = w0 < windows ? std::min(B, windows - w0) : 1;  // past the end: one empty window
    std::fill(inputs.begin(), inputs.end(), 0);
    std::fill(targets.begin(), targets.end(), -1);
    for (int64_t b = 0; b < nb && w0 < windows; ++b) {
      const int64_t len = read(w0 + b, window);
      for (int64_t t = 0; t + 1 < len; ++t) {
        inputs[b * T + t] = window[t];
        targets[b * T + t] = window[t + 1];
      }
    }
    const Model::LossSum r = model.loss_sum(inputs.data(), targets.data(), nb, T);
    sum += r.sum;
    count += r.count;
    const uint64_t done = static_cast<uint64_t>(std::min(w0 + nb, windows));
    progress.update(done, progress.rate(done, "windows"));
  }
  progress.finish(progress.rate(static_cast<uint64_t>(windows), "windows"));
  EvalResult r;
  r.tokens = count;
  r.windows = windows;
  r.sum = sum;
  r.loss = count ? sum / static_cast<double>(count) : 0.0;
  r.ppl = std::exp(r.loss);
  r.seconds = now_seconds() - t0;
  return r;
}

int64_t evaluation_windows(int64_t file_tokens, int64_t max_tokens, int64_t T) {
  const int64_t n = max_tokens > 0 ? std::min(file_tokens, max_tokens + 1) : file_tokens;
  return n < 2 ? 0 : (n - 1 + T - 1) / T;
}

EvalResult evaluate(Model& model, const TokenFile& file, const EvalOptions& o) {
  const int64_t T = o.seq_len > 0 ? o.seq_len : model.T();
  int64_t n = static_cast<int64_t>(file.size());
  if (o.max_tokens > 0) n = std::min(n, o.max_tokens + 1);
  if (n < 2) fail(file.path(), ": ", n, " tokens; evaluation needs at least 2");
  // Window w: tokens [w T, w T + T + 1) of the first n (the last may be shorter).
  return evaluate_windows(model, evaluation_windows(static_cast<int64_t>(file.size()), o.max_tokens, T),
                          [&](int64_t w, std::span<int32_t> out) {
    const int64_t begin = w * T, len = std::min(T + 1, n - begin);
    file.read(static_cast<size_t>(begin), out.first(static_cast<size_t>(len)));
    return len;
  }, o);
}


}  // namespace attnres
