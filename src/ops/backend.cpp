// backend.cpp — the backends by name.
#include "ops/backend.h"

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/guarded_backend.h"

namespace attnres {

// cpu-guarded: the CPU's kernels with memory the host cannot reach beside the
// interface (guarded_backend.h) — for checking that the callers keep to it.
std::vector<std::string> backend_names() { return {"cpu", "cpu-guarded"}; }

std::string device_help() {
  std::string devices;
  for (const std::string& n : backend_names()) devices += (devices.empty() ? "" : ", ") + n;
  return "where the model runs (this build: " + devices +
         "; cpu-guarded is the CPU with its memory locked outside the op interface: slow, for checking that the "
         "code keeps to it)";
}

void check_device(const std::string& name) {
  std::string known;
  for (const std::string& n : backend_names()) {
    if (n == name) return;
    known += (known.empty() ? "" : ", ") + n;
  }
  fail("--device ", name, ": no such device in this build (it has: ", known, ")");
}

std::unique_ptr<Backend> make_backend(const std::string& name, Context& ctx, const std::string& cpu_level) {
  check_device(name);
  std::unique_ptr<CpuBackend> cpu = make_cpu_backend(ctx, choose_cpu_level(cpu_level));
  if (name == "cpu-guarded") return std::make_unique<GuardedCpuBackend>(ctx, std::move(cpu));
  return cpu;
}

}  // namespace attnres
