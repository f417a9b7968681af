// bench.cpp — `attnres bench`: tok/s, MFU and peak RSS of full training steps
// (forward, backward, clipping, AdamW) on random tokens; with --generate,
// prefill and decoding; with --gemm, the step's products per library.  What
// is measured is bench/harness.h; this file runs it and prints it.
//
// Each mode runs in a process of its own (posix_spawn of this binary), so its peak RSS is its
// own and not the largest of the modes before it.  MFU is measured against the
// product rate of the precision the step ran in — the float32 library's (oneDNN, or SGEMM) or oneDNN's
// bf16 matmul (bf16), both timed here on 2048³ — unless --peak-gflops is given.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "bench/harness.h"
#include "cli/options.h"
#include "core/spawn.h"
#include "core/error.h"
#include "ops/context.h"
#include "data/corpus.h"
#include "model/modes.h"
#include "ops/cpu/blas_kernels.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/timed_backend.h"
#include "model/presets.h"

namespace attnres {

namespace {

// bench's options (cmd_bench binds them to its flags).
struct BenchFlags {
  std::string config, mode;
  int64_t batch = 0, seq_len = 0, steps = 0, warmup_steps = 0, rounds = 0;
  int threads = 0;
  std::string device;
  std::string precision, precision_flag;  // a list; the spelling it was given as (--precision or --dtype)
  bool precision_given = false, config_given = false;
  double peak_gflops = 0;
  bool json = false, generate = false, gemm = false, profile = false;
  int64_t prompt_len = 0, decode_prompt_len = 0, new_tokens = 0, decode_batch = 0;
  bool no_train_forward = false, worker = false;
  std::string measure;
  std::optional<int64_t> routing_heads;
};

// The config a bench run builds: --config, with attnres_mode `mode` (empty:
// the config's) and --routing-heads laid over it where the mode is routed.
Config bench_config(const BenchFlags& f, const std::string& mode) {
  Config c = load_config(f.config);
  if (!mode.empty()) c = c.with_mode(mode);
  if (f.routing_heads && mode_spec(c.mode).routed()) {
    c.routing_heads = *f.routing_heads;
    c.validate("--routing-heads");
  }
  return c;
}

// Runs `attnres bench ARGS --worker` in a fresh process (posix_spawn: a plain
// fork would inherit a started OpenMP pool, which hangs), so that its peak RSS
// is its own, and returns the JSON line it prints.
nlohmann::json run_worker(const BenchFlags& f, std::vector<std::string> args, const std::string& what) {
  args.insert(args.begin(), {"bench", "--worker", "--device", f.device});
  const ChildResult r = run_self(args);
  if (r.exit_code != 0 || r.out.empty()) fail("benchmark of ", what, " failed (exit status ", r.exit_code, ")");
  return nlohmann::json::parse(r.out);
}

// A machine rate (SGEMM or bf16 GFLOP/s, copy GB/s) measured in a process of its own:
// a worker spawned later would inherit this process's peak RSS (Linux keeps
// the high-water mark across fork and exec), so the parent allocates nothing big.
double measured(const BenchFlags& f, const std::string& what) {
  return run_worker(f, {"--measure", what, "--threads", cat(f.threads)}, what)["value"].get<double>();
}

// The training benchmark of one mode, in its own process.
nlohmann::json bench_in_child(const std::string& mode, Precision p, const BenchFlags& f, double peak_gflops) {
  std::vector<std::string> args = {"--mode", mode, "--precision", precision_name(p), "--peak-gflops",
                                   cat(peak_gflops)};
  if (f.routing_heads && mode != "baseline") args.insert(args.end(), {"--routing-heads", cat(*f.routing_heads)});
  args.insert(args.end(), {"--config", f.config, "--batch", cat(f.batch), "--seq-len", cat(f.seq_len), "--steps",
                           cat(f.steps), "--warmup-steps", cat(f.warmup_steps), "--threads", cat(f.threads)});
  if (f.profile) args.push_back("--profile");
  return run_worker(f, args, cat("mode ", mode));
}


// ---- bench --generate ----------------------------------------------------------

// The precisions of --precision (a list); those this machine cannot run are
// refused when asked for, and left out with a note when they were a default.
std::vector<Precision> bench_precisions(const BenchFlags& f, const std::string& fallback, const Backend& ops, bool json) {
  const bool given = f.precision_given;
  std::vector<Precision> out;
  for (const std::string& s : split_commas(given ? f.precision : fallback)) {
    const Precision p = parse_precision(s, f.precision_flag.c_str());
    if (const std::string why = ops.unsupported(p); !why.empty()) {
      if (given) fail("--precision ", precision_name(p), ": ", why);
      if (!json) std::printf("bench: %s left out: %s\n", precision_name(p), why.c_str());
      continue;
    }
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  if (out.empty()) fail("--precision: nothing to run");
  return out;
}

int bench_generate(const BenchFlags& f, Context& ctx) {
  if (f.worker) {
    const Config c = bench_config(f, f.mode);
    GenerationBench g{f.prompt_len, f.decode_prompt_len, f.new_tokens, f.decode_batch,
                      parse_precision(f.precision, f.precision_flag.c_str()), !f.no_train_forward};
    if (f.prompt_len < 1 || f.decode_prompt_len < 1 || f.new_tokens < 1 || f.decode_batch < 1)
      fail("--prompt-len, --decode-prompt-len, --new-tokens and --decode-batch must be positive");
    nlohmann::json r = bench_generation(ctx, c, g);
    r["config"] = f.config;
    std::printf("%s\n", r.dump().c_str());
    return 0;
  }
  const bool json = f.json;
  const std::vector<Precision> precisions = bench_precisions(f, "fp32,bf16", ctx.ops(), json);
  const double copy = measured(f, "copy");
  if (!json)
    std::printf("bench --generate: %d threads, STREAM-like copy bandwidth %.1f GB/s; prefill of %lld tokens, "
                "decode of %lld tokens after %lld-token prompts\n",
                ctx.threads(), copy, static_cast<long long>(f.prompt_len),
                static_cast<long long>(f.new_tokens), static_cast<long long>(f.decode_prompt_len));
  const std::string Bd = cat(f.decode_batch);
  // --generate without --config: the three shapes of the targets.
  const std::string configs = f.config_given ? f.config : "tiny,bench-small,qwen3-0.6b";
  for (const std::string& config : split_commas(configs)) {
    for (const Precision p : precisions) {
      const std::string dtype = precision_name(p);
      std::vector<std::string> args = {"--generate", "--config", config, "--precision", dtype};
      if (!f.mode.empty()) args.insert(args.end(), {"--mode", f.mode});
      if (f.routing_heads) args.insert(args.end(), {"--routing-heads", cat(*f.routing_heads)});
      args.insert(args.end(), {"--threads", cat(f.threads), "--prompt-len", cat(f.prompt_len), "--decode-prompt-len",
                               cat(f.decode_prompt_len), "--new-tokens", cat(f.new_tokens), "--decode-batch",
                               cat(f.decode_batch)});
      if (f.no_train_forward) args.push_back("--no-train-forward");
      nlohmann::json r = run_worker(f, args, cat("generation on ", config, " ", dtype));
      // The memory-bandwidth bound of batch-1 decoding: weights read per token ÷ copy bandwidth.
      const double bound = copy * 1e9 / r["bytes_per_token"].get<double>();
      r["copy_gb_per_s"] = copy;
      r["bound_tok_per_s"] = bound;
      r["b1_bound_ratio"] = bound / r["decode_tok_per_s_b1"].get<double>();
      if (json) {
        std::printf("%s\n", r.dump().c_str());
      } else {
        std::printf("%-12s %-5s prefill %8.1f tok/s", config.c_str(), dtype.c_str(),
                    r["prefill_tok_per_s"].get<double>());
        if (r.contains("train_forward_tok_per_s"))
          std::printf(" (training forward %8.1f)", r["train_forward_tok_per_s"].get<double>());
        std::printf(" | decode b1 %7.1f tok/s (bound %7.1f, %.2fx) | b%s %7.1f tok/s | peak RSS %.2f GiB\n",
                    r["decode_tok_per_s_b1"].get<double>(), bound, r["b1_bound_ratio"].get<double>(), Bd.c_str(),
                    r[cat("decode_tok_per_s_b", Bd)].get<double>(),
                    r["peak_rss_bytes"].get<double>() / (1024.0 * 1024 * 1024));
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

// ---- bench --profile --------------------------------------------------------------

// The object `key` of the rounds' runs of one mode, each number averaged.
nlohmann::json mean_over_runs(const std::vector<nlohmann::json>& runs, const char* key) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& r : runs)
    for (const auto& [name, v] : r[key].items())
      out[name] = out.value(name, 0.0) + v.get<double>() / static_cast<double>(runs.size());
  return out;
}

// One line under a mode's: each family's share of the step, largest first.
void print_profile(const nlohmann::json& profile, const nlohmann::json& routing_traffic, double ms_per_step) {
  std::vector<std::pair<double, std::string>> parts;
  for (const auto& [family, ms] : profile.items())
    if (family != "communication" || ms.get<double>() > 0) parts.emplace_back(ms.get<double>(), family);
  std::sort(parts.rbegin(), parts.rend());
  std::printf("    where the step goes:");
  for (const auto& [ms, family] : parts) std::printf(" %s %.1f%%", family.c_str(), 100 * ms / ms_per_step);
  if (routing_traffic.contains("gb_per_s"))
    std::printf(" | routing moves >= %.0f KB/token at %.1f GB/s", routing_traffic["bytes_per_token"].get<double>() / 1e3,
                routing_traffic["gb_per_s"].get<double>());
  std::printf("\n");
}

// ---- bench --gemm ----------------------------------------------------------------

int bench_gemm(const BenchFlags& f, Context& ctx, bool batch_given) {
  auto* cpu = dynamic_cast<CpuBackend*>(&ctx.ops());
  if (!cpu) fail("bench --gemm measures the CPU's libraries: use --device cpu");
  if (!onednn::available()) fail("bench --gemm: this attnres was built without oneDNN (libdnnl-dev)");
  const std::vector<std::string> configs = split_commas(f.config_given ? f.config : "bench-small,qwen3-0.6b");
  const int reps = static_cast<int>(std::max<int64_t>(f.steps, 1));
  // --precision with bf16: each product in bf16 as well, as matmul's bf16 path runs it.
  bool bf16 = false;
  if (f.precision_given)
    for (const Precision p : bench_precisions(f, "fp32", ctx.ops(), f.json)) bf16 |= p == Precision::kBF16;
  for (const std::string& config : configs) {
    BenchFlags g = f;
    g.config = config;
    const Config c = bench_config(g, "");
    // The fine-tuning shape of a published model is one sequence (B 1) unless --batch says otherwise.
    const int64_t B = batch_given || config == "bench-small" || config == "tiny" ? f.batch : 1;
    const int64_t N = flag_batch_tokens(B, f.seq_len);
    double total[3] = {0, 0, 0};
    if (!f.json)
      std::printf("bench --gemm: %s, N = B·T = %lld x %lld, %d threads, OpenBLAS core %s%s, oneDNN %s; "
                  "fastest of %d\n%-16s %6s %6s %6s %8s %12s %12s %8s%s\n",
                  config.c_str(), static_cast<long long>(B), static_cast<long long>(f.seq_len), ctx.threads(),
                  openblas_core().c_str(), std::getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "",
                  onednn::isa().c_str(), reps, "product", "M", "N", "K", "per step", "OpenBLAS GF/s",
                  "oneDNN GF/s", "oneDNN/OB", bf16 ? "    bf16 GF/s" : "");
    for (const GemmShape& s : step_gemm_shapes(c, N)) {
      const double flop = 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
      const GemmTiming t = time_gemm_shape(*cpu, s, reps, bf16);
      const double sec[3] = {t.openblas_s, t.onednn_s, t.bf16_s};
      for (int lib = 0; lib < 3; ++lib) total[lib] += sec[lib] * static_cast<double>(s.per_step);
      if (f.json) {
        nlohmann::json row{{"config", config}, {"product", s.what}, {"M", s.M}, {"N", s.N},
                           {"K", s.K}, {"ta", s.ta}, {"tb", s.tb}, {"accumulate", s.accumulate},
                           {"per_step", s.per_step}, {"threads", ctx.threads()},
                           {"openblas_gflops", flop / sec[0] / 1e9},
                           {"onednn_gflops", flop / sec[1] / 1e9},
                           {"openblas_core", openblas_core()}, {"onednn_isa", onednn::isa()}};
        if (bf16) row["bf16_gflops"] = flop / sec[2] / 1e9;
        std::printf("%s\n", row.dump().c_str());
      } else {
        std::printf("%-16s %6lld %6lld %6lld %8lld %12.1f %12.1f %7.2fx", s.what.c_str(),
                    static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                    static_cast<long long>(s.per_step), flop / sec[0] / 1e9, flop / sec[1] / 1e9, sec[0] / sec[1]);
        if (bf16) std::printf(" %12.1f", flop / sec[2] / 1e9);
        std::printf("\n");
      }
      std::fflush(stdout);
    }
    if (f.json) {
      nlohmann::json row{{"config", config}, {"step_products_s_openblas", total[0]},
                         {"step_products_s_onednn", total[1]}, {"threads", ctx.threads()}};
      if (bf16) row["step_products_s_bf16"] = total[2];
      std::printf("%s\n", row.dump().c_str());
    } else {
      std::printf("the products of one step: OpenBLAS %.3f s, oneDNN %.3f s (oneDNN %.2fx the speed)", total[0],
                  total[1], total[0] / total[1]);
      if (bf16) std::printf("; bf16 %.3f s", total[2]);
      std::printf("\n\n");
    }
  }
  return 0;
}

// One (mode, precision) of the training benchmark as a line of text: the
// median tok/s (the runs' range with --rounds), ms per step, MFU, RSS, and
// the ratios to baseline and to fp32; with --profile, where the step went.
void print_bench_line(const nlohmann::json& r, bool profile) {
  const int64_t heads = r["routing_heads"].get<int64_t>();
  const std::string label = r["mode"].get<std::string>() + (heads > 1 ? cat(" H", heads) : "");
  std::printf("%-15s %-4s %8.0f tok/s", label.c_str(), r["precision"].get<std::string>().c_str(), r["tok_per_s"].get<double>());
  if (r.contains("tok_per_s_runs")) {  // --rounds > 1: the runs' range
    const std::vector<double> tok = r["tok_per_s_runs"].get<std::vector<double>>();
    std::printf(" (%.0f-%.0f)", *std::min_element(tok.begin(), tok.end()), *std::max_element(tok.begin(), tok.end()));
  }
  std::printf("  %7.1f ms/step  MFU %5.1f%%  peak RSS %6.2f GiB", r["ms_per_step"].get<double>(),
              100 * r["mfu"].get<double>(), r["peak_rss_bytes"].get<double>() / (1024.0 * 1024 * 1024));
  if (r.contains("tok_per_s_vs_baseline") && r["mode"] != "baseline")
    std::printf("  (%.2fx tok/s, %.2fx RSS of baseline)", r["tok_per_s_vs_baseline"].get<double>(),
                r["rss_vs_baseline"].get<double>());
  if (r.contains("tok_per_s_vs_fp32")) std::printf("  (%.2fx fp32)", r["tok_per_s_vs_fp32"].get<double>());
  std::printf("\n");
  if (profile) print_profile(r["profile_ms_per_step"], r["routing_traffic"], r["ms_per_step"].get<double>());
}

}  // namespace

namespace {

void add_bench_options(OptionList& opts, BenchFlags& f) {
  opts.add(f.config, {"config", "bench-small", "preset name or path to a config.json"});
  opts.add(f.mode, {"mode", "", "attnres_mode to run, or 'all': every mode name, the _mh ones included (default: the config's)"});
  opts.add(f.routing_heads, {"routing-heads", "", "attnres_num_heads of the routed modes (default: each mode name's: 1, or 8 for the _mh names)"});
  opts.add(f.batch, {"batch", "8", "micro-batch size B"});
  opts.add(f.seq_len, {"seq-len", "512", "sequence length T"});
  opts.add(f.steps, {"steps", "5", "timed steps"});
  opts.add(f.warmup_steps, {"warmup-steps", "1", "untimed steps first"});
  opts.add(f.rounds, {"rounds", "1", "runs of each mode and precision, interleaved; the figures are their medians"});
  add_threads_option(opts, f.threads);
  opts.add(f.device, device_flag());
  opts.add_parsed({"precision", "fp32",
                   "fp32, bf16, or both (fp32,bf16): the products' precision (core/precision.h); "
                   "with --generate the default is fp32,bf16"},
                  [&f](const std::string& text, const std::string& flag) {
                    f.precision = text;
                    f.precision_flag = flag;
                  },
                  [&f] { return f.precision; });
  opts.add_spelling({"dtype", "", "its older spelling", "precision"});
  opts.add(f.peak_gflops, {"peak-gflops", "0", "peak GFLOP/s for MFU (0 = measure 2048^3 products of each precision now)"});
  opts.add(f.json, {"json", "false", "one JSON object per line"});
  opts.add(f.generate, {"generate", "false",
                        "benchmark generation instead: --config may list several (default with "
                        "--generate: tiny,bench-small,qwen3-0.6b)"});
  opts.add(f.prompt_len, {"prompt-len", "512", "--generate: prefill prompt length"});
  opts.add(f.decode_prompt_len, {"decode-prompt-len", "64", "--generate: prompt length before decoding"});
  opts.add(f.new_tokens, {"new-tokens", "32", "--generate: decoded tokens per sequence"});
  opts.add(f.decode_batch, {"decode-batch", "8", "--generate: sequences decoded together (besides batch 1)"});
  opts.add(f.no_train_forward, {"no-train-forward", "false", "--generate: skip the training-forward comparison"});
  opts.add(f.gemm, {"gemm", "false",
                    "time the float32 products of a training step, shape by shape, through OpenBLAS and oneDNN, "
                    "and in bf16 too where --precision lists it (--config may list several; default with --gemm: "
                    "bench-small,qwen3-0.6b at B 1; --steps: timed repeats)"});
  opts.add(f.profile, {"profile", "false", profile_help()});
  opts.add(f.worker, {"worker", "false", "internal: run one mode in this process and print its JSON"});
  opts.add(f.measure, {"measure", "", "internal: print the machine's 'sgemm' or 'bf16' GFLOP/s, or 'copy' GB/s"});
}

// The mode names --mode asks for: one (the config's by default), or with
// "all" every name of every mode (model/modes.h), in its order.
std::vector<std::string> bench_modes(const BenchFlags& f) {
  std::vector<std::string> modes;
  if (f.mode == "all") {
    for (const ModeName& n : mode_names()) modes.push_back(n.name);
    return modes;
  }
  const Config c = bench_config(f, f.mode);
  if (f.routing_heads && !mode_spec(c.mode).routed())  // as train refuses it
    fail("--routing-heads ", *f.routing_heads, " with attnres_mode ", c.mode_label(),
         ", which has no depth routing (routing heads need a routed mode)");
  return {c.mode_label()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The peaks and bandwidth a bench's figures are against (0 where not measured).
struct BenchPeaks {
  double sgemm = 0, bf16 = 0, copy_gb_per_s = 0;
  bool bf16_here = false;
  double of(Precision p) const { return p == Precision::kBF16 ? bf16 : sgemm; }
};

// One (precision, mode)'s record from its rounds: the first run's settings
// with the medians of the figures, the profile's means, and the ratios to
// baseline (base: its tok/s and RSS, 0 before baseline ran) and to fp32.
nlohmann::json summarize(const std::vector<nlohmann::json>& runs, const BenchFlags& f, Precision p,
                         const BenchPeaks& peaks, int64_t rounds) {
  std::vector<double> tok, ms, rss;
  for (const auto& r : runs) {
    tok.push_back(r["tok_per_s"].get<double>());
    ms.push_back(r["ms_per_step"].get<double>());
    rss.push_back(r["peak_rss_bytes"].get<double>());
  }
  nlohmann::json r = runs[0];  // settings; the figures are the medians
  r["tok_per_s"] = median(tok);
  r["ms_per_step"] = median(ms);
  r["peak_rss_bytes"] = median(rss);
  if (f.profile) {
    r["profile_ms_per_step"] = mean_over_runs(runs, "profile_ms_per_step");
    r["routing_traffic"] = mean_over_runs(runs, "routing_traffic");
    r["copy_gb_per_s"] = peaks.copy_gb_per_s;
  }
  r["mfu"] = median(tok) * r["mfu"].get<double>() / tok[0];
  r["rounds"] = rounds;
  if (rounds > 1) r["tok_per_s_runs"] = tok;
  r["peak_gflops"] = peaks.of(p);
  r["sgemm_peak_gflops"] = peaks.sgemm;
  if (peaks.bf16_here) r["bf16_peak_gflops"] = peaks.bf16;
  return r;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  BenchFlags f;
  OptionList opts("bench",
                  "Throughput (tok/s), MFU and peak RSS of full training steps on random tokens; with --generate,\n"
                  "prefill and decode speed (batch 1 and --decode-batch) against the memory-bandwidth bound.");
  add_bench_options(opts, f);
  if (!opts.parse(argc, argv)) return 0;
  f.precision_given = opts.given("precision");
  f.config_given = opts.given("config");
  // --precision may list several: each is checked against the device where it is run.
  if (f.profile && (f.generate || f.gemm)) fail("--profile times training steps: not with --generate or --gemm");
  // The workers time their ops with --profile; the parent runs none.
  ContextOptions co{f.threads, f.device, Precision::kF32};
  co.time_ops = f.profile && f.worker;
  const std::unique_ptr<Context> ctx_ptr = open_context(co);
  Context& ctx = *ctx_ptr;
  if (!f.measure.empty()) {
    const std::string what = f.measure;
    if (what != "sgemm" && what != "bf16" && what != "copy") fail("--measure expects sgemm, bf16 or copy");
    const double value = what == "copy" ? measure_copy_gb_per_s(ctx)
                                        : measure_peak_gflops(what == "bf16" ? Precision::kBF16 : Precision::kF32,
                                                              ctx.threads());
    std::printf("%s\n", nlohmann::json({{"value", value}}).dump().c_str());
    return 0;
  }
  if (f.generate) return bench_generate(f, ctx);
  if (f.gemm) return bench_gemm(f, ctx, opts.given("batch"));
  const int threads = ctx.threads();
  flag_batch_tokens(f.batch, f.seq_len);
  if (f.steps <= 0 || f.warmup_steps < 0) fail("--steps must be positive and --warmup-steps not negative");
  if (f.worker) {
    const Config c = bench_config(f, f.mode);
    const Precision p = parse_precision(f.precision, f.precision_flag.c_str());
    if (const std::string why = ctx.ops().unsupported(p); !why.empty()) fail("--precision ", precision_name(p), ": ", why);
    std::printf("%s\n", bench_training(ctx, c, f.batch, f.seq_len, p,
                                   f.steps, f.warmup_steps, f.peak_gflops * 1e9)
                            .dump()
                            .c_str());
    return 0;
  }
  const std::vector<std::string> modes = bench_modes(f);
  const bool json = f.json;
  const std::vector<Precision> precisions = bench_precisions(f, "fp32", ctx.ops(), json);
  // Both peaks where the machine has both (the bf16 one beside SGEMM's), each
  // precision's MFU against its own.
  BenchPeaks peaks;
  peaks.bf16_here = ctx.ops().unsupported(Precision::kBF16).empty();
  peaks.sgemm = f.peak_gflops > 0 ? f.peak_gflops : measured(f, "sgemm");
  peaks.bf16 = !peaks.bf16_here ? 0 : f.peak_gflops > 0 ? f.peak_gflops : measured(f, "bf16");
  // --profile: the machine's copy bandwidth beside the routers' (which are memory-bound).
  peaks.copy_gb_per_s = f.profile ? measured(f, "copy") : 0;
  if (!json) {
    if (f.profile) std::printf("bench --profile: STREAM-like copy bandwidth %.1f GB/s\n", peaks.copy_gb_per_s);
    std::printf("bench: config %s, B=%lld T=%lld, %d threads, %s kernels, attention's bf16 tiles on %s, "
                "%s peak %.1f GFLOP/s",
                f.config.c_str(), static_cast<long long>(f.batch), static_cast<long long>(f.seq_len), threads,
                ctx.ops().kernels(), ctx.ops().attention_tiles(), peak_name(Precision::kF32), peaks.sgemm);
    if (peaks.bf16_here) std::printf(", bf16 matmul peak %.1f GFLOP/s (oneDNN %s)", peaks.bf16, onednn::isa().c_str());
    std::printf("\n");
  }
  // --rounds R: every (precision, mode) runs R times, the runs of a round one
  // after the other, so that a drift of this shared machine's speed touches
  // every pair alike; each figure is the median of its runs, min and max beside it.
  const int64_t rounds = f.rounds;
  if (rounds < 1) fail("--rounds must be at least 1");
  std::vector<std::vector<std::vector<nlohmann::json>>> runs(
      precisions.size(), std::vector<std::vector<nlohmann::json>>(modes.size()));
  for (int64_t round = 0; round < rounds; ++round)
    for (size_t pi = 0; pi < precisions.size(); ++pi)
      for (size_t i = 0; i < modes.size(); ++i)
        runs[pi][i].push_back(bench_in_child(modes[i], precisions[pi], f, peaks.of(precisions[pi])));
  std::vector<double> fp32_tok(modes.size(), 0.0);
  for (size_t pi = 0; pi < precisions.size(); ++pi) {
    const Precision p = precisions[pi];
    double base_tok = 0, base_rss = 0;
    for (size_t i = 0; i < modes.size(); ++i) {
      const std::string& mode = modes[i];
      nlohmann::json r = summarize(runs[pi][i], f, p, peaks, rounds);
      if (mode == "baseline") {
        base_tok = r["tok_per_s"].get<double>();
        base_rss = r["peak_rss_bytes"].get<double>();
      }
      if (base_tok > 0) {
        r["tok_per_s_vs_baseline"] = r["tok_per_s"].get<double>() / base_tok;
        r["rss_vs_baseline"] = r["peak_rss_bytes"].get<double>() / base_rss;
      }
      if (p == Precision::kF32) fp32_tok[i] = r["tok_per_s"].get<double>();
      else if (fp32_tok[i] > 0) r["tok_per_s_vs_fp32"] = r["tok_per_s"].get<double>() / fp32_tok[i];
      if (json) std::printf("%s\n", r.dump().c_str());
      else print_bench_line(r, f.profile);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace attnres
