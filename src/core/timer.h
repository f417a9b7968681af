// timer.h — wall-clock timing and peak resident memory, for logs and benchmarks.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdint>

namespace attnres {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Peak resident set size of this process so far, in bytes (getrusage ru_maxrss).
inline int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace attnres
