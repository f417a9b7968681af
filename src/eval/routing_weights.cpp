// routing_weights.cpp — see routing_weights.h.
#include "eval/routing_weights.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace attnres {

std::vector<TokenRouting> routing_weights(Model& model, const int32_t* inputs, int64_t B, int64_t T) {
  const std::vector<Router>& routers = model.routers();
  const int64_t N = B * T, H = model.config().routing_heads;
  std::vector<TokenRouting> out(routers.size());
  for (size_t r = 0; r < routers.size(); ++r) {
    out[r].name = routers[r].name;
    out[r].sources = routers[r].source_names;
    out[r].heads = H;
  }
  // Each router's logits z (N, H, S) live until the next router runs: taken as it routes.
  std::vector<float> z;
  model.set_route_tap([&](int r, const float* logits) {
    const int64_t S = static_cast<int64_t>(out[static_cast<size_t>(r)].sources.size());
    z.resize(static_cast<size_t>(N * H * S));
    model.ops().download(z.data(), logits, z.size() * sizeof(float));
    std::vector<float>& w = out[static_cast<size_t>(r)].weights;
    w.resize(z.size());
    // α = softmax(z) over the S sources of each (row, head).
    for (int64_t i = 0; i < N * H; ++i) {
      const float* zi = z.data() + i * S;
      float* wi = w.data() + i * S;
      const double zmax = *std::max_element(zi, zi + S);
      double sum = 0;
      for (int64_t s = 0; s < S; ++s) sum += std::exp(static_cast<double>(zi[s]) - zmax);
      for (int64_t s = 0; s < S; ++s) wi[s] = static_cast<float>(std::exp(static_cast<double>(zi[s]) - zmax) / sum);
    }
  });
  try {
    model.forward(inputs, B, T);
  } catch (...) {
    model.set_route_tap(nullptr);
    throw;
  }
  model.set_route_tap(nullptr);
  for (const TokenRouting& t : out)
    ATTNRES_CHECK(!t.weights.empty(), "router ", t.name, " did not route in the forward");
  return out;
}

}  // namespace attnres
