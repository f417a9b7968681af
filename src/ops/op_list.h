// op_list.h — the ops of ops/backend.h that read or write backend memory, as
// one list: X(family, return type, name, (parameters), (arguments)) per op,
// the family (OpFamily in backend.h) being what `--profile` counts it under.  The CPU
// backend declares its implementations (<name>_impl) from it; the guarded,
// timed and partial backends wrap each one from it; Backend's public entry
// per op (check, then <name>_impl) and Op::k_<name> come from it (backend.h),
// so a new op is written here once (backend.h documents it and gives its
// default body; ops/op_checks.cpp its argument checks; the compiler's
// `override` and the linker keep them in step; docs/DESIGN.md §4 "Adding an
// op" walks the rest).  Not listed: the memory
// functions (alloc, synchronize, upload, download, map, unmap), which each
// backend writes by hand, and the *_workspace sizes, which touch no memory.
#pragma once

#define ATTNRES_BACKEND_OPS(X) ATTNRES_PRODUCT_OPS(X) ATTNRES_KERNEL_OPS(X)

// A row's (parameters) or (arguments) without their parentheses, to put
// something before them or pass them on.
#define ATTNRES_UNPAREN(...) __VA_ARGS__

// The products (matmul.cpp): BLAS and oneDNN calls, compiled once.
#define ATTNRES_PRODUCT_OPS(X)                                                                                        \
  X(Products, void, to_bf16, (bf16* dst, const float* src, int64_t n), (dst, src, n))                                 \
  X(Products, void, matmul_forward, (float* out, Rows inp, Weight W, int64_t N, int64_t I, int64_t O),                \
    (out, inp, W, N, I, O))                                                                                           \
  X(Products, void, matmul_backward,                                                                                  \
    (float* dinp, float* dW, Rows dout, Rows inp, Weight W, int64_t N, int64_t I, int64_t O,                          \
     bool accumulate_dinp),                                                                                           \
    (dinp, dW, dout, inp, W, N, I, O, accumulate_dinp))

// Every other op: our own kernels, compiled once per instruction-set level
// (cpu_level.h) into the CpuKernels of that level (cpu_backend.h).
#define ATTNRES_KERNEL_OPS(X)                                                                                         \
  X(Norms, void, copy, (float* dst, const float* src, int64_t n), (dst, src, n))                                      \
  X(Norms, void, fill, (float* dst, float value, int64_t n), (dst, value, n))                                         \
  X(Norms, void, rmsnorm_forward,                                                                                     \
    (RowsOut out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps),               \
    (out, rstd, inp, weight, N, C, eps))                                                                              \
  X(Norms, void, rmsnorm_backward,                                                                                    \
    (float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd,        \
     int64_t N, int64_t C, bool accumulate_dinp),                                                                     \
    (dinp, dweight, dout, inp, weight, rstd, N, C, accumulate_dinp))                                                  \
  X(Attention, void, rope_tables, (float* cos_t, float* sin_t, int64_t P, int64_t hd, double theta),                  \
    (cos_t, sin_t, P, hd, theta))                                                                                     \
  X(Attention, void, rope_forward,                                                                                    \
    (float* x, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads, int64_t hd,               \
     const int64_t* pos),                                                                                             \
    (x, cos_t, sin_t, B, T, heads, hd, pos))                                                                          \
  X(Attention, void, rope_backward,                                                                                   \
    (float* dx, const float* cos_t, const float* sin_t, int64_t B, int64_t T, int64_t heads, int64_t hd),             \
    (dx, cos_t, sin_t, B, T, heads, hd))                                                                              \
  X(Attention, void, kv_cache_store,                                                                                  \
    (float* cache, const float* x, const int64_t* slot, const int64_t* pos, int64_t B, int64_t T, int64_t P,          \
     int64_t w),                                                                                                      \
    (cache, x, slot, pos, B, T, P, w))                                                                                \
  X(Attention, void, attention_forward,                                                                               \
    (float* y, float* lse, const float* q, const KeyValues& kv, int64_t B, int64_t T, int64_t H, int64_t KV,          \
     int64_t hd, Precision p),                                                                                        \
    (y, lse, q, kv, B, T, H, KV, hd, p))                                                                              \
  X(Attention, void, attention_backward,                                                                              \
    (float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k, const float* v,                \
     const float* y, const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, Precision p),         \
    (dq, dk, dv, dy, q, k, v, y, lse, B, T, H, KV, hd, p))                                                            \
  X(Norms, void, swiglu_forward, (RowsOut h, const float* g, const float* u, int64_t n), (h, g, u, n))                \
  X(Norms, void, swiglu_backward,                                                                                     \
    (RowsOut dg, RowsOut du, const float* dh, const float* g, const float* u, int64_t n),                             \
    (dg, du, dh, g, u, n))                                                                                            \
  X(Norms, void, embedding_forward, (float* out, const int32_t* tokens, Weight table, int64_t N, int64_t C),          \
    (out, tokens, table, N, C))                                                                                       \
  X(Norms, void, embedding_backward, (float* dtable, const float* dout, const int32_t* tokens, int64_t N, int64_t C), \
    (dtable, dout, tokens, N, C))                                                                                     \
  X(Norms, void, add_inplace, (float* y, const float* x, int64_t n), (y, x, n))                                       \
  X(Norms, void, add, (float* out, const float* a, const float* b, int64_t n), (out, a, b, n))                        \
  X(Norms, void, sub, (float* out, const float* a, const float* b, int64_t n), (out, a, b, n))                        \
  X(Norms, void, scale, (float* x, float c, int64_t n), (x, c, n))                                                    \
  X(Optimizer, double, sum_squares, (const float* x, int64_t n), (x, n))                                              \
  X(LmHead, double, lm_head_loss,                                                                                     \
    (float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N, int64_t C, int64_t V,         \
     float scale, float* losses_out, uint8_t* greedy_out),                                                            \
    (dx, dW, x, W, targets, N, C, V, scale, losses_out, greedy_out))                                                  \
  X(LmHead, double, cross_entropy,                                                                                    \
    (float* dlogits, const float* logits, const int32_t* targets, int64_t N, int64_t V, float scale,                  \
     float* losses_out, uint8_t* greedy_out),                                                                         \
    (dlogits, logits, targets, N, V, scale, losses_out, greedy_out))                                                  \
  X(Routing, void, source_rstd, (float* rstd, const float* v, int64_t N, int64_t d, float eps), (rstd, v, N, d, eps)) \
  X(Routing, void, route_forward,                                                                                     \
    (float* out, float* logits, const RouteSource* src, int64_t S, int64_t H, const float* w, const float* gamma,     \
     const float* base, const float* gate, Combine combine, int64_t N, int64_t d, double* stats),                     \
    (out, logits, src, S, H, w, gamma, base, gate, combine, N, d, stats))                                             \
  X(Routing, void, route_mix,                                                                                         \
    (float* out, const float* logits, const RouteSource* src, int64_t S, int64_t H, const float* base,                \
     const float* gate, Combine combine, int64_t N, int64_t d),                                                       \
    (out, logits, src, S, H, base, gate, combine, N, d))                                                              \
  X(Routing, void, route_mix_weights,                                                                                 \
    (float* out, const double* weights, const RouteSource* src, int64_t S, int64_t H, const float* base,              \
     const float* gate, Combine combine, int64_t N, int64_t d),                                                       \
    (out, weights, src, S, H, base, gate, combine, N, d))                                                             \
  X(Routing, void, route_mix_stream,                                                                                  \
    (float* out, const float* logits, const RouteSource* src, int64_t S, int64_t H, const float* gate, int64_t N,     \
     int64_t d),                                                                                                      \
    (out, logits, src, S, H, gate, N, d))                                                                             \
  X(Routing, void, route_backward,                                                                                    \
    (float* const* dsrc, float* dbase, float* dw, float* dgamma, float* dgate, const float* dout,                     \
     const float* logits, const RouteSource* src, int64_t S, int64_t H, const float* w, const float* gamma,           \
     const float* base, const float* gate, Combine combine, int64_t N, int64_t d, const RouteRebuild* rebuild,        \
     bool accumulate_src, float entropy_scale),                                                                       \
    (dsrc, dbase, dw, dgamma, dgate, dout, logits, src, S, H, w, gamma, base, gate, combine, N, d, rebuild,           \
     accumulate_src, entropy_scale))                                                                                  \
  X(Routing, void, route_entropy, (double* sum, const float* logits, int64_t S, int64_t H, int64_t N),               \
    (sum, logits, S, H, N))                                                                                           \
  X(Routing, void, sigmoid_forward, (float* y, const float* x, int64_t n), (y, x, n))                                 \
  X(Routing, void, sigmoid_backward, (float* dx, const float* dy, const float* y, int64_t n), (dx, dy, y, n))         \
  X(Routing, void, gate_vector_forward,                                                                               \
    (float* u, float* g, float* diff, const float* bias, const float* base, int64_t N, int64_t d),                    \
    (u, g, diff, bias, base, N, d))                                                                                   \
  X(Routing, void, gate_vector_backward,                                                                              \
    (float* dh, float* dpre, float* dbias, float* dbase, const float* du, const float* g, const float* diff,          \
     int64_t N, int64_t d),                                                                                           \
    (dh, dpre, dbias, dbase, du, g, diff, N, d))                                                                      \
  X(Routing, void, sigmoid_gate_forward, (float* g, const float* pre, const float* bias, int64_t N, int64_t d),       \
    (g, pre, bias, N, d))                                                                                             \
  X(Routing, void, sigmoid_gate_backward,                                                                             \
    (float* dpre, float* dbias, const float* dg, const float* g, int64_t N, int64_t d), (dpre, dbias, dg, g, N, d))   \
  X(Routing, void, gated_source_forward,                                                                              \
    (float* y, float* y_rstd, const float* g, const float* v, int64_t N, int64_t d, float eps),                       \
    (y, y_rstd, g, v, N, d, eps))                                                                                     \
  X(Routing, void, gated_source_backward,                                                                             \
    (float* dv, float* dg, const float* dy, const float* g, const float* v, int64_t N, int64_t d, bool accumulate_dv), \
    (dv, dg, dy, g, v, N, d, accumulate_dv))                                                                          \
  X(Optimizer, void, adamw_update,                                                                                    \
    (float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate& u, bf16* p16),                       \
    (p, g, m, v, n, u, p16))
