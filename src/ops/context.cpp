// context.cpp — see context.h.
#include "ops/context.h"

#include <omp.h>

#include "core/error.h"
#include "ops/backend.h"
#include "ops/timed_backend.h"

namespace attnres {

std::unique_ptr<Context> open_context(const ContextOptions& o) {
  auto ctx = std::make_unique<Context>(o.threads, o.device, "", o.time_ops);
  ctx->ops().check_supported(o.precision);
  return ctx;
}

int hardware_threads() {
  const int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}

void check_threads(int64_t n, const std::string& what) {
  if (n < 0 || n > 1024) fail(what, " must be 0 (all cores) or at most 1024, got ", n);
}

Context::Context(int threads, const std::string& backend, const std::string& cpu_level, bool time_ops)
    : Context(threads, [&](Context& ctx) {
        std::unique_ptr<Backend> ops = make_backend(backend, ctx, cpu_level);
        if (time_ops) ops = std::make_unique<TimedBackend>(ctx, std::move(ops));
        return ops;
      }) {}

Context::Context(int threads, const std::function<std::unique_ptr<Backend>(Context&)>& make_ops)
    : threads_(threads > 0 ? threads : hardware_threads()) {
  // The count asked for, or the cores 0 stands for (the commands check
  // --threads first, naming the flag); then the backend.
  check_threads(threads < 0 ? threads : threads_, "threads");
  ops_ = make_ops(*this);
  ATTNRES_CHECK(ops_ != nullptr, "Context: the backend factory made no backend");
}

Context::~Context() = default;

void Context::reserve(int64_t floats) {
  if (floats > reserved()) workspace_ = ops_->alloc(static_cast<size_t>(floats) * sizeof(float));
}

float* Context::workspace(int64_t floats) {
  ATTNRES_CHECK(floats <= reserved(), "an op needs ", floats, " floats of workspace, ", reserved(),
                " were reserved (Context::reserve when the model is built)");
  return workspace_.data();
}

}  // namespace attnres
