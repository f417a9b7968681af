// ops.h — the CPU kernels of attnres, forward and backward, one function per
// op and direction (outputs first, gradients prefixed d).
//
// Dimension letters: N rows (tokens, B·T), C channels, B batch, T time,
// H query heads, KV key/value heads, hd head_dim, F intermediate, V vocab.
// All tensors are row-major float32.  Reductions accumulate in double where
// a row is long (norms, softmax sums).
//
// Gradient convention: parameter gradients accumulate (+=); activation
// gradients assign (=) unless the argument is named `dinp_acc`, which
// accumulates (the activation feeds several consumers).
//
// Threading: elementwise and row kernels use OpenMP over rows; matmuls go to
// OpenBLAS (OpenMP build), which runs single-threaded inside our parallel
// regions, so the one OpenMP pool is never oversubscribed.
#pragma once

#include <cstdint>

namespace attnres {

// ---- matmul: out[N,O] = inp[N,I] · weight[O,I]ᵀ  (nn.Linear without bias) ----
void matmul_forward(float* out, const float* inp, const float* weight, int64_t N, int64_t I, int64_t O);
// dinp[N,I] (= or += by accumulate) = dout · weight;  dweight[O,I] += doutᵀ · inp.
// Either of dinp/dweight may be null to skip it.
void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                     int64_t N, int64_t I, int64_t O, bool accumulate_dinp = false);

// ---- RMSNorm over rows of C: out = inp · rstd · weight, rstd = (mean(inp²)+eps)^-½ ----
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     float eps);
// With x̂ = inp·rstd:  dweight += Σ_rows dout∘x̂;
// dinp = rstd·(g − x̂·mean(g∘x̂)),  g = dout∘weight.   (accumulate: dinp +=)
// dinp may alias dout when accumulate_dinp is false.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C, bool accumulate_dinp = false);

// ---- RoPE (HF rotate_half convention) on x[B,T,heads,hd], in place ----
// cos/sin tables are [T, hd/2]: angle(t, j) = t · theta^(-2j/hd).
void rope_tables(float* cos_t, float* sin_t, int64_t T, int64_t hd, double theta);
// out[j] = x[j]c − x[j+h]s,  out[j+h] = x[j+h]c + x[j]s   (h = hd/2)
void rope_forward(float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                  int64_t hd);
// The transpose rotation: dx[j] = dy[j]c + dy[j+h]s,  dx[j+h] = dy[j+h]c − dy[j]s.
void rope_backward(float* dx, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads,
                   int64_t hd);

// ---- causal grouped-query attention ----
// q[B,T,H,hd], k,v[B,T,KV,hd] → y[B,T,H,hd], lse[B,H,T] (log-sum-exp of each
// scaled score row, kept so the backward can rebuild P without storing it).
// scratch: attention_scratch_floats(T) floats per OpenMP thread.
int64_t attention_scratch_floats(int64_t T);
void attention_forward(float* y, float* lse, const float* q, const float* k, const float* v, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t hd, float* scratch);
// S = s·QKᵀ (s = hd^-½), P = softmax(S) (causal), Y = PV.  With D = rowsum(dY∘Y):
//   dP = dY Vᵀ,  dS = P∘(dP − D),  dQ = s·dS K,  dK = s·dSᵀQ,  dV = PᵀdY.
// dq, dk, dv are assigned.
void attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k,
                        const float* v, const float* y, const float* lse, int64_t B, int64_t T, int64_t H,
                        int64_t KV, int64_t hd, float* scratch);

// ---- SwiGLU: h = silu(g)∘u over N·F elements ----
void swiglu_forward(float* h, const float* g, const float* u, int64_t n);
// dg = dh∘u∘σ(g)(1 + g(1−σ(g))),  du = dh∘silu(g).
void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t n);

// ---- embedding ----
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C);
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t N, int64_t C);

// ---- elementwise ----
void add_inplace(float* y, const float* x, int64_t n);           // y += x
void add(float* out, const float* a, const float* b, int64_t n);  // out = a + b

// ---- LM head + softmax cross-entropy, fused, in row chunks ----
// logits = x[N,C] · W[V,C]ᵀ, loss_i = logsumexp(logits_i) − logits_i[target_i].
// Returns Σ_i loss_i.  If dx is non-null also computes, with dlogits_i =
// scale·(softmax_i − onehot(target_i)):  dx = dlogits·W (assigned),
// dW += dlogitsᵀ·x.  scratch: lm_head_scratch_floats(V) floats.
// Targets < 0 are ignored (no loss, no gradient).
int64_t lm_head_chunk_rows();
int64_t lm_head_scratch_floats(int64_t V);
double lm_head_loss(float* dx, float* dW, const float* x, const float* W, const int32_t* targets, int64_t N,
                    int64_t C, int64_t V, float scale, float* scratch, float* losses_out = nullptr);

}  // namespace attnres
