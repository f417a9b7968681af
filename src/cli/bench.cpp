// bench.cpp — `attnres bench`: tok/s, MFU and peak RSS of full training steps
// (forward, backward, clipping, AdamW) on random tokens.
//
// Each mode runs in a process of its own (posix_spawn of this binary), so its peak RSS is its
// own and not the largest of the modes before it.  MFU is measured against the
// SGEMM rate of this machine, timed here on 2048³ unless --peak-gflops is given.
#include <cblas.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "model/model.h"
#include "model/presets.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace attnres {

namespace {

double measure_sgemm_gflops() {
  const int64_t n = 2048;
  Buffer a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) a.data()[i] = b.data()[i] = 1e-3f * static_cast<float>(i % 97);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = now_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
    const double g = 2.0 * n * n * n / (now_seconds() - t0) / 1e9;
    best = g > best ? g : best;
  }
  return best;
}

nlohmann::json bench_mode(Config c, int64_t B, int64_t T, int64_t steps, int64_t warmup, double peak_flops) {
  Model model(c, B, T);
  Rng rng(1);
  model.init(rng);
  AdamW adamw(model.layout(), AdamWConfig{});
  const int64_t N = B * T;
  // Random tokens, drawn outside the timed region.
  std::vector<int32_t> tokens(static_cast<size_t>(2 * N));
  auto next = [&](int32_t* in, int32_t* tg) {
    std::copy(tokens.begin(), tokens.begin() + N, in);
    std::copy(tokens.begin() + N, tokens.end(), tg);
  };
  double seconds = 0, loss = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.V)));
    const double t0 = now_seconds();
    loss = train_step(model, adamw, next, 1, 1e-4, s + 1, 1.0).loss;
    if (s >= warmup) seconds += now_seconds() - t0;
  }
  const double tok_s = static_cast<double>(N * steps) / seconds;
  return {{"mode", mode_name(c.mode)},
          {"tok_per_s", tok_s},
          {"ms_per_step", 1e3 * seconds / static_cast<double>(steps)},
          {"mfu", tok_s * model.flops_per_token(T) / peak_flops},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"params", model.num_params()},
          {"B", B},
          {"T", T},
          {"steps", steps},
          {"threads", num_threads()},
          {"loss", loss}};
}

// Runs one mode in a fresh process (`attnres bench --worker ...` through
// posix_spawn: a plain fork would inherit a started OpenMP pool, which hangs)
// and returns the JSON line it prints.
nlohmann::json bench_in_child(const std::string& mode, const Flags& f, double peak_gflops) {
  std::vector<std::string> args = {"attnres", "bench", "--worker", "--mode", mode, "--peak-gflops",
                                   cat(peak_gflops)};
  for (const char* name : {"config", "batch", "seq-len", "steps", "warmup-steps", "threads"})
    args.insert(args.end(), {cat("--", name), f.str(name)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe(fds) != 0) fail("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    fail("cannot start the benchmark worker: ", std::strerror(rc));
  }
  std::string text;
  char buf[4096];
  ssize_t k;
  while ((k = ::read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(k));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.empty())
    fail("benchmark of mode ", mode, " failed (exit status ", status, ")");
  return nlohmann::json::parse(text);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Flags f("bench", "Throughput (tok/s), MFU and peak RSS of full training steps on random tokens.",
          {
              {"config", "bench-small", "preset name or path to a config.json"},
              {"mode", "", "attnres_mode to run, or 'all' (default: the config's)"},
              {"batch", "8", "micro-batch size B"},
              {"seq-len", "512", "sequence length T"},
              {"steps", "5", "timed steps"},
              {"warmup-steps", "1", "untimed steps first"},
              {"threads", "0", "threads (0 = all cores)"},
              {"peak-gflops", "0", "peak GFLOP/s for MFU (0 = measure SGEMM 2048^3 now)"},
              {"json", "false", "one JSON object per line"},
              {"worker", "false", "internal: run one mode in this process and print its JSON"},
          });
  if (!f.parse(argc, argv)) return 0;
  const int threads = set_threads(static_cast<int>(f.i64("threads")));
  Config base = load_config(f.str("config"));
  if (f.on("worker")) {
    base.mode = parse_mode(f.str("mode"));
    std::printf("%s\n", bench_mode(base, f.i64("batch"), f.i64("seq-len"), f.i64("steps"), f.i64("warmup-steps"),
                                   f.f64("peak-gflops") * 1e9)
                            .dump()
                            .c_str());
    return 0;
  }
  std::vector<Mode> modes;
  const std::string m = f.str("mode");
  if (m == "all") modes = {Mode::kBaseline, Mode::kBlock, Mode::kFull, Mode::kDelta, Mode::kDeltaBlock};
  else modes = {m.empty() ? base.mode : parse_mode(m)};
  double peak = f.f64("peak-gflops");
  if (peak <= 0) peak = measure_sgemm_gflops();
  const bool json = f.on("json");
  if (!json)
    std::printf("bench: config %s, B=%lld T=%lld, %d threads, SGEMM peak %.1f GFLOP/s\n", f.str("config").c_str(),
                static_cast<long long>(f.i64("batch")), static_cast<long long>(f.i64("seq-len")), threads, peak);
  double base_tok = 0, base_rss = 0;
  for (Mode mode : modes) {
    nlohmann::json r = bench_in_child(mode_name(mode), f, peak);
    r["sgemm_peak_gflops"] = peak;
    if (mode == Mode::kBaseline) {
      base_tok = r["tok_per_s"].get<double>();
      base_rss = r["peak_rss_bytes"].get<double>();
    }
    if (base_tok > 0) {
      r["tok_per_s_vs_baseline"] = r["tok_per_s"].get<double>() / base_tok;
      r["rss_vs_baseline"] = r["peak_rss_bytes"].get<double>() / base_rss;
    }
    if (json) {
      std::printf("%s\n", r.dump().c_str());
    } else {
      std::printf("%-12s %8.0f tok/s  %7.1f ms/step  MFU %5.1f%%  peak RSS %6.2f GiB", mode_name(mode),
                  r["tok_per_s"].get<double>(), r["ms_per_step"].get<double>(), 100 * r["mfu"].get<double>(),
                  r["peak_rss_bytes"].get<double>() / (1024.0 * 1024 * 1024));
      if (r.contains("tok_per_s_vs_baseline") && mode != Mode::kBaseline)
        std::printf("  (%.2fx tok/s, %.2fx RSS of baseline)", r["tok_per_s_vs_baseline"].get<double>(),
                    r["rss_vs_baseline"].get<double>());
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace attnres
