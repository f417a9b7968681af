// side_sums.h — dot products in double, several side by side.  Included by a
// kernel file after isa_begin.h, so each level's copy gets its own.
#pragma once
#include <cstdint>

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

// s[l] += Σ_i a[l·stride + i]·b[l·stride + i] for l < lanes ≤ kSideSums,
// i < len, each sum in element order (b = a: sums of squares).  One sum
// alone is a chain of dependent adds, bound by the add's latency; side by
// side they are independent chains.  The product of two floats is exact in
// double, so every s[l] is the sum it would be alone, to the bit.
constexpr int64_t kSideSums = 8;
inline void side_dots(double* s, const float* a, const float* b, int64_t stride, int64_t lanes, int64_t len) {
  if (lanes == kSideSums) {
    for (int64_t i = 0; i < len; ++i)
#pragma omp simd
      for (int64_t l = 0; l < kSideSums; ++l) s[l] += static_cast<double>(a[l * stride + i]) * b[l * stride + i];
  } else {
    for (int64_t i = 0; i < len; ++i)
      for (int64_t l = 0; l < lanes; ++l) s[l] += static_cast<double>(a[l * stride + i]) * b[l * stride + i];
  }
}

}  // namespace attnres::ATTNRES_ISA
