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

// exp(x) for double x ≤ 0 that the compiler can vectorise: the softmax of the
// routers (routing.cpp), whose weights are computed in double.  The same
// reduction in double (x = n·ln2 + r, |r| ≤ ln2/2, ln2 in two parts) and a
// degree-13 Taylor polynomial for e^r: its truncation error is below 5e-18
// on that interval, so the result is within a few ulp of libm's (which is
// not vectorised: with 8 routing heads its calls took a third of a router's
// time).  Inputs below −708 give 0 (e^−708 ≈ 3e−308, the smallest normal
// range); x must not be NaN or above 0.
#pragma omp declare simd
inline double exp_nonpositive(double x) {
  const bool underflow = x < -708.0;
  x = x < -708.0 ? -708.0 : x;
#if defined(__clang__)
  const double n = __builtin_rint(x * 1.4426950408889634074);  // x / ln2, to nearest even
#else
  const double n = __builtin_roundeven(x * 1.4426950408889634074);
#endif
  double r = x - n * 6.93147180369123816490e-01;  // ln2, high part (n·hi exact for |n| < 2^11)
  r = r - n * 1.90821492927058770002e-10;          // ln2, low part
  double p = 1.0 / 6227020800.0;                    // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int64_t e = static_cast<int64_t>(n) + 1023;
  const double scale = std::bit_cast<double>(e << 52);
  return underflow ? 0.0 : p * scale;
}

}  // namespace attnres
