// bf16.h — bfloat16 storage: the upper 16 bits of an IEEE float32.
//
// Inference may hold weight matrices in bf16 (half the bytes read per decoded
// token); every product is accumulated in float32.  float → bf16 rounds to
// nearest, ties to even, as PyTorch's .to(torch.bfloat16) does; NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace attnres {

using bf16 = uint16_t;

#pragma omp declare simd
inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline bf16 float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return static_cast<bf16>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<bf16>((u + rounding) >> 16);
}

}  // namespace attnres
