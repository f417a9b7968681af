// context.h — where and how the ops of a model run: the backend (CPU today),
// its thread count, and the workspace its kernels take scratch from.  It sits
// with the ops because it makes its backend (make_backend, ops/backend.h);
// defined in ops/context.cpp.
//
// Every kernel runs with exactly threads() threads (an explicit num_threads on
// each parallel region) and sizes per-thread scratch from the same number, so
// no kernel reads the process-wide OpenMP state: a model built under one
// omp_set_num_threads() runs safely under any other.  One Context runs one op
// at a time (the workspace is shared by them); use one per concurrent model.
// It is not a thread pool: OpenMP's is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/buffer.h"
#include "core/precision.h"

namespace attnres {

class Backend;

class Context {
 public:
  // threads: 0 = every core of this machine.  backend: "cpu" or "cpu-guarded".
  // cpu_level: the CPU kernels' instruction-set level, "" for $ATTNRES_CPU_LEVEL
  // or else the best this CPU has (ops/cpu/cpu_level.h).  time_ops: run the
  // backend under a TimedBackend (ops/timed_backend.h), which adds each op's
  // time to its family (bench --profile, train --profile).
  explicit Context(int threads = 0, const std::string& backend = "cpu", const std::string& cpu_level = "",
                   bool time_ops = false);
  // A backend of one's own (a backend being written; the tests' toy one),
  // made by make_ops for this Context — e.g. a PartialBackend over it.
  Context(int threads, const std::function<std::unique_ptr<Backend>(Context&)>& make_ops);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int threads() const { return threads_; }
  Backend& ops() const { return *ops_; }

  // The workspace: scratch shared by the ops, grown by reserve() when a model
  // is built (never in a step) and handed out by workspace(), which checks
  // that the request was reserved.  Contents do not survive from op to op.
  void reserve(int64_t floats);
  float* workspace(int64_t floats);
  int64_t reserved() const { return static_cast<int64_t>(workspace_.floats()); }

 private:
  int threads_;
  std::unique_ptr<Backend> ops_;
  Buffer workspace_;
};

// Threads of this machine (the OpenMP processor count).
int hardware_threads();
// The thread counts a Context (and every command's --threads) takes: 0, every
// core, or 1 to 1024.  Otherwise an Error "<what> must be 0 (all cores) or at
// most 1024, got <n>".
void check_threads(int64_t n, const std::string& what);

// Where and how a command's model runs: the shared options of every command
// that runs one (--threads, --device, --precision).
struct ContextOptions {
  int threads = 0;             // 0 = every core of this machine
  std::string device = "cpu";  // a name of backend_names() (ops/backend.h)
  Precision precision = Precision::kF32;
  bool time_ops = false;       // each op's time added to its family (ops/timed_backend.h)
};
// The one place a command's Context is built from them: an unknown device is
// an Error listing the known ones, and a precision the device cannot run here
// is an Error saying why (both naming the flags).
std::unique_ptr<Context> open_context(const ContextOptions& o);

}  // namespace attnres
