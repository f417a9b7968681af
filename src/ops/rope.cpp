// rope.cpp — rotary position embedding, HF rotate_half convention.
#include <cmath>

#include "ops/ops.h"

namespace attnres {

void rope_tables(float* cos_t, float* sin_t, int64_t T, int64_t hd, double theta) {
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < half; ++j) {
      // inv_freq[j] = theta^(-2j/hd); computed in double, rounded once.
      const double angle = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(j) / hd);
      cos_t[t * half + j] = static_cast<float>(std::cos(angle));
      sin_t[t * half + j] = static_cast<float>(std::sin(angle));
    }
}

// sign = +1: forward rotation by the angle; −1: its transpose (the backward).
static void rotate(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                   int64_t hd, float sign) {
  const int64_t half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (bt * heads + h) * hd;
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half], sj = sign * s[j];
        v[j] = a * c[j] - b * sj;
        v[j + half] = b * c[j] + a * sj;
      }
    }
  }
}

void rope_forward(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                  int64_t hd) {
  rotate(x, cos_t, sin_t, B, T, heads, hd, 1.0f);
}

void rope_backward(float* dx, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                   int64_t hd) {
  rotate(dx, cos_t, sin_t, B, T, heads, hd, -1.0f);
}

}  // namespace attnres
