// dnnl_matmul.h — bfloat16 products on this CPU's matrix units (AMX-BF16 or
// AVX512-BF16) through oneDNN's matmul primitive, and float32 products through
// the same primitive (the default; `bench --gemm` measures them against
// OpenBLAS: cpu_backend.h, Fp32Gemm).
//
// This is the only place that calls oneDNN (its descriptor API changed in
// 3.x).  What it gives the CPU backend is one product of a fixed shape,
// planned once and cached, and run on the calling thread alone: the backend
// cuts every large product into tiles that depend on the shape only and runs
// one tile per call inside its own parallel region (cpu_backend.h), so the
// result does not depend on the thread count — the promise of the fp32 path,
// which does the same with single-threaded SGEMMs.  A plan is created while
// OpenMP's thread count is 1, so oneDNN never splits a tile's reduction
// across threads.
//
// Not here: rounding to bf16 (core/bf16.h, done by the backend), the tiling.
#pragma once

#include <cstdint>
#include <string>

#include "core/bf16.h"

namespace attnres::onednn {

// Why bf16 products cannot run here: this build has no oneDNN, or this CPU
// (as oneDNN sees it) has neither AMX-BF16 nor AVX512-BF16.  "" when they can.
const std::string& unsupported();
// The instruction set oneDNN's kernels use here ("avx512_core_amx", "avx512_core_bf16", "avx2", …;
// "none" without oneDNN).
std::string isa();

// C[M,N] (float32, row stride ldc) = alpha · op(A)[M,K] · op(B)[K,N], plus
// C's old value when accumulate.  A and B are bfloat16 (float32 when f32),
// row-major with row strides lda and ldb; op transposes when ta / tb (A is
// then stored [K,M], B [N,K]).
struct Shape {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  bool accumulate = false;
  bool f32 = false;
  float alpha = 1.0f;
  bool operator==(const Shape&) const = default;
};

class Plan;
// The plan of one shape: created on first use (about a millisecond), then
// found in a cache (thread-safe).  Error for bf16 where unsupported() is not
// "", and for f32 in a build without oneDNN.
const Plan& plan(const Shape& s);
// Runs the product on the calling thread (scratch is per thread); the
// operands' type must be the plan's.
void run(const Plan& p, const bf16* A, const bf16* B, float* C);
void run(const Plan& p, const float* A, const float* B, float* C);
// Whether this build has oneDNN (float32 products can run through it).
bool available();
// Plans in the cache (tests and benchmarks).
int64_t cached_plans();

// This machine's bf16 (f32: float32) product rate: one 2048³ matmul on
// `threads` threads (oneDNN's own threading), best of three, GFLOP/s.
double measure_gflops(int threads, bool f32 = false);

}  // namespace attnres::onednn
