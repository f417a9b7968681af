// dnnl_matmul.cpp — see dnnl_matmul.h.
#include "ops/cpu/dnnl_matmul.h"

#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"

#ifdef ATTNRES_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace attnres::onednn {

#ifdef ATTNRES_HAVE_DNNL

namespace {

using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct ShapeHash {
  size_t operator()(const Shape& s) const {
    size_t h = (size_t{s.f32} << 3) | (size_t{s.ta} << 2) | (size_t{s.tb} << 1) | size_t{s.accumulate};
    for (int64_t v : {s.M, s.N, s.K, s.lda, s.ldb, s.ldc}) h = h * 0x9E3779B97F4A7C15ull + static_cast<size_t>(v);
    h = h * 0x9E3779B97F4A7C15ull + std::bit_cast<uint32_t>(s.alpha);
    return h;
  }
};

}  // namespace

// oneDNN's float32 GEMM kernels (jit_avx512_common_gemm_f32, jit_avx_gemm_f32;
// oneDNN issue #4845, fixed in 3.11.1 — Debian 12 ships 2.6.3) point rsp
// into a heap buffer while they run: a signal handled on that thread then has
// its frame written there, over the heap ("corrupted size vs. prev_size" when
// a run was stopped by SIGTERM, tests/distributed/mpi.py).  So each thread
// blocks the asynchronous signals while it runs a primitive; one that arrives
// meanwhile is delivered when it returns (the faults stay unblocked: blocked,
// they would end the process without their handlers).
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&all, sig);
    pthread_sigmask(SIG_BLOCK, &all, &old_);
  }
  ~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

class Plan {
 public:
  explicit Plan(const Shape& s)
      // A [M,K] with row stride lda, or stored [K,M] (ta): element (m, k) at m·lda + k or k·lda + m.
      : f32_(s.f32),
        a_({s.M, s.K}, s.f32 ? dt::f32 : dt::bf16, s.ta ? dnnl::memory::dims{1, s.lda} : dnnl::memory::dims{s.lda, 1}),
        b_({s.K, s.N}, s.f32 ? dt::f32 : dt::bf16, s.tb ? dnnl::memory::dims{1, s.ldb} : dnnl::memory::dims{s.ldb, 1}),
        c_({s.M, s.N}, dt::f32, dnnl::memory::dims{s.ldc, 1}) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // ours, per thread: see run()
    if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});  // before the sum below
    if (s.accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);  // C = A·B + C
      attr.set_post_ops(po);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_, b_, c_), attr, engine());
    scratch_ = pd.scratchpad_desc().get_size();
    prim_ = dnnl::matmul(pd);
  }

  bool f32() const { return f32_; }
  void run(const void* A, const void* B, float* C) const {
    const SignalsBlocked quiet;
    thread_local std::vector<uint8_t> scratch;  // grows to the largest plan a thread ran
    thread_local dnnl::stream stream(engine());
    if (scratch.size() < scratch_) scratch.resize(scratch_);
    dnnl::memory a(a_, engine(), const_cast<void*>(A)), b(b_, engine(), const_cast<void*>(B)), c(c_, engine(), C);
    dnnl::memory pad({{static_cast<int64_t>(scratch_)}, dt::u8, dnnl::memory::format_tag::a}, engine(),
                     scratch.data());
    prim_.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, pad}});
  }

 private:
  bool f32_;
  dnnl::memory::desc a_, b_, c_;
  dnnl::matmul prim_;
  size_t scratch_ = 0;
};

std::string isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

const std::string& unsupported() {
  static const std::string why = [] {
    const dnnl::cpu_isa have = dnnl::get_effective_cpu_isa();
    if (have == dnnl::cpu_isa::avx512_core_bf16 || have == dnnl::cpu_isa::avx512_core_amx) return std::string();
    return cat("this CPU has no bfloat16 matrix instructions (AVX512-BF16 or AMX-BF16; oneDNN runs ", isa(),
               " kernels here", std::getenv("ONEDNN_MAX_CPU_ISA") ? ", limited by ONEDNN_MAX_CPU_ISA" : "",
               "): use --precision fp32");
  }();
  return why;
}

namespace {
std::mutex g_mutex;
std::unordered_map<Shape, std::unique_ptr<Plan>, ShapeHash> g_plans;
}  // namespace

bool available() { return true; }

const Plan& plan(const Shape& s) {
  if (!s.f32 && !unsupported().empty()) fail("precision bf16: ", unsupported());
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_plans.find(s);
  if (it != g_plans.end()) return *it->second;
  // oneDNN sizes a primitive's threading from OpenMP's count when it is
  // created: one thread, so a tile is one thread's fixed sequence of work.
  if (!omp_in_parallel() && omp_get_max_threads() != 1) omp_set_num_threads(1);
  try {
    auto p = std::make_unique<Plan>(s);
    return *g_plans.emplace(s, std::move(p)).first->second;
  } catch (const dnnl::error& e) {
    fail("oneDNN cannot plan a ", s.f32 ? "float32" : "bf16", " product of ", s.M, " x ", s.N, " x ", s.K, ": ",
         e.what());
  }
}

void run(const Plan& p, const bf16* A, const bf16* B, float* C) {
  ATTNRES_CHECK(!p.f32(), "a float32 plan run with bf16 operands");
  p.run(A, B, C);
}
void run(const Plan& p, const float* A, const float* B, float* C) {
  ATTNRES_CHECK(p.f32(), "a bf16 plan run with float32 operands");
  p.run(A, B, C);
}

int64_t cached_plans() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int64_t>(g_plans.size());
}

double measure_gflops(int threads, bool f32) {
  if (!f32 && !unsupported().empty()) fail("precision bf16: ", unsupported());
  const int64_t n = 2048;
  std::vector<bf16> a16(f32 ? 0 : static_cast<size_t>(n * n)), b16(a16.size());
  std::vector<float> a32(f32 ? static_cast<size_t>(n * n) : 0), b32(a32.size());
  for (size_t i = 0; i < a16.size(); ++i) a16[i] = b16[i] = float_to_bf16(1e-3f * static_cast<float>(i % 97));
  for (size_t i = 0; i < a32.size(); ++i) a32[i] = b32[i] = 1e-3f * static_cast<float>(i % 97);
  void* a = f32 ? static_cast<void*>(a32.data()) : static_cast<void*>(a16.data());
  void* b = f32 ? static_cast<void*>(b32.data()) : static_cast<void*>(b16.data());
  std::vector<float> c(static_cast<size_t>(n * n));
  const dnnl::memory::desc ad({n, n}, f32 ? dt::f32 : dt::bf16, dnnl::memory::format_tag::ab),
      cd({n, n}, dt::f32, dnnl::memory::format_tag::ab);
  // oneDNN's threads, for this primitive only: it reads OpenMP's count when
  // it is created and again when it runs.
  omp_set_num_threads(threads);
  const dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, ad, cd), engine()));
  dnnl::stream stream(engine());
  dnnl::memory am(ad, engine(), a), bm(ad, engine(), b), cm(cd, engine(), c.data());
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {  // the first one warms up
    const auto t0 = std::chrono::steady_clock::now();
    {
      const SignalsBlocked quiet;
      mm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  omp_set_num_threads(1);  // as the tiles' plans expect
  return best;
}

#else  // built without oneDNN

class Plan {};

std::string isa() { return "none"; }

const std::string& unsupported() {
  static const std::string why =
      "this attnres was built without oneDNN (install libdnnl-dev and rebuild): use --precision fp32";
  return why;
}

bool available() { return false; }
const Plan& plan(const Shape& s) {
  if (s.f32) fail("float32 products through oneDNN: this attnres was built without oneDNN (libdnnl-dev)");
  fail("precision bf16: ", unsupported());
}
void run(const Plan&, const bf16*, const bf16*, float*) { fail("precision bf16: ", unsupported()); }
void run(const Plan&, const float*, const float*, float*) { fail("this attnres was built without oneDNN"); }
int64_t cached_plans() { return 0; }
double measure_gflops(int, bool f32) {
  if (f32) fail("float32 products through oneDNN: this attnres was built without oneDNN (libdnnl-dev)");
  fail("precision bf16: ", unsupported());
}

#endif

}  // namespace attnres::onednn
