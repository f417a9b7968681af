// harness.h — what `attnres bench` measures, each as a function of a
// Context and a Config that returns its figures (cli/bench.cpp runs each in a
// process of its own, so that its peak RSS is its own, and prints them):
//   bench_training    full training steps (forward, backward, clipping,
//                     AdamW) on random tokens: tok/s, MFU, peak RSS, and with
//                     a timed Context (--profile) where the step went;
//   bench_generation  prefill, decoding at batch 1 and B through the KV
//                     cache, and the training forward for comparison;
//   measure_copy_gb_per_s  the machine's copy bandwidth (decoding's bound);
//   step_gemm_shapes, time_gemm_shape  the float32 products of one step,
//                     through OpenBLAS and oneDNN shape by shape (the choice
//                     of the fp32 library).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/precision.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/context.h"

namespace attnres {

class CpuBackend;
class Rng;

// `steps` timed steps of micro-batch B × T after `warmup` untimed ones;
// MFU against peak_flops (FLOP/s).  The JSON line of a training worker:
// mode, routing_heads, precision, tok_per_s, ms_per_step, mfu,
// peak_rss_bytes, params, B, T, steps, threads, kernels, attention_tiles,
// fp32_gemm, loss (the last step's), and with a timed Context
// profile_ms_per_step (per op family, and outside_ops), ops_ms_per_step (per
// op) and routing_traffic (the routers' least bytes per token and the rate
// they moved them at).
nlohmann::json bench_training(Context& ctx, const Config& c, int64_t B, int64_t T, Precision precision, int64_t steps,
                              int64_t warmup, double peak_flops);

// STREAM's copy kernel, a[i] = b[i] over two 256 MiB arrays with every thread:
// the best of five passes, counted as STREAM counts it (bytes read + written).
double measure_copy_gb_per_s(Context& ctx);

// Bytes of weights read to decode one token: every matrix once (the embedding
// only as the tied LM head; an untied embedding gives one row), and the vectors.
double weight_bytes_per_token(const Model& m);

// n token ids drawn uniformly from [0, V).
std::vector<int32_t> random_ids(Rng& rng, int64_t n, int64_t V);

struct GenerationBench {
  int64_t prompt_len = 512;         // P: the prefill's prompt
  int64_t decode_prompt_len = 128;  // the decoded sequences' prompts
  int64_t new_tokens = 64;          // tokens decoded per sequence
  int64_t decode_batch = 8;         // B of the batched decode
  Precision precision = Precision::kF32;
  bool train_forward = true;        // also time the training forward over the P tokens
};
// One config and precision (routing drawn at random, not uniform): prefill
// tok/s of P tokens, decode tok/s at batch 1 and at decode_batch, the weight
// bytes per decoded token, peak RSS (read before the training forward's model
// is built), and the training forward's tok/s over the same P tokens.
nlohmann::json bench_generation(Context& ctx, Config c, const GenerationBench& g);

// The products of one training step, shape by shape, as gemm() (float32) and
// gemm_bf16() run them (the same fixed tiles on the same threads).  Per layer, for each
// linear W[O,I] on N = B·T rows: the forward out = x·Wᵀ (N, O, I), the input
// gradient dx = dy·W (N, I, O) and the weight gradient dW += dyᵀ·x (O, I,
// N); the LM head's the same per chunk of rows.  Attention's tile products
// (called per tile inside its kernel) are not among them.
struct GemmShape {
  std::string what;
  bool ta, tb;
  int64_t M, N, K;
  bool accumulate;
  int64_t per_step;  // calls in one step
};
std::vector<GemmShape> step_gemm_shapes(const Config& c, int64_t N);
// One shape through each library: seconds of one call, the fastest of reps
// after a warm-up, on this backend's threads.
// With bf16, the bf16 product as well (bf16_s; 0 when not timed).
struct GemmTiming {
  double openblas_s, onednn_s, bf16_s;
};
GemmTiming time_gemm_shape(CpuBackend& cpu, const GemmShape& s, int reps, bool bf16 = false);

}  // namespace attnres
