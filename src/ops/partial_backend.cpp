// partial_backend.cpp — see partial_backend.h.
#include "ops/partial_backend.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "ops/timed_backend.h"

namespace attnres {

namespace {

// The precision an op runs in, from its arguments: a weight's, or a
// Precision given; fp32 when it has neither.
struct PrecisionOf {
  Precision p = Precision::kF32;
  void see(const Weight& w) { p = w.precision(); }
  void see(Precision q) { p = q; }
  template <class T>
  void see(const T&) {}
};
template <class... A>
Precision precision_of(const A&... args) {
  PrecisionOf o;
  (o.see(args), ...);
  return o.p;
}

// The host's access to the primary's memory for one op on the CPU.
class HostAccess {
 public:
  explicit HostAccess(Backend& b) : b_(b) { b_.host_access(true); }
  ~HostAccess() { b_.host_access(false); }
  HostAccess(const HostAccess&) = delete;
  HostAccess& operator=(const HostAccess&) = delete;

 private:
  Backend& b_;
};

}  // namespace

PartialBackend::PartialBackend(Context& ctx, std::unique_ptr<Backend> primary, std::unique_ptr<Backend> cpu)
    : WrappingBackend(ctx,
                      [&]() -> Backend& {
                        ATTNRES_CHECK(primary && cpu, "PartialBackend: a primary and a CPU backend");
                        return *primary;
                      }()),
      primary_(std::move(primary)),
      cpu_(std::move(cpu)) {
  if (!primary_->host_addressable())
    fail("the ", primary_->name(), " backend's memory is its own: a partial backend needs memory the host can "
         "address (the seam does not move operands yet)");
}

std::string PartialBackend::unsupported(Precision p) const {
  if (std::string why = primary_->unsupported(p); !why.empty()) return why;
  for (int i = 0; i < kOps; ++i)
    if (!primary_->supports(static_cast<Op>(i), p)) return cpu_->unsupported(p);
  return "";
}

int64_t PartialBackend::matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const {
  return std::max(primary_->matmul_workspace(N, I, O, p), cpu_->matmul_workspace(N, I, O, p));
}
int64_t PartialBackend::attention_workspace(int64_t max_keys, int64_t hd, Precision p) const {
  return std::max(primary_->attention_workspace(max_keys, hd, p), cpu_->attention_workspace(max_keys, hd, p));
}
int64_t PartialBackend::lm_head_workspace(int64_t C, int64_t V, Precision p) const {
  return std::max(primary_->lm_head_workspace(C, V, p), cpu_->lm_head_workspace(C, V, p));
}
int64_t PartialBackend::route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const {
  return std::max(primary_->route_workspace(N, d, S, H), cpu_->route_workspace(N, d, S, H));
}

int64_t PartialBackend::seam_total() const {
  int64_t n = 0;
  for (int64_t c : seam_) n += c;
  return n;
}

std::string PartialBackend::seam_summary() const {
  std::vector<int> crossed;
  for (int i = 0; i < kOps; ++i)
    if (seam_[static_cast<size_t>(i)] > 0) crossed.push_back(i);
  std::stable_sort(crossed.begin(), crossed.end(), [&](int a, int b) { return seam_[a] > seam_[b]; });
  std::string s = cat(seam_total(), " calls of ", crossed.size(), " ops ran on the CPU beside ", name(),
                      crossed.empty() ? "" : ":");
  for (size_t k = 0; k < crossed.size(); ++k)
    s += cat(k ? ", " : " ", op_name(static_cast<Op>(crossed[k])), " ", seam_[static_cast<size_t>(crossed[k])]);
  return s;
}

// Each op: the primary's where it supports the op in the op's precision;
// else, after the primary's work so far is done, the CPU's on the same memory.
#define ATTNRES_PARTIAL(fam, ret, name, params, args)                             \
  ret PartialBackend::name##_impl params {                                               \
    if (primary_->supports(Op::k_##name, precision_of(ATTNRES_UNPAREN args)))     \
      return name##_of(*primary_, ATTNRES_UNPAREN args);                          \
    primary_->synchronize();                                                      \
    ++seam_[static_cast<size_t>(Op::k_##name)];                                   \
    HostAccess open(*primary_);                                                   \
    return name##_of(*cpu_, ATTNRES_UNPAREN args);                                \
  }
ATTNRES_BACKEND_OPS(ATTNRES_PARTIAL)
#undef ATTNRES_PARTIAL

const PartialBackend* partial_backend(const Context& ctx) {
  Backend* b = &ctx.ops();
  if (auto* timed = dynamic_cast<TimedBackend*>(b)) b = &timed->inner();
  return dynamic_cast<const PartialBackend*>(b);
}

}  // namespace attnres
