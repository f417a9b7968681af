// routing_stats.cpp — see routing_stats.h.
#include "eval/routing_stats.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/progress.h"

namespace attnres {

RoutingStats measure_routing(Model& model, const TokenFile& data, int64_t T, int64_t B, int64_t max_tokens,
                             Progress* progress) {
  int64_t n = static_cast<int64_t>(data.size());
  if (max_tokens > 0) n = std::min(n, max_tokens);
  const int64_t windows = n / T;
  if (windows == 0) fail(data.path(), ": ", n, " tokens, fewer than one window of ", T);
  model.collect_routing_stats(true);
  std::vector<int32_t> inputs(static_cast<size_t>(B * T));
  for (int64_t w0 = 0; w0 < windows; w0 += B) {
    const int64_t nb = std::min(B, windows - w0);
    data.read(static_cast<size_t>(w0 * T), {inputs.data(), static_cast<size_t>(nb * T)});
    model.forward(inputs.data(), nb, T);
    if (progress)
      progress->update(static_cast<uint64_t>(w0 + nb), progress->rate(static_cast<uint64_t>(w0 + nb), "windows"));
  }
  if (progress) progress->finish(progress->rate(static_cast<uint64_t>(windows), "windows"));
  RoutingStats stats = model.routing_stats();
  model.collect_routing_stats(false);
  return stats;
}

}  // namespace attnres
