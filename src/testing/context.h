// context.h — the Contexts that model-level tests run on: test_context(),
// the CPU backend with two threads (the machine's cores), and context_for(p),
// one Context per backend configuration of check.h's backend_params() for the
// tests parameterised by backend (the oracle comparisons).  One each per test
// process, built on first use.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ops/context.h"
#include "ops/backend.h"

namespace attnres::testing {

inline Context& test_context() {
  static Context ctx(2);
  return ctx;
}

// The Context of a backend configuration (name, backend, threads, CPU level), built once.
inline Context& context_for(const std::string& name, const std::string& backend, int threads,
                            const std::string& level = "") {
  static std::map<std::string, std::unique_ptr<Context>> contexts;
  auto& c = contexts[name];
  if (!c) c = std::make_unique<Context>(threads, backend, level);
  return *c;
}

}  // namespace attnres::testing
