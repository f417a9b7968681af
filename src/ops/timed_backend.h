// timed_backend.h — where a step's time goes, measured by the op interface
// itself: a Backend that runs another (any device) and adds each op's wall
// time, up to its synchronize(), to the op's family.  `bench --profile` and
// `train --profile` build their Context with it (ContextOptions::time_ops),
// so a regression or a gap names itself without `perf`.
//
// The families (OpFamily, backend.h; each op's row of ops/op_list.h names
// its own) follow what a step is made of:
//   products    matmul_forward/backward and the bf16 weight copies (to_bf16)
//   attention   attention_forward/backward with their tile products, RoPE, the KV-cache store
//   routing     source_rstd and the route_* ops
//   norms       RMSNorm, SwiGLU, embedding, and the elementwise ops (copy, fill, add, sub, scale)
//   lm_head     the LM head's products fused with the softmax cross-entropy (lm_head_loss)
//   optimizer   adamw_update and the gradient norm (sum_squares)
//   communication  the trainer's reduce-scatters and all-gathers between ranks (timed by the trainer)
// What a step spends outside all of these (host code between the ops, data)
// is its wall time minus their sum: the caller's to report.
//
// The timing adds two clock reads per op (some 40 ns against ops of
// microseconds to milliseconds); memory, transfers and host views pass through
// untimed.
#pragma once

#include <array>
#include <memory>

#include "ops/backend.h"
#include "ops/wrapping_backend.h"
#include "ops/op_list.h"

namespace attnres {

// OpFamily and op_family(Op): backend.h, from the op list.
// "products", "attention", … (JSON keys of bench --profile).
const char* op_family_name(OpFamily f);
// --profile's help in every command that has it (train, bench): the
// families by name, from the list above, so that it cannot go stale.
std::string profile_help();

// Seconds per family, and per op, since the last reset().
struct OpTimes {
  std::array<double, kOpFamilies> seconds{};
  std::array<double, kOps> op_seconds{};
  std::array<int64_t, kOps> op_calls{};
  void add(OpFamily f, double s) { seconds[static_cast<size_t>(f)] += s; }
  void add(Op op, OpFamily f, double s) {
    add(f, s);
    op_seconds[static_cast<size_t>(op)] += s;
    ++op_calls[static_cast<size_t>(op)];
  }
  double total() const;
  void reset() { *this = OpTimes{}; }
};

class TimedBackend final : public WrappingBackend {
 public:
  TimedBackend(Context& ctx, std::unique_ptr<Backend> inner);
  Backend& inner() const { return *inner_; }
  OpTimes& times() { return times_; }

 protected:
#define ATTNRES_DECLARE(fam, ret, name, params, args) ret name##_impl params override;
  ATTNRES_BACKEND_OPS(ATTNRES_DECLARE)
#undef ATTNRES_DECLARE

 private:
  std::unique_ptr<Backend> inner_;
  OpTimes times_;
};

// The op timings of a Context built with time_ops, else null.
OpTimes* op_times(Context& ctx);

}  // namespace attnres
