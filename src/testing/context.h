// context.h — the Context that model-level tests run on: the CPU backend
// with two threads (the machine's cores), one per test process.
#pragma once

#include "core/context.h"
#include "ops/backend.h"

namespace attnres::testing {

inline Context& test_context() {
  static Context ctx(2);
  return ctx;
}

}  // namespace attnres::testing
