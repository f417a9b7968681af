// backend_ops_test.cpp — every op of the list (ops/op_list.h) on every backend
// configuration against the reference, from one table with a case per op
// (ggml's test-backend-ops is the model).  A case makes its inputs from fixed
// seeds, runs the op, and returns each output as floats; it runs on each
// configuration of testing::backend_params() (the CPU at each vector level
// this machine has, the guarded CPU, the partial backend) and on the
// reference, the CPU backend at the x86-64 level with one thread, and the
// outputs agree within the case's tolerance, relative to the largest
// |output| (levels sum in other orders; the guarded and partial backends run
// the CPU's kernels and agree to the bit with the CPU of their level).  The
// math of each op is ops_test.cpp's, products_test.cpp's and
// routing_test.cpp's; this table is what a new backend is held to, and a test
// fails while an op of the list has no case in it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "ops/backend.h"
#include "ops/context.h"
#include "ops/route_types.h"
#include "testing/check.h"

namespace attnres {
namespace {

using testing::dev;
using testing::DeviceVec;
using testing::randn;
using Outputs = std::vector<std::vector<float>>;

constexpr double kFp32 = 1e-5;  // float32 kernels at another vector level: other orders of the same sums
// A bf16 rounding of a float32 value that another level computes in another
// order can land one bf16 unit (2^-8 relative) away: attention's P and dS,
// the LM head's dlogits, AdamW's bf16 copy.
constexpr double kBf16 = 1e-2;

std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_float(x[i]);
  return out;
}
std::vector<bf16> narrow(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16(x[i]);
  return out;
}
bool has_bf16(const Backend& ops) { return ops.unsupported(Precision::kBF16).empty(); }

struct OpCase {
  Op op;
  const char* what;  // the variant, for the failure message
  double tol;
  std::function<Outputs(Backend&)> run;
};

// The router of the routing cases: S = 3 sources (the first a broadcast null
// source) of N × d, H heads, with their rstd, in backend memory.
struct Router {
  static constexpr int64_t N = 7, d = 16, S = 3, H = 2;
  std::vector<DeviceVec<float>> v, rstd;
  DeviceVec<RouteSource> src;
  DeviceVec<float> w, gamma, base, gate, logits, out;
  explicit Router(Backend& ops)
      : src(ops, S), w(dev(ops, randn(d, 31, 0.5))), gamma(dev(ops, randn(d, 32, 0.5))),
        base(dev(ops, randn(N * d, 33))), gate(dev(ops, std::vector<float>{0.7f})), logits(ops, N * H * S),
        out(ops, N * d) {
    ops.context().reserve(ops.route_workspace(N, d, S, H));
    std::vector<RouteSource> list;
    for (int64_t i = 0; i < S; ++i) {
      const int64_t rows = i == 0 ? 1 : N;
      v.push_back(dev(ops, randn(rows * d, 40 + i)));
      rstd.emplace_back(ops, rows);
      ops.source_rstd(rstd.back().data(), v.back().data(), rows, d, 1e-6f);
      list.push_back({v.back().data(), rstd.back().data(), i == 0});
    }
    src.upload(list);
  }
  void forward(Backend& ops, Combine c) {
    ops.route_forward(out.data(), logits.data(), src.data(), S, H, w.data(), gamma.data(), base.data(), gate.data(),
                      c, N, d);
  }
};

std::vector<OpCase> cases() {
  std::vector<OpCase> k;
  // ---- products ----
  k.push_back({Op::k_to_bf16, "", 0, [](Backend& ops) {
                 const auto x = randn(1031, 1, 3.0);
                 auto x_d = dev(ops, x);
                 DeviceVec<bf16> y(ops, x.size());
                 ops.to_bf16(y.data(), x_d.data(), static_cast<int64_t>(x.size()));
                 return Outputs{widen(y.host())};
               }});
  for (Precision p : {Precision::kF32, Precision::kBF16}) {
    const double tol = p == Precision::kF32 ? kFp32 : kFp32;  // bf16 products: oneDNN at every level
    k.push_back({Op::k_matmul_forward, precision_name(p), tol, [p](Backend& ops) {
                   if (p == Precision::kBF16 && !has_bf16(ops)) return Outputs{};
                   const int64_t N = 37, I = 24, O = 13;
                   const auto w = randn(O * I, 2);
                   auto x = dev(ops, randn(N * I, 3));
                   auto w32 = dev(ops, w);
                   auto w16 = dev(ops, narrow(w));
                   const Weight W = p == Precision::kBF16 ? Weight(w16.data()) : Weight(w32.data());
                   ops.context().reserve(ops.matmul_workspace(N, I, O, p));
                   DeviceVec<float> out(ops, N * O), few(ops, 3 * O);
                   ops.matmul_forward(out.data(), x.data(), W, N, I, O);
                   ops.matmul_forward(few.data(), x.data(), W, 3, I, O);  // few rows: the streaming kernel
                   return Outputs{out.host(), few.host()};
                 }});
    k.push_back({Op::k_matmul_backward, precision_name(p), tol, [p](Backend& ops) {
                   if (p == Precision::kBF16 && !has_bf16(ops)) return Outputs{};
                   const int64_t N = 37, I = 24, O = 13;
                   const auto w = randn(O * I, 4);
                   auto x = dev(ops, randn(N * I, 5)), dy = dev(ops, randn(N * O, 6));
                   auto w32 = dev(ops, w);
                   auto w16 = dev(ops, narrow(w));
                   const Weight W = p == Precision::kBF16 ? Weight(w16.data()) : Weight(w32.data());
                   ops.context().reserve(ops.matmul_workspace(N, I, O, p));
                   auto dx = dev(ops, randn(N * I, 7)), dw = dev(ops, randn(O * I, 8));
                   ops.matmul_backward(dx.data(), dw.data(), dy.data(), x.data(), W, N, I, O, /*accumulate_dinp=*/true);
                   return Outputs{dx.host(), dw.host()};
                 }});
  }
  // ---- elementwise, norms, SwiGLU, embedding ----
  k.push_back({Op::k_copy, "", 0, [](Backend& ops) {
                 auto x = dev(ops, randn(77, 9));
                 DeviceVec<float> y(ops, 77);
                 ops.copy(y.data(), x.data(), 77);
                 return Outputs{y.host()};
               }});
  k.push_back({Op::k_fill, "", 0, [](Backend& ops) {
                 DeviceVec<float> y(ops, 77);
                 ops.fill(y.data(), -2.5f, 77);
                 return Outputs{y.host()};
               }});
  k.push_back({Op::k_rmsnorm_forward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 9, C = 37;
                 auto x = dev(ops, randn(N * C, 10)), w = dev(ops, randn(C, 11));
                 DeviceVec<float> y(ops, N * C), r(ops, N);
                 DeviceVec<bf16> y16(ops, N * C);
                 ops.rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6f);
                 ops.rmsnorm_forward(y16.data(), nullptr, x.data(), w.data(), N, C, 1e-6f);
                 return Outputs{y.host(), r.host(), widen(y16.host())};
               }});
  k.push_back({Op::k_rmsnorm_backward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 9, C = 37;
                 auto x = dev(ops, randn(N * C, 12)), w = dev(ops, randn(C, 13)), dy = dev(ops, randn(N * C, 14));
                 DeviceVec<float> y(ops, N * C), r(ops, N);
                 ops.rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6f);
                 auto dx = dev(ops, randn(N * C, 15)), dw = dev(ops, randn(C, 16));
                 ops.rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), r.data(), N, C, true);
                 return Outputs{dx.host(), dw.host()};
               }});
  k.push_back({Op::k_swiglu_forward, "", kFp32, [](Backend& ops) {
                 auto g = dev(ops, randn(301, 17, 3.0)), u = dev(ops, randn(301, 18));
                 DeviceVec<float> h(ops, 301);
                 ops.swiglu_forward(h.data(), g.data(), u.data(), 301);
                 return Outputs{h.host()};
               }});
  k.push_back({Op::k_swiglu_backward, "", kFp32, [](Backend& ops) {
                 auto g = dev(ops, randn(301, 19, 3.0)), u = dev(ops, randn(301, 20)), dh = dev(ops, randn(301, 21));
                 DeviceVec<float> dg(ops, 301), du(ops, 301);
                 ops.swiglu_backward(dg.data(), du.data(), dh.data(), g.data(), u.data(), 301);
                 return Outputs{dg.host(), du.host()};
               }});
  k.push_back({Op::k_embedding_forward, "", 0, [](Backend& ops) {
                 auto table = dev(ops, randn(11 * 6, 22));
                 auto tok = dev(ops, std::vector<int32_t>{3, 0, 10, 3, 7});
                 DeviceVec<float> y(ops, 5 * 6);
                 ops.embedding_forward(y.data(), tok.data(), table.data(), 5, 6);
                 return Outputs{y.host()};
               }});
  k.push_back({Op::k_embedding_backward, "", kFp32, [](Backend& ops) {
                 auto dtable = dev(ops, randn(11 * 6, 23)), dy = dev(ops, randn(5 * 6, 24));
                 auto tok = dev(ops, std::vector<int32_t>{3, 0, 10, 3, 7});
                 ops.embedding_backward(dtable.data(), dy.data(), tok.data(), 5, 6);
                 return Outputs{dtable.host()};
               }});
  k.push_back({Op::k_add_inplace, "", 0, [](Backend& ops) {
                 auto y = dev(ops, randn(77, 25)), x = dev(ops, randn(77, 26));
                 ops.add_inplace(y.data(), x.data(), 77);
                 return Outputs{y.host()};
               }});
  k.push_back({Op::k_add, "", 0, [](Backend& ops) {
                 auto a = dev(ops, randn(77, 27)), b = dev(ops, randn(77, 28));
                 DeviceVec<float> y(ops, 77);
                 ops.add(y.data(), a.data(), b.data(), 77);
                 return Outputs{y.host()};
               }});
  k.push_back({Op::k_sub, "", 0, [](Backend& ops) {
                 auto a = dev(ops, randn(77, 29)), b = dev(ops, randn(77, 30));
                 ops.sub(a.data(), a.data(), b.data(), 77);  // aliased
                 return Outputs{a.host()};
               }});
  k.push_back({Op::k_scale, "", 0, [](Backend& ops) {
                 auto x = dev(ops, randn(77, 31));
                 ops.scale(x.data(), -0.375f, 77);
                 return Outputs{x.host()};
               }});
  k.push_back({Op::k_sum_squares, "", kFp32, [](Backend& ops) {
                 auto x = dev(ops, randn(70001, 32));
                 return Outputs{{static_cast<float>(ops.sum_squares(x.data(), 70001))}};
               }});
  // ---- attention ----
  k.push_back({Op::k_rope_tables, "", kFp32, [](Backend& ops) {
                 DeviceVec<float> c(ops, 9 * 4), s(ops, 9 * 4);
                 ops.rope_tables(c.data(), s.data(), 9, 8, 1e4);
                 return Outputs{c.host(), s.host()};
               }});
  for (bool at_positions : {false, true}) {
    k.push_back({Op::k_rope_forward, at_positions ? "positions" : "", kFp32, [at_positions](Backend& ops) {
                   const int64_t B = 2, T = 3, heads = 2, hd = 8;
                   DeviceVec<float> c(ops, 9 * 4), s(ops, 9 * 4);
                   ops.rope_tables(c.data(), s.data(), 9, hd, 1e4);
                   auto x = dev(ops, randn(B * T * heads * hd, 33));
                   auto pos = dev(ops, std::vector<int64_t>{4, 1});
                   ops.rope_forward(x.data(), c.data(), s.data(), B, T, heads, hd, at_positions ? pos.data() : nullptr);
                   return Outputs{x.host()};
                 }});
  }
  k.push_back({Op::k_rope_backward, "", kFp32, [](Backend& ops) {
                 const int64_t B = 2, T = 3, heads = 2, hd = 8;
                 DeviceVec<float> c(ops, T * 4), s(ops, T * 4);
                 ops.rope_tables(c.data(), s.data(), T, hd, 1e4);
                 auto dx = dev(ops, randn(B * T * heads * hd, 34));
                 ops.rope_backward(dx.data(), c.data(), s.data(), B, T, heads, hd);
                 return Outputs{dx.host()};
               }});
  k.push_back({Op::k_kv_cache_store, "", 0, [](Backend& ops) {
                 const int64_t B = 2, T = 2, P = 6, w = 8;
                 auto cache = dev(ops, randn(3 * P * w, 35)), x = dev(ops, randn(B * T * w, 36));
                 auto slot = dev(ops, std::vector<int64_t>{2, 0}), pos = dev(ops, std::vector<int64_t>{1, 4});
                 ops.kv_cache_store(cache.data(), x.data(), slot.data(), pos.data(), B, T, P, w);
                 return Outputs{cache.host()};
               }});
  for (Precision p : {Precision::kF32, Precision::kBF16}) {
    const double tol = p == Precision::kF32 ? kFp32 : kBf16;
    k.push_back({Op::k_attention_forward, precision_name(p), tol, [p](Backend& ops) {
                   if (p == Precision::kBF16 && !has_bf16(ops)) return Outputs{};
                   const int64_t B = 2, T = 19, H = 4, KV = 2, hd = 16;
                   auto q = dev(ops, randn(B * T * H * hd, 37)), kk = dev(ops, randn(B * T * KV * hd, 38)),
                        v = dev(ops, randn(B * T * KV * hd, 39));
                   ops.context().reserve(ops.attention_workspace(T, hd, p));
                   DeviceVec<float> y(ops, B * T * H * hd), lse(ops, B * H * T);
                   ops.attention_forward(y.data(), lse.data(), q.data(), {kk.data(), v.data(), T * KV * hd}, B, T, H,
                                         KV, hd, p);
                   return Outputs{y.host(), lse.host()};
                 }});
    k.push_back({Op::k_attention_backward, precision_name(p), tol, [p](Backend& ops) {
                   if (p == Precision::kBF16 && !has_bf16(ops)) return Outputs{};
                   const int64_t B = 2, T = 19, H = 4, KV = 2, hd = 16;
                   auto q = dev(ops, randn(B * T * H * hd, 40)), kk = dev(ops, randn(B * T * KV * hd, 41)),
                        v = dev(ops, randn(B * T * KV * hd, 42)), dy = dev(ops, randn(B * T * H * hd, 43));
                   ops.context().reserve(ops.attention_workspace(T, hd, p));
                   DeviceVec<float> y(ops, B * T * H * hd), lse(ops, B * H * T);
                   ops.attention_forward(y.data(), lse.data(), q.data(), {kk.data(), v.data(), T * KV * hd}, B, T, H,
                                         KV, hd, p);
                   DeviceVec<float> dq(ops, B * T * H * hd), dk(ops, B * T * KV * hd), dv(ops, B * T * KV * hd);
                   ops.attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), kk.data(), v.data(),
                                          y.data(), lse.data(), B, T, H, KV, hd, p);
                   return Outputs{dq.host(), dk.host(), dv.host()};
                 }});
  }
  // ---- LM head ----
  for (Precision p : {Precision::kF32, Precision::kBF16}) {
    const double tol = p == Precision::kF32 ? kFp32 : kBf16;
    k.push_back({Op::k_lm_head_loss, precision_name(p), tol, [p](Backend& ops) {
                   if (p == Precision::kBF16 && !has_bf16(ops)) return Outputs{};
                   const int64_t N = 300, C = 16, V = 53;  // N: more than one chunk of rows
                   const auto w = randn(V * C, 44);
                   auto x = dev(ops, randn(N * C, 45));
                   auto w32 = dev(ops, w);
                   auto w16 = dev(ops, narrow(w));
                   const Weight W = p == Precision::kBF16 ? Weight(w16.data()) : Weight(w32.data());
                   std::vector<int32_t> t(N);
                   for (int64_t i = 0; i < N; ++i) t[i] = i == 5 ? -1 : static_cast<int32_t>((i * 7) % V);
                   auto targets = dev(ops, t);
                   ops.context().reserve(ops.lm_head_workspace(C, V, p));
                   DeviceVec<float> dx(ops, N * C), losses(ops, N);
                   auto dw = dev(ops, randn(V * C, 46));
                   DeviceVec<uint8_t> greedy(ops, N);
                   const double sum = ops.lm_head_loss(dx.data(), dw.data(), x.data(), W, targets.data(), N, C, V,
                                                       1.0f / N, losses.data(), greedy.data());
                   std::vector<float> g;
                   for (uint8_t b : greedy.host()) g.push_back(b);
                   return Outputs{{static_cast<float>(sum)}, dx.host(), dw.host(), losses.host(), g};
                 }});
  }
  k.push_back({Op::k_cross_entropy, "", kFp32, [](Backend& ops) {
                 const int64_t N = 9, V = 301;  // V: more than one block of 256
                 auto z = dev(ops, randn(N * V, 48));
                 std::vector<int32_t> t(N);
                 for (int64_t i = 0; i < N; ++i) t[i] = i == 2 ? -1 : static_cast<int32_t>((i * 37) % V);
                 auto targets = dev(ops, t);
                 DeviceVec<float> dz(ops, N * V), losses(ops, N);
                 DeviceVec<uint8_t> greedy(ops, N);
                 const double sum = ops.cross_entropy(dz.data(), z.data(), targets.data(), N, V, 0.5f, losses.data(),
                                                      greedy.data());
                 std::vector<float> g;
                 for (uint8_t b : greedy.host()) g.push_back(b);
                 return Outputs{{static_cast<float>(sum)}, dz.host(), losses.host(), g};
               }});
  // ---- routing ----
  k.push_back({Op::k_source_rstd, "", kFp32, [](Backend& ops) {
                 auto v = dev(ops, randn(7 * 37, 47));
                 DeviceVec<float> r(ops, 7);
                 ops.source_rstd(r.data(), v.data(), 7, 37, 1e-6f);
                 return Outputs{r.host()};
               }});
  for (Combine c : {Combine::kReplace, Combine::kAdd}) {
    const char* what = c == Combine::kReplace ? "replace" : "add";
    k.push_back({Op::k_route_forward, what, kFp32, [c](Backend& ops) {
                   Router R(ops);
                   DeviceVec<double> stats(ops, route_stats_size(Router::S, Router::H));
                   ops.route_forward(R.out.data(), R.logits.data(), R.src.data(), Router::S, Router::H, R.w.data(),
                                     R.gamma.data(), R.base.data(), R.gate.data(), c, Router::N, Router::d,
                                     stats.data());
                   std::vector<float> st;
                   for (double s : stats.host()) st.push_back(static_cast<float>(s));
                   return Outputs{R.out.host(), R.logits.host(), st};
                 }});
    k.push_back({Op::k_route_mix, what, kFp32, [c](Backend& ops) {
                   Router R(ops);
                   R.forward(ops, c);
                   ops.route_mix(R.out.data(), R.logits.data(), R.src.data(), Router::S, Router::H, R.base.data(),
                                 R.gate.data(), c, Router::N, Router::d);
                   return Outputs{R.out.host()};
                 }});
    k.push_back({Op::k_route_mix_weights, what, kFp32, [c](Backend& ops) {
                   Router R(ops);
                   auto weights = dev(ops, std::vector<double>{0.5, 0.25, 0.25, 0.1, 0.6, 0.3});  // (H, S)
                   ops.route_mix_weights(R.out.data(), weights.data(), R.src.data(), Router::S, Router::H,
                                         R.base.data(), R.gate.data(), c, Router::N, Router::d);
                   return Outputs{R.out.host()};
                 }});
    k.push_back({Op::k_route_backward, what, kFp32, [c](Backend& ops) {
                   Router R(ops);
                   R.forward(ops, c);
                   const int64_t N = Router::N, d = Router::d;
                   auto dout = dev(ops, randn(N * d, 48));
                   std::vector<DeviceVec<float>> dsrc;
                   std::vector<float*> list;
                   for (int64_t i = 0; i < Router::S; ++i) {
                     dsrc.push_back(dev(ops, randn(i == 0 ? d : N * d, 49 + i)));
                     list.push_back(dsrc.back().data());
                   }
                   auto dsrc_list = dev(ops, list);
                   auto dbase = dev(ops, randn(N * d, 53));
                   auto dw = dev(ops, randn(d, 54)), dgamma = dev(ops, randn(d, 55));
                   auto dgate = dev(ops, std::vector<float>{0.25f});
                   ops.route_backward(dsrc_list.data(), dbase.data(), dw.data(), dgamma.data(), dgate.data(),
                                      dout.data(), R.logits.data(), R.src.data(), Router::S, Router::H, R.w.data(),
                                      R.gamma.data(), R.base.data(), R.gate.data(), c, N, d, nullptr,
                                      /*accumulate_src=*/true, /*entropy_scale=*/0.3f);
                   Outputs out{dbase.host(), dw.host(), dgamma.host(), dgate.host()};
                   for (auto& x : dsrc) out.push_back(x.host());
                   return out;
                 }});
  }
  k.push_back({Op::k_route_mix_stream, "", kFp32, [](Backend& ops) {
                 Router R(ops);
                 R.forward(ops, Combine::kAdd);
                 ops.route_mix_stream(R.out.data(), R.logits.data(), R.src.data(), Router::S, Router::H, R.gate.data(),
                                      Router::N, Router::d);
                 return Outputs{R.out.host()};
               }});
  k.push_back({Op::k_route_entropy, "", kFp32, [](Backend& ops) {
                 Router R(ops);
                 R.forward(ops, Combine::kAdd);
                 auto sum = dev(ops, std::vector<double>{0.5});
                 ops.route_entropy(sum.data(), R.logits.data(), Router::S, Router::H, Router::N);
                 return Outputs{{static_cast<float>(sum.host()[0])}};
               }});
  k.push_back({Op::k_sigmoid_forward, "", kFp32, [](Backend& ops) {
                 auto x = dev(ops, randn(301, 60, 4.0));
                 DeviceVec<float> y(ops, 301);
                 ops.sigmoid_forward(y.data(), x.data(), 301);
                 return Outputs{y.host()};
               }});
  k.push_back({Op::k_sigmoid_backward, "", kFp32, [](Backend& ops) {
                 auto x = dev(ops, randn(301, 61, 4.0)), dy = dev(ops, randn(301, 62)), dx = dev(ops, randn(301, 63));
                 DeviceVec<float> y(ops, 301);
                 ops.sigmoid_forward(y.data(), x.data(), 301);
                 ops.sigmoid_backward(dx.data(), dy.data(), y.data(), 301);
                 return Outputs{dx.host()};
               }});
  k.push_back({Op::k_gate_vector_forward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 70, d = 7;
                 auto u = dev(ops, randn(N * d, 64)), g = dev(ops, randn(N * d, 65, 2.0)), b = dev(ops, randn(d, 66)),
                      x = dev(ops, randn(N * d, 67));
                 DeviceVec<float> diff(ops, N * d);
                 ops.gate_vector_forward(u.data(), g.data(), diff.data(), b.data(), x.data(), N, d);
                 return Outputs{u.host(), g.host(), diff.host()};
               }});
  k.push_back({Op::k_gate_vector_backward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 70, d = 7;
                 ops.context().reserve(4 * N * d);
                 auto du = dev(ops, randn(N * d, 68)), diff = dev(ops, randn(N * d, 70)), db = dev(ops, randn(d, 71));
                 std::vector<float> g0 = randn(N * d, 69);
                 for (float& e : g0) e = 1.0f / (1.0f + std::exp(-e));
                 auto g = dev(ops, g0);
                 DeviceVec<float> dh(ops, N * d), dpre(ops, N * d), dx(ops, N * d);
                 ops.gate_vector_backward(dh.data(), dpre.data(), db.data(), dx.data(), du.data(), g.data(), diff.data(),
                                          N, d);
                 return Outputs{dh.host(), dpre.host(), db.host(), dx.host()};
               }});
  k.push_back({Op::k_sigmoid_gate_forward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 70, d = 7;
                 auto pre = dev(ops, randn(N * d, 72, 2.0)), b = dev(ops, randn(d, 73));
                 DeviceVec<float> g(ops, N * d);
                 ops.sigmoid_gate_forward(g.data(), pre.data(), b.data(), N, d);
                 return Outputs{g.host()};
               }});
  k.push_back({Op::k_sigmoid_gate_backward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 70, d = 7;
                 ops.context().reserve(4 * N * d);
                 std::vector<float> g0 = randn(N * d, 74);
                 for (float& e : g0) e = 1.0f / (1.0f + std::exp(-e));
                 auto g = dev(ops, g0), dg = dev(ops, randn(N * d, 75)), db = dev(ops, randn(d, 76));
                 DeviceVec<float> dpre(ops, N * d);
                 ops.sigmoid_gate_backward(dpre.data(), db.data(), dg.data(), g.data(), N, d);
                 return Outputs{dpre.host(), db.host()};
               }});
  k.push_back({Op::k_gated_source_forward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 70, d = 7;
                 auto g = dev(ops, randn(N * d, 77)), v = dev(ops, randn(N * d, 78));
                 DeviceVec<float> y(ops, N * d), r(ops, N);
                 ops.gated_source_forward(y.data(), r.data(), g.data(), v.data(), N, d, 1e-6f);
                 return Outputs{y.host(), r.host()};
               }});
  k.push_back({Op::k_gated_source_backward, "", kFp32, [](Backend& ops) {
                 const int64_t N = 70, d = 7;
                 auto g = dev(ops, randn(N * d, 79)), v = dev(ops, randn(N * d, 80)), dy = dev(ops, randn(N * d, 81)),
                      dv = dev(ops, randn(N * d, 82)), dg = dev(ops, randn(N * d, 83));
                 ops.gated_source_backward(dv.data(), dg.data(), dy.data(), g.data(), v.data(), N, d, true);
                 return Outputs{dv.host(), dg.host()};
               }});
  // ---- optimizer ----
  for (bool copy16 : {false, true}) {  // the float32 state, then the bf16 copy (kBf16: a rounding of it)
    k.push_back({Op::k_adamw_update, copy16 ? "bf16 copy" : "", copy16 ? kBf16 : kFp32, [copy16](Backend& ops) {
                   const int64_t n = 1001;
                   auto v0 = randn(n, 56, 0.1);
                   for (float& e : v0) e *= e;
                   auto p = dev(ops, randn(n, 57)), g = dev(ops, randn(n, 58)), m = dev(ops, randn(n, 59, 0.1)),
                        v = dev(ops, v0);
                   DeviceVec<bf16> p16(ops, n);
                   ops.adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                                    {0.9f, 0.95f, 1e-8f, 0.999f, 1e-3f, 1.1f}, copy16 ? p16.data() : nullptr);
                   if (copy16) return Outputs{widen(p16.host())};
                   return Outputs{p.host(), m.host(), v.host()};
                 }});
  }
  return k;
}

// The largest |got − want| relative to max(1, max |want|), over one output.
double relative_gap(const std::vector<float>& got, const std::vector<float>& want) {
  double gap = 0, scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    gap = std::max(gap, std::isnan(d) ? INFINITY : d);
  }
  return gap / scale;
}

// A test fails while an op of the list has no case.
TEST(BackendOps, EveryOpOfTheListHasACase) {
  const std::vector<OpCase> all = cases();
  std::string missing;
  for (int i = 0; i < kOps; ++i)
    if (std::none_of(all.begin(), all.end(), [&](const OpCase& c) { return static_cast<int>(c.op) == i; }))
      missing += cat(missing.empty() ? "" : ", ", op_name(static_cast<Op>(i)));
  EXPECT_TRUE(missing.empty()) << "ops of ops/op_list.h with no case in backend_ops_test.cpp: " << missing;
}

class BackendOps : public testing::OnBackend {};

TEST_P(BackendOps, EveryOpAgreesWithTheReference) {
  static Context reference(1, "cpu", "x86-64");
  for (const OpCase& c : cases()) {
    const std::string name = cat(op_name(c.op), c.what[0] ? " " : "", c.what);
    const Outputs want = c.run(reference.ops());
    const Outputs got = c.run(ops);
    if (want.empty() || got.empty()) {  // a precision one side cannot run (bf16 without the instructions)
      EXPECT_EQ(got.empty(), !has_bf16(ops)) << name;
      continue;
    }
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size()) << name << ", output " << i;
      EXPECT_LE(relative_gap(got[i], want[i]), c.tol) << name << ", output " << i << " on " << GetParam().name;
    }
  }
}

ATTNRES_ON_BACKENDS(BackendOps);

}  // namespace
}  // namespace attnres
