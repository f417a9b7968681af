// parallel.h — the threading context of attnres: one OpenMP pool shared by our
// kernels and by OpenBLAS (its OpenMP build), set once per process.
#pragma once

#include <omp.h>

#include <cstdint>

namespace attnres {

// Sets the OpenMP and OpenBLAS thread counts (0 = all cores).  Returns the count.
int set_threads(int n);
inline int num_threads() { return omp_get_max_threads(); }

// The [begin, end) share of `n` items for the calling thread of a parallel region.
struct Range {
  int64_t begin, end;
};
inline Range thread_range(int64_t n) {
  const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
  return {n * id / nt, n * (id + 1) / nt};
}

}  // namespace attnres
