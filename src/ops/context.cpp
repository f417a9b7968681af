// context.cpp — see context.h.
#include "ops/context.h"

#include <omp.h>

#include "core/error.h"
#include "ops/backend.h"
#include "ops/timed_backend.h"

namespace attnres {

std::unique_ptr<Context> open_context(const ContextOptions& o) {
  auto ctx = std::make_unique<Context>(o.threads, o.device, "", o.time_ops);
  if (const std::string why = ctx->ops().unsupported(o.precision); !why.empty())
    fail("precision ", precision_name(o.precision), ": ", why);
  return ctx;
}

int hardware_threads() {
  const int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}

Context::Context(int threads, const std::string& backend, const std::string& cpu_level, bool time_ops)
    : threads_(threads > 0 ? threads : hardware_threads()) {
  // The commands check --threads first (cli/options.h: add_threads_option), naming it.
  if (threads < 0 || threads_ > 1024) fail("threads ", threads, ": 0 (all cores) to 1024");
  ops_ = make_backend(backend, *this, cpu_level);
  if (time_ops) ops_ = std::make_unique<TimedBackend>(*this, std::move(ops_));
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
