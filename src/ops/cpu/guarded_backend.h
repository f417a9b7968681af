// guarded_backend.h — the CPU backend with its memory locked: a test backend
// ("cpu-guarded") whose allocations the host cannot read or write except
// inside an op or an explicit transfer.
//
// Every allocation is mapped PROT_NONE.  Each op and each upload/download
// unlocks all of this backend's allocations for the call (PROT_READ|WRITE)
// and locks them again when it returns, and map() … unmap() keeps them open
// between (a counter lets an op call another, and views nest).
// The kernels are CpuBackend's, so results are its bits; what changes is that
// a host access that bypasses the interface — reading an arena in place, as a
// GPU backend would not allow — faults (SIGSEGV) in a test instead of waiting
// for a GPU to find it.  Not a --device: backend_names() lists the devices a
// user chooses; make_backend("cpu-guarded") builds this one for tests.
#pragma once

#include "ops/cpu/cpu_backend.h"

namespace attnres {

class GuardedCpuBackend final : public CpuBackend {
 public:
  explicit GuardedCpuBackend(Context& ctx) : CpuBackend(ctx) {}
  const char* name() const override { return "cpu-guarded"; }

  Buffer alloc(size_t bytes, bool lazy) override;
  void synchronize() override {}
  void* map(void* p, size_t bytes) override;   // opens the memory until unmap
  void unmap(void* p, size_t bytes) override;
  void copy(float* dst, const float* src, int64_t n) override;
  void fill(float* dst, float value, int64_t n) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void to_bf16(bf16* dst, const float* src, int64_t n) override;
  void matmul_forward(float* out, const float* inp, Weight W, int64_t N, int64_t I, int64_t O) override;
  void matmul_backward(float* dinp, float* dW, const float* dout, const float* inp, Weight W, int64_t N,
                       int64_t I, int64_t O, bool accumulate_dinp) override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                       float eps) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int64_t N, int64_t C, bool accumulate_dinp) override;
  void rope_tables(float* cos_t, float* sin_t, int64_t P, int64_t hd, double theta) override;
  void rope_forward(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                    int64_t hd, const int64_t* pos) override;
  void rope_backward(float* dx, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                     int64_t hd) override;
  void attention_forward(float* y, float* lse, const float* q, const KeyValues& kv, int64_t B, int64_t T,
                         int64_t H, int64_t KV, int64_t hd) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k,
                          const float* v, const float* y, const float* lse, int64_t B, int64_t T, int64_t H,
                          int64_t KV, int64_t hd) override;
  void swiglu_forward(float* h, const float* g, const float* u, int64_t n) override;
  void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t n) override;
  void embedding_forward(float* out, const int32_t* tokens, Weight table, int64_t N, int64_t C) override;
  void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t N, int64_t C) override;
  void add_inplace(float* y, const float* x, int64_t n) override;
  void add(float* out, const float* a, const float* b, int64_t n) override;
  void sub(float* out, const float* a, const float* b, int64_t n) override;
  void scale(float* x, float c, int64_t n) override;
  double sum_squares(const float* x, int64_t n) override;
  double lm_head_loss(float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N, int64_t C,
                      int64_t V, float scale, float* losses_out, uint8_t* greedy_out) override;
  void source_rstd(float* rstd, const float* v, int64_t N, int64_t d, float eps) override;
  void route_forward(float* out, float* logits, const RouteSource* src, int64_t S, const float* w,
                     const float* gamma, const float* base, const float* gate, Combine combine, int64_t N, int64_t d,
                     RouteStats* stats) override;
  void route_mix(float* out, const float* logits, const RouteSource* src, int64_t S, const float* base,
                 const float* gate, Combine combine, int64_t N, int64_t d) override;
  void route_mix_stream(float* out, const float* logits, const RouteSource* src, int64_t S, const float* gate,
                        int64_t N, int64_t d) override;
  void route_backward(float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate, const float* dout,
                      const float* logits, const RouteSource* src, int64_t S, const float* w, const float* gamma,
                      const float* base, const float* gate, Combine combine, int64_t N, int64_t d,
                      const RouteRebuild* rebuild, bool accumulate_src) override;
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate& u,
                    bf16* p16) override;
};

}  // namespace attnres
