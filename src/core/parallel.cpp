// parallel.cpp — see parallel.h.
#include "core/parallel.h"

#include <cblas.h>

#include <thread>

namespace attnres {

int set_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return n;
}

}  // namespace attnres
