// timed_backend.cpp — see timed_backend.h.
#include "ops/timed_backend.h"


#include "core/error.h"
#include "core/timer.h"

namespace attnres {

const char* op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::kProducts: return "products";
    case OpFamily::kAttention: return "attention";
    case OpFamily::kRouting: return "routing";
    case OpFamily::kNorms: return "norms_elementwise";
    case OpFamily::kLmHead: return "lm_head_loss";
    case OpFamily::kOptimizer: return "optimizer";
    case OpFamily::kCommunication: return "communication";
    case OpFamily::kCount: break;
  }
  return "?";
}

std::string profile_help() {
  std::string names;
  for (int f = 0; f < kOpFamilies; ++f) names += cat(f ? ", " : "", op_family_name(static_cast<OpFamily>(f)));
  return cat("say where the steps' time goes: milliseconds per step in each family of ops (", names,
             "), timed by the op interface (ops/timed_backend.h), and outside them");
}

double OpTimes::total() const {
  double s = 0;
  for (double x : seconds) s += x;
  return s;
}

TimedBackend::TimedBackend(Context& ctx, std::unique_ptr<Backend> inner)
    : WrappingBackend(ctx, *inner), inner_(std::move(inner)) {}

// Each op: the inner backend's, timed up to its synchronize() (a device
// backend's ops return before they finish; the CPU's synchronize is free).
#define ATTNRES_TIMED(fam, ret, name, params, args)               \
  ret TimedBackend::name##_impl params {                            \
    constexpr OpFamily family = op_family(Op::k_##name);     \
    struct Stop {                                            \
      TimedBackend* self;                                    \
      double t0;                                             \
      ~Stop() {                                              \
        self->inner_->synchronize();                         \
        self->times_.add(Op::k_##name, family, now_seconds() - t0); \
      }                                                      \
    } stop{this, now_seconds()};                             \
    return name##_of(*inner_, ATTNRES_UNPAREN args);         \
  }
ATTNRES_BACKEND_OPS(ATTNRES_TIMED)
#undef ATTNRES_TIMED

OpTimes* op_times(Context& ctx) {
  auto* timed = dynamic_cast<TimedBackend*>(&ctx.ops());
  return timed ? &timed->times() : nullptr;
}

}  // namespace attnres
