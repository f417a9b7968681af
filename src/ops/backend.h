// backend.h — the op interface of attnres: every kernel, memory copy and fill,
// and optimizer loop that the model and the trainer run, one virtual function
// per op and direction (outputs first, gradients prefixed d).  The CPU backend
// (ops/cpu/) is the only implementation today and the reference the per-op
// tests hold any other against; a second backend is a directory beside it
// plus its name in make_backend and backend_names (ops/backend.cpp), chosen
// by --device through open_context, with no change to the model or the
// trainer: they reach backend memory only through the ops, upload/download
// and host views (map/unmap), and every pointer an op is given — the arrays
// of routing sources, KV-cache slots and positions, routing statistics
// included — is backend memory.  ops/cpu/guarded_backend.h ("cpu-guarded")
// holds them to it: its memory is locked outside the ops and transfers, and
// an op given a pointer outside its allocations is an internal error, so the
// per-op tests and the model-level tests run on it prove the callers keep to
// the interface.
//
// Dimension letters: N rows (tokens, B·T), C channels, B batch, T time,
// H query heads, KV key/value heads, hd head_dim, F intermediate, V vocab,
// d hidden size, S sources of one router.  All tensors are row-major float32
// in memory from alloc(), except the bfloat16 copies of weight matrices that
// bf16 products read (Weight).  Reductions accumulate in double where a row is
// long (norms, softmax sums).
//
// Precision (core/precision.h) is carried by the weight a product is given:
// a float32 Weight makes an fp32 product; a bfloat16 one makes a bf16
// product, whose other operands (the input rows, and in the backward dout and
// the input again) are rounded to bfloat16, nearest even, and whose sums are
// float32 — dinp and dW are float32 like every gradient.  Nothing else reads
// the precision: the model decides it once by the weights it binds.
//
// Gradient convention: parameter gradients accumulate (+=); activation
// gradients assign (=) unless the flag says accumulate (the activation feeds
// several consumers).  Every pointer argument is backend memory, except the
// host side of upload/download and the RouteRebuild struct (an argument
// record whose pointers are backend memory).
//
// Scratch comes from the Context's workspace: the *_workspace functions give
// the floats an op needs, which a model reserves when it is built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/buffer.h"
#include "core/precision.h"
#include "ops/context.h"
#include "ops/op_list.h"
#include "ops/route_types.h"

namespace attnres {

// A weight matrix [O, I] (or an embedding table [V, C]) as a product or a
// lookup reads it: float32 (an fp32 product), or its bfloat16 copy (a bf16
// product; a lookup widens the rounded rows).  Exactly one is set.
// rows × cols is its shape when the caller knows it (a model's weights: from
// the layout), checked against the op's dimensions; 0 × 0 when not given.
struct Weight {
  const float* f32 = nullptr;
  const bf16* b16 = nullptr;
  int64_t rows = 0, cols = 0;
  Weight() = default;
  Weight(const float* w) : f32(w) {}  // NOLINT: a float32 matrix is the common case
  Weight(const bf16* w) : b16(w) {}   // NOLINT
  Weight(const float* w, int64_t r, int64_t c) : f32(w), rows(r), cols(c) {}
  Weight(const bf16* w, int64_t r, int64_t c) : b16(w), rows(r), cols(c) {}
  Precision precision() const { return b16 ? Precision::kBF16 : Precision::kF32; }
  // Whether this is an [r, c] matrix, as far as it says.
  bool fits(int64_t r, int64_t c) const { return rows == 0 || (rows == r && cols == c); }
};

// Activation rows as an op writes them (RowsOut) and a product reads them
// (Rows): float32, or bfloat16 where only bf16 products read them — the norm
// before the projections, SwiGLU's output before the down projection and its
// gradients before the gate/up backward.  Written as bf16 they are rounded
// nearest even by the op that makes them, to exactly the values a bf16
// product would round the float32 rows to: the same product, one pass over
// the rows fewer and half the bytes.  Exactly one pointer is set.
struct RowsOut {
  float* f32 = nullptr;
  bf16* b16 = nullptr;
  RowsOut(float* p) : f32(p) {}  // NOLINT: float32 rows are the common case
  RowsOut(bf16* p) : b16(p) {}   // NOLINT
};
struct Rows {
  const float* f32 = nullptr;
  const bf16* b16 = nullptr;
  Rows(const float* p) : f32(p) {}  // NOLINT
  Rows(const bf16* p) : b16(p) {}   // NOLINT
  Rows(RowsOut r) : f32(r.f32), b16(r.b16) {}  // NOLINT: what an op wrote, read by the next
};

// The keys and values a block of queries attends to.  Batch row b reads the
// sequence slot[b]: its keys are the rows of KV·hd floats at k + slot[b]·stride,
// positions 0 … pos[b] + T − 1; query t of the block is at position pos[b] + t
// and sees keys 0 … pos[b] + t (causal).  Training: the block's own keys,
// slot = b, pos = 0, stride = T·KV·hd.  Inference with a KV cache: the cache,
// with slot and pos uploaded by the model for each forward.
struct KeyValues {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t stride = 0;             // floats from one sequence to the next
  const int64_t* slot = nullptr;  // (B) backend memory; null: slot b = b
  const int64_t* pos = nullptr;   // (B) backend memory; null: every block starts at position 0
};

// One AdamW update of a tensor (PyTorch semantics), at 1-based step t:
//   p ← p·decay;  m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;
//   p ← p − step_size · m / (sqrt(v)·inv_sqrt_bc2 + eps)
// with decay = 1 − lr·wd (decayed tensors) or 1, step_size = lr/(1−β1ᵗ),
// inv_sqrt_bc2 = 1/sqrt(1−β2ᵗ).
struct AdamWUpdate {
  float beta1, beta2, eps, decay, step_size, inv_sqrt_bc2;
};

// Every op of the list (ops/op_list.h) by number (Op::k_matmul_forward …),
// its name, and the op of a name (an Error listing them).
enum class Op {
#define ATTNRES_OP_ENUM(fam, ret, name, params, args) k_##name,
  ATTNRES_BACKEND_OPS(ATTNRES_OP_ENUM)
#undef ATTNRES_OP_ENUM
      kCount
};
constexpr int kOps = static_cast<int>(Op::kCount);
// What `--profile` counts an op's time under (ops/timed_backend.h), as its
// row of the list says; communication is the trainer's, no op's.
enum class OpFamily { kProducts, kAttention, kRouting, kNorms, kLmHead, kOptimizer, kCommunication, kCount };
constexpr int kOpFamilies = static_cast<int>(OpFamily::kCount);
constexpr OpFamily op_family(Op op) {
  constexpr OpFamily family[] = {
#define ATTNRES_OP_FAMILY(fam, ret, name, params, args) OpFamily::k##fam,
      ATTNRES_BACKEND_OPS(ATTNRES_OP_FAMILY)
#undef ATTNRES_OP_FAMILY
  };
  return family[static_cast<int>(op)];
}
const char* op_name(Op op);
Op parse_op_name(const std::string& name);

class Backend {
 public:
  explicit Backend(Context& ctx) : ctx_(ctx) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual const char* name() const = 0;
  // Which build of its kernels runs: on the CPU the instruction-set level
  // (ops/cpu/cpu_level.h: "x86-64", "avx2", "avx512"), printed in the start-up
  // lines and in `bench --json` so that figures name what ran.
  virtual const char* kernels() const = 0;
  // What runs attention's bf16 products: on the CPU the tile path
  // (ops/cpu/cpu_level.h TilePath: "amx", "avx512-bf16", "float"); named
  // beside kernels() in the same places.
  virtual const char* attention_tiles() const = 0;
  Context& context() const { return ctx_; }
  // Why this backend cannot run products in precision p here (a CPU without
  // bf16 matrix instructions, a build without the library); "" when it can.
  virtual std::string unsupported(Precision p) const = 0;
  // Whether this backend runs `op` in precision p itself (p: the op's
  // weight's, or its Precision argument's; fp32 for an op with neither).  A
  // backend that says no to some runs under a PartialBackend
  // (ops/partial_backend.h), which gives those to the CPU.  Every op below
  // has a default body that is an Error naming the op and this backend, so a
  // new backend compiles, and runs a model beside the CPU, from its first op.
  virtual bool supports(Op /*op*/, Precision /*p*/) const { return true; }
  // Lets the host address this backend's memory until host_access(false):
  // the CPU's ops run on it in place (a PartialBackend's seam).  Only a
  // backend whose memory the host can address (host_addressable()) can be
  // partial today; one with device memory of its own needs the seam to move
  // each op's operands, which the op list does not size yet.
  virtual bool host_addressable() const { return true; }
  virtual void host_access(bool /*open*/) {}
  // An Error "precision bf16: <why>" unless this backend can run p here.
  void check_supported(Precision p) const {
    if (const std::string why = unsupported(p); !why.empty()) fail("precision ", precision_name(p), ": ", why);
  }
  // The peak rate of this backend's products in precision p, GFLOP/s,
  // measured once per process (MFU's denominator), and what it is of in
  // words ("float32 matmul (oneDNN)", …).
  virtual double peak_gflops(Precision p) const = 0;
  virtual const char* peak_name(Precision p) const = 0;

  // ---- memory -------------------------------------------------------------------
  // Zero-filled memory of this backend, which the host reaches only through
  // upload/download and map/unmap.  lazy: pages need not be backed until first written (an arena laid out for
  // more tensors than it will hold).
  virtual Buffer alloc(size_t bytes, bool lazy = false) = 0;
  virtual void synchronize() = 0;
  // Host ↔ backend bytes (token ids in, losses and logits out).
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  // Host views: [p, p + bytes) of this backend's memory, readable and
  // writable on the host from map() until unmap() — the one way besides
  // upload/download that the host reaches backend memory.  CPU: map returns p
  // and nothing moves; a device backend gives a host copy, filled at map and
  // written back at unmap.  No op may run on the range while it is mapped.
  // HostView (below) pairs the two calls.
  virtual void* map(void* p, size_t bytes) = 0;
  virtual void unmap(void* p, size_t bytes) = 0;

  // ---- workspaces: the scratch each family of ops asks the Context for ----
  virtual int64_t matmul_workspace(int64_t N, int64_t I, int64_t O, Precision p) const = 0;
  virtual int64_t attention_workspace(int64_t max_keys, int64_t hd, Precision p) const = 0;
  virtual int64_t lm_head_workspace(int64_t C, int64_t V, Precision p) const = 0;
  virtual int64_t route_workspace(int64_t N, int64_t d, int64_t S, int64_t H) const = 0;

  // ---- the ops (ops/op_list.h) -----------------------------------------------------
  // One public entry per op: it checks the op's arguments (ops/op_checks.cpp,
  // once for every backend: shapes, precisions, what a combination needs),
  // then runs this backend's implementation, op_impl (protected, below, with
  // its math).  Where an argument has a usual value, an overload gives it.
#define ATTNRES_OP_ENTRY(fam, ret, name, params, args) \
  ret name params {                                    \
    check_##name args;                                 \
    return name##_impl args;                           \
  }
  ATTNRES_BACKEND_OPS(ATTNRES_OP_ENTRY)
#undef ATTNRES_OP_ENTRY
  void matmul_backward(float* dinp, float* dW, Rows dout, Rows inp, Weight W, int64_t N, int64_t I, int64_t O) {
    matmul_backward(dinp, dW, dout, inp, W, N, I, O, /*accumulate_dinp=*/false);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int64_t N, int64_t C) {
    rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, /*accumulate_dinp=*/false);
  }
  void rope_forward(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                    int64_t hd) {
    rope_forward(x, cos_t, sin_t, B, T, heads, hd, /*pos=*/nullptr);
  }
  double lm_head_loss(float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N, int64_t C,
                      int64_t V, float scale, float* losses_out = nullptr) {
    return lm_head_loss(dx, dW, x, W, targets, N, C, V, scale, losses_out, /*greedy_out=*/nullptr);
  }
  void route_forward(float* out, float* logits, const RouteSource* src, int64_t S, int64_t H, const float* w,
                     const float* gamma, const float* base, const float* gate, Combine combine, int64_t N,
                     int64_t d) {
    route_forward(out, logits, src, S, H, w, gamma, base, gate, combine, N, d, /*stats=*/nullptr);
  }
  void route_backward(float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate, const float* dout,
                      const float* logits, const RouteSource* src, int64_t S, int64_t H, const float* w,
                      const float* gamma, const float* base, const float* gate, Combine combine, int64_t N,
                      int64_t d, const RouteRebuild* rebuild = nullptr) {
    route_backward(dsrc, dbase, dw, dgamma, dgate, dout, logits, src, S, H, w, gamma, base, gate, combine, N, d,
                   rebuild, /*accumulate_src=*/true, /*entropy_scale=*/0.0f);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate& u) {
    adamw_update(p, g, m, v, n, u, /*p16=*/nullptr);
  }

 protected:
  // ---- each op's implementation in this backend, and its math ------------------
  // Every one has a default body, an Error naming the op and this backend
  // (not_implemented), so a new backend compiles, and runs a model beside the
  // CPU, from its first op.
  virtual void copy_impl(float* dst, const float* src, int64_t n) { not_implemented(Op::k_copy); }
  virtual void fill_impl(float* dst, float value, int64_t n) { not_implemented(Op::k_fill); }
  // dst[i] = bf16(src[i]), rounded to nearest even (NaN stays NaN): the copy of
  // a weight matrix that bf16 products read.
  virtual void to_bf16_impl(bf16* dst, const float* src, int64_t n) { not_implemented(Op::k_to_bf16); }

  // ---- matmul: out[N,O] = inp[N,I] · W[O,I]ᵀ  (nn.Linear without bias) ----------
  // In the precision of W (see the top): with bf16 W, out = bf16(inp) · Wᵀ.
  // Rows given in bf16 (inp, dout) are read as they are, and only with bf16 W.
  // The workspace serves products of up to N rows of I inputs and O outputs in precision p.
  virtual void matmul_forward_impl(float* out, Rows inp, Weight W, int64_t N, int64_t I, int64_t O) {
    not_implemented(Op::k_matmul_forward);
  }
  // dinp[N,I] (= or += by accumulate) = dout · W;  dW[O,I] += doutᵀ · inp.
  // Either of dinp/dW may be null to skip it.  With bf16 W:
  //   dinp = bf16(dout) · W,   dW += bf16(dout)ᵀ · bf16(inp)   (float32 sums).
  virtual void matmul_backward_impl(float* dinp, float* dW, Rows dout, Rows inp, Weight W, int64_t N, int64_t I,
                               int64_t O, bool accumulate_dinp) { not_implemented(Op::k_matmul_backward); }

  // ---- RMSNorm over rows of C: out = inp · rstd · weight, rstd = (mean(inp²)+eps)^-½ ----
  // rstd may be null (not kept).  out in bf16: the float32 result rounded.
  // In the backward, dweight may be null (frozen).
  virtual void rmsnorm_forward_impl(RowsOut out, float* rstd, const float* inp, const float* weight, int64_t N,
                               int64_t C, float eps) { not_implemented(Op::k_rmsnorm_forward); }
  // With x̂ = inp·rstd:  dweight += Σ_rows dout∘x̂;
  // dinp = rstd·(g − x̂·mean(g∘x̂)),  g = dout∘weight.   (accumulate: dinp +=)
  // dinp may alias dout when accumulate_dinp is false.
  virtual void rmsnorm_backward_impl(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, const float* rstd, int64_t N, int64_t C,
                                bool accumulate_dinp) { not_implemented(Op::k_rmsnorm_backward); }

  // ---- RoPE (HF rotate_half convention) on x[B,T,heads,hd], in place ----
  // Tables [P, hd/2] for positions 0 … P−1: angle(p, j) = p · theta^(-2j/hd).
  virtual void rope_tables_impl(float* cos_t, float* sin_t, int64_t P, int64_t hd, double theta) {
    not_implemented(Op::k_rope_tables);
  }
  // out[j] = x[j]c − x[j+h]s,  out[j+h] = x[j+h]c + x[j]s   (h = hd/2), with the
  // angle of position pos[b] + t (pos: (B) backend memory, null = 0).
  virtual void rope_forward_impl(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T,
                            int64_t heads, int64_t hd, const int64_t* pos) {
    not_implemented(Op::k_rope_forward);
  }
  // The transpose rotation (positions 0 … T−1): dx[j] = dy[j]c + dy[j+h]s,  dx[j+h] = dy[j+h]c − dy[j]s.
  virtual void rope_backward_impl(float* dx, const float* cos_t, const float* sin_t, int64_t B, int64_t T,
                             int64_t heads, int64_t hd) { not_implemented(Op::k_rope_backward); }

  // ---- KV cache ----
  // A block's rows into a cache of sequences of P positions: for b < B, t < T,
  //   cache[((slot[b]·P + pos[b] + t)·w) …] = x[((b·T + t)·w) …]   (w floats per row)
  // slot, pos: (B) backend memory.  Every position must lie inside the cache.
  virtual void kv_cache_store_impl(float* cache, const float* x, const int64_t* slot, const int64_t* pos, int64_t B,
                              int64_t T, int64_t P, int64_t w) { not_implemented(Op::k_kv_cache_store); }

  // ---- causal grouped-query attention ----
  // q[B,T,H,hd] and the keys/values of kv → y[B,T,H,hd] (query head h reads
  // KV head h/(H/KV)), and, when lse is not null, lse[B,H,T]: the log-sum-exp
  // of each scaled score row, kept so the backward can rebuild P.
  // max_keys: the most keys one sequence will have (pos + T).
  // In bf16 (p) the products QKᵀ, PV and the four of the backward read bf16
  // operands and sum in float32 (docs/DESIGN.md §6); the softmax stays float32.
  virtual void attention_forward_impl(float* y, float* lse, const float* q, const KeyValues& kv, int64_t B,
                                 int64_t T, int64_t H, int64_t KV, int64_t hd, Precision p) {
    not_implemented(Op::k_attention_forward);
  }
  // Keys of the block itself (training).  S = s·QKᵀ (s = hd^-½), P = softmax(S)
  // (causal), Y = PV.  With D = rowsum(dY∘Y):
  //   dP = dY Vᵀ,  dS = P∘(dP − D),  dQ = s·dS K,  dK = s·dSᵀQ,  dV = PᵀdY.
  // In bf16 every operand of those products is rounded: dP = r(dY) r(V)ᵀ,
  // dQ = s·r(dS) r(K), dK = s·r(dS)ᵀ r(Q), dV = r(P)ᵀ r(dY).
  // dq, dk, dv are assigned.
  virtual void attention_backward_impl(float* dq, float* dk, float* dv, const float* dy, const float* q,
                                  const float* k, const float* v, const float* y, const float* lse, int64_t B,
                                  int64_t T, int64_t H, int64_t KV, int64_t hd, Precision p) {
    not_implemented(Op::k_attention_backward);
  }

  // ---- SwiGLU: h = silu(g)∘u over n elements ----
  // (h, dg, du in bf16: the float32 results rounded.)
  virtual void swiglu_forward_impl(RowsOut h, const float* g, const float* u, int64_t n) {
    not_implemented(Op::k_swiglu_forward);
  }
  // dg = dh∘u∘σ(g)(1 + g(1−σ(g))),  du = dh∘silu(g).
  virtual void swiglu_backward_impl(RowsOut dg, RowsOut du, const float* dh, const float* g, const float* u,
                               int64_t n) { not_implemented(Op::k_swiglu_backward); }

  // ---- embedding: out[N,C] = table[tokens[n]] ----
  virtual void embedding_forward_impl(float* out, const int32_t* tokens, Weight table, int64_t N, int64_t C) {
    not_implemented(Op::k_embedding_forward);
  }
  virtual void embedding_backward_impl(float* dtable, const float* dout, const int32_t* tokens, int64_t N,
                                  int64_t C) { not_implemented(Op::k_embedding_backward); }

  // ---- elementwise ----
  // y += x;  out = a + b;  out = a − b;  x *= c   (out may alias a or b)
  virtual void add_inplace_impl(float* y, const float* x, int64_t n) { not_implemented(Op::k_add_inplace); }
  virtual void add_impl(float* out, const float* a, const float* b, int64_t n) { not_implemented(Op::k_add); }
  virtual void sub_impl(float* out, const float* a, const float* b, int64_t n) { not_implemented(Op::k_sub); }
  virtual void scale_impl(float* x, float c, int64_t n) { not_implemented(Op::k_scale); }
  // Σ x² in double; the same bits for the same thread count.
  virtual double sum_squares_impl(const float* x, int64_t n) { not_implemented(Op::k_sum_squares); }

  // ---- LM head + softmax cross-entropy, fused, in row chunks ----
  // logits = x[N,C] · W[V,C]ᵀ, loss_i = logsumexp(logits_i) − logits_i[target_i].
  // Returns Σ_i loss_i.  If dx is non-null also computes, with
  // dlogits_i = scale·(softmax_i − onehot(target_i)):  dx = dlogits·W
  // (assigned), dW += dlogitsᵀ·x (skipped when dW is null: a frozen head);
  // with bf16 W the three products round x and dlogits to bf16 (the softmax
  // and the loss are float32).  Targets < 0 are ignored (no loss, no
  // gradient); losses_out (N), when not null, gets each row's loss (0 there);
  // greedy_out (N), when not null, gets 1 where the target is the row's argmax
  // (the first index of the largest logit, as torch.argmax), else 0.
  // The [N, V] logits never exist at once: chunks of rows are computed,
  // reduced and pushed through the backward in turn.
  // The default body is the composition of simpler ops of the list, chunk by
  // chunk of rows: logits = matmul_forward(x, W), cross_entropy (dlogits in
  // place), matmul_backward(dx, dW, dlogits, x, W) — the same function (with
  // bf16 W the products round x and dlogits), other sums' order; a backend
  // without the fused head runs from these.
  virtual double lm_head_loss_impl(float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N,
                                   int64_t C, int64_t V, float scale, float* losses_out, uint8_t* greedy_out);
  // Softmax cross-entropy of logits rows (N, V): returns Σ_i loss_i with
  // loss_i = logsumexp(logits_i) − logits_i[target_i]; with dlogits not null
  // also dlogits_i = scale·(softmax_i − onehot(target_i)) (dlogits may alias
  // logits).  Targets < 0, losses_out and greedy_out as lm_head_loss (a row
  // without a target: loss 0 and dlogits 0).  Row losses are summed in row
  // order, so the total does not depend on the thread count.
  virtual double cross_entropy_impl(float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                                    float scale, float* losses_out, uint8_t* greedy_out) {
    not_implemented(Op::k_cross_entropy);
  }

  // ---- depth routing (docs/routing.md) ----
  // A router has a pseudo-query w (d) and an RMSNorm weight γ (d); for a token
  // with source rows v_1..v_S (each d):
  //
  //   r_i = (mean(v_i²) + eps)^(-1/2)     per source and token, computed ONCE when
  //                                       the source is made (source_rstd) and
  //                                       shared by every router reading it
  //   q   = w∘γ                           (d) folded once per call
  //   z_i = w·RMSNorm_γ(v_i) = r_i (q·v_i)  logits (N, S); normalised keys are never built
  //   α   = softmax_i(z)                  recomputed from z where needed
  //   R   = Σ_i α_i v_i
  //   out = a·base + c·R                  the combination:
  //
  //     combine   gate   a       c     meaning
  //     kReplace  none   0       1     out = R                        (full, block)
  //     kReplace  g      1 − g   g     out = (1−g)·base + g·R         (base = the router's last source)
  //     kAdd      none   1       1     out = base + R                 (delta modes, base = stream x)
  //     kAdd      g      1       g     out = base + g·R
  //
  // g is the raw learnable scalar (no sigmoid); gate is a pointer to it or null.
  // Token-sum reductions (dw, dγ, null source, gate) go through fixed 64-token
  // chunk partials added in chunk order in double, so results do not depend on
  // the thread count.
  //
  // r[n] = (mean_c v[n,c]² + eps)^(-1/2), n < N.   (rstd (N), v (N, d))
  virtual void source_rstd_impl(float* rstd, const float* v, int64_t N, int64_t d, float eps) {
    not_implemented(Op::k_source_rstd);
  }
  // src: the S sources, a list in backend memory (route_types.h).  H routing
  // heads (H divides d; H = 1 is single-head routing): head h owns the
  // columns [h·d/H, (h+1)·d/H) of the query, the keys and the values, with
  //   z[n,h,i] = r_i[n] · (q[slice h] · v_i[n, slice h])   (r_i over the full d)
  //   α[n,h,·] = softmax_i z[n,h,·],   R[n, slice h] = Σ_i α[n,h,i] v_i[n, slice h].
  // out (N, d) and logits z (N, H, S) assigned.  base (N, d) may be null for
  // kReplace without gate.  stats, when non-null, is route_stats_size(S, H)
  // doubles of backend memory to which this call's statistics are added
  // (route_types.h); null costs nothing.  out must not alias base or a source.
  virtual void route_forward_impl(float* out, float* logits, const RouteSource* src, int64_t S, int64_t H, const float* w,
                             const float* gamma, const float* base, const float* gate, Combine combine, int64_t N,
                             int64_t d, double* stats) { not_implemented(Op::k_route_forward); }
  // The combination alone from stored logits: exactly route_forward's out
  // (same arithmetic, same bits).  out may alias base.
  virtual void route_mix_impl(float* out, const float* logits, const RouteSource* src, int64_t S, int64_t H,
                         const float* base, const float* gate, Combine combine, int64_t N, int64_t d) {
    not_implemented(Op::k_route_mix);
  }
  // The combination with token-independent weights: α[h, i] = weights[h·S + i]
  // (H, S doubles, backend memory) for every token, then out = a·base + c·R
  // exactly as route_mix (the same mix: the weights are rounded to float per
  // term as the softmax's are there), so weights equal to a router's α give
  // its bits.  The routing interventions' mean and uniform routing, and
  // all-zero weights for a router left with no source (R = 0).  out may alias base.
  virtual void route_mix_weights_impl(float* out, const double* weights, const RouteSource* src, int64_t S, int64_t H,
                                 const float* base, const float* gate, Combine combine, int64_t N, int64_t d) {
    not_implemented(Op::k_route_mix_weights);
  }
  // Delta's sublayer input rebuilt in one pass over the sources: out = x + g·R
  // (kAdd) with x = ((v_j + v_j+1) + …) + v_S−1 the sum of the non-broadcast
  // sources in order — the delta stream, bit-identical to the forward's
  // running `x += out` — and the same bits as route_mix with that base.
  virtual void route_mix_stream_impl(float* out, const float* logits, const RouteSource* src, int64_t S, int64_t H,
                                const float* gate, int64_t N, int64_t d) { not_implemented(Op::k_route_mix_stream); }
  // Given dout (N, d), the gradient of out (dsrc: a list of S pointers in backend memory):
  //   dsrc[i] (N, d) or (d) if broadcast  += ∂/∂v_i   (with accumulate_src = false the
  //                                       (N, d) ones are assigned: the first router of a backward)
  //   dbase   (N, d)                      += a·dout   (may be null; may alias dsrc[S−1])
  //   dw, dgamma (d)                      += ∂/∂w, ∂/∂γ
  //   dgate   ()                          += ∂/∂g     (only with a gate)
  // base is read only for kReplace with a gate (dg needs R − base).
  // logits: route_forward's, or null — then each token's are computed again
  // from w, γ and the source rows (the forward's arithmetic: the same bits),
  // in the pass that reads those rows anyway, so a model need not keep
  // (N, H, S) of them per router; a rebuild with null logits does the same
  // from its own w and γ.
  // Per head h (slice h of every d-vector; H = 1: the whole of it), with
  // z_hi = r_i (q_h·v_hi):  dα_hi = c·dout_h·v_hi;  dz_hi = α_hi (dα_hi − Σ_j α_hj dα_hj);
  //   dv_i[slice h] += α_hi c dout_h + dz_hi r_i q_h,  and over the full d (r_i reads all of v_i)
  //   dv_i −= (Σ_h dz_hi z_hi) r_i² v_i / d;  dq[slice h] = Σ_tokens Σ_i dz_hi r_i v_hi,
  //   dw += dq∘γ,  dγ += dq∘w;  dbase += a·dout;  dg += dout·(R − base) or dout·R.
  // entropy_scale κ (0: none) adds the routing entropy term of the training
  // objective (route_entropy below): its gradient joins dα before dz,
  //   dα_hi += κ·(ln(α_hi + ε) + α_hi / (α_hi + ε)),   ε = 1e−8,
  // which is d/dα of −κ·Σ_i −α_i ln(α_i + ε): the objective subtracts λ times
  // the entropy, and κ carries λ and its mean's 1/(tokens·routers·heads).
  virtual void route_backward_impl(float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate,
                              const float* dout, const float* logits, const RouteSource* src, int64_t S, int64_t H,
                              const float* w, const float* gamma, const float* base, const float* gate,
                              Combine combine, int64_t N, int64_t d, const RouteRebuild* rebuild,
                              bool accumulate_src, float entropy_scale) { not_implemented(Op::k_route_backward); }
  // The routing entropy of the training objective (the reference code's
  // entropy term, docs/routing.md "The entropy term"), from a router's logits
  // (N, H, S), α = softmax per head as the other routing ops compute it:
  //   *sum (one double, backend memory) += Σ_n (1/H) Σ_h −Σ_i α_nhi ln(α_nhi + ε),  ε = 1e−8.
  // The ε is the reference's; the statistics' entropy (route_types.h) has none.
  // The sum over tokens goes through the fixed chunk partials: the result does
  // not depend on the thread count.
  virtual void route_entropy_impl(double* sum, const float* logits, int64_t S, int64_t H, int64_t N) {
    not_implemented(Op::k_route_entropy);
  }
  // y[i] = σ(x[i]) = 1 / (1 + e^(−x[i])), and its backward dx[i] += dy[i]·y[i]·(1 − y[i]):
  // the sigmoid gates' g = σ(θ) (docs/routing.md "Gates").
  virtual void sigmoid_forward_impl(float* y, const float* x, int64_t n) { not_implemented(Op::k_sigmoid_forward); }
  virtual void sigmoid_backward_impl(float* dx, const float* dy, const float* y, int64_t n) {
    not_implemented(Op::k_sigmoid_backward);
  }
  // sigmoid_vector's gate (docs/routing.md "Gates"), per token n and channel c,
  // on a router's ungated result h (route_forward with no gate: x + R in the
  // additive modes, R in the replacing ones) and the gate's base x_g:
  //   g = σ(pre + b),   diff = h − x_g,   u = x_g + g∘diff  (= (1 − g)∘x_g + g∘h)
  // On entry u holds h and g holds pre = x_g·Wᵀ (a product); both are
  // overwritten (u, g, diff (N, d); b (d)).  diff may be null (no backward).
  virtual void gate_vector_forward_impl(float* u, float* g, float* diff, const float* bias, const float* base,
                                        int64_t N, int64_t d) {
    not_implemented(Op::k_gate_vector_forward);
  }
  // Its backward, given du (N, d):
  //   dh = g∘du (assigned; may alias du),  dbase = (1 − g)∘du (assigned),
  //   dpre = du∘diff∘g(1 − g) (assigned),  dbias += Σ_n dpre  (chunk partials in double, thread-independent).
  // The product's backward (dW, and dpre·W into dbase) and the router's
  // backward with dh are the caller's.
  virtual void gate_vector_backward_impl(float* dh, float* dpre, float* dbias, float* dbase, const float* du,
                                         const float* g, const float* diff, int64_t N, int64_t d) {
    not_implemented(Op::k_gate_vector_backward);
  }

  // pre_gated's source gate (docs/routing.md "pre_gated"), per token n and
  // channel c: g = σ(pre + b) (g may alias pre; b (d)), and its backward
  // dpre = dg∘g(1 − g) (assigned; may alias dg), dbias += Σ_n dpre (chunk
  // partials in double, thread-independent).
  virtual void sigmoid_gate_forward_impl(float* g, const float* pre, const float* bias, int64_t N, int64_t d) {
    not_implemented(Op::k_sigmoid_gate_forward);
  }
  virtual void sigmoid_gate_backward_impl(float* dpre, float* dbias, const float* dg, const float* g, int64_t N,
                                          int64_t d) {
    not_implemented(Op::k_sigmoid_gate_backward);
  }
  // A gated source y = g∘v (N, d) and its keys' rstd per token,
  // y_rstd = (mean_c y² + eps)^−½ (as source_rstd); its backward
  // dv (= or +=, accumulate_dv) g∘dy and dg += v∘dy.
  virtual void gated_source_forward_impl(float* y, float* y_rstd, const float* g, const float* v, int64_t N, int64_t d,
                                         float eps) {
    not_implemented(Op::k_gated_source_forward);
  }
  virtual void gated_source_backward_impl(float* dv, float* dg, const float* dy, const float* g, const float* v,
                                          int64_t N, int64_t d, bool accumulate_dv) {
    not_implemented(Op::k_gated_source_backward);
  }

  // ---- optimizer ----
  // One AdamW update of n elements of a tensor (see AdamWUpdate); p16, when
  // not null, receives bf16(p) of the updated values in the same pass (the
  // bf16 copy a bf16 model's products read).
  virtual void adamw_update_impl(float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate& u,
                            bf16* p16) { not_implemented(Op::k_adamw_update); }

  // The default body of every op: an Error naming the op and this backend.
  [[noreturn]] void not_implemented(Op op) const;
  // The CPU-shaped fusions as compositions of simpler ops of the list, for a
  // backend that does not fuse them:
  //  - route_backward's rebuild (RouteRebuild): a route_backward_impl that
  //    does not rebuild in its own pass calls this after its backward, which
  //    makes rebuild.out as the forward made it (route_forward for logits not
  //    kept, then route_mix, or route_mix_stream for the delta stream): the
  //    forward's bits, as the fused rebuild's;
  //  - lm_head_loss: the default lm_head_loss_impl (above); a backend that
  //    runs it sizes lm_head_workspace with lm_head_composition_workspace.
  void rebuild_by_composition(const RouteRebuild& rebuild, int64_t N, int64_t d);
  int64_t lm_head_composition_workspace(int64_t C, int64_t V, Precision p) const;
  // Rows of logits per chunk of the composed LM head: 256, fewer for a large
  // vocabulary (16 M floats at most).
  static int64_t lm_head_chunk_rows(int64_t V);
  // Another backend's implementation of an op, its arguments checked already:
  // what a backend wrapping another calls (WrappingBackend; the timed,
  // guarded and partial backends), so that the checks run once per call.
#define ATTNRES_OP_INNER(fam, ret, name, params, args) \
  static ret name##_of(Backend& backend, ATTNRES_UNPAREN params) { return backend.name##_impl args; }
  ATTNRES_BACKEND_OPS(ATTNRES_OP_INNER)
#undef ATTNRES_OP_INNER
  // Backend memory of the compositions (logits), grown on first need and kept.
  float* composition_scratch(int64_t floats);
  Buffer composition_;
  Context& ctx_;

 private:
  // Each op's argument checks (ops/op_checks.cpp): an Error naming the op and
  // what is wrong.  Declared for every op of the list, so an op without its
  // check does not link.
#define ATTNRES_OP_CHECK(fam, ret, name, params, args) void check_##name params const;
  ATTNRES_BACKEND_OPS(ATTNRES_OP_CHECK)
#undef ATTNRES_OP_CHECK
};

// A scope in which n values of T at p (backend memory) are host memory:
// data() is where the host reads and writes them (Backend::map … unmap).
template <class T>
class HostView {
 public:
  HostView(Backend& ops, T* p, size_t n)
      : ops_(ops), p_(p), bytes_(n * sizeof(T)), host_(p ? static_cast<T*>(ops.map(p, bytes_)) : nullptr) {}
  ~HostView() {
    if (p_) ops_.unmap(p_, bytes_);
  }
  HostView(const HostView&) = delete;
  HostView& operator=(const HostView&) = delete;
  T* data() const { return host_; }

 private:
  Backend& ops_;
  T* p_;
  size_t bytes_;
  T* host_;
};

// The backend called `name`, running on ctx; Error for an unknown name.
// cpu_level: the CPU kernels' level ("" = $ATTNRES_CPU_LEVEL, else the best
// this CPU has; ops/cpu/cpu_level.h).
std::unique_ptr<Backend> make_backend(const std::string& name, Context& ctx, const std::string& cpu_level = "");
// The names make_backend knows in this build ("cpu", "cpu-guarded").
std::vector<std::string> backend_names();
// --device's help: the names of this build and what cpu-guarded is.
std::string device_help();
// An Error naming --device and the known names unless `name` is one of them.
void check_device(const std::string& name);

}  // namespace attnres
