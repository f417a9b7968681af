// cpu_backend.h — the CPU backend: the ops of ops/backend.h (where their math
// is written down) as OpenMP kernels, with every fp32 matmul through CBLAS
// (OpenBLAS, its OpenMP build) and every bf16 one through oneDNN's matmul on
// the CPU's matrix units (AMX-BF16 or AVX512-BF16; dnnl_matmul.h).  One file
// per op family in this directory.
//
// Threading: every parallel region runs exactly ctx.threads() threads
// (num_threads clause) and per-thread scratch is sized from the same count.
// BLAS and oneDNN calls run single-threaded inside our parallel regions
// (OpenBLAS does so inside an OpenMP region; oneDNN plans are made for one
// thread), so the one OpenMP pool is never oversubscribed: large products go
// through gemm() and gemm_bf16(), which cut the output into fixed tiles.
// Determinism: no result depends on the thread count — every sum over threads'
// work is taken over fixed chunks in a fixed order (tests: Trainer.
// ThreadCountDoesNotChangeTheArithmetic), so a resume with another --threads or
// on a machine with another core count continues bit-identically.
#pragma once

#include "ops/backend.h"
#include "ops/cpu/op_list.h"

namespace attnres {

// Elements of work below which an elementwise or row kernel runs on the
// calling thread alone: waking the team costs microseconds, more than such a
// kernel (decoding one token of a small model runs hundreds of them).
inline constexpr int64_t kParallelMin = int64_t{1} << 15;

// Floats of workspace that hold n bf16 values, rounded up to a cache line.
inline constexpr int64_t bf16_floats(int64_t n) { return (n + 31) / 32 * 16; }

// dst (cols, rows) = bf16 of src (rows, cols) transposed (matmul.cpp).
void to_bf16_transposed(bf16* dst, const float* src, int64_t rows, int64_t cols, int threads);

class CpuBackend : public Backend {  // GuardedCpuBackend (guarded_backend.h) locks its memory
 public:
  explicit CpuBackend(Context& ctx) : Backend(ctx) {}
  const char* name() const override { return "cpu"; }
  std::string unsupported(Precision p) const override;

  Buffer alloc(size_t bytes, bool lazy) override { return Buffer::host_bytes(bytes, lazy); }
  void synchronize() override {}
  void* map(void* p, size_t) override { return p; }
  void unmap(void*, size_t) override {}
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;

  int64_t matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const override;
  int64_t attention_workspace(int64_t max_keys) const override;
  int64_t lm_head_workspace(int64_t C, int64_t V, Precision p) const override;
  int64_t route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const override;

  // Every op of backend.h (op_list.h), one file per family in this directory.
#define ATTNRES_DECLARE(ret, name, params, args) ret name params override;
  ATTNRES_BACKEND_OPS(ATTNRES_DECLARE)
#undef ATTNRES_DECLARE

 protected:
  // Whether p (not null) is memory of this backend: always, on the plain CPU;
  // the guarded backend checks its allocations.  The routing ops ask it of
  // every pointer in the source lists they are given.
  virtual bool owns(const void* /*p*/) const { return true; }
  // The routing ops' check of a source list (and of its gradient list, when
  // given): S ≥ 1, only source 0 broadcast, every pointer in them owned.
  void check_sources(const RouteSource* src, int64_t S, float* const* dsrc = nullptr) const;

 private:
  int threads() const { return ctx_.threads(); }
  // BLAS never threads itself: every call is one tile of gemm() (below) or
  // runs inside one of our parallel regions.
  void blas_single_thread() const;
  static constexpr int64_t kGemmTiles = 8;
  // C[M,N] = α·op(A)·op(B) + β·C (row-major; op = transpose when ta/tb), as
  // fixed tiles over our threads: the same bits for any thread count.
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
            const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const;
  // The same for bf16 A and B, C float32 (= the product, or += with accumulate),
  // through oneDNN: one cached plan per tile shape, one tile per call.
  void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B,
                 int64_t ldb, bool accumulate, float* C, int64_t ldc) const;
  // out[N,O] = bf16(inp) · Wᵀ for bf16 W: gemm_bf16, or for few rows a kernel
  // that streams each weight row once (decoding); scratch: matmul_workspace.
  void matmul_bf16(float* out, const float* inp, const bf16* W, int64_t N, int64_t I, int64_t O, float* scratch);
};

}  // namespace attnres
