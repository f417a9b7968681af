// backend.cpp — the backends by name, and the Context that owns one.
#include "ops/backend.h"

#include <omp.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

namespace attnres {

std::unique_ptr<Backend> make_backend(const std::string& name, Context& ctx) {
  if (name == "cpu") return std::make_unique<CpuBackend>(ctx);
  fail("unknown backend '", name, "' (this build has: cpu)");
}

int hardware_threads() {
  const int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}

Context::Context(int threads, const std::string& backend) : threads_(threads > 0 ? threads : hardware_threads()) {
  if (threads_ > 1024) fail("--threads ", threads_, " is more than 1024");
  ops_ = make_backend(backend, *this);
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
