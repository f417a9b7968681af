// bf16.h — bfloat16 storage: the upper 16 bits of an IEEE float32.
//
// The operands of bf16 products (core/precision.h): weight copies and rounded
// activations; every product is accumulated in float32.  float → bf16 rounds to
// nearest, ties to even, as PyTorch's .to(torch.bfloat16) does; NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace attnres {

using bf16 = uint16_t;

#pragma omp declare simd
inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Branch-free, so that loops over it vectorise.  (Not the AVX512-BF16
// instruction VCVTNEPS2BF16: it flushes subnormal inputs to zero.)
#pragma omp declare simd
inline bf16 float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<bf16>(nan ? (u >> 16) | 0x40u : rounded);  // a NaN stays a (quiet) NaN
}

// f rounded to bf16 and back: the value a bf16 product reads for f.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace attnres
