// partial_backend_test.cpp — a backend written from its first op: a toy
// backend that has host memory and two ops of its own (embedding_forward,
// add_inplace) and nothing else.  Alone, every other op is a clear error naming the op and the
// backend; under a PartialBackend the CPU runs the rest, and a model trains
// on it to the CPU's bits in every mode, with the seam counted per op.
#include "ops/partial_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "model/model.h"
#include "ops/context.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_level.h"
#include "testing/check.h"
#include "testing/configs.h"

namespace attnres {
namespace {

class ToyBackend final : public Backend {
 public:
  explicit ToyBackend(Context& ctx) : Backend(ctx) {}
  const char* name() const override { return "toy"; }
  const char* kernels() const override { return "toy"; }
  const char* attention_tiles() const override { return "none"; }
  std::string unsupported(Precision p) const override {
    return p == Precision::kBF16 ? "the toy backend has no bf16 products" : "";
  }
  double peak_gflops(Precision) const override { return 1.0; }
  const char* peak_name(Precision) const override { return "toy"; }
  bool supports(Op op, Precision) const override { return op == Op::k_embedding_forward || op == Op::k_add_inplace; }
  int64_t matmul_workspace(int64_t, int64_t, int64_t, Precision) const override { return 0; }
  int64_t attention_workspace(int64_t, int64_t, Precision) const override { return 0; }
  int64_t lm_head_workspace(int64_t, int64_t, Precision) const override { return 0; }
  int64_t route_workspace(int64_t, int64_t, int64_t, int64_t) const override { return 0; }

  Buffer alloc(size_t bytes, bool lazy) override { return Buffer::host_bytes(bytes, lazy); }
  void synchronize() override {}
  void* map(void* p, size_t) override { return p; }
  void unmap(void*, size_t) override {}
  void upload(void* dst, const void* host_src, size_t bytes) override { std::memcpy(dst, host_src, bytes); }
  void download(void* host_dst, const void* src, size_t bytes) override { std::memcpy(host_dst, src, bytes); }

  // Its two ops, written plainly (the CPU's bits: one rounding per element).
  void embedding_forward_impl(float* out, const int32_t* tokens, Weight table, int64_t N, int64_t C) override {
    ++calls;
    ATTNRES_CHECK(table.f32, "the toy backend's embedding reads float32 tables");
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < C; ++c) out[i * C + c] = table.f32[static_cast<int64_t>(tokens[i]) * C + c];
  }
  void add_inplace_impl(float* y, const float* x, int64_t n) override {
    ++calls;
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  int64_t calls = 0;
};

ToyBackend* toy_of(Context& ctx) {
  auto* partial = dynamic_cast<PartialBackend*>(&ctx.ops());
  return partial ? dynamic_cast<ToyBackend*>(&partial->primary()) : dynamic_cast<ToyBackend*>(&ctx.ops());
}

std::unique_ptr<Context> toy_context(bool partial) {
  return std::make_unique<Context>(1, [partial](Context& c) -> std::unique_ptr<Backend> {
    auto toy = std::make_unique<ToyBackend>(c);
    if (!partial) return toy;
    return std::make_unique<PartialBackend>(c, std::move(toy), make_cpu_backend(c, cpu_level_detected()));
  });
}


TEST(PartialBackend, AnOpABackendLacksIsAClearError) {
  auto ctx = toy_context(false);
  Backend& ops = ctx->ops();
  Buffer a = ops.alloc(64), b = ops.alloc(64);
  ops.add_inplace(a.as<float>(), b.as<float>(), 16);  // its own
  EXPECT_EQ(toy_of(*ctx)->calls, 1);
  try {
    ops.rmsnorm_forward(a.as<float>(), nullptr, b.as<float>(), b.as<float>(), 1, 16, 1e-6f);
    FAIL() << "rmsnorm_forward ran on the toy backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op rmsnorm_forward: not implemented by the toy backend"), std::string::npos)
        << e.what();
  }
}

// The op's entry checks its arguments before any backend's implementation
// runs (op_checks.cpp): the toy backend, which writes no check, refuses a
// bad call with the check's message — for an op it lacks, before saying it
// lacks it; for its own op, before running it.
TEST(PartialBackend, TheEntryChecksArgumentsForEveryBackend) {
  auto ctx = toy_context(false);
  Backend& ops = ctx->ops();
  Buffer a = ops.alloc(256), b = ops.alloc(256);
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Weight w3x4(b.as<float>(), 3, 4);
  EXPECT_NE(message([&] { ops.matmul_forward(a.as<float>(), b.as<float>(), w3x4, 2, 4, 5); })
                .find("matmul_forward: a 3 x 4 weight for 5 x 4"),
            std::string::npos);
  EXPECT_NE(message([&] { ops.matmul_forward(a.as<float>(), b.as<float>(), w3x4, 2, 4, 3); })
                .find("op matmul_forward: not implemented by the toy backend"),
            std::string::npos);
  EXPECT_NE(message([&] { ops.add_inplace(a.as<float>(), b.as<float>(), -1); }).find("add_inplace: a negative size -1"),
            std::string::npos);
  EXPECT_EQ(toy_of(*ctx)->calls, 0);
  EXPECT_NE(message([&] {
              ops.route_mix(a.as<float>(), b.as<float>(), reinterpret_cast<const RouteSource*>(b.data()), 1, 3,
                            nullptr, nullptr, Combine::kAdd, 1, 16);
            }).find("route_mix: routing heads 3 for d = 16"),
            std::string::npos);
  EXPECT_NE(message([&] {
              ops.route_mix(a.as<float>(), b.as<float>(), reinterpret_cast<const RouteSource*>(b.data()), 1, 2,
                            nullptr, nullptr, Combine::kAdd, 1, 16);
            }).find("route_mix: this combination needs a base"),
            std::string::npos);
}

// A model on the toy backend beside the CPU: the losses and every gradient
// of the CPU to the bit; the toy ran its ops, and everything else crossed
// the seam (counted per op, none for the toy's own).
TEST(PartialBackend, AModelOnAToyBackendGivesTheCpusBits) {
  const int64_t B = 2, T = 8;
  for (const char* mode : {"baseline", "block", "full", "delta", "delta_block", "block_add", "delta_mh"}) {
    const Config c = testing::small_config(mode);
    Context cpu(1, "cpu");
    auto toy = toy_context(true);
    Model ref(cpu, c, B, T), got(*toy, c, B, T);
    Rng r1(5), r2(5);
    ref.init(r1);
    got.init(r2);
    std::vector<int32_t> in(B * T), tg(B * T);
    for (int64_t i = 0; i < B * T; ++i) in[i] = static_cast<int32_t>((7 * i + 3) % c.V), tg[i] = in[(i + 1) % (B * T)];
    for (int step = 0; step < 2; ++step) {  // twice: nothing left over from the first pass
      ref.zero_grad();
      got.zero_grad();
      const double want = ref.forward_backward(in.data(), tg.data(), true);
      EXPECT_EQ(got.forward_backward(in.data(), tg.data(), true), want) << mode;
      const int64_t n = ref.layout().total();
      EXPECT_EQ(0, std::memcmp(ref.grads(), got.grads(), static_cast<size_t>(n) * sizeof(float))) << mode;
    }
    const PartialBackend* p = partial_backend(*toy);
    ASSERT_NE(p, nullptr);
    EXPECT_GT(toy_of(*toy)->calls, 0) << mode;
    EXPECT_GT(p->seam()[static_cast<size_t>(Op::k_matmul_forward)], 0) << mode;
    EXPECT_GT(p->seam()[static_cast<size_t>(Op::k_attention_backward)], 0) << mode;
    EXPECT_EQ(p->seam()[static_cast<size_t>(Op::k_add_inplace)], 0) << mode;
    EXPECT_EQ(p->seam()[static_cast<size_t>(Op::k_embedding_forward)], 0) << mode;
  }
}

// The partial device of the command line: ops declared unsupported by name,
// each checked, and only on cpu-guarded.
TEST(PartialBackend, TheDeviceSpellingIsCheckedOpByOp) {
  EXPECT_NO_THROW(check_device(testing::partial_device()));
  Context ctx(1, "cpu-guarded:unsupported=matmul_forward,add");
  const PartialBackend* p = partial_backend(ctx);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(p->primary().supports(Op::k_matmul_forward, Precision::kF32));
  EXPECT_TRUE(p->primary().supports(Op::k_matmul_backward, Precision::kF32));
  auto error_of = [](const std::string& device) {
    try {
      check_device(device);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("cpu-guarded:unsupported=matmul").find("no op 'matmul' (the ops: to_bf16, matmul_forward"),
            std::string::npos);
  EXPECT_NE(error_of("cpu:unsupported=add").find("only cpu-guarded takes an option"), std::string::npos);
  EXPECT_NE(error_of("cpu-guarded:unsupported=").find("only cpu-guarded takes an option"), std::string::npos);
  EXPECT_NE(error_of("cpu-guarded:unsupported=add,,copy").find("no op ''"), std::string::npos);
}

}  // namespace
}  // namespace attnres
