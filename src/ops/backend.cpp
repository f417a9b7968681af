// backend.cpp — the backends by name.
#include "ops/backend.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/guarded_backend.h"
#include "ops/partial_backend.h"

namespace attnres {

// cpu-guarded: the CPU's kernels with memory the host cannot reach beside the
// interface (guarded_backend.h) — for checking that the callers keep to it.
std::vector<std::string> backend_names() { return {"cpu", "cpu-guarded"}; }

const char* op_name(Op op) {
  static const char* const names[] = {
#define ATTNRES_OP_NAME(fam, ret, name, params, args) #name,
      ATTNRES_BACKEND_OPS(ATTNRES_OP_NAME)
#undef ATTNRES_OP_NAME
  };
  const int i = static_cast<int>(op);
  return i >= 0 && i < kOps ? names[i] : "?";
}

Op parse_op_name(const std::string& name) {
  std::string known;
  for (int i = 0; i < kOps; ++i) {
    if (name == op_name(static_cast<Op>(i))) return static_cast<Op>(i);
    known += cat(i ? ", " : "", op_name(static_cast<Op>(i)));
  }
  fail("no op '", name, "' (the ops: ", known, ")");
}

void Backend::not_implemented(Op op) const {
  fail("op ", op_name(op), ": not implemented by the ", name(), " backend (run it on a partial backend, which gives "
       "the ops it does not support to the CPU: ops/partial_backend.h)");
}

// ---- the fusions' compositions (backend.h) ---------------------------------------

float* Backend::composition_scratch(int64_t floats) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (composition_.bytes() < bytes) composition_ = alloc(bytes);
  return composition_.as<float>();
}

int64_t Backend::lm_head_chunk_rows(int64_t V) { return std::clamp<int64_t>((int64_t{16} << 20) / V, 16, 256); }

int64_t Backend::lm_head_composition_workspace(int64_t C, int64_t V, Precision p) const {
  return matmul_workspace(lm_head_chunk_rows(V), C, V, p);
}

// Per chunk of rows: z = x·Wᵀ; Σ loss and dlogits in place (cross_entropy);
// dx = dlogits·W (assigned), dW += dlogitsᵀ·x.  With bf16 W the products
// round x and dlogits to bf16, as the fused head does.
double Backend::lm_head_loss_impl(float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N,
                                  int64_t C, int64_t V, float scale, float* losses_out, uint8_t* greedy_out) {
  const int64_t chunk = lm_head_chunk_rows(V);
  float* z = composition_scratch(std::min(chunk, N) * V);  // (rows, V)
  double total = 0;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t rows = std::min(chunk, N - r0);
    matmul_forward(z, x + r0 * C, W, rows, C, V);
    total += cross_entropy(dx ? z : nullptr, z, targets + r0, rows, V, scale, losses_out ? losses_out + r0 : nullptr,
                           greedy_out ? greedy_out + r0 : nullptr);
    if (dx) matmul_backward(dx + r0 * C, dW, z, x + r0 * C, W, rows, C, V);
  }
  return total;
}

void Backend::rebuild_by_composition(const RouteRebuild& rb, int64_t N, int64_t d) {
  const float* logits = rb.logits;
  if (!logits) {  // the logits again, from the router's query: route_forward's (its out is overwritten below)
    float* z = composition_scratch(N * rb.H * rb.S);
    route_forward(rb.out, z, rb.src, rb.S, rb.H, rb.w, rb.gamma, nullptr, nullptr, Combine::kReplace, N, d);
    logits = z;
  }
  if (rb.stream) route_mix_stream(rb.out, logits, rb.src, rb.S, rb.H, rb.gate, N, d);
  else route_mix(rb.out, logits, rb.src, rb.S, rb.H, rb.base, rb.gate, rb.combine, N, d);
}

std::string device_help() {
  std::string devices;
  for (const std::string& n : backend_names()) devices += (devices.empty() ? "" : ", ") + n;
  return "where the model runs (this build: " + devices +
         "; cpu-guarded is the CPU with its memory locked outside the op interface: slow, for checking that the "
         "code keeps to it; cpu-guarded:unsupported=OP,... declares those ops unsupported, and they run on the "
         "CPU beside it, as a partial backend's do)";
}

namespace {
// "cpu-guarded:unsupported=a,b" → ("cpu-guarded", [a, b]); a name without ':' → (name, []).
std::pair<std::string, std::vector<Op>> split_device(const std::string& name) {
  const size_t colon = name.find(':');
  if (colon == std::string::npos) return {name, {}};
  const std::string base = name.substr(0, colon), rest = name.substr(colon + 1);
  const std::string key = "unsupported=";
  if (base != "cpu-guarded" || rest.rfind(key, 0) != 0 || rest.size() == key.size())
    fail("--device ", name, ": only cpu-guarded takes an option, as cpu-guarded:unsupported=OP,OP,...");
  std::vector<Op> ops;
  for (size_t at = key.size(); at <= rest.size();) {
    const size_t comma = std::min(rest.find(',', at), rest.size());
    try {
      ops.push_back(parse_op_name(rest.substr(at, comma - at)));
    } catch (const Error& e) {
      fail("--device ", name, ": ", e.what());
    }
    at = comma + 1;
  }
  return {base, ops};
}
}  // namespace

void check_device(const std::string& name) {
  const std::string base = split_device(name).first;
  std::string known;
  for (const std::string& n : backend_names()) {
    if (n == base) return;
    known += (known.empty() ? "" : ", ") + n;
  }
  fail("--device ", name, ": no such device in this build (it has: ", known, ")");
}

std::unique_ptr<Backend> make_backend(const std::string& name, Context& ctx, const std::string& cpu_level) {
  check_device(name);
  const auto [base, unsupported] = split_device(name);
  const CpuLevel level = choose_cpu_level(cpu_level);
  if (base == "cpu") return make_cpu_backend(ctx, level);
  auto guarded = std::make_unique<GuardedCpuBackend>(ctx, make_cpu_backend(ctx, level), unsupported);
  if (unsupported.empty()) return guarded;
  return std::make_unique<PartialBackend>(ctx, std::move(guarded), make_cpu_backend(ctx, level));
}

}  // namespace attnres
