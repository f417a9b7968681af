// trainer.cpp — see trainer.h.
#include "train/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "distributed/comm.h"
#include "eval/perplexity.h"
#include "io/checkpoint.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "model/model.h"
#include "model/modes.h"
#include "ops/cpu/blas_kernels.h"
#include "train/data_loader.h"

namespace attnres {

namespace {

// SIGINT, SIGTERM, SIGHUP and SIGUSR1 while a run trains: the first asks the
// loop to stop after the current step (with a checkpoint; with several ranks,
// every rank stops after the same step); a second one ends the process at
// once, as the signal's default would.  SIGUSR1 is the one mpirun passes on to
// every rank as it is (it answers SIGTERM by ending the job itself).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  int received() const { return g_stop_signal; }

 private:
  static constexpr size_t kCount = 4;
  static constexpr int kSignals[kCount] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
  struct sigaction old_[kCount];
};

// Keeps the lines of log.jsonl whose step is at most `step` (atomically).
void truncate_log(const std::string& path, int64_t step) {
  std::istringstream in(read_file(path));
  std::string kept, line;
  while (std::getline(in, line)) {
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("step", int64_t{0}) > step) continue;
    } catch (const nlohmann::json::exception&) {
      continue;  // a torn last line of a killed run
    }
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

int64_t trained_params(const ParamLayout& layout, const AdamW& adamw) {
  int64_t n = 0;
  for (const TensorSpec& s : layout.specs()) n += adamw.trains(s) ? s.numel : 0;
  return n;
}

// What a conversion changes, measured before the first step: the unconverted
// model (as saved in `dir`) and the converted one (the model being trained, at
// its init) run on the first `P` tokens of the first batch the run will draw.
void report_conversion(Context& ctx, const TrainOptions& opt, const Config& saved, const std::string& dir,
                       Rng rng, Rng data_rng) {
  const Config& c = opt.model;
  const int64_t P = std::min<int64_t>(opt.seq_len, 256), V = c.V;
  ModelOptions mo;
  mo.batch = 1;
  mo.seq_len = P;
  mo.training = false;
  mo.precision = parse_precision(opt.precision);  // measured in the arithmetic the run trains in
  std::vector<float> conv(static_cast<size_t>(P * V)), base(conv.size());
  std::vector<int32_t> in(static_cast<size_t>(opt.batch * opt.seq_len)), tg(in.size());
  double loss_conv = 0, loss_base = 0;
  {
    Model m(ctx, c, mo);
    m.init(rng);  // the draws the trained model's init makes
    load_weights(m, dir, /*keep_missing_routing=*/true);
    DataLoader first(opt.data, opt.batch, opt.seq_len, c.V, parse_data_order(opt.data_order), &data_rng);
    first.next(in.data(), tg.data());  // the run's first batch
    m.forward_logits(in.data(), conv.data());
    const Model::LossSum l = m.loss_sum(in.data(), tg.data(), 1, P);
    loss_conv = l.sum / static_cast<double>(l.count);
  }
  {
    Model m(ctx, saved, mo);
    load_weights(m, dir);
    m.forward_logits(in.data(), base.data());
    const Model::LossSum l = m.loss_sum(in.data(), tg.data(), 1, P);
    loss_base = l.sum / static_cast<double>(l.count);
  }
  double max_diff = 0;
  for (size_t i = 0; i < conv.size(); ++i) max_diff = std::max(max_diff, std::fabs(double(conv[i]) - base[i]));
  const bool delta = mode_spec(c.mode).zero_gate_is_identity();
  const char* kind = c.gate == Gate::kLearnableAlpha
                         ? (delta ? "exact conversion (learnable_alpha gate at 0: the routed term is switched off)"
                                  : "learnable_alpha gate at 0 — not an identity in block/full (the gate mixes "
                                    "with the partial sum / latest output), no exact conversion exists there")
                         : "the reference's conversion (bias gate, zero-initialised queries: uniform routing "
                           "from the start)";
  std::printf("conversion %s -> %s: %s\n", mode_name(saved.mode), mode_name(c.mode), kind);
  std::printf("  first %lld tokens of the first batch: loss %.6f -> %.6f (%+.3e), max |logit change| %.3e%s\n",
              static_cast<long long>(P), loss_base, loss_conv, loss_conv - loss_base, max_diff,
              max_diff == 0 ? " (bit-identical logits)" : "");
}

}  // namespace

StepStats train_step(Model& model, AdamW& adamw, const std::function<void(int32_t*, int32_t*)>& next_batch,
                     const StepOptions& so) {
  const int64_t N = model.B() * model.T();
  const int ranks = so.comm ? so.comm->size() : 1;
  // Scratch for one micro-batch; small next to the activations.
  thread_local std::vector<int32_t> inputs, targets;
  inputs.resize(static_cast<size_t>(N));
  targets.resize(static_cast<size_t>(N));
  StepStats st;
  model.zero_grad();
  const float scale = 1.0f / static_cast<float>(so.accum * ranks);
  double loss = 0;  // this rank's mean over its micro-batches
  for (int64_t micro = 0; micro < so.accum; ++micro) {
    next_batch(inputs.data(), targets.data());
    loss += model.forward_backward(inputs.data(), targets.data(), true, scale);
  }
  loss /= static_cast<double>(so.accum);
  Backend& ops = model.context().ops();
  float* grads = model.grads();
  if (so.poison) {
    loss = std::nan("");
    ops.fill(grads + adamw.lo(), std::nanf(""), std::min<int64_t>(1, adamw.hi() - adamw.lo()));
  }
  double sum_sq = 0;
  if (ranks == 1) {
    sum_sq = sum_squares(ops, adamw, grads);
  } else {
    const int signal = so.received_signal ? so.received_signal() : 0;
    ops.synchronize();  // the arena is read by MPI from the host
    const std::string at = cat("step ", so.t, ": ");
    double my_sum_sq;
    if (!adamw.freeze_base()) {
      so.comm->reduce_scatter(grads, *so.shards, at + "the gradient reduce-scatter");
      my_sum_sq = sum_squares(ops, adamw, grads);
    } else {
      // A frozen base: only the routing parameters' gradients travel, packed
      // into one buffer, summed (reduce-scatter + all-gather: every rank gets
      // the same bits) and unpacked; each rank then updates every routing
      // parameter itself (their moments are small: not sharded).
      thread_local std::vector<float> packed;
      packed.clear();
      adamw.for_each_range([&](const TensorSpec&, int64_t off, int64_t n) {
        packed.insert(packed.end(), grads + off, grads + off + n);
      });
      const Shards parts(static_cast<int64_t>(packed.size()), ranks);
      so.comm->reduce_scatter(packed.data(), parts, at + "the routing gradients' reduce-scatter");
      so.comm->all_gather(packed.data(), parts, at + "the routing gradients' all-gather");
      size_t i = 0;
      adamw.for_each_range([&](const TensorSpec&, int64_t off, int64_t n) {
        std::copy(packed.begin() + static_cast<std::ptrdiff_t>(i), packed.begin() + static_cast<std::ptrdiff_t>(i + n),
                  grads + off);
        i += static_cast<size_t>(n);
      });
      // Every rank holds the whole sum: rank 0's Σg² counts once.
      my_sum_sq = so.comm->root() ? sum_squares(ops, adamw, grads) : 0.0;
    }
    const std::vector<double> all = so.comm->all_gather({loss, my_sum_sq, static_cast<double>(signal)},
                                                        at + "the exchange of losses and norms");
    loss = 0;
    st.signal = 0;
    for (int r = 0; r < ranks; ++r) {  // in rank order: the same sums on every rank
      loss += all[3 * static_cast<size_t>(r)];
      sum_sq += all[3 * static_cast<size_t>(r) + 1];
      if (!st.signal) st.signal = static_cast<int>(all[3 * static_cast<size_t>(r) + 2]);
    }
    loss /= ranks;
  }
  st.loss = loss;
  st.grad_norm = std::sqrt(sum_sq);
  if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm)) {
    if (so.skip_nonfinite) {
      st.skipped = true;
      if (ranks == 1 && so.received_signal) st.signal = so.received_signal();
      return st;  // every rank skips: the parameters stay as they are everywhere
    }
    fail("step ", so.t, ": loss ", st.loss, ", gradient norm ", st.grad_norm,
         " — training diverged (try a lower --lr, or --on-nan skip)");
  }
  clip_gradients(ops, adamw, grads, st.grad_norm, so.clip);
  adamw.step(model.params(), grads, so.lr, so.t, so.lr_routing, model.params_bf16());
  if (ranks > 1 && !adamw.freeze_base()) {
    ops.synchronize();
    so.comm->all_gather(model.params(), *so.shards, cat("step ", so.t, ": the parameter all-gather"));
    // The other ranks' ranges arrived as float32: their bf16 copies (bf16 only).
    model.refresh_bf16(0, adamw.lo());
    model.refresh_bf16(adamw.hi(), model.layout().total());
  } else if (ranks == 1 && so.received_signal) {
    st.signal = so.received_signal();  // one process: a signal during the whole step ends the run after it
  }
  return st;
}

StepStats train_step(Model& model, AdamW& adamw, const std::function<void(int32_t*, int32_t*)>& next_batch,
                     int64_t accum, double lr, int64_t t, double clip, double lr_routing) {
  StepOptions so;
  so.accum = accum;
  so.lr = lr;
  so.t = t;
  so.clip = clip;
  so.lr_routing = lr_routing;
  return train_step(model, adamw, next_batch, so);
}

TrainResult train(const TrainOptions& opt, Comm* comm_in, const TrainTestHooks& hooks) {
  const Config& c = opt.model;
  opt.validate();
  // A device or precision this machine cannot run is refused before anything is written.
  open_context({1, opt.device, parse_precision(opt.precision)});
  std::unique_ptr<Comm> own_comm;
  if (!comm_in) own_comm = Comm::single();
  Comm& comm = comm_in ? *comm_in : *own_comm;
  const int ranks = comm.size(), rank = comm.rank();
  ATTNRES_CHECK(opt.world == ranks, "TrainOptions::world (", opt.world, ") is not the number of ranks (", ranks, ")");
  const bool root = comm.root();
  const bool quiet = opt.quiet || !root;  // rank 0 speaks for the run
  comm.set_timeout(opt.collective_timeout);
  // A resume is checked before anything is built: every option either
  // continues the run unchanged or may change (the notes say which changed);
  // one that would alter the trajectory is refused.
  std::vector<std::string> resume_notes;
  nlohmann::json settings;  // the run's settings, stored in every checkpoint (made here when resuming)
  if (!opt.resume.empty()) {
    const std::string dir = resolve_model_dir(opt.resume);
    const TrainerState st = read_trainer_state(dir);
    settings = run_settings(opt);
    resume_notes = check_resume(opt, settings, st.settings, st.step, dir);
  }

  // Rank 0 owns the output directory.  Check it first: a run must not train
  // for an hour and then fail to save.
  std::unique_ptr<DirLock> lock;
  if (root) {
    std::error_code ec;
    std::filesystem::create_directories(opt.out, ec);
    const std::string probe = opt.out + "/.write_test";
    std::ofstream f(probe);
    if (ec || !f) fail(opt.out, ": output directory is not writable");
    f.close();
    std::filesystem::remove(probe, ec);
    // One run per directory: a second one is refused, naming the first.
    lock = std::make_unique<DirLock>(opt.out);
    if (const int n = remove_stray_checkpoint_dirs(opt.out); n > 0 && !quiet)
      std::printf("removed %d unfinished checkpoint director%s left by an interrupted run\n", n, n == 1 ? "y" : "ies");
  }
  StopSignals signals;

  // Two generators: the model's init, and the data windows — so every mode
  // (whatever its init draws) reads the same windows in the same order.  Every
  // rank draws every window of a step (ranks × accum micro-batches of B) and
  // computes its own: rank r the micro-batches r·accum … r·accum + accum − 1.
  Rng rng(opt.seed);
  Rng data_rng(opt.seed ^ 0xD1B54A32D192ED03ull);
  DataLoader loader(opt.data, opt.batch, opt.seq_len, c.V, parse_data_order(opt.data_order), &data_rng,
                    ranks * opt.accum);
  int64_t drawn = 0;  // micro-batches of this step this rank has drawn
  auto next_batch = [&](int32_t* in, int32_t* tg) {
    if (drawn == 0)
      for (int64_t j = 0; j < rank * opt.accum; ++j) loader.skip();  // lower ranks' micro-batches
    loader.next(in, tg);
    if (++drawn == opt.accum) {
      for (int64_t j = 0; j < (ranks - 1 - rank) * opt.accum; ++j) loader.skip();  // higher ranks'
      drawn = 0;
    }
  };
  std::unique_ptr<TokenFile> val;
  if (!opt.val_data.empty()) {
    val = std::make_unique<TokenFile>(opt.val_data);
    val->check_vocab(c.V);
  }

  // --threads 0: the cores this process may run on — the ones mpirun bound it
  // to, or, unbound, the machine's shared by the ranks on it.
  int threads = opt.threads;
  if (threads == 0) {
    const int mine = hardware_threads(), online = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    threads = mine < online ? mine : std::max(1, mine / comm.local_size());
    if (!quiet && comm.local_size() > 1)
      std::printf("threads: %d per rank (%s)\n", threads,
                  mine < online ? cat("bound to ", mine, " of ", online, " cores").c_str()
                                : cat(online, " cores shared by ", comm.local_size(), " ranks").c_str());
  }
  const std::unique_ptr<Context> ctx_ptr = open_context({threads, opt.device, parse_precision(opt.precision)});
  Context& ctx = *ctx_ptr;
  // A conversion is measured first, with models of its own that are gone
  // before the trained one (and its optimizer) take their memory.
  std::string init_dir;
  if (opt.resume.empty() && !opt.init.empty()) {
    init_dir = resolve_model_dir(opt.init);
    Config saved = Config::load(init_dir + "/config.json");
    if (saved.d != c.d || saved.L != c.L || saved.H != c.H || saved.KV != c.KV || saved.hd != c.hd ||
        saved.F != c.F || saved.V != c.V || saved.tied != c.tied)
      fail(init_dir, ": its model shape (config.json) differs from the model being trained");
    if (saved.to_json() != c.to_json() && !quiet) report_conversion(ctx, opt, saved, init_dir, rng, data_rng);
  }
  ModelOptions mo{opt.batch, opt.seq_len};
  mo.precision = parse_precision(opt.precision);
  mo.freeze_base = opt.freeze_base;
  mo.recompute = opt.recompute;
  Model model(ctx, c, mo);
  // ZeRO stage 1: each rank keeps the AdamW moments of its range of the arena
  // (with a frozen base, the few routing parameters' moments are not sharded).
  const Shards shards(model.layout().total(), opt.freeze_base ? 1 : ranks);
  const int shard = opt.freeze_base ? 0 : rank;
  AdamW adamw(ctx.ops(), model.layout(), opt.adamw(), opt.freeze_base, shards.lo(shard), shards.hi(shard));
  auto trained = [&](const TensorSpec& s) { return adamw.trains(s); };
  int64_t start = 0;
  if (!opt.resume.empty()) {
    const std::string dir = resolve_model_dir(opt.resume);
    // Every rank reads the weights and its own range of the moments (the
    // checkpoint is the same for any number of ranks).
    const TrainerState st = load_checkpoint(dir, model.layout(), model.params(), adamw.m(), adamw.v(), trained,
                                            ctx.threads(), adamw.lo(), adamw.hi());
    model.refresh_bf16();
    for (const std::string& note : resume_notes)
      if (!quiet) std::printf("resume: %s\n", note.c_str());
    start = st.step;
    loader.set_position(st.data);
    data_rng.set_state(st.rng);
    if (!quiet) std::printf("resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(start));
  } else {
    model.init(rng);  // the same draws on every rank: the same weights
    if (!init_dir.empty()) {
      const std::string& dir = init_dir;
      // Routing tensors missing from a plain checkpoint keep their init (zero
      // queries, unit norms, zero gates): a pretrained model converts in place.
      const double t0 = now_seconds();
      const int64_t kept = load_weights(model, dir, /*keep_missing_routing=*/true);
      if (!quiet)
        std::printf("initialised from %s in %.1f s%s\n", dir.c_str(), now_seconds() - t0,
                    kept ? cat(" (", kept, " routing tensors not in the checkpoint start from their init)").c_str()
                         : "");
    }
  }

  const std::string log_path = opt.out + "/log.jsonl";
  std::FILE* log = nullptr;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log_guard(nullptr, &std::fclose);
  if (root) {
    // A resumed run's log continues from the checkpoint's step: lines of the
    // steps it redoes (written after that checkpoint) are dropped first.
    if (start > 0 && std::filesystem::exists(log_path)) truncate_log(log_path, start);
    log = std::fopen(log_path.c_str(), start > 0 ? "a" : "w");
    if (!log) fail(log_path, ": cannot open log for writing");
    log_guard.reset(log);
  }
  auto log_line = [&](const nlohmann::json& j) {
    if (!log) return;
    std::fprintf(log, "%s\n", j.dump().c_str());
    std::fflush(log);
  };

  const int64_t N = opt.batch * opt.seq_len;
  const double flops_per_token = model.flops_per_token(opt.seq_len);
  // MFU is against every rank's peak: one rank's (measured on rank 0) × ranks.
  double peak_flops = opt.peak_gflops * 1e9;
  if (peak_flops <= 0) peak_flops = root ? measure_peak_gflops(mo.precision, ctx.threads()) * 1e9 : 1;
  if (!quiet && opt.peak_gflops <= 0)
    std::printf("MFU against this machine's %s rate, measured now: %.1f GFLOP/s%s\n",
                mo.precision == Precision::kBF16 ? "bf16 matmul (oneDNN)" : "SGEMM", peak_flops / 1e9,
                ranks > 1 ? " per rank" : "");
  peak_flops *= ranks;
  std::fflush(stdout);
  const int64_t tokens_per_step = N * opt.accum * ranks;
  if (!quiet) {
    std::printf("model: %s%s, %lld parameters; %lld tokens/step; %lld training tokens\n", mode_name(c.mode),
                !mode_spec(c.mode).block_deltas() ? ""
                : c.block_delta == BlockDelta::kTrue
                    ? " (attnres_block_delta true: the paper's block delta)"
                    : " (attnres_block_delta reference: the released code's x - last source)",
                static_cast<long long>(model.num_params()), static_cast<long long>(tokens_per_step),
                static_cast<long long>(loader.total_tokens()));
    if (ranks > 1) {
      char moments[160];
      if (opt.freeze_base)
        std::snprintf(moments, sizeof moments, "frozen base: the routing parameters' gradients are summed, packed");
      else
        std::snprintf(moments, sizeof moments, "AdamW moments sharded (%.1f MiB per rank instead of %.1f)",
                      2.0 * shards.size(0) * sizeof(float) / (1 << 20),
                      2.0 * model.layout().total() * sizeof(float) / (1 << 20));
      std::printf("data parallel: %d ranks x batch %lld x accum %lld = a global batch of %lld windows of %lld "
                  "tokens; %s\n",
                  ranks, static_cast<long long>(opt.batch), static_cast<long long>(opt.accum),
                  static_cast<long long>(ranks * opt.batch * opt.accum), static_cast<long long>(opt.seq_len), moments);
    }
  }

  // The tokenizer that travels with the checkpoints.
  std::string tokenizer = opt.tokenizer;
  if (tokenizer.empty()) {
    std::vector<std::string> candidates = {
        (std::filesystem::path(opt.data).parent_path() / "tokenizer.json").string()};
    for (const std::string& d : {opt.resume, opt.init})
      if (!d.empty()) candidates.push_back(resolve_model_dir(d) + "/tokenizer.json");
    for (const std::string& p : candidates)
      if (std::filesystem::exists(p)) {
        tokenizer = p;
        break;
      }
  } else if (!std::filesystem::exists(tokenizer)) {
    fail(tokenizer, ": no such tokenizer file (--tokenizer)");
  }
  // The tokenizer's companion files beside it, and the generation config of
  // the model the run started from, travel with every checkpoint too.
  SaveOptions so;
  so.optimizer = opt.save_optimizer;
  so.bf16 = parse_save_dtype(opt.save_dtype, "--save-dtype");
  so.keep = opt.keep_checkpoints;
  if (opt.freeze_base) so.trained = trained;
  if (!tokenizer.empty()) {
    so.copy_files.push_back(tokenizer);
    for (const std::string& f : companion_files(std::filesystem::path(tokenizer).parent_path().string())) {
      const std::string name = std::filesystem::path(f).filename().string();
      if (name != "tokenizer.json" && name != "generation_config.json") so.copy_files.push_back(f);
    }
  }
  for (const std::string& d : {opt.resume, opt.init}) {
    if (d.empty()) continue;
    const std::string g = resolve_model_dir(d) + "/generation_config.json";
    if (std::filesystem::exists(g)) {
      so.copy_files.push_back(g);
      break;
    }
  }
  if (!quiet) {
    std::printf("tokenizer: %s\n", tokenizer.empty() ? "none found (checkpoints will not carry one)"
                                                      : (tokenizer + " (copied into every checkpoint)").c_str());
    if (opt.freeze_base)
      std::printf("frozen base: %lld of %lld parameters train (the routing parameters)\n",
                  static_cast<long long>(trained_params(model.layout(), adamw)),
                  static_cast<long long>(model.layout().total()));
  }

  if (settings.is_null()) settings = run_settings(opt);
  TrainResult result;
  const double run_start = now_seconds();
  double step_seconds = 0, last_val_seconds = 0;  // this process's time in steps; the last validation's
  // Sharded moments travel to rank 0 in pieces of 16 MiB (tests: smaller,
  // so that a tiny model crosses pieces).
  const int64_t moment_chunk = hooks.moment_chunk > 0 ? hooks.moment_chunk : int64_t{1} << 22;
  auto save = [&](int64_t step_done) {
    TrainerState st{step_done, loader.position(), data_rng.state(), settings};
    // Never write a diverged model: one pass over the weights (the same on
    // every rank, so every rank stops) before anything is written.
    if (!std::isfinite(ctx.ops().sum_squares(model.params(), model.layout().total())))
      fail("step ", step_done, ": the parameters are not finite (NaN or Inf): training diverged (try a lower --lr); "
           "no checkpoint written", result.last_checkpoint.empty() ? "" : ", the last good one is ",
           result.last_checkpoint);
    ctx.ops().synchronize();  // the arenas are read from the host
    if (shards.bounds.size() <= 2 || !opt.save_optimizer) {  // one process holds every moment it saves
      if (root)
        result.last_checkpoint = save_checkpoint(opt.out, c, model.layout(), model.params(), adamw.m(), adamw.v(),
                                                 st, so);
      return;
    }
    // Sharded moments: each rank's range streams to rank 0 while it writes
    // optimizer.safetensors, one piece at a time (no process holds them whole).
    const std::string what = cat("step ", step_done, ": the transfer of the AdamW moments to rank 0 for the checkpoint");
    if (!root) {
      comm.send_range(adamw.m(), shards, 1, moment_chunk, what);
      comm.send_range(adamw.v(), shards, 2, moment_chunk, what);
      return;
    }
    RangeReader m(comm, shards, adamw.m(), 1, moment_chunk, what);
    RangeReader v(comm, shards, adamw.v(), 2, moment_chunk, what);
    SaveOptions streamed = so;
    streamed.fetch_moments = [&](int k, int64_t at, std::span<float> out) {
      if (k == 1) m.finish();  // every exp_avg piece is taken before the first exp_avg_sq one
      (k == 0 ? m : v).read(at, out);
    };
    result.last_checkpoint = save_checkpoint(opt.out, c, model.layout(), model.params(), nullptr, nullptr, st, streamed);
    m.finish();
    v.finish();
  };
  auto validate = [&](int64_t step_done) {
    // How long validation takes: a binding time budget keeps that much for the last one.
    struct Timed {
      double t0;
      double& out;
      ~Timed() { out = now_seconds() - t0; }
    } timed{now_seconds(), last_val_seconds};
    EvalOptions eo;
    eo.max_tokens = opt.val_tokens;
    eo.progress = !quiet;  // windows and ETA on stderr
    eo.part = rank;        // the ranks share the windows, in batches dealt round-robin
    eo.parts = ranks;
    EvalResult r = evaluate(model, *val, eo);
    if (ranks > 1) {
      const std::vector<double> all = comm.all_gather({r.sum, static_cast<double>(r.tokens)},
                                                      cat("step ", step_done, ": the validation sums"));
      r.sum = 0;
      r.tokens = 0;
      for (int q = 0; q < ranks; ++q) {
        r.sum += all[2 * static_cast<size_t>(q)];
        r.tokens += static_cast<int64_t>(all[2 * static_cast<size_t>(q) + 1]);
      }
      r.loss = r.sum / static_cast<double>(r.tokens);
      r.ppl = std::exp(r.loss);
      r.seconds = now_seconds() - timed.t0;
    }
    result.val_loss = r.loss;
    result.val_ppl = r.ppl;
    result.val_tokens = r.tokens;
    if (!quiet)
      std::printf("step %5lld | val loss %.4f | val ppl %.2f | %lld tokens | %.1f s\n",
                  static_cast<long long>(step_done), r.loss, r.ppl, static_cast<long long>(r.tokens), r.seconds);
    log_line({{"step", step_done}, {"val_loss", r.loss}, {"val_ppl", r.ppl}, {"val_tokens", r.tokens}});
  };

  // Routing statistics of every routing_every-th step (all its micro-batches,
  // of every rank), one JSONL line each; the forward does no statistics work on other steps.
  RoutingStats routing = model.make_routing_stats();
  const bool log_routing = opt.routing_every > 0 && !model.routers().empty();

  int64_t step = start;
  int stopped_by = 0;    // the signal that ended the run early, if one did
  int skipped_in_a_row = 0;
  // The step the learning-rate schedule ends at: --steps, unless the time
  // budget cannot reach it — then the schedule is shortened (never
  // lengthened) to the steps the budget still allows, so a cut run still ends
  // its decay at lr-min.  Only a binding budget makes a run depend on timing
  // (rank 0's clock decides, for every rank).
  int64_t schedule = opt.steps;
  for (; step < schedule; ++step) {
    const double t0 = now_seconds();
    comm.take_seconds();
    const double lr = lr_at(step, opt.warmup, schedule, opt.lr, opt.lr_min);
    const double lr_routing = opt.lr_routing < 0 ? lr
                                                 : lr_at(step, opt.warmup, schedule, opt.lr_routing,
                                                         opt.lr_min_routing < 0 ? opt.lr_min : opt.lr_min_routing);
    const bool routing_step = log_routing && (step + 1) % opt.routing_every == 0;
    if (routing_step) {
      routing.clear();
      model.attach_routing_stats(&routing);
    }
    StepOptions sopt;
    sopt.accum = opt.accum;
    sopt.t = step + 1;
    sopt.lr = lr;
    sopt.lr_routing = lr_routing;
    sopt.clip = opt.clip;
    sopt.skip_nonfinite = opt.on_nan == "skip";
    sopt.received_signal = [&] { return signals.received(); };
    sopt.poison = rank == hooks.nan_rank && step + 1 == hooks.nan_step;
    sopt.comm = &comm;
    sopt.shards = &shards;
    const StepStats st = train_step(model, adamw, next_batch, sopt);
    if (routing_step) {
      model.attach_routing_stats(nullptr);
      if (ranks > 1) {  // the global batch's statistics: every rank's sums, added in rank order
        const std::vector<double> mine = routing.values();
        const std::vector<double> all = comm.all_gather(mine, cat("step ", step + 1, ": the routing statistics"));
        std::vector<double> sum(mine.size(), 0.0);
        for (int q = 0; q < ranks; ++q)
          for (size_t i = 0; i < mine.size(); ++i) sum[i] += all[static_cast<size_t>(q) * mine.size() + i];
        routing.set_values(sum);
      }
      log_line({{"step", step + 1}, {"routing", routing.to_json()}});
    }
    const double loss = st.loss, norm = st.grad_norm;
    const double comm_s = comm.take_seconds();
    const double dt = now_seconds() - t0;
    step_seconds += dt;
    const double tok_s = static_cast<double>(tokens_per_step) / dt;
    const double mfu = tok_s * flops_per_token / peak_flops;
    const int64_t done = step + 1;
    if (st.skipped) {
      ++skipped_in_a_row;
      if (!quiet)
        std::printf("step %5lld/%lld | loss %.4f | norm %.3f | not finite: update skipped (--on-nan skip, %d in a "
                    "row)\n",
                    static_cast<long long>(done), static_cast<long long>(schedule), loss, norm, skipped_in_a_row);
      log_line({{"step", done}, {"skipped", "non-finite loss or gradient"}});
      if (skipped_in_a_row >= 10)
        fail("step ", done, ": 10 steps in a row had a non-finite loss or gradient (--on-nan skip): training "
             "diverged (try a lower --lr)", result.last_checkpoint.empty() ? "" : "; the last checkpoint is ",
             result.last_checkpoint);
    } else {
      skipped_in_a_row = 0;
      result.final_loss = loss;
      if (!quiet)
        std::printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %7.0f tok/s | MFU %4.1f%%%s\n",
                    static_cast<long long>(done), static_cast<long long>(schedule), loss, lr, norm, dt * 1e3,
                    tok_s, 100.0 * mfu, ranks > 1 ? cat(" | comm ", static_cast<int>(comm_s * 1e3), " ms").c_str() : "");
      nlohmann::json line = {{"step", done}, {"loss", loss}, {"lr", lr},         {"grad_norm", norm},
                             {"ms", dt * 1e3}, {"tok_per_s", tok_s}, {"mfu", mfu}};
      if (ranks > 1) line["comm_ms"] = comm_s * 1e3;
      log_line(line);
    }
    std::fflush(stdout);
    // Rank 0's clock decides the time budget, for every rank.
    int64_t decision[2] = {schedule, 0};  // the schedule's end; out of time
    if (opt.time_budget > 0) {
      if (root) {
        if (done < schedule) {
          const double left = opt.time_budget - (now_seconds() - run_start) - last_val_seconds;
          const int64_t can = done + static_cast<int64_t>(std::max(0.0, left) / (step_seconds / (done - start)));
          if (can < schedule) decision[0] = std::max(done + 1, can);
        }
        decision[1] = now_seconds() - run_start > opt.time_budget;
      }
      comm.broadcast(decision, sizeof decision, cat("step ", done, ": the time-budget decision"));
      if (decision[0] < schedule) {
        schedule = decision[0];
        if (!quiet)
          std::printf("time budget: the learning-rate schedule now ends at step %lld of the %lld planned\n",
                      static_cast<long long>(schedule), static_cast<long long>(opt.steps));
        log_line({{"step", done}, {"schedule_steps", schedule}});
      }
    }
    const bool last = done == schedule;
    const bool out_of_time = decision[1] != 0;
    if ((stopped_by = st.signal)) {  // finish here, on every rank: checkpoint (no validation), say where, exit 0
      if (!quiet)
        std::printf("%s received%s after step %lld: saving a checkpoint and stopping\n", ::strsignal(stopped_by),
                    ranks > 1 ? " (by a rank)" : "", static_cast<long long>(done));
      ++step;
      break;
    }
    if (val && opt.val_every > 0 && done % opt.val_every == 0 && !last && !out_of_time) validate(done);
    if (opt.ckpt_every > 0 && done % opt.ckpt_every == 0 && !last && !out_of_time) save(done);
    if (out_of_time) {
      if (!quiet) std::printf("time budget of %.0f s reached after %lld steps\n", opt.time_budget,
                              static_cast<long long>(done));
      ++step;
      break;
    }
  }
  result.steps_done = step;
  result.schedule_steps = schedule;
  if (val && !stopped_by) validate(step);
  save(step);
  // Peak memory of every rank (ZeRO-1 shrinks each one's moments), in the log and on stdout.
  const std::vector<double> rss =
      comm.all_gather({static_cast<double>(peak_rss_bytes())}, "the end of the run: peak memory of each rank");
  nlohmann::json per_rank = nlohmann::json::array();
  std::string rss_line = ranks > 1 ? "peak RSS per rank (MiB):" : "peak RSS (MiB):";
  for (double b : rss) {
    per_rank.push_back(static_cast<int64_t>(b));
    rss_line += cat(" ", static_cast<int64_t>(b) >> 20);
  }
  if (!quiet) std::printf("%s\n", rss_line.c_str());
  log_line({{"step", step}, {"peak_rss_bytes_per_rank", per_rank}});
  if (!quiet) std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
  std::fflush(stdout);
  return result;
}

}  // namespace attnres
