// fast_exp.h — exp(x) for float that the compiler can vectorise.
//
// glibc's vector expf is only used under -ffast-math, which we do not want for
// the whole build, so the softmax loops use this instead: Cody–Waite range
// reduction x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial for e^r (Taylor
// coefficients; relative error below 2e-7 on that interval), and 2^n built
// in the exponent bits.  Inputs below −87 give 0 (e^−87 ≈ 1.6e−38), inputs
// above 88 give e^88: the softmax callers only pass x ≤ 0.  Not a general libm
// replacement: no NaN handling beyond propagation.
#pragma once

#include <bit>
#include <cstdint>

namespace attnres {

#pragma omp declare simd
inline float fast_exp(float x) {
  const float hi = 88.0f, lo = -87.0f;  // keeps 2^n a normal float: n ∈ [−126, 127]
  const bool underflow = x < lo;
  x = x > hi ? hi : (x < lo ? lo : x);
#if defined(__clang__)  // no roundeven builtin in clang 14; rint rounds to nearest even in the default mode
  const float n = __builtin_rintf(x * 1.44269504088896341f);  // x / ln2
#else
  const float n = __builtin_roundevenf(x * 1.44269504088896341f);  // x / ln2
#endif
  float r = x - n * 0.693145751953125f;                            // ln2, high part (exact in n·hi)
  r = r - n * 1.42860682030941723212e-6f;                          // ln2, low part
  // e^r ≈ 1 + r + r²/2! + … + r⁶/6!  (Horner)
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  const float scale = std::bit_cast<float>(e << 23);
  return underflow ? 0.0f : p * scale;
}

}  // namespace attnres
