// harness.cpp — see harness.h.
#include "bench/harness.h"

#include <algorithm>

#include "core/buffer.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "infer/generate.h"
#include "infer/kv_cache.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/timed_backend.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace attnres {

nlohmann::json bench_training(Context& ctx, const Config& c, int64_t B, int64_t T, Precision precision, int64_t steps,
                              int64_t warmup, double peak_flops) {
  ModelOptions mo{B, T};
  mo.precision = precision;
  Model model(ctx, c, mo);
  Rng rng(1);
  model.init(rng);
  AdamW adamw(ctx.ops(), model.layout(), AdamWConfig{});
  const int64_t N = B * T;
  // Random tokens, drawn outside the timed region.
  std::vector<int32_t> tokens(static_cast<size_t>(2 * N));
  auto next = [&](int32_t* in, int32_t* tg) {
    std::copy(tokens.begin(), tokens.begin() + N, in);
    std::copy(tokens.begin() + N, tokens.end(), tg);
  };
  double seconds = 0, loss = 0;
  OpTimes* times = op_times(ctx);  // --profile
  for (int64_t s = 0; s < warmup + steps; ++s) {
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.V)));
    if (times && s == warmup) times->reset();
    const double t0 = now_seconds();
    loss = train_step(model, adamw, next, 1, 1e-4, s + 1, 1.0).loss;
    if (s >= warmup) seconds += now_seconds() - t0;
  }
  const double tok_s = static_cast<double>(N * steps) / seconds;
  nlohmann::json profile;
  if (times) {
    // ms per step in each family of ops, and outside them (host code between the ops).
    const double per = 1e3 / static_cast<double>(steps);
    for (int i = 0; i < kOpFamilies; ++i)
      profile[op_family_name(static_cast<OpFamily>(i))] = times->seconds[static_cast<size_t>(i)] * per;
    profile["outside_ops"] = (seconds - times->total()) * per;
  }
  nlohmann::json routing_traffic;
  if (times && !model.routers().empty()) {
    // The routing ops' bytes per token, the least they can move: every
    // router's forward reads its S' token-row sources (the broadcast null
    // source aside) and writes its output; its backward reads the sources and
    // dout, and reads and writes each source's gradient (3 S' + 1 rows).
    // Against the routing time this is the bandwidth the routers run at.
    double rows = 0;
    for (const Router& r : model.routers()) {
      int64_t S = 0;
      for (const RouteSource& s : r.src) S += s.broadcast ? 0 : 1;
      rows += static_cast<double>((S + 1) + (3 * S + 1));
    }
    const double bytes = rows * static_cast<double>(c.d) * 4.0;
    routing_traffic["bytes_per_token"] = bytes;
    routing_traffic["gb_per_s"] =
        bytes * static_cast<double>(N * steps) / times->seconds[static_cast<size_t>(OpFamily::kRouting)] / 1e9;
  }
  nlohmann::json ops_profile;  // the same per op: which op of a family
  if (times)
    for (int i = 0; i < kOps; ++i)
      if (times->op_calls[static_cast<size_t>(i)] > 0)
        ops_profile[op_name(static_cast<Op>(i))] = times->op_seconds[static_cast<size_t>(i)] * 1e3 / static_cast<double>(steps);
  return {{"mode", c.mode_label()},
          {"routing_heads", c.routing_heads},
          {"precision", precision_name(precision)},
          {"tok_per_s", tok_s},
          {"ms_per_step", 1e3 * seconds / static_cast<double>(steps)},
          {"mfu", tok_s * model.flops_per_token(T) / peak_flops},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"params", model.num_params()},
          {"B", B},
          {"T", T},
          {"steps", steps},
          {"threads", ctx.threads()},
          {"kernels", ctx.ops().kernels()},
          {"attention_tiles", ctx.ops().attention_tiles()},
          {"fp32_gemm", fp32_gemm_name(choose_fp32_gemm())},
          {"loss", loss},
          {"profile_ms_per_step", profile},
          {"routing_traffic", routing_traffic},
          {"ops_ms_per_step", ops_profile}};
}

double measure_copy_gb_per_s(Context& ctx) {
  const int64_t n = int64_t{1} << 26;
  Buffer a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  const int threads = ctx.threads();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) b.data()[i] = static_cast<float>(i & 1023), a.data()[i] = 0.0f;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_seconds();
    float* dst = a.data();
    const float* src = b.data();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    best = std::max(best, 2.0 * 4.0 * static_cast<double>(n) / (now_seconds() - t0) / 1e9);
  }
  return best;
}

double weight_bytes_per_token(const Model& m) {
  const Config& c = m.config();
  const double elt = m.precision() == Precision::kBF16 ? 2.0 : 4.0;
  double bytes = 0;
  for (const auto& s : m.layout().specs()) {
    if (s.name == "model.embed_tokens.weight" && !c.tied) continue;
    bytes += static_cast<double>(s.numel) * (s.matrix ? elt : 4.0);
  }
  return bytes;
}

std::vector<int32_t> random_ids(Rng& rng, int64_t n, int64_t V) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return ids;
}

nlohmann::json bench_generation(Context& ctx, Config c, const GenerationBench& f) {
  const int64_t P = f.prompt_len, Pd = f.decode_prompt_len, new_tokens = f.new_tokens, Bd = f.decode_batch;
  if (P < 1 || Pd < 1 || new_tokens < 1 || Bd < 1)
    fail("--prompt-len, --decode-prompt-len, --new-tokens and --decode-batch must be positive");
  c.query_init_normal = true;  // random routing, not uniform
  ModelOptions mo;
  mo.training = false;
  mo.batch = Bd;
  mo.seq_len = P;
  mo.rows = std::max(Bd, P);
  mo.cache_len = std::max(P, Pd + new_tokens + 1);
  mo.precision = f.precision;
  if (mo.cache_len > c.max_position_embeddings) fail("the benchmark's lengths exceed max_position_embeddings");
  Model m(ctx, c, mo);
  Rng rng(1);
  m.init(rng);
  KvCache cache(m, Bd);
  std::vector<float> logits(static_cast<size_t>(Bd * c.V));
  const int64_t slot0 = 0, pos0 = 0;

  // Prefill: one untimed short prompt, then one of P tokens.
  auto warm = random_ids(rng, std::min<int64_t>(P, 16), c.V);
  cache.forward(warm.data(), 1, static_cast<int64_t>(warm.size()), &slot0, &pos0, logits.data());
  auto prompt = random_ids(rng, P, c.V);
  double t0 = now_seconds();
  cache.forward(prompt.data(), 1, P, &slot0, &pos0, logits.data());
  const double prefill_s = now_seconds() - t0;

  // Decode: greedy, no end-of-sequence, new_tokens steps after the prompt's own token.
  GenerateOptions g;
  g.max_new_tokens = new_tokens + 1;
  auto decode = [&](int64_t B) {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t b = 0; b < B; ++b) prompts.push_back(random_ids(rng, Pd, c.V));
    GenerateOptions w = g;  // an untimed warm-up of two steps at this batch
    w.max_new_tokens = 3;
    generate(cache, prompts, w);
    GenerateTimes t;
    generate(cache, prompts, g, &t);
    return static_cast<double>(t.decode_tokens) / t.decode_s;
  };
  const double b1 = decode(1), bB = decode(Bd);
  const int64_t rss = peak_rss_bytes();
  nlohmann::json r = {{"mode", c.mode_label()},
                      {"routing_heads", c.routing_heads},
                      {"precision", precision_name(m.precision())},
                      {"threads", ctx.threads()},
                      {"kernels", ctx.ops().kernels()},
                      {"attention_tiles", ctx.ops().attention_tiles()},
                      {"params", m.num_params()},
                      {"weight_bytes", m.weight_bytes()},
                      {"bytes_per_token", weight_bytes_per_token(m)},
                      {"prompt_len", P},
                      {"prefill_tok_per_s", static_cast<double>(P) / prefill_s},
                      {"decode_prompt_len", Pd},
                      {"new_tokens", new_tokens},
                      {"decode_batch", Bd},
                      {"decode_tok_per_s_b1", b1},
                      {cat("decode_tok_per_s_b", Bd), bB},
                      {"peak_rss_bytes", rss}};
  if (f.train_forward) {
    // The training forward over the same P tokens (a training model keeps
    // every layer's activations), for "prefill at least as fast per token".
    ModelOptions to{1, P};
    to.precision = m.precision();
    Model tm(ctx, c, to);
    tm.init(rng);
    std::vector<int32_t> tg(prompt.begin() + 1, prompt.end());
    tg.push_back(0);
    tm.forward_backward(prompt.data(), tg.data(), false);  // warm-up
    t0 = now_seconds();
    tm.forward_backward(prompt.data(), tg.data(), false);
    r["train_forward_tok_per_s"] = static_cast<double>(P) / (now_seconds() - t0);
  }
  return r;
}

std::vector<GemmShape> step_gemm_shapes(const Config& c, int64_t N) {
  std::vector<GemmShape> out;
  auto linear = [&](const std::string& name, int64_t O, int64_t I, int64_t count, int64_t rows) {
    out.push_back({name + " forward", false, true, rows, O, I, false, count});
    out.push_back({name + " dx", false, false, rows, I, O, false, count});
    out.push_back({name + " dW", true, false, O, I, rows, true, count});
  };
  linear("q", c.H * c.hd, c.d, c.L, N);
  linear("k,v", c.KV * c.hd, c.d, 2 * c.L, N);
  linear("o", c.d, c.H * c.hd, c.L, N);
  linear("gate,up", c.F, c.d, 2 * c.L, N);
  linear("down", c.d, c.F, c.L, N);
  // The LM head's chunks (ops/cpu/lm_head.cpp: 256 rows, fewer for a large vocabulary).
  const int64_t rows = std::clamp<int64_t>((int64_t{16} << 20) / c.V, 16, 256);
  linear("lm_head", c.V, c.d, (N + rows - 1) / rows, std::min(rows, N));
  return out;
}

GemmTiming time_gemm_shape(CpuBackend& cpu, const GemmShape& s, int reps, bool bf16) {
  return {cpu.time_gemm(Fp32Gemm::kOpenBlas, s.ta, s.tb, s.M, s.N, s.K, s.accumulate, reps),
          cpu.time_gemm(Fp32Gemm::kOneDnn, s.ta, s.tb, s.M, s.N, s.K, s.accumulate, reps),
          bf16 ? cpu.time_gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, s.accumulate, reps) : 0.0};
}

}  // namespace attnres
