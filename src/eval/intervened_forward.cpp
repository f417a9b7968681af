// intervened_forward.cpp — see intervened_forward.h.
#include "eval/intervened_forward.h"

#include "core/error.h"

namespace attnres {

IntervenedForward::IntervenedForward(Model& model) : model_(model) {
  const std::vector<Router>& routers = model.routers();
  if (routers.empty()) fail("routing interventions need a model with depth routing (attnres_mode not baseline)");
  Backend& ops = model.context().ops();
  const int64_t N = model.plan().rows, d = model.config().d, H = model.config().routing_heads;
  const int64_t carried = 2;  // at most: the stream and delta_block's xb (Model::carried_state)
  state_ = ops.alloc(static_cast<size_t>(carried * N * d) * sizeof(float));
  int64_t entries = 0;
  for (const Router& R : routers) entries += static_cast<int64_t>(R.src.size());
  const size_t src_bytes = static_cast<size_t>(entries) * sizeof(RouteSource);
  lists_ = ops.alloc(src_bytes + static_cast<size_t>(H * entries) * sizeof(double));
  auto* src_at = lists_.as<RouteSource>();
  auto* w_at = reinterpret_cast<double*>(lists_.as<char>() + src_bytes);
  for (const Router& R : routers) {
    const int64_t S = static_cast<int64_t>(R.src.size());
    src_slot_.push_back(src_at);
    w_slot_.push_back(w_at);
    src_at += S;
    w_at += H * S;
  }
  override_.resize(routers.size());
}

int64_t IntervenedForward::prefix() const { return model_.forwards() == forward_ ? prefix_k_ : -1; }

// The carried buffers, each (rows, d) of the current forward, at stride (N, d) in state_.
void IntervenedForward::save_() {
  const std::vector<float*> carried = model_.carried_state();
  ATTNRES_CHECK(carried.size() <= 2, "the prefix keeps 2 carried buffers, the model has ", carried.size());
  const int64_t stride = model_.plan().rows * model_.config().d;
  for (size_t i = 0; i < carried.size(); ++i) model_.context().ops().copy(state_.data() + i * stride, carried[i], n_);
}

void IntervenedForward::restore_() {
  const std::vector<float*> carried = model_.carried_state();
  const int64_t stride = model_.plan().rows * model_.config().d;
  for (size_t i = 0; i < carried.size(); ++i) model_.context().ops().copy(carried[i], state_.data() + i * stride, n_);
}

void IntervenedForward::begin(const int32_t* inputs, int64_t B, int64_t T) {
  model_.begin_forward(inputs, B, T);
  forward_ = model_.forwards();
  n_ = B * T * model_.config().d;
  save_();
  prefix_k_ = 0;
}
void IntervenedForward::advance(int64_t k) {
  const int64_t at = prefix();
  if (at < 0) fail("advance: no prefix (begin first)");
  const int64_t L2 = 2 * model_.config().L;
  if (k < at || k > L2) fail("advance to sublayer ", k, " from ", at, ": it moves forward only, up to ", L2);
  if (k == at) return;
  restore_();
  model_.run_sublayers(at, k);
  save_();
  prefix_k_ = k;
}

Model::LossSum IntervenedForward::loss(const int32_t* targets, const std::vector<RouteIntervention>& iv) {
  const int64_t at = prefix();
  if (at < 0) fail("intervened loss: no prefix (begin first)");
  const std::vector<Router>& routers = model_.routers();
  const int64_t H = model_.config().routing_heads;
  Backend& ops = model_.context().ops();
  std::vector<bool> given(routers.size(), false);
  for (const RouteIntervention& v : iv) {
    if (v.router < 0 || static_cast<size_t>(v.router) >= routers.size())
      fail("intervention at router ", v.router, ": the model has routers 0 to ", routers.size() - 1);
    const Router& R = routers[v.router];
    if (given[v.router]) fail("intervention: router ", R.name, " is given twice");
    given[v.router] = true;
    if (R.k < at) fail("intervention at ", R.name, " (sublayer ", R.k, "): the prefix already ran to sublayer ", at);
    const int64_t S = static_cast<int64_t>(R.src.size());
    RouteOverride& o = override_[v.router];
    o = {};
    if (v.kind == RouteIntervention::Kind::kAblate) {
      std::vector<RouteSource> kept;
      for (size_t p = 0; p < v.keep.size(); ++p) {
        if (v.keep[p] < 0 || v.keep[p] >= S || (p > 0 && v.keep[p] <= v.keep[p - 1]))
          fail("intervention at ", R.name, ": kept sources must be ascending positions in 0..", S - 1);
        kept.push_back(R.src[v.keep[p]]);
      }
      if (kept.empty()) {  // nothing left to route: R = 0
        const std::vector<double> zeros(static_cast<size_t>(H * S), 0.0);
        ops.upload(w_slot_[v.router], zeros.data(), zeros.size() * sizeof(double));
        o.weights = w_slot_[v.router];
      } else {
        ops.upload(src_slot_[v.router], kept.data(), kept.size() * sizeof(RouteSource));
        o.src = src_slot_[v.router];
        o.S = static_cast<int64_t>(kept.size());
      }
    } else {
      if (static_cast<int64_t>(v.weights.size()) != H * S)
        fail("intervention at ", R.name, ": ", v.weights.size(), " weights for ", H, " x ", S, " (heads x sources)");
      ops.upload(w_slot_[v.router], v.weights.data(), v.weights.size() * sizeof(double));
      o.weights = w_slot_[v.router];
    }
  }
  // Every router's own routing, then the overrides given (begin_forward cleared
  // them for the prefix's forward; a previous loss may have set others).
  for (size_t r = 0; r < routers.size(); ++r)
    model_.set_route_override(static_cast<int>(r), given[r] ? &override_[r] : nullptr);
  restore_();
  model_.run_sublayers(at, 2 * model_.config().L);
  model_.finish_forward();
  for (size_t r = 0; r < routers.size(); ++r) model_.set_route_override(static_cast<int>(r), nullptr);
  return model_.loss_of_forward(targets);
}

}  // namespace attnres
