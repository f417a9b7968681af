// check.h — helpers shared by the unit tests: random tensors, tolerance
// comparisons, a central finite-difference gradient check, and the backend
// configurations the per-op tests run on with arrays in backend memory.
//
// The FD check treats an op as a function of one input tensor, contracts its
// output with a fixed random tensor G (loss = Σ out∘G, in double), and compares
// the analytic gradient (the op's backward fed dout = G) with
// (loss(x + h) − loss(x − h)) / 2h element by element.
//
// Per-op tests are value-parameterized over backend_params() (OnBackend,
// OnBackendWith<Shape>): each builds Context(threads, backend) and passes the
// ops only memory from ops.alloc (DeviceVec), uploaded from and downloaded to
// host vectors, so that a backend with memory of its own runs the same tests.
// The CPU backend is the reference the others are held against.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "core/buffer.h"
#include "ops/context.h"
#include "core/error.h"
#include "core/precision.h"
#include "core/rng.h"
#include "core/file_util.h"
#include "model/params.h"
#include "ops/backend.h"
#include "ops/cpu/cpu_level.h"
#include "testing/context.h"

// stmt throws an Error whose message contains msg.
#define EXPECT_THROW_MSG(stmt, msg)                                                      \
  do {                                                                                   \
    try {                                                                                \
      stmt;                                                                              \
      ADD_FAILURE() << "no error; expected: " << (msg);                                  \
    } catch (const ::attnres::Error& e) {                                                \
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();         \
    }                                                                                    \
  } while (0)

namespace attnres::testing {

// A fresh directory under /tmp, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() /
             ("attnres_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Writes `bytes` to path()/name (creating parent directories); returns the path.
  std::string file(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path p = std::filesystem::path(path_) / name;
    std::filesystem::create_directories(p.parent_path());
    write_file_atomic(p.string(), bytes);
    return p.string();
  }

 private:
  std::string path_;
};

inline std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * r.normal());
  return v;
}

// |a − b| ≤ atol + rtol·|b| for every element.
inline ::testing::AssertionResult all_close(const std::vector<double>& a, const std::vector<double>& b, double atol,
                                            double rtol) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "size " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= atol + rtol * std::fabs(b[i])))
      return ::testing::AssertionFailure() << "[" << i << "]: " << a[i] << " vs " << b[i] << " (atol " << atol
                                           << ", rtol " << rtol << ")";
  return ::testing::AssertionSuccess();
}

inline std::vector<double> to_double(const float* p, size_t n) { return std::vector<double>(p, p + n); }

// loss(): recomputes Σ out∘G from the current contents of x.
// Returns the finite-difference gradient of loss w.r.t. x.
inline std::vector<double> fd_gradient(std::vector<float>& x, const std::function<double()>& loss, float h = 1e-2f) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    g[i] = (lp - lm) / (2.0 * static_cast<double>(h));
  }
  return g;
}

// The tensor of `layout` named `name`, or null.
inline const TensorSpec* find_tensor(const ParamLayout& layout, const std::string& name) {
  for (const TensorSpec& s : layout.specs())
    if (s.name == name) return &s;
  return nullptr;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// ---- backend memory -------------------------------------------------------------

// n values of T in a backend's memory (ops.alloc, zero-filled), written from and
// read back to host vectors through ops.upload / ops.download.  Pass data() to
// the ops; never index it on the host.
template <class T>
class DeviceVec {
 public:
  DeviceVec(Backend& ops, size_t n) : ops_(&ops), n_(n), buf_(ops.alloc(n * sizeof(T))) {}
  DeviceVec(Backend& ops, const std::vector<T>& values) : DeviceVec(ops, values.size()) { upload(values); }

  T* data() { return buf_.template as<T>(); }
  const T* data() const { return buf_.template as<T>(); }
  size_t size() const { return n_; }

  void upload(const std::vector<T>& values) {
    ATTNRES_CHECK(values.size() == n_, "upload of ", values.size(), " values into ", n_);
    ops_->upload(data(), values.data(), n_ * sizeof(T));
  }
  // Element i only (the finite-difference check moves one input at a time).
  void set(size_t i, T value) { ops_->upload(data() + i, &value, sizeof(T)); }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    ops_->synchronize();
    ops_->download(h.data(), data(), n_ * sizeof(T));
    return h;
  }

 private:
  Backend* ops_;
  size_t n_;
  Buffer buf_;
};

// A backend copy of a host vector.
template <class T>
DeviceVec<T> dev(Backend& ops, const std::vector<T>& values) {
  return DeviceVec<T>(ops, values);
}

// n values at p (backend memory) on the host.
template <class T>
std::vector<T> host(Backend& ops, const T* p, size_t n) {
  std::vector<T> h(n);
  ops.synchronize();
  ops.download(h.data(), p, n * sizeof(T));
  return h;
}

inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// fd_gradient for an input in backend memory: x is perturbed there, one
// element at a time (the same float arithmetic as the host version).
inline std::vector<double> fd_gradient(DeviceVec<float>& x, const std::function<double()>& loss, float h = 1e-2f) {
  const std::vector<float> x0 = x.host();
  std::vector<double> g(x0.size());
  for (size_t i = 0; i < x0.size(); ++i) {
    x.set(i, x0[i] + h);
    const double lp = loss();
    x.set(i, x0[i] - h);
    const double lm = loss();
    x.set(i, x0[i]);
    g[i] = (lp - lm) / (2.0 * static_cast<double>(h));
  }
  return g;
}

// Σ out∘G with out in backend memory.
inline double dot(const DeviceVec<float>& out, const std::vector<float>& G) { return dot(out.host(), G); }

// ---- backend configurations -------------------------------------------------------

// One configuration the per-op tests run on: Context(threads, backend).
struct BackendParam {
  std::string name;     // the test-name suffix
  std::string backend;  // make_backend's name
  int threads;
  std::string level;    // the CPU kernels' level (ops/cpu/cpu_level.h); "" = the best here
};
inline void PrintTo(const BackendParam& p, std::ostream* os) { *os << p.name; }

// Every configuration of the per-op tests: the CPU backend (the reference)
// with one thread and with an odd number of threads (uneven splits of rows,
// chunks and heads), and the guarded CPU backend (ops/cpu/guarded_backend.h),
// whose memory the host cannot touch but through the interface — so a test
// that reads backend memory in place fails on it.  These run the kernels of
// the CPU's best level; every lower level this CPU has runs beside them with
// three threads (cpu_x86_64_3threads, cpu_avx2_3threads), so each level's
// copy of the kernels is checked on a machine that has it.  And a partial
// backend (ops/partial_backend.h): the guarded CPU declaring every other op
// of the list unsupported (partial_device()), so a model's ops alternate
// between it and the CPU beside it and every op is run on each side of the
// seam by some test.
// The oracle comparisons (golden_test.cpp, generate_test.cpp) run on every
// one: what they reach of the model goes through the interface.  Other
// model-level tests read arenas in place (params(), grads(), checkpoints, the
// trainer's MPI staging) and run on test_context(), the plain CPU backend.
// "cpu-guarded:unsupported=" every op of odd index in the list (even: the
// other half), the device of the partial configuration.
inline std::string partial_device(bool odd = true) {
  std::string ops;
  for (int i = odd ? 1 : 0; i < kOps; i += 2) ops += cat(ops.empty() ? "" : ",", op_name(static_cast<Op>(i)));
  return "cpu-guarded:unsupported=" + ops;
}

// A device's name without its options ("cpu-guarded" for the partial one):
// what tables of measured tolerances are keyed by.  A partial device runs the
// CPU's kernels on both sides of its seam, so it takes its primary's rows.
inline std::string device_base(const std::string& device) { return device.substr(0, device.find(':')); }

inline std::vector<BackendParam> backend_params() {
  std::vector<BackendParam> p = {{"cpu_1thread", "cpu", 1, ""},
                                 {"cpu_3threads", "cpu", 3, ""},
                                 {"cpu_guarded", "cpu-guarded", 3, ""},
                                 {"cpu_partial", partial_device(), 3, ""}};
  for (CpuLevel l : cpu_levels_here()) {
    if (l == cpu_level_detected()) continue;
    std::string name = cpu_level_name(l);
    for (char& c : name)
      if (c == '-') c = '_';
    p.push_back({"cpu_" + name + "_3threads", "cpu", 3, cpu_level_name(l)});
  }
  return p;
}

// The Context of a configuration, shared by the tests that take it (testing/context.h).
inline Context& context_for(const BackendParam& p) { return context_for(p.name, p.backend, p.threads, p.level); }

// Fixture of a test over backend_params(): ctx and its ops.
class OnBackend : public ::testing::TestWithParam<BackendParam> {
 protected:
  OnBackend() : ctx(GetParam().threads, GetParam().backend, GetParam().level), ops(ctx.ops()) {}
  Context ctx;
  Backend& ops;
};

// Fixture of a test over backend_params() × shapes: ctx, its ops and shape().
template <class Shape>
class OnBackendWith : public ::testing::TestWithParam<std::tuple<BackendParam, Shape>> {
 protected:
  using Base = ::testing::TestWithParam<std::tuple<BackendParam, Shape>>;
  OnBackendWith() : ctx(backend().threads, backend().backend, backend().level), ops(ctx.ops()) {}
  static const BackendParam& backend() { return std::get<0>(Base::GetParam()); }
  static const Shape& shape() { return std::get<1>(Base::GetParam()); }
  Context ctx;
  Backend& ops;
};

// Test names: the configuration's name; with shapes, shape_name(shape) + "_" + it.
inline std::string backend_test_name(const ::testing::TestParamInfo<BackendParam>& info) { return info.param.name; }
template <class Shape, class ShapeName>
auto backend_shape_test_name(ShapeName shape_name) {
  return [shape_name](const ::testing::TestParamInfo<std::tuple<BackendParam, Shape>>& info) {
    return std::string(shape_name(std::get<1>(info.param))) + "_" + std::get<0>(info.param).name;
  };
}

// Instantiates the OnBackend suite `Suite` as Kernel/Suite.Test/<configuration>.
#define ATTNRES_ON_BACKENDS(Suite)                                                                   \
  INSTANTIATE_TEST_SUITE_P(Kernel, Suite, ::testing::ValuesIn(::attnres::testing::backend_params()), \
                           ::attnres::testing::backend_test_name)
// Instantiates the OnBackendWith<Shape> suite `Suite` over the shapes `values`
// (a ::testing generator) as Kernel/Suite.Test/<shape_name(shape)>_<configuration>.
#define ATTNRES_ON_BACKENDS_WITH(Suite, Shape, values, shape_name)                                                \
  INSTANTIATE_TEST_SUITE_P(Kernel, Suite,                                                                         \
                           ::testing::Combine(::testing::ValuesIn(::attnres::testing::backend_params()), values), \
                           ::attnres::testing::backend_shape_test_name<Shape>(shape_name))

// ---- precisions -------------------------------------------------------------------

// How far an op of one (backend, precision) pair may be from the double-precision
// reference of the operands it reads (bf16: the rounded operands), as
// |got − ref| ≤ rtol · Σ_k |a_k·b_k|, the sum of the magnitudes of its terms.
struct ProductTolerance {
  // The sums: float32 over K terms in tiles (every backend and precision sums
  // in float32; K ≤ 10³ in the tests, so K·2⁻²⁴ ≈ 6e-5 is the worst case and
  // √K·2⁻²⁴ ≈ 2e-6 the typical one).  1e-5 is about 7× the typical error at the
  // tests' largest K (600) in any summation order, so it holds whichever
  // kernel oneDNN or OpenBLAS picks for the CPU (AMX, AVX512-BF16, AVX-512).
  double sums;
  // bf16: an operand the op computes itself in float32 (the LM head's
  // dlogits) and then rounds may round to the other neighbour than the
  // double-precision reference's: one bf16 unit of one term per product,
  // which is at most 2⁻⁷ of the term (bf16's spacing is 2⁻⁷ of a value at
  // the bottom of its binade, 2⁻⁸ at the top), so 2⁻⁷ relative to the sum of
  // magnitudes.  0 in fp32.  A definition: the CPU decides whether a value
  // flips (its float32 sums), not how far.  (It was 2⁻⁸, bf16's unit
  // roundoff, which is half a unit: one flip of a dominant term could pass it.)
  double rounding;
};
inline ProductTolerance product_tolerance(const BackendParam& b, Precision p) {
  (void)b;  // the CPU backend: both precisions sum in float32 (SGEMM, oneDNN)
  return {1e-5, p == Precision::kBF16 ? 1.0 / 128 : 0.0};
}

// Why bf16 products cannot run on this machine's CPU backend ("" when they can):
// the reason bf16 tests skip with.
inline std::string bf16_here() {
  static const std::string why = [] {
    Context probe(1);
    return probe.ops().unsupported(Precision::kBF16);
  }();
  return why;
}

// Sets OpenMP's process-wide thread count for the scope; restores it at exit.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

}  // namespace attnres::testing
