// cpu_backend.h — the CPU backend: the ops of ops/backend.h (where their math
// is written down) as OpenMP kernels, with every matmul through oneDNN's
// matmul — fp32, and bf16 on the CPU's matrix units (AMX-BF16 or
// AVX512-BF16; dnnl_matmul.h) — or fp32 through CBLAS (OpenBLAS, its OpenMP
// build) where asked (Fp32Gemm below), and attention's tiles through CBLAS in
// fp32 and tile products of ours in bf16 (attention.cpp, tiles.h: AMX or
// VDPBF16PS).  One file
// per op family in this directory.
//
// Two classes: CpuBackend holds memory, the products and what the kernels
// share (compiled once, for the baseline x86-64); CpuKernels, derived from
// it, holds every other op (ATTNRES_KERNEL_OPS) and is compiled once per
// instruction-set level (cpu_level.h) into the namespace of that level —
// isa_x86_64, isa_avx2, isa_avx512 — with that level's flags.  make_cpu_backend
// picks the one to run.  What the copies share with each other (the headers'
// inline functions and templates) stays baseline code: isa_begin.h says how,
// test build.isa_kernels_keep_to_their_level_* checks it.
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

#include <memory>

#include "ops/backend.h"
#include "ops/cpu/cpu_level.h"
#include "ops/op_list.h"

namespace attnres {

// Elements of work below which an elementwise or row kernel runs on the
// calling thread alone: waking the team costs microseconds, more than such a
// kernel (decoding one token of a small model runs hundreds of them).
inline constexpr int64_t kParallelMin = int64_t{1} << 15;

// Floats of workspace that hold n bf16 values, rounded up to a cache line.
inline constexpr int64_t bf16_floats(int64_t n) { return (n + 31) / 32 * 16; }

// The library of float32 products: OpenBLAS's SGEMM, or oneDNN's matmul
// (ATTNRES_FP32_GEMM=openblas|onednn; `bench --gemm` measures both on the
// shapes of a step).  Either runs as the same fixed tiles (gemm() below).
enum class Fp32Gemm { kOpenBlas, kOneDnn };
const char* fp32_gemm_name(Fp32Gemm g);
// $ATTNRES_FP32_GEMM, else oneDNN where the build has it (matmul.cpp says why), else OpenBLAS;
// an unknown name, or onednn in a build without it, is an Error.
Fp32Gemm choose_fp32_gemm();

class CpuBackend : public Backend {  // GuardedCpuBackend (guarded_backend.h) wraps one
 public:
  const char* name() const override { return "cpu"; }
  const char* kernels() const override { return cpu_level_name(level_); }
  const char* attention_tiles() const override { return tile_path_name(tiles_); }
  std::string unsupported(Precision p) const override;
  double peak_gflops(Precision p) const override;  // blas_kernels.h: measure_peak_gflops
  const char* peak_name(Precision p) const override;
  // The instruction-set level of this backend's kernels.
  CpuLevel level() const { return level_; }
  // What runs attention's bf16 products (cpu_level.h choose_tile_path).
  TilePath tile_path() const { return tiles_; }

  Buffer alloc(size_t bytes, bool lazy) override { return Buffer::host_bytes(bytes, lazy); }
  void synchronize() override {}
  void* map(void* p, size_t) override { return p; }
  void unmap(void*, size_t) override {}
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;

  int64_t matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const override;

  // The products (op_list.h), matmul.cpp.
#define ATTNRES_DECLARE(fam, ret, name, params, args) ret name##_impl params override;
  ATTNRES_PRODUCT_OPS(ATTNRES_DECLARE)
#undef ATTNRES_DECLARE

  // What the routing ops accept as memory of this backend: every pointer on
  // the plain CPU; the guarded backend (guarded_backend.h) sets its check.
  void check_memory_with(bool (*owns)(const void*)) { owns_ = owns; }

  // The float32 products' library (Fp32Gemm), and a change of it (bench).
  Fp32Gemm fp32_gemm() const { return fp32_gemm_; }
  void set_fp32_gemm(Fp32Gemm g) { fp32_gemm_ = g; }
  // Seconds of one C[M,N] (+)= op(A)·op(B) as gemm() runs it through `g`, on
  // this backend's threads: the fastest of `reps` after one warm-up, on
  // operands of its own (bench --gemm).
  double time_gemm(Fp32Gemm g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool accumulate, int reps);
  // The same for the bf16 product as gemm_bf16() runs it.
  double time_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool accumulate, int reps);

 protected:
  CpuBackend(Context& ctx, CpuLevel level) : Backend(ctx), level_(level), tiles_(choose_tile_path(level)) {}
  bool owns(const void* p) const { return !owns_ || owns_(p); }
  // The routing ops' check of a source list (and of its gradient list, when
  // given), which reads the lists: only source 0 broadcast, every pointer in
  // them owned.  (S ≥ 1 and the rest of the arguments: op_checks.cpp.)
  void check_sources(const RouteSource* src, int64_t S, float* const* dsrc = nullptr) const;

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

 private:
  // r's n elements in bf16: r itself where it is bf16, else rounded into scratch.
  const bf16* bf16_rows(Rows r, bf16* scratch, int64_t n);
  // out[N,O] = bf16(inp) · Wᵀ for bf16 W: gemm_bf16, or for few rows a kernel
  // that streams each weight row once (decoding); scratch: matmul_workspace.
  void matmul_bf16(float* out, Rows inp, const bf16* W, int64_t N, int64_t I, int64_t O, float* scratch);

  // gemm() through oneDNN's float32 matmul: the same tiles, one plan per tile shape.
  void gemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const;

  CpuLevel level_;
  TilePath tiles_;  // what runs attention's bf16 tile products (tiles.h)
  Fp32Gemm fp32_gemm_ = choose_fp32_gemm();
  bool (*owns_)(const void*) = nullptr;
};

// The CPU backend whose kernels are compiled for `level` (which this CPU must run).
std::unique_ptr<CpuBackend> make_cpu_backend(Context& ctx, CpuLevel level);

// The kernels of one level.  This declaration is compiled into each level's
// namespace by the kernel files (ATTNRES_ISA names it); nothing outside them
// sees the class, only its factory, make_cpu_kernels, one per level
// (kernels.cpp).  ATTNRES_ISA_LEVEL is the level's CpuLevel enumerator.
#ifdef ATTNRES_ISA
namespace ATTNRES_ISA {
class CpuKernels final : public CpuBackend {
 public:
  explicit CpuKernels(Context& ctx) : CpuBackend(ctx, CpuLevel::ATTNRES_ISA_LEVEL) {}
  int64_t attention_workspace(int64_t max_keys, int64_t hd, Precision p) const override;
  int64_t lm_head_workspace(int64_t C, int64_t V, Precision p) const override;
  int64_t route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const override;
#define ATTNRES_DECLARE(fam, ret, name, params, args) ret name##_impl params override;
  ATTNRES_KERNEL_OPS(ATTNRES_DECLARE)
#undef ATTNRES_DECLARE
};
}  // namespace ATTNRES_ISA
#endif
namespace isa_x86_64 { std::unique_ptr<CpuBackend> make_cpu_kernels(Context& ctx); }
namespace isa_avx2 { std::unique_ptr<CpuBackend> make_cpu_kernels(Context& ctx); }
namespace isa_avx512 { std::unique_ptr<CpuBackend> make_cpu_kernels(Context& ctx); }

}  // namespace attnres
