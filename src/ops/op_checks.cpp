// op_checks.cpp — every op's argument checks, run by its public entry
// (Backend::<op>, backend.h) before any backend's implementation, so that a
// second backend need not repeat them.  What is checked here is what the host
// knows without reading backend memory: sizes, shapes the caller states
// (Weight's rows × cols), precisions of the operands, and what a combination
// of arguments needs.  What needs the memory itself (a source list's
// pointers, the cache rows of a KeyValues) stays with the backend that can
// read it.  A failed check is an InternalError: a caller broke the op's
// contract.  Every op of the list has its function here (backend.h declares
// them from the list), or the build does not link.
#include <cmath>

#include "ops/backend.h"

namespace attnres {

namespace {

void sizes(const char* op, std::initializer_list<int64_t> n) {
  for (int64_t v : n) ATTNRES_CHECK(v >= 0, op, ": a negative size ", v);
}

void heads(const char* op, int64_t H, int64_t d) {
  ATTNRES_CHECK(H >= 1 && H <= kMaxRoutingHeads && d % H == 0, op, ": routing heads ", H, " for d = ", d, " (1 to ",
                kMaxRoutingHeads, ", dividing d)");
}

// The combination out = a·base + c·R reads base unless it replaces without a gate.
void base_for(const char* op, const float* base, const float* gate, Combine combine) {
  ATTNRES_CHECK(base || (combine == Combine::kReplace && !gate), op, ": this combination needs a base");
}

void weight(const char* op, Weight W, int64_t rows, int64_t cols) {
  ATTNRES_CHECK(!W.f32 != !W.b16, op, ": a weight is float32 or bf16, exactly one");
  ATTNRES_CHECK(W.fits(rows, cols), op, ": a ", W.rows, " x ", W.cols, " weight for ", rows, " x ", cols);
}

// Rows in bf16 are read only by bf16 products.
void rows_for(const char* op, Rows r, Weight W) {
  ATTNRES_CHECK(r.f32 || W.b16, op, ": bf16 rows for a float32 weight");
}

}  // namespace

void Backend::check_to_bf16(bf16*, const float*, int64_t n) const { sizes("to_bf16", {n}); }
void Backend::check_copy(float*, const float*, int64_t n) const { sizes("copy", {n}); }
void Backend::check_fill(float*, float, int64_t n) const { sizes("fill", {n}); }

void Backend::check_matmul_forward(float*, Rows inp, Weight W, int64_t N, int64_t I, int64_t O) const {
  sizes("matmul_forward", {N, I, O});
  weight("matmul_forward", W, O, I);
  rows_for("matmul_forward", inp, W);
}

void Backend::check_matmul_backward(float*, float*, Rows dout, Rows inp, Weight W, int64_t N, int64_t I, int64_t O,
                                    bool) const {
  sizes("matmul_backward", {N, I, O});
  weight("matmul_backward", W, O, I);
  rows_for("matmul_backward", dout, W);
  rows_for("matmul_backward", inp, W);
}

void Backend::check_rmsnorm_forward(RowsOut, float*, const float*, const float*, int64_t N, int64_t C, float eps) const {
  sizes("rmsnorm_forward", {N, C});
  ATTNRES_CHECK(eps >= 0, "rmsnorm_forward: eps ", eps);
}

void Backend::check_rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*, int64_t N,
                                     int64_t C, bool) const {
  sizes("rmsnorm_backward", {N, C});
}

void Backend::check_rope_tables(float*, float*, int64_t P, int64_t hd, double theta) const {
  sizes("rope_tables", {P, hd});
  ATTNRES_CHECK(hd % 2 == 0 && theta > 0, "rope_tables: head_dim ", hd, " (even) and theta ", theta, " (> 0)");
}

void Backend::check_rope_forward(float*, const float*, const float*, int64_t B, int64_t T, int64_t heads, int64_t hd,
                                 const int64_t*) const {
  sizes("rope_forward", {B, T, heads, hd});
  ATTNRES_CHECK(hd % 2 == 0, "rope_forward: head_dim ", hd, " is odd");
}

void Backend::check_rope_backward(float*, const float*, const float*, int64_t B, int64_t T, int64_t heads,
                                  int64_t hd) const {
  sizes("rope_backward", {B, T, heads, hd});
  ATTNRES_CHECK(hd % 2 == 0, "rope_backward: head_dim ", hd, " is odd");
}

void Backend::check_kv_cache_store(float*, const float*, const int64_t* slot, const int64_t* pos, int64_t B, int64_t T,
                                   int64_t P, int64_t w) const {
  sizes("kv_cache_store", {B, T, P, w});
  ATTNRES_CHECK(slot && pos, "kv_cache_store: the rows' slots and positions are needed");
  ATTNRES_CHECK(T <= P, "kv_cache_store: a block of ", T, " positions in a cache of ", P);
}

void Backend::check_attention_forward(float*, float*, const float*, const KeyValues& kv, int64_t B, int64_t T,
                                      int64_t H, int64_t KV, int64_t hd, Precision) const {
  sizes("attention_forward", {B, T, hd});
  ATTNRES_CHECK(H >= 1 && KV >= 1 && H % KV == 0, "attention_forward: ", H, " query heads over ", KV, " KV heads");
  ATTNRES_CHECK(kv.k && kv.v && kv.stride >= T * KV * hd, "attention_forward: keys and values of stride ", kv.stride,
                " for ", T, " positions of ", KV, " x ", hd);
}

void Backend::check_attention_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                                       const float*, const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV,
                                       int64_t hd, Precision) const {
  sizes("attention_backward", {B, T, hd});
  ATTNRES_CHECK(H >= 1 && KV >= 1 && H % KV == 0, "attention_backward: ", H, " query heads over ", KV, " KV heads");
  ATTNRES_CHECK(lse, "attention_backward: the forward's log-sum-exp is needed");
}

void Backend::check_swiglu_forward(RowsOut, const float*, const float*, int64_t n) const { sizes("swiglu_forward", {n}); }

void Backend::check_swiglu_backward(RowsOut dg, RowsOut du, const float*, const float*, const float*, int64_t n) const {
  sizes("swiglu_backward", {n});
  ATTNRES_CHECK(!dg.f32 == !du.f32, "swiglu_backward: dg and du in one precision");
}

void Backend::check_embedding_forward(float*, const int32_t*, Weight table, int64_t N, int64_t C) const {
  sizes("embedding_forward", {N, C});
  ATTNRES_CHECK(!table.f32 != !table.b16, "embedding_forward: a table is float32 or bf16, exactly one");
  ATTNRES_CHECK(table.cols == 0 || table.cols == C, "embedding_forward: a table of rows of ", table.cols, ", not ", C);
}

void Backend::check_embedding_backward(float*, const float*, const int32_t*, int64_t N, int64_t C) const {
  sizes("embedding_backward", {N, C});
}

void Backend::check_add_inplace(float*, const float*, int64_t n) const { sizes("add_inplace", {n}); }
void Backend::check_add(float*, const float*, const float*, int64_t n) const { sizes("add", {n}); }
void Backend::check_sub(float*, const float*, const float*, int64_t n) const { sizes("sub", {n}); }
void Backend::check_scale(float*, float, int64_t n) const { sizes("scale", {n}); }
void Backend::check_sum_squares(const float*, int64_t n) const { sizes("sum_squares", {n}); }

void Backend::check_lm_head_loss(float*, float*, const float*, Weight W, const int32_t*, int64_t N, int64_t C,
                                 int64_t V, float, float*, uint8_t*) const {
  sizes("lm_head_loss", {N, C, V});
  weight("lm_head_loss", W, V, C);
}

void Backend::check_cross_entropy(float*, const float* logits, const int32_t* targets, int64_t N, int64_t V, float,
                                  float*, uint8_t*) const {
  sizes("cross_entropy", {N, V});
  ATTNRES_CHECK(V >= 1 && (N == 0 || (logits && targets)), "cross_entropy: logits rows of ", V, " and their targets");
}

void Backend::check_source_rstd(float*, const float*, int64_t N, int64_t d, float eps) const {
  sizes("source_rstd", {N, d});
  ATTNRES_CHECK(eps >= 0, "source_rstd: eps ", eps);
}

void Backend::check_route_forward(float*, float*, const RouteSource* src, int64_t S, int64_t H, const float* w,
                                  const float* gamma, const float* base, const float* gate, Combine combine, int64_t N,
                                  int64_t d, double*) const {
  sizes("route_forward", {N, d});
  ATTNRES_CHECK(src && S >= 1, "route_forward: a router needs at least one source");
  ATTNRES_CHECK(w && gamma, "route_forward: the router's query and norm weight are needed");
  heads("route_forward", H, d);
  base_for("route_forward", base, gate, combine);
}

void Backend::check_route_mix(float*, const float* logits, const RouteSource* src, int64_t S, int64_t H,
                              const float* base, const float* gate, Combine combine, int64_t N, int64_t d) const {
  sizes("route_mix", {N, d});
  ATTNRES_CHECK(src && S >= 1 && logits, "route_mix: sources and their logits are needed");
  heads("route_mix", H, d);
  base_for("route_mix", base, gate, combine);
}

void Backend::check_route_mix_weights(float*, const double* weights, const RouteSource* src, int64_t S, int64_t H,
                                      const float* base, const float* gate, Combine combine, int64_t N,
                                      int64_t d) const {
  sizes("route_mix_weights", {N, d});
  ATTNRES_CHECK(src && S >= 1 && weights, "route_mix_weights: sources and their weights are needed");
  heads("route_mix_weights", H, d);
  base_for("route_mix_weights", base, gate, combine);
}

void Backend::check_route_mix_stream(float*, const float* logits, const RouteSource* src, int64_t S, int64_t H,
                                     const float*, int64_t N, int64_t d) const {
  sizes("route_mix_stream", {N, d});
  ATTNRES_CHECK(src && S >= 1 && logits, "route_mix_stream: sources and their logits are needed");
  heads("route_mix_stream", H, d);
}

void Backend::check_route_backward(float* const* dsrc, float*, float*, float*, float*, const float* dout, const float*,
                                   const RouteSource* src, int64_t S, int64_t H, const float* w, const float* gamma,
                                   const float* base, const float* gate, Combine combine, int64_t N, int64_t d,
                                   const RouteRebuild* rebuild, bool, float entropy_scale) const {
  sizes("route_backward", {N, d});
  ATTNRES_CHECK(src && dsrc && dout && S >= 1, "route_backward: sources, their gradients and dout are needed");
  ATTNRES_CHECK(std::isfinite(entropy_scale) && entropy_scale >= 0,
                "route_backward: entropy scale ", entropy_scale, " (a finite value >= 0)");
  ATTNRES_CHECK(w && gamma, "route_backward: the router's query and norm weight are needed");
  heads("route_backward", H, d);
  ATTNRES_CHECK(!(gate && combine == Combine::kReplace) || base,
                "route_backward: a gated replacement needs its base in the backward");
  if (!rebuild) return;
  ATTNRES_CHECK(rebuild->out && rebuild->src && rebuild->S >= 1,
                "route_backward: a rebuild needs its output and its sources");
  ATTNRES_CHECK(rebuild->S <= S, "route_backward: a rebuilt router may not have more sources than this one");
  heads("route_backward (rebuild)", rebuild->H, d);
  ATTNRES_CHECK(rebuild->stream ? rebuild->combine == Combine::kAdd
                                : rebuild->base || (rebuild->combine == Combine::kReplace && !rebuild->gate),
                "route_backward: rebuild: bad base");
  ATTNRES_CHECK(rebuild->logits || (rebuild->w && rebuild->gamma),
                "route_backward: rebuild: no logits and no query to compute them from");
}

void Backend::check_route_entropy(double* sum, const float* logits, int64_t S, int64_t H, int64_t N) const {
  sizes("route_entropy", {S, N});
  ATTNRES_CHECK(sum && S >= 1 && (N == 0 || logits), "route_entropy: a sum and the logits of at least one source");
  ATTNRES_CHECK(H >= 1 && H <= kMaxRoutingHeads, "route_entropy: routing heads ", H, " (1 to ", kMaxRoutingHeads, ")");
}

void Backend::check_sigmoid_forward(float* y, const float* x, int64_t n) const {
  sizes("sigmoid_forward", {n});
  ATTNRES_CHECK(n == 0 || (y && x), "sigmoid_forward: input and output are needed");
}

void Backend::check_sigmoid_backward(float* dx, const float* dy, const float* y, int64_t n) const {
  sizes("sigmoid_backward", {n});
  ATTNRES_CHECK(n == 0 || (dx && dy && y), "sigmoid_backward: dx, dy and the forward's output are needed");
}

void Backend::check_gate_vector_forward(float* u, float* g, float*, const float* bias, const float* base, int64_t N,
                                        int64_t d) const {
  sizes("gate_vector_forward", {N, d});
  ATTNRES_CHECK(N == 0 || (u && g && bias && base), "gate_vector_forward: u, g, the bias and the base are needed");
}

void Backend::check_gate_vector_backward(float* dh, float* dpre, float* dbias, float* dbase, const float* du,
                                         const float* g, const float* diff, int64_t N, int64_t d) const {
  sizes("gate_vector_backward", {N, d});
  ATTNRES_CHECK(N == 0 || (dh && dpre && dbias && dbase && du && g && diff),
                "gate_vector_backward: every gradient, du, g and diff are needed");
}

void Backend::check_sigmoid_gate_forward(float* g, const float* pre, const float* bias, int64_t N, int64_t d) const {
  sizes("sigmoid_gate_forward", {N, d});
  ATTNRES_CHECK(N == 0 || (g && pre && bias), "sigmoid_gate_forward: g, pre and the bias are needed");
}

void Backend::check_sigmoid_gate_backward(float* dpre, float* dbias, const float* dg, const float* g, int64_t N,
                                          int64_t d) const {
  sizes("sigmoid_gate_backward", {N, d});
  ATTNRES_CHECK(N == 0 || (dpre && dbias && dg && g), "sigmoid_gate_backward: dpre, dbias, dg and g are needed");
}

void Backend::check_gated_source_forward(float* y, float* y_rstd, const float* g, const float* v, int64_t N, int64_t d,
                                         float eps) const {
  sizes("gated_source_forward", {N, d});
  ATTNRES_CHECK(N == 0 || (y && y_rstd && g && v), "gated_source_forward: y, its rstd, g and v are needed");
  ATTNRES_CHECK(eps > 0, "gated_source_forward: eps must be positive");
}

void Backend::check_gated_source_backward(float* dv, float* dg, const float* dy, const float* g, const float* v,
                                          int64_t N, int64_t d, bool) const {
  sizes("gated_source_backward", {N, d});
  ATTNRES_CHECK(N == 0 || (dv && dg && dy && g && v), "gated_source_backward: dv, dg, dy, g and v are needed");
}

void Backend::check_adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWUpdate&,
                                 bf16*) const {
  sizes("adamw_update", {n});
  ATTNRES_CHECK(n == 0 || (p && g && m && v), "adamw_update: parameters, gradients and both moments are needed");
}

}  // namespace attnres
