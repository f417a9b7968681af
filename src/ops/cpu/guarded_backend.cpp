// guarded_backend.cpp — see guarded_backend.h.
#include "ops/cpu/guarded_backend.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"

namespace attnres {

namespace {

// Every live allocation of the guarded backends and whether an op is running
// (depth > 0: all of them unlocked).  Ops are called from one host thread at a
// time per Context; the mutex keeps two Contexts' calls from interleaving.
struct Guard {
  std::recursive_mutex mutex;
  std::map<void*, size_t> allocations;
  int depth = 0;
  void protect_all(int prot) {
    for (const auto& [p, n] : allocations)
      ATTNRES_CHECK(::mprotect(p, n, prot) == 0, "mprotect: ", std::strerror(errno));
  }
};
Guard& guard() {
  static Guard* g = new Guard;  // never destroyed: Buffers released at exit still find it
  return *g;
}

void open_all() {
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  if (guard().depth++ == 0) guard().protect_all(PROT_READ | PROT_WRITE);
}
void close_all() {
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  ATTNRES_CHECK(guard().depth > 0, "unmap without map");
  if (--guard().depth == 0) guard().protect_all(PROT_NONE);
}

// Backend memory open to the host for one op or transfer.
class Unlocked {
 public:
  Unlocked() : lock_(guard().mutex) { open_all(); }
  ~Unlocked() { close_all(); }
  Unlocked(const Unlocked&) = delete;
  Unlocked& operator=(const Unlocked&) = delete;

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

void release(void* p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  guard().allocations.erase(p);
  ::munmap(p, bytes);
}

}  // namespace

Buffer GuardedCpuBackend::alloc(size_t bytes, bool /*lazy: every page is backed when first touched anyway*/) {
  if (bytes == 0) return {};
  std::lock_guard<std::recursive_mutex> lock(guard().mutex);
  const int prot = guard().depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;  // allocated inside an op: open
  void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cannot allocate ", bytes, " bytes: ", std::strerror(errno));
  guard().allocations[p] = bytes;
  return {p, bytes, &release};
}

void* GuardedCpuBackend::map(void* p, size_t) {
  open_all();
  return p;
}
void GuardedCpuBackend::unmap(void*, size_t) { close_all(); }

#define ATTNRES_GUARDED(ret, name, params, args) \
  ret GuardedCpuBackend::name params {           \
    Unlocked open;                               \
    return CpuBackend::name args;                \
  }

ATTNRES_GUARDED(void, copy, (float* dst, const float* src, int64_t n), (dst, src, n))
ATTNRES_GUARDED(void, fill, (float* dst, float value, int64_t n), (dst, value, n))
ATTNRES_GUARDED(void, upload, (void* dst, const void* host_src, size_t bytes), (dst, host_src, bytes))
ATTNRES_GUARDED(void, download, (void* host_dst, const void* src, size_t bytes), (host_dst, src, bytes))
ATTNRES_GUARDED(void, to_bf16, (bf16* dst, const float* src, int64_t n), (dst, src, n))
ATTNRES_GUARDED(void, matmul_forward, (float* out, const float* inp, Weight W, int64_t N, int64_t I, int64_t O),
                (out, inp, W, N, I, O))
ATTNRES_GUARDED(void, matmul_backward,
                (float* dinp, float* dW, const float* dout, const float* inp, Weight W, int64_t N, int64_t I,
                 int64_t O, bool accumulate_dinp),
                (dinp, dW, dout, inp, W, N, I, O, accumulate_dinp))
ATTNRES_GUARDED(void, rmsnorm_forward,
                (float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps),
                (out, rstd, inp, weight, N, C, eps))
ATTNRES_GUARDED(void, rmsnorm_backward,
                (float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                 const float* rstd, int64_t N, int64_t C, bool accumulate_dinp),
                (dinp, dweight, dout, inp, weight, rstd, N, C, accumulate_dinp))
ATTNRES_GUARDED(void, rope_tables, (float* cos_t, float* sin_t, int64_t P, int64_t hd, double theta),
                (cos_t, sin_t, P, hd, theta))
ATTNRES_GUARDED(void, rope_forward,
                (float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads, int64_t hd,
                 const int64_t* pos),
                (x, cos_t, sin_t, B, T, heads, hd, pos))
ATTNRES_GUARDED(void, rope_backward,
                (float* dx, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads, int64_t hd),
                (dx, cos_t, sin_t, B, T, heads, hd))
ATTNRES_GUARDED(void, attention_forward,
                (float* y, float* lse, const float* q, const KeyValues& kv, int64_t B, int64_t T, int64_t H,
                 int64_t KV, int64_t hd),
                (y, lse, q, kv, B, T, H, KV, hd))
ATTNRES_GUARDED(void, attention_backward,
                (float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k, const float* v,
                 const float* y, const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd),
                (dq, dk, dv, dy, q, k, v, y, lse, B, T, H, KV, hd))
ATTNRES_GUARDED(void, swiglu_forward, (float* h, const float* g, const float* u, int64_t n), (h, g, u, n))
ATTNRES_GUARDED(void, swiglu_backward,
                (float* dg, float* du, const float* dh, const float* g, const float* u, int64_t n),
                (dg, du, dh, g, u, n))
ATTNRES_GUARDED(void, embedding_forward, (float* out, const int32_t* tokens, Weight table, int64_t N, int64_t C),
                (out, tokens, table, N, C))
ATTNRES_GUARDED(void, embedding_backward,
                (float* dtable, const float* dout, const int32_t* tokens, int64_t N, int64_t C),
                (dtable, dout, tokens, N, C))
ATTNRES_GUARDED(void, add_inplace, (float* y, const float* x, int64_t n), (y, x, n))
ATTNRES_GUARDED(void, add, (float* out, const float* a, const float* b, int64_t n), (out, a, b, n))
ATTNRES_GUARDED(void, sub, (float* out, const float* a, const float* b, int64_t n), (out, a, b, n))
ATTNRES_GUARDED(void, scale, (float* x, float c, int64_t n), (x, c, n))
ATTNRES_GUARDED(double, sum_squares, (const float* x, int64_t n), (x, n))
ATTNRES_GUARDED(double, lm_head_loss,
                (float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N, int64_t C,
                 int64_t V, float scale, float* losses_out, uint8_t* greedy_out),
                (dx, dW, x, W, targets, N, C, V, scale, losses_out, greedy_out))
ATTNRES_GUARDED(void, source_rstd, (float* rstd, const float* v, int64_t N, int64_t d, float eps),
                (rstd, v, N, d, eps))
ATTNRES_GUARDED(void, route_forward,
                (float* out, float* logits, const RouteSource* src, int64_t S, const float* w, const float* gamma,
                 const float* base, const float* gate, Combine combine, int64_t N, int64_t d, RouteStats* stats),
                (out, logits, src, S, w, gamma, base, gate, combine, N, d, stats))
ATTNRES_GUARDED(void, route_mix,
                (float* out, const float* logits, const RouteSource* src, int64_t S, const float* base,
                 const float* gate, Combine combine, int64_t N, int64_t d),
                (out, logits, src, S, base, gate, combine, N, d))
ATTNRES_GUARDED(void, route_mix_stream,
                (float* out, const float* logits, const RouteSource* src, int64_t S, const float* gate, int64_t N,
                 int64_t d),
                (out, logits, src, S, gate, N, d))
ATTNRES_GUARDED(void, route_backward,
                (float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate, const float* dout,
                 const float* logits, const RouteSource* src, int64_t S, const float* w, const float* gamma,
                 const float* base, const float* gate, Combine combine, int64_t N, int64_t d,
                 const RouteRebuild* rebuild, bool accumulate_src),
                (dsrc, dbase, dw, dgamma, dgate, dout, logits, src, S, w, gamma, base, gate, combine, N, d, rebuild,
                 accumulate_src))
ATTNRES_GUARDED(void, adamw_update,
                (float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate& u, bf16* p16),
                (p, g, m, v, n, u, p16))

#undef ATTNRES_GUARDED

}  // namespace attnres
