// precision.h — the arithmetic of a model's matrix products (--precision).
//
//   fp32  every product in float32 (SGEMM): the exact path, compared with the
//         float64 oracle at float32's tolerances.
//   bf16  every large product — the projections, the MLP, the LM head and
//         attention's QKᵀ and PV, forward and backward — takes bfloat16
//         inputs (float32 values rounded to nearest even) and accumulates and
//         writes float32; the weight matrices are read from a bfloat16 copy
//         of the float32 master weights (in training refreshed once per
//         optimizer step, in the AdamW pass).  Everything else stays float32:
//         norms, RoPE, SwiGLU, the softmaxes, the loss, all depth-routing
//         arithmetic, the master weights, gradients and AdamW moments.
//         docs/DESIGN.md §6.
//
// Which products run in which precision is decided in one place: the weight
// views a model hands its products (Model::W_), whose element type the
// backend's product ops read (ops/backend.h: Weight).
#pragma once

#include <string>

#include "core/error.h"

namespace attnres {

enum class Precision { kF32, kBF16 };

// --precision's help, in every command that runs a model (compare's and the
// main job's add `auto` to it: kPrecisionAutoHelp).
#define ATTNRES_PRECISION_HELP                                                                                    \
  "fp32, or bf16: the matrix products (projections, MLP, LM head, attention) take bfloat16 inputs and sum in "   \
  "float32 on the CPU's matrix units (AMX / AVX512-BF16); norms, softmaxes, routing, master weights, gradients " \
  "and AdamW moments stay float32"
inline constexpr const char kPrecisionHelp[] = ATTNRES_PRECISION_HELP;
inline constexpr const char kPrecisionAutoHelp[] =
    ATTNRES_PRECISION_HELP "; or auto: bf16 where this CPU has bfloat16 matrix instructions, else fp32";
#undef ATTNRES_PRECISION_HELP

inline const char* precision_name(Precision p) { return p == Precision::kBF16 ? "bf16" : "fp32"; }

// "fp32" or "bf16" (also spelled "f32", the --dtype spelling of inference);
// anything else is an Error naming `flag`.
inline Precision parse_precision(const std::string& s, const char* flag = "--precision") {
  if (s == "fp32" || s == "f32") return Precision::kF32;
  if (s == "bf16") return Precision::kBF16;
  fail(flag, " must be fp32 or bf16, got '", s, "'",
       s == "fp16" || s == "f16" || s == "half" ? " (float16 products are not supported: bf16 keeps float32's range)"
                                                : "");
}

}  // namespace attnres
