// fast_exp.h — exp(x) for float and double that the compiler vectorises at
// every level (SSE2 included).
//
// glibc's vector expf is only used under -ffast-math, which we do not want for
// the whole build, so the softmax loops and SwiGLU use these instead:
// Cody–Waite range reduction x = n·ln2 + r, |r| ≤ ln2/2 (ln2 in a high part,
// exact in n·hi, and a low part), a Taylor polynomial for e^r, and 2^n built
// in the exponent bits.  n = round(x/ln2) is taken by adding and subtracting
// 1.5·2^23 (1.5·2^52 in double), which rounds to nearest in the default mode
// and leaves n in the low bits of the sum: no roundeven or float-to-integer
// conversion, which GCC 12 does not vectorise (every loop calling the first
// version of this helper stayed scalar).  Where the multiply-add is fused
// (the AVX2 and AVX-512 levels) n can differ by one at a tie; r then lies
// just outside ±ln2/2 and the polynomial is as accurate there.
// Not a general libm replacement: no NaN handling beyond propagation.
#pragma once

#include <bit>
#include <cstdint>

namespace attnres {

// float: inputs below −87 give 0 (e^−87 ≈ 1.6e−38), inputs above 88 give
// e^88 (the softmax callers pass x ≤ 0; SwiGLU's σ passes −g).  A degree-6
// polynomial: relative error below 3e-7.
inline float fast_exp(float x) {
  const float hi = 88.0f, lo = -87.0f;  // keeps 2^n a normal float: n ∈ [−126, 127]
  const bool underflow = x < lo;
  x = x > hi ? hi : (x < lo ? lo : x);
  constexpr float kShift = 12582912.0f;  // 1.5·2^23
  const float t = x * 1.44269504088896341f + kShift;  // x / ln2, rounded, in the low bits of t
  const float n = t - kShift;
  float r = x - n * 0.693145751953125f;  // ln2, high part (exact in n·hi)
  r = r - n * 1.42860682030941723212e-6f;  // ln2, low part
  // e^r ≈ 1 + r + r²/2! + … + r⁶/6!  (Horner)
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift) + 127;  // n + bias
  const float scale = std::bit_cast<float>(e << 23);
  return underflow ? 0.0f : p * scale;
}

// double, for x ≤ 0: the softmax of the routers (routing.cpp), whose weights
// are computed in double.  A degree-13 polynomial: its truncation error is
// below 5e-18 on the interval, so the result is within a few ulp of libm's
// (which is a call per element: with 8 routing heads its calls took a third
// of a router's time).  Inputs below −708 give 0 (e^−708 ≈ 3e−308, the
// smallest normal range); x must not be NaN or above 0.
inline double exp_nonpositive(double x) {
  const bool underflow = x < -708.0;
  x = x < -708.0 ? -708.0 : x;
  constexpr double kShift = 6755399441055744.0;  // 1.5·2^52
  const double t = x * 1.4426950408889634074 + kShift;
  const double n = t - kShift;
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
  const int64_t e = std::bit_cast<int64_t>(t) - std::bit_cast<int64_t>(kShift) + 1023;  // n + bias
  const double scale = std::bit_cast<double>(e << 52);
  return underflow ? 0.0 : p * scale;
}

}  // namespace attnres
