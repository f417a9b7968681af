// partial_backend.h — a backend that runs some ops itself and the rest on the
// CPU: the way a new backend runs a whole model from its first op (ggml's
// supports_op and its scheduler's fallback are the model).
//
// PartialBackend holds the backend being built (the primary: its memory, its
// name, its ops where primary.supports(op, precision) says yes) and a CPU
// backend for every other op.  An op given to the CPU — the seam — first
// waits for the primary (synchronize), then runs the CPU's kernel on the
// primary's memory in place, with host_access open around it.  That needs
// memory the host can address (host_addressable(): the guarded CPU, a toy
// backend in the tests, unified or managed device memory); a backend with
// memory of its own is refused at construction, since moving an op's
// operands across needs their sizes, which the op list does not give yet.
//
// Every seam crossing is counted per op (seam()), and the commands that print
// where a step's time goes (`--profile`) say how many ops ran on the CPU.
// The CPU's results are its bits, so a model on a partial backend whose own
// ops compute the CPU's bits gives the CPU's results to the bit (the tests'
// toy backend; `--device cpu-guarded:unsupported=OP,...` on every machine).
#pragma once

#include <array>
#include <memory>

#include "ops/backend.h"
#include "ops/wrapping_backend.h"

namespace attnres {

class PartialBackend final : public WrappingBackend {
 public:
  // primary: its ops where it supports them; cpu: every other op.  Its names,
  // peaks and memory are the primary's (WrappingBackend).
  PartialBackend(Context& ctx, std::unique_ptr<Backend> primary, std::unique_ptr<Backend> cpu);
  // A precision is runnable where the ops the primary leaves to the CPU can run it there.
  std::string unsupported(Precision p) const override;
  bool supports(Op, Precision) const override { return true; }  // every op runs, one side or the other
  bool host_addressable() const override { return true; }

  // Scratch: enough for whichever side runs the op.
  int64_t matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const override;
  int64_t attention_workspace(int64_t max_keys, int64_t hd, Precision p) const override;
  int64_t lm_head_workspace(int64_t C, int64_t V, Precision p) const override;
  int64_t route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const override;

  Backend& primary() const { return *primary_; }
  // Calls of each op that crossed the seam (ran on the CPU) since construction.
  const std::array<int64_t, kOps>& seam() const { return seam_; }
  int64_t seam_total() const;
  // "N calls of M ops ran on the CPU beside <name>: op a, op b, …" (most first), for --profile.
  std::string seam_summary() const;

 protected:
#define ATTNRES_DECLARE(fam, ret, name, params, args) ret name##_impl params override;
  ATTNRES_BACKEND_OPS(ATTNRES_DECLARE)
#undef ATTNRES_DECLARE

 private:
  std::unique_ptr<Backend> primary_, cpu_;
  std::array<int64_t, kOps> seam_{};
};

// The partial backend of a Context, else null (the calls that crossed its seam).
const PartialBackend* partial_backend(const Context& ctx);

}  // namespace attnres
