// lm_head.cpp — LM head and softmax cross-entropy, fused and chunked over rows
// so the [N, V] logits never exist at once: per chunk of rows the logits are
// computed, turned into losses and (when training) into dlogits in place, and
// immediately pushed through the head's backward.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/fast_exp.h"

#include "ops/cpu/isa_begin.h"  // compiled for this copy's level (cpu_level.h)

namespace attnres::ATTNRES_ISA {  // this level's copy (cpu_backend.h)

namespace {
// Rows per chunk: 256, fewer for a large vocabulary so that one chunk's logits
// stay within 16 M floats (64 MiB; Qwen3's 151936 entries: 110 rows).
int64_t chunk_rows(int64_t V) {
  const int64_t rows = (int64_t{16} << 20) / V;
  return rows > 256 ? 256 : (rows < 16 ? 16 : rows);
}

// A row's largest logit and log-sum-exp: Σ exp in float per SIMD lane,
// lanes and blocks of 256 summed in double.
struct RowMax {
  float max;
  double lse;
};
RowMax row_lse(const float* z, int64_t V) {
  float mx = z[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j < V; ++j) mx = z[j] > mx ? z[j] : mx;
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < V; j0 += 256) {
    const int64_t j1 = j0 + 256 < V ? j0 + 256 : V;
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int64_t j = j0; j < j1; ++j) part += fast_exp(z[j] - mx);
    sum += part;
  }
  return {mx, mx + std::log(sum)};
}

// Whether the target is the first index of the largest logit (torch.argmax's).
bool is_first_argmax(const float* z, int32_t target, float mx) {
  bool first = target >= 0 && z[target] == mx;
  for (int64_t j = 0; first && j < target; ++j) first = z[j] != mx;
  return first;
}

// dlogits = scale · (softmax − onehot) (dz may alias z).
void dlogits_row(float* dz, const float* z, int64_t V, int32_t target, double lse, float scale) {
  const float lse_f = static_cast<float>(lse);
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) dz[j] = scale * fast_exp(z[j] - lse_f);
  dz[target] -= scale;
}
}  // namespace

// Scratch: a chunk's logits (rows, V) | in bf16, the copies of its x (rows, C)
// and of dlogits (rows, V).
int64_t CpuKernels::lm_head_workspace(int64_t C, int64_t V, Precision p) const {
  const int64_t rows = chunk_rows(V);
  return rows * V + (p == Precision::kBF16 ? bf16_floats(rows * C) + bf16_floats(rows * V) : 0);
}

double CpuKernels::lm_head_loss_impl(float* dx, float* dW, const float* x, Weight W, const int32_t* targets, int64_t N,
                                int64_t C, int64_t V, float scale, float* losses_out, uint8_t* greedy_out) {
  const int64_t kChunk = chunk_rows(V);
  float* scratch = ctx_.workspace(lm_head_workspace(C, V, W.precision()));
  bf16* x16 = reinterpret_cast<bf16*>(scratch + kChunk * V);                        // (rows, C)
  bf16* dl16 = reinterpret_cast<bf16*>(scratch + kChunk * V + bf16_floats(kChunk * C));  // (rows, V)
  // Each row's loss lands in its own slot and the slots are added in row
  // order, so the total does not depend on the thread count.
  std::vector<double> row_loss(static_cast<size_t>(kChunk));
  double total = 0.0;
  for (int64_t r0 = 0; r0 < N; r0 += kChunk) {
    const int64_t rows = r0 + kChunk < N ? kChunk : N - r0;
    float* logits = scratch;  // (rows, V)
    if (W.b16) {  // logits[rows, V] = bf16(x) · Wᵀ
      to_bf16(x16, x + r0 * C, rows * C);
      gemm_bf16(false, true, rows, V, C, x16, C, W.b16, C, /*accumulate=*/false, logits, V);
    } else {
      gemm(false, true, rows, V, C, 1.0f, x + r0 * C, C, W.f32, C, 0.0f, logits, V);
    }
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int64_t r = 0; r < rows; ++r) {
      float* z = logits + r * V;
      const int32_t target = targets[r0 + r];
      const RowMax m = row_lse(z, V);
      const double lse = m.lse;
      row_loss[static_cast<size_t>(r)] = 0.0;
      if (greedy_out) greedy_out[r0 + r] = is_first_argmax(z, target, m.max);
      if (target < 0) {
        if (losses_out) losses_out[r0 + r] = 0.0f;
        if (dx && W.b16) std::fill(dl16 + r * V, dl16 + (r + 1) * V, bf16{0});
        else if (dx) std::fill(z, z + V, 0.0f);
        continue;
      }
      const double loss = lse - z[target];
      row_loss[static_cast<size_t>(r)] = loss;
      if (losses_out) losses_out[r0 + r] = static_cast<float>(loss);
      if (dx && W.b16) {
        // dlogits = scale · (softmax − onehot), written as the bf16 operand of
        // the two products that read it (the same floats, rounded here rather
        // than in a pass of their own over the chunk).
        const float lse_f = static_cast<float>(lse);
        bf16* dl = dl16 + r * V;
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) {
          const float p = scale * fast_exp(z[j] - lse_f);
          dl[j] = float_to_bf16(j == target ? p - scale : p);
        }
      } else if (dx) {
        dlogits_row(z, z, V, target, lse, scale);
      }
    }
    for (int64_t r = 0; r < rows; ++r) total += row_loss[static_cast<size_t>(r)];
    if (dx && W.b16) {
      // dx[rows, C] = bf16(dlogits) · W;   dW[V, C] += bf16(dlogits)ᵀ · bf16(x)
      gemm_bf16(false, false, rows, C, V, dl16, V, W.b16, C, /*accumulate=*/false, dx + r0 * C, C);
      if (dW) gemm_bf16(true, false, V, C, rows, dl16, V, x16, C, /*accumulate=*/true, dW, C);  // dl16 read transposed
    } else if (dx) {
      // dx[rows, C] = dlogits · W;   dW[V, C] += dlogitsᵀ · x
      gemm(false, false, rows, C, V, 1.0f, logits, V, W.f32, C, 0.0f, dx + r0 * C, C);
      if (dW) gemm(true, false, V, C, rows, 1.0f, logits, V, x + r0 * C, C, 1.0f, dW, C);
    }
  }
  return total;
}

// The same rows' arithmetic as the fused head's (row_lse, dlogits_row), on
// logits given.
double CpuKernels::cross_entropy_impl(float* dlogits, const float* logits, const int32_t* targets, int64_t N,
                                      int64_t V, float scale, float* losses_out, uint8_t* greedy_out) {
  std::vector<double> row_loss(static_cast<size_t>(N));
#pragma omp parallel for schedule(static) num_threads(threads()) if (N * V >= (int64_t{1} << 16))
  for (int64_t r = 0; r < N; ++r) {
    const float* z = logits + r * V;
    const int32_t target = targets[r];
    const RowMax m = row_lse(z, V);
    if (greedy_out) greedy_out[r] = is_first_argmax(z, target, m.max);
    if (target < 0) {
      row_loss[static_cast<size_t>(r)] = 0.0;
      if (losses_out) losses_out[r] = 0.0f;
      if (dlogits) std::fill(dlogits + r * V, dlogits + (r + 1) * V, 0.0f);
      continue;
    }
    const double loss = m.lse - z[target];
    row_loss[static_cast<size_t>(r)] = loss;
    if (losses_out) losses_out[r] = static_cast<float>(loss);
    if (dlogits) dlogits_row(dlogits + r * V, z, V, target, m.lse, scale);
  }
  double total = 0.0;
  for (double l : row_loss) total += l;
  return total;
}

}  // namespace attnres::ATTNRES_ISA

#include "ops/cpu/isa_end.h"
