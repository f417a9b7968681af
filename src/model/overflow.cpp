// overflow.cpp — see overflow.h.
#include "model/overflow.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace attnres {

void fail_overflow(Model& model, const std::string& what) {
  fail(what, ": the weights are finite but overflow float32 arithmetic; the largest is ",
       largest_weight(model));
}

std::string largest_weight(Model& model) {
  const ParamLayout& layout = model.layout();
  Backend& ops = model.context().ops();
  const bf16* p16 = model.params_bf16();
  std::string name;
  double most = -1;
  for (const TensorSpec& s : layout.specs()) {
    std::vector<float> w(static_cast<size_t>(s.numel));
    if (p16 && s.matrix) {
      std::vector<bf16> h(w.size());
      ops.download(h.data(), p16 + s.offset, h.size() * sizeof(bf16));
      for (size_t i = 0; i < h.size(); ++i) w[i] = bf16_to_float(h[i]);
    } else {
      ops.download(w.data(), model.params() + s.offset, w.size() * sizeof(float));
    }
    for (float x : w)
      if (std::fabs(x) > most) most = std::fabs(x), name = s.name;
  }
  return cat(name, " (|w| up to ", most, ")");
}

}  // namespace attnres
