// timed_backend.cpp — see timed_backend.h.
#include "ops/timed_backend.h"

#include <cstring>

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

OpFamily op_family(const char* op) {
  struct Entry {
    const char* op;
    OpFamily family;
  };
  static const Entry table[] = {
      {"to_bf16", OpFamily::kProducts},          {"matmul_forward", OpFamily::kProducts},
      {"matmul_backward", OpFamily::kProducts},  {"attention_forward", OpFamily::kAttention},
      {"attention_backward", OpFamily::kAttention}, {"rope_tables", OpFamily::kAttention},
      {"rope_forward", OpFamily::kAttention},    {"rope_backward", OpFamily::kAttention},
      {"kv_cache_store", OpFamily::kAttention},  {"source_rstd", OpFamily::kRouting},
      {"route_forward", OpFamily::kRouting},     {"route_mix", OpFamily::kRouting},
      {"route_mix_stream", OpFamily::kRouting},  {"route_backward", OpFamily::kRouting},
      {"route_mix_weights", OpFamily::kRouting},
      {"copy", OpFamily::kNorms},                {"fill", OpFamily::kNorms},
      {"rmsnorm_forward", OpFamily::kNorms},     {"rmsnorm_backward", OpFamily::kNorms},
      {"swiglu_forward", OpFamily::kNorms},      {"swiglu_backward", OpFamily::kNorms},
      {"embedding_forward", OpFamily::kNorms},   {"embedding_backward", OpFamily::kNorms},
      {"add_inplace", OpFamily::kNorms},         {"add", OpFamily::kNorms},
      {"sub", OpFamily::kNorms},                 {"scale", OpFamily::kNorms},
      {"lm_head_loss", OpFamily::kLmHead},       {"adamw_update", OpFamily::kOptimizer},
      {"sum_squares", OpFamily::kOptimizer},
  };
  for (const Entry& e : table)
    if (std::strcmp(e.op, op) == 0) return e.family;
  ATTNRES_CHECK(false, "the op ", op, " has no family (add it to op_family's table)");
  return OpFamily::kCount;
}

double OpTimes::total() const {
  double s = 0;
  for (double x : seconds) s += x;
  return s;
}

TimedBackend::TimedBackend(Context& ctx, std::unique_ptr<Backend> inner) : Backend(ctx), inner_(std::move(inner)) {
  // Every op of the list has a family: checked once here, not at its first call.
#define ATTNRES_CHECK_FAMILY(ret, name, params, args) op_family(#name);
  ATTNRES_BACKEND_OPS(ATTNRES_CHECK_FAMILY)
#undef ATTNRES_CHECK_FAMILY
}

// Each op: the inner backend's, timed up to its synchronize() (a device
// backend's ops return before they finish; the CPU's synchronize is free).
#define ATTNRES_TIMED(ret, name, params, args)               \
  ret TimedBackend::name params {                            \
    static const OpFamily family = op_family(#name);         \
    struct Stop {                                            \
      TimedBackend* self;                                    \
      double t0;                                             \
      ~Stop() {                                              \
        self->inner_->synchronize();                         \
        self->times_.add(Op::k_##name, family, now_seconds() - t0); \
      }                                                      \
    } stop{this, now_seconds()};                             \
    return inner_->name args;                                \
  }
ATTNRES_BACKEND_OPS(ATTNRES_TIMED)
#undef ATTNRES_TIMED

OpTimes* op_times(Context& ctx) {
  auto* timed = dynamic_cast<TimedBackend*>(&ctx.ops());
  return timed ? &timed->times() : nullptr;
}

}  // namespace attnres
