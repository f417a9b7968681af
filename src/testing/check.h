// check.h — helpers shared by the unit tests: random tensors, tolerance
// comparisons, and a central finite-difference gradient check.
//
// The FD check treats an op as a function of one input tensor, contracts its
// output with a fixed random tensor G (loss = Σ out∘G, in double), and compares
// the analytic gradient (the op's backward fed dout = G) with
// (loss(x + h) − loss(x − h)) / 2h element by element.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/file_util.h"

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

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace attnres::testing
