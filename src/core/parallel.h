// parallel.h — helpers for the OpenMP parallel regions of the CPU kernels.
// The thread count of a region always comes from the Context (ops/context.h).
#pragma once

#include <omp.h>

#include <cstdint>

namespace attnres {

// The [begin, end) share of `n` items for the calling thread of a parallel region.
struct Range {
  int64_t begin, end;
};
inline Range thread_range(int64_t n) {
  const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  return {n * id / nt, n * (id + 1) / nt};
}

}  // namespace attnres
