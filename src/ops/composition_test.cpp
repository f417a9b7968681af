// composition_test.cpp — the CPU-shaped fusions as compositions of simpler
// ops (ops/backend.h: rebuild_by_composition, the default lm_head_loss_impl),
// which a backend that does not fuse them runs: a backend that forwards every
// op to the CPU except those two, run against the CPU's fused ops — the
// rebuild to the bit, the LM head and whole training steps within float32's
// rounding, in every mode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "model/model.h"
#include "ops/backend.h"
#include "ops/context.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_level.h"
#include "ops/wrapping_backend.h"
#include "testing/check.h"
#include "testing/configs.h"

namespace attnres {
namespace {

// Every op the CPU's (and its names, workspaces and memory: WrappingBackend).
class Forwarding : public WrappingBackend {
 public:
  explicit Forwarding(Context& ctx) : Forwarding(ctx, make_cpu_backend(ctx, cpu_level_detected())) {}
  const char* name() const override { return "unfused"; }

 protected:
#define ATTNRES_FORWARD(fam, ret, name, params, args) \
  ret name##_impl params override { return cpu_->name args; }
  ATTNRES_BACKEND_OPS(ATTNRES_FORWARD)
#undef ATTNRES_FORWARD
  std::unique_ptr<CpuBackend> cpu_;

 private:
  Forwarding(Context& ctx, std::unique_ptr<CpuBackend> cpu) : WrappingBackend(ctx, *cpu), cpu_(std::move(cpu)) {}
};

// ... except the two fusions: their compositions (the LM head's unless
// compose_head is false: then the CPU's fused head).
class Unfused final : public Forwarding {
 public:
  Unfused(Context& ctx, bool compose_head) : Forwarding(ctx), compose_head_(compose_head) {}
  int64_t lm_head_workspace(int64_t C, int64_t V, Precision p) const override {
    return compose_head_ ? lm_head_composition_workspace(C, V, p) : cpu_->lm_head_workspace(C, V, p);
  }

 protected:
  double lm_head_loss_impl(float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N, int64_t C,
                           int64_t V, float scale, float* losses, uint8_t* greedy) override {
    if (!compose_head_) return cpu_->lm_head_loss(dx, dW, x, W, targets, N, C, V, scale, losses, greedy);
    return Backend::lm_head_loss_impl(dx, dW, x, W, targets, N, C, V, scale, losses, greedy);
  }
  void route_backward_impl(float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate, const float* dout,
                           const float* logits, const RouteSource* src, int64_t S, int64_t H, const float* w,
                           const float* gamma, const float* base, const float* gate, Combine combine, int64_t N,
                           int64_t d, const RouteRebuild* rebuild, bool accumulate_src, float entropy) override {
    cpu_->route_backward(dsrc, dbase, dw, dgamma, dgate, dout, logits, src, S, H, w, gamma, base, gate, combine, N, d,
                         nullptr, accumulate_src, entropy);
    if (rebuild) rebuild_by_composition(*rebuild, N, d);
  }

 private:
  bool compose_head_;
};

std::unique_ptr<Context> unfused_context(bool compose_head = true) {
  return std::make_unique<Context>(2, [compose_head](Context& c) -> std::unique_ptr<Backend> {
    return std::make_unique<Unfused>(c, compose_head);
  });
}


double max_rel(const float* a, const float* b, int64_t n) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(static_cast<double>(a[i])));
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return scale > 0 ? worst / scale : worst;
}

// Training steps on the compositions: the CPU's losses and gradients within
// float32's rounding (the composed head sums its products in another order);
// the rebuilt inputs are the forward's bits either way, so the modes that
// rebuild (full, block, delta) differ from the fused backward no more than
// baseline does.
TEST(Compositions, TrainingOnThemGivesTheCpusLossesAndGradients) {
  const int64_t B = 2, T = 8;
  for (const char* mode : {"baseline", "block", "full", "delta", "delta_block", "block_add", "delta_mh"}) {
    for (const Precision p : {Precision::kF32, Precision::kBF16}) {
      SCOPED_TRACE(cat(mode, " ", precision_name(p)));
      Context cpu(2, "cpu");
      if (!cpu.ops().unsupported(p).empty()) continue;
      auto unfused = unfused_context();
      const Config c = testing::small_config(mode, {{"vocab_size", 301}});
      ModelOptions mo{B, T};
      mo.precision = p;
      Model ref(cpu, c, mo), got(*unfused, c, mo);
      Rng r1(5), r2(5);
      ref.init(r1);
      got.init(r2);
      std::vector<int32_t> in(B * T), tg(B * T);
      for (int64_t i = 0; i < B * T; ++i) in[i] = static_cast<int32_t>((7 * i + 3) % c.V), tg[i] = in[(i + 1) % (B * T)];
      ref.zero_grad();
      got.zero_grad();
      const double want = ref.forward_backward(in.data(), tg.data(), true);
      const double have = got.forward_backward(in.data(), tg.data(), true);
      EXPECT_NEAR(have, want, 1e-5 * std::fabs(want));
      // bf16: the head's products round the same operands; their float32 sums differ in order only.
      EXPECT_LT(max_rel(ref.grads(), got.grads(), ref.layout().total()), p == Precision::kF32 ? 1e-4 : 1e-2);
    }
  }
}

// The rebuild composed is the fused rebuild's bits (both are the forward's),
// and the backward beside it is the same call: with the fused head, training
// steps on the composed rebuild are the CPU's to the bit, in every mode that
// rebuilds its inputs, routing queries non-zero (so the rebuilt inputs depend
// on the logits, kept or computed again).
TEST(Compositions, TheRebuildIsTheFusedRebuildsBits) {
  for (const char* mode : {"full", "block", "delta", "delta_mh"}) {
    SCOPED_TRACE(mode);
    Context cpu(2, "cpu");
    auto unfused = unfused_context(/*compose_head=*/false);
    const Config c = testing::small_config(mode, {{"vocab_size", 301}});
    Model ref(cpu, c, 2, 8), got(*unfused, c, 2, 8);
    Rng r1(9), r2(9);
    ref.init(r1);
    got.init(r2);
    for (Model* m : {&ref, &got}) {
      for (const TensorSpec& s : m->layout().specs()) {
        if (s.name.find("res_proj") == std::string::npos) continue;
        for (int64_t i = 0; i < s.numel; ++i) m->params()[s.offset + i] = 0.3f * std::sin(0.7f * static_cast<float>(i));
      }
    }
    std::vector<int32_t> in(16), tg(16);
    for (int64_t i = 0; i < 16; ++i) in[i] = static_cast<int32_t>((5 * i + 1) % c.V), tg[i] = in[(i + 3) % 16];
    ref.zero_grad();
    got.zero_grad();
    EXPECT_EQ(ref.forward_backward(in.data(), tg.data(), true), got.forward_backward(in.data(), tg.data(), true));
    const size_t bytes = static_cast<size_t>(ref.layout().total()) * sizeof(float);
    EXPECT_EQ(0, std::memcmp(ref.grads(), got.grads(), bytes));
  }
}

}  // namespace
}  // namespace attnres
