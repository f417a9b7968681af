// trainer.cpp — see trainer.h.
#include "train/trainer.h"

#include <signal.h>
#include <fcntl.h>
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
#include "ops/partial_backend.h"
#include "ops/timed_backend.h"
#include "train/data_loader.h"
#include "train/loop_parts.h"
#include "train/memory_plan.h"
#include "train/zero3.h"

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

// "SIGINT" for SIGINT, … (the signals StopSignals handles; else "signal N").
std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal " + std::to_string(sig);
  }
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    // A write to a blocked stdout (a slow reader) that the signal interrupts
    // is restarted, not failed with EINTR: the stop stays clean (issue 48.2).
    sa.sa_flags = SA_RESTART;
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
  int64_t kept = 0;  // routing tensors of the new mode the checkpoint lacks
  {
    Model m(ctx, c, mo);
    m.init(rng);  // the draws the trained model's init makes
    kept = load_weights(m, dir, /*keep_missing_routing=*/true);
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
                         : c.gate == Gate::kSigmoidScalar
                         ? "sigmoid_scalar gate at sigmoid(-2) = 0.12 — not an identity: the routed input is mixed "
                           "in at 12% from the start, as the reference initialises it"
                         : c.gate == Gate::kSigmoidVector
                         ? "sigmoid_vector gate at sigmoid(-2) = 0.12 (W = 0, b = -2) — not an identity: the routed "
                           "input is mixed in at 12% in every channel from the start, as the reference initialises it"
                         : !mode_spec(saved.mode).routed()
                         ? "the reference's conversion (bias gate, zero-initialised queries: uniform routing "
                           "from the start)"
                         : kept == 0 ? "the checkpoint's routing kept (its queries and norms, read by the new mode)"
                                     : "the checkpoint's routing kept where the new mode has the same tensors; the "
                                       "others start from their init";
  std::printf("conversion %s -> %s%s: %s\n", saved.mode_label(), c.mode_label(),
              c.routing_heads > 1 ? cat(" (", c.routing_heads, " routing heads)").c_str() : "", kind);
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
  if (so.zero3) so.zero3->zero_grad(adamw);
  else model.zero_grad();
  const float scale = 1.0f / static_cast<float>(so.accum * ranks);
  double loss = 0;  // this rank's mean over its micro-batches
  const bool entropy = model.options().entropy_lambda > 0;
  double ent = 0;   // the entropy term's E, likewise
  for (int64_t micro = 0; micro < so.accum; ++micro) {
    // One process: a stop signal is honoured between micro-batches — the
    // step is abandoned (no update; the caller puts the data position back),
    // so a long --accum never keeps a stop waiting for the whole step.
    // (With ranks the signal travels with the step's exchange, at its end.)
    if (micro > 0 && ranks == 1 && so.received_signal && (st.signal = so.received_signal())) {
      st.abandoned = true;
      return st;
    }
    next_batch(inputs.data(), targets.data());
    loss += model.forward_backward(inputs.data(), targets.data(), true, scale);
    if (entropy) ent += model.route_entropy();
  }
  loss /= static_cast<double>(so.accum);
  ent /= static_cast<double>(so.accum);
  Backend& ops = model.context().ops();
  float* grads = model.grads();
  if (so.gradient_fault) {
    // Its range: this rank's own gradients (under ZeRO-3, the first range it holds).
    const bool pieces = so.zero3 && !so.zero3->owned().empty();
    StepGradients g{loss, ops, grads, pieces ? so.zero3->owned().front().lo : adamw.lo(),
                    pieces ? so.zero3->owned().front().hi : adamw.hi()};
    so.gradient_fault(g);
  }
  double sum_sq = 0;
  if (ranks == 1) {
    sum_sq = sum_squares(ops, adamw, grads);
  } else {
    const int signal = so.received_signal ? so.received_signal() : 0;
    ops.synchronize();
    const std::string at = cat("step ", so.t, ": ");
    const size_t total = static_cast<size_t>(model.layout().total());
    double my_sum_sq;
    if (so.zero3) {
      // The matrices' gradients are in pieces already (each layer's backward
      // ended with their reduce-scatter); the vectors' are summed now.
      so.zero3->sum_vector_gradients(adamw, at + "the vectors' gradient sum");
      my_sum_sq = so.zero3->sum_squares(adamw);
    } else if (!adamw.freeze_base()) {
      {  // MPI reads and writes the gradient arena as host memory
        const HostView<float> host_grads(ops, grads, total);
        so.comm->reduce_scatter(host_grads.data(), *so.shards, at + "the gradient reduce-scatter");
      }
      my_sum_sq = sum_squares(ops, adamw, grads);
    } else {
      // A frozen base: only the routing parameters' gradients travel, summed
      // over the ranks (every rank gets the same bits); each rank then updates
      // every routing parameter itself (their moments are small: not sharded).
      std::vector<ArenaRange> routing;
      adamw.for_each_range([&](const TensorSpec&, int64_t off, int64_t n) { routing.push_back({off, off + n}); });
      sum_ranges_over_ranks(*so.comm, ops, grads, routing, at + "the routing gradients' sum");
      // Every rank holds the whole sum: rank 0's Σg² counts once.
      my_sum_sq = so.comm->root() ? sum_squares(ops, adamw, grads) : 0.0;
    }
    const std::vector<double> all = so.comm->all_gather({loss, my_sum_sq, static_cast<double>(signal), ent},
                                                        at + "the exchange of losses and norms");
    const std::vector<double> sum = sum_over_ranks(all, ranks, 4);
    loss = sum[0] / ranks;
    sum_sq = sum[1];
    ent = sum[3] / ranks;
    st.signal = 0;
    for (int r = 0; r < ranks && !st.signal; ++r) st.signal = static_cast<int>(all[4 * static_cast<size_t>(r) + 2]);
  }
  st.loss = loss;
  if (entropy) st.route_entropy = ent;
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
  if (ranks > 1 && !adamw.freeze_base() && !so.zero3) {
    ops.synchronize();
    {
      const HostView<float> params(ops, model.params(), static_cast<size_t>(model.layout().total()));
      so.comm->all_gather(params.data(), *so.shards, cat("step ", so.t, ": the parameter all-gather"));
    }
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

// The ids a Hugging Face tokenizer.json defines: one more than the largest
// in model.vocab and added_tokens (what tokenizer/ counts as its vocabulary;
// read here from the JSON, as the train layer does not load tokenizers).
static int64_t tokenizer_ids(const std::string& path) {
  int64_t top = -1;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(path));
    for (const auto& [token, id] : j.at("model").at("vocab").items()) top = std::max(top, id.get<int64_t>());
    if (j.contains("added_tokens"))
      for (const auto& t : j["added_tokens"]) top = std::max(top, t.at("id").get<int64_t>());
  } catch (const nlohmann::json::exception&) {
    fail(path, ": not a tokenizer.json (no model.vocab of token ids)");
  }
  return top + 1;
}

// ---- train(): settle the run's settings, build, the step loop, the end ----

RunPlan plan_run(const TrainOptions& opt, int local_ranks) {
  RunPlan plan;
  opt.validate();
  // A device or precision this machine cannot run is refused before anything is written.
  open_context({1, opt.device, parse_precision(opt.precision)});
  // A resume is checked before anything is built: every option either
  // continues the run unchanged or may change (the notes say which changed);
  // one that would alter the trajectory is refused.
  if (!opt.resume.empty()) {
    plan.settings = run_settings(opt);
    plan.resume_dir = resolve_model_dir(opt.resume);
    const TrainerState st = read_trainer_state(plan.resume_dir);
    plan.resume_notes = check_resume(opt, plan.settings, st.settings, st.step, plan.resume_dir);
  } else if (!opt.init.empty()) {
    plan.init_held = std::make_shared<HeldModelDir>(opt.init);
    plan.init_dir = plan.init_held->dir();
  }
  // --threads 0: the cores this process may run on — the ones mpirun bound it
  // to, or, unbound, the machine's shared by the ranks on it.
  plan.threads = static_cast<int>(opt.threads);  // validate(): 0 to 1024
  if (plan.threads == 0) {
    const int mine = hardware_threads(), online = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    plan.threads = mine < online ? mine : std::max(1, mine / local_ranks);
    if (local_ranks > 1)
      plan.threads_note = mine < online ? cat("bound to ", mine, " of ", online, " cores")
                                        : cat(online, " cores shared by ", local_ranks, " ranks");
  }
  // The tokenizer that travels with the checkpoints: --tokenizer, else the
  // one beside the data, else the resumed or initial model's.
  plan.tokenizer = opt.tokenizer;
  if (plan.tokenizer.empty()) {
    std::vector<std::string> candidates = {(std::filesystem::path(opt.data).parent_path() / "tokenizer.json").string()};
    for (const std::string& d : {plan.resume_dir, plan.init_dir})
      if (!d.empty()) candidates.push_back(d + "/tokenizer.json");
    for (const std::string& p : candidates)
      if (std::filesystem::exists(p)) {
        plan.tokenizer = p;
        break;
      }
  } else if (!std::filesystem::exists(plan.tokenizer)) {
    fail(plan.tokenizer, ": no such tokenizer file (--tokenizer)");
  }
  return plan;
}

namespace {

// One run of train(): its stages, in the order train() calls them, and the
// state they share.  Rank 0 owns the output directory, speaks for the run,
// logs and writes the checkpoints; every rank computes.
class Run {
 public:
  Run(const TrainOptions& opt, Comm& comm, const TrainTestHooks& hooks, RunPlan plan, const StepCallback& on_step)
      : opt_(opt), c_(opt.model), comm_(comm), hooks_(hooks), on_step_(on_step), plan_(std::move(plan)), ranks_(comm.size()),
        rank_(comm.rank()), root_(comm.root()), quiet_(opt.quiet || !root_),
        rng_(opt.seed), data_rng_(opt.seed ^ 0xD1B54A32D192ED03ull) {}

  void claim_output();
  void build();
  void step_loop();
  TrainResult finish();
  void report_profile(const OpTimes& times);

 private:
  const TrainOptions& opt_;
  const Config& c_;
  Comm& comm_;
  const TrainTestHooks& hooks_;
  const StepCallback& on_step_;
  const RunPlan plan_;
  nlohmann::json settings_;  // the run's, stored in every checkpoint
  const int ranks_, rank_;
  const bool root_, quiet_;
  std::unique_ptr<DirLock> lock_;
  StopSignals signals_;
  // Two generators: the model's init, and the data windows — so every mode
  // (whatever its init draws) reads the same windows in the same order.
  Rng rng_, data_rng_;
  std::unique_ptr<DataLoader> loader_;
  int64_t drawn_ = 0;  // micro-batches of this step this rank has drawn
  std::unique_ptr<TokenFile> val_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Zero3> zero3_;  // --zero 3 (after model_: gone before it)
  std::unique_ptr<Shards> shards_;
  std::unique_ptr<AdamW> adamw_;
  int64_t start_ = 0;  // the step the run starts at (a resume's)
  int log_ = -1;           // log.jsonl (root only), appended a whole line at a time
  std::string log_path_;
  struct FdGuard {
    int& fd;
    ~FdGuard() {
      if (fd >= 0) ::close(fd);
    }
  } log_guard_{log_};
  SaveOptions save_options_;
  double flops_per_token_ = 0, peak_flops_ = 0;
  int64_t tokens_per_step_ = 0;
  TrainResult result_;
  double run_start_ = 0, step_seconds_ = 0, last_val_seconds_ = 0;
  int64_t step_ = 0, schedule_ = 0;
  int64_t comm_bytes_ = 0, comm_steps_ = 0;  // the steps' weight and gradient collectives (Comm::take_bytes)
  int stopped_by_ = 0;  // the signal that ended the run early, if one did
  bool stopped_by_callback_ = false;  // the step callback ended it
  int64_t last_val_step_ = -1;        // the step of the last validation (its result: result_.val_loss, val_ppl)

  void next_batch(int32_t* in, int32_t* tg);
  void open_log();
  void save_options();
  void print_start();
  void check_memory(const ModelOptions& mo);
  void log_line(const nlohmann::json& j);
  void validate(int64_t step_done);
  void save(int64_t step_done);
  [[noreturn]] void stop_after_failed_write(const std::string& what) const;
  bool trained(const TensorSpec& s) const { return adamw_->trains(s); }
};

// The output directory: writable, this run's alone (a second one is refused,
// naming the first), cleared of what interrupted saves left.  Checked first:
// a run must not train for an hour and then fail to save.
void Run::claim_output() {
  if (!root_) return;
  std::error_code ec;
  std::filesystem::create_directories(opt_.out, ec);
  const std::string probe = opt_.out + "/.write_test";
  std::ofstream f(probe);
  if (ec || !f) fail(opt_.out, ": output directory is not writable");
  f.close();
  std::filesystem::remove(probe, ec);
  lock_ = std::make_unique<DirLock>(opt_.out);
  if (const int n = remove_stray_checkpoint_dirs(opt_.out); n > 0 && !quiet_)
    std::printf("removed %d unfinished checkpoint director%s left by an interrupted run\n", n, n == 1 ? "y" : "ies");
  // A new run never writes among another run's files (a mixed directory
  // would resume into two runs' checkpoints): refused, or, when the user
  // said so, that run is deleted first.
  if (!opt_.resume.empty()) {
    if (opt_.overwrite) fail("--overwrite starts a new run in --out; it does not go with --resume");
    return;
  }
  const std::vector<std::string> old = previous_run_files(opt_.out);
  if (old.empty()) return;
  const int64_t ckpts = static_cast<int64_t>(list_checkpoints(opt_.out).size());
  const std::string what = cat(std::filesystem::exists(opt_.out + "/log.jsonl") ? "a log.jsonl, " : "", ckpts,
                               " checkpoint", ckpts == 1 ? "" : "s");
  if (!opt_.overwrite)
    fail(opt_.out, " holds a run (", what, "): resume it with --resume ", opt_.out,
         ", or choose another --out (--overwrite deletes that run and starts a new one)");
  if (!opt_.init.empty()) {  // never delete what this run is to start from
    std::error_code e1, e2;
    const auto init = std::filesystem::weakly_canonical(opt_.init, e1).string() + "/";
    const auto out = std::filesystem::weakly_canonical(opt_.out, e2).string() + "/";
    if (!e1 && !e2 && init.rfind(out, 0) == 0)
      fail("--overwrite would delete --init ", opt_.init, ", which is inside --out ", opt_.out,
           ": choose another --out");
  }
  for (const std::string& p : old) std::filesystem::remove_all(p, ec);
  if (ec) fail(opt_.out, ": cannot delete the previous run (", ec.message(), ")");
  if (!quiet_) std::printf("--overwrite: deleted the run that was in %s (%s)\n", opt_.out.c_str(), what.c_str());
}

// Every rank draws every window of a step (ranks × accum micro-batches of B)
// and computes its own: rank r the micro-batches r·accum … r·accum + accum − 1.
void Run::next_batch(int32_t* in, int32_t* tg) {
  if (drawn_ == 0)
    for (int64_t j = 0; j < rank_ * opt_.accum; ++j) loader_->skip();  // lower ranks' micro-batches
  loader_->next(in, tg);
  if (step_ + 1 == hooks_.stop_step && drawn_ + 1 == hooks_.stop_micro) std::raise(SIGTERM);  // tests
  if (++drawn_ == opt_.accum) {
    for (int64_t j = 0; j < (ranks_ - 1 - rank_) * opt_.accum; ++j) loader_->skip();  // higher ranks'
    drawn_ = 0;
  }
}

// The data, the model and its optimizer, and the weights: a resume's, an
// init's (converted), or random.
void Run::build() {
  // The tokenizer the checkpoints will carry: the data's ids must be its
  // tokens (issue 33: a directory mixing two prepares trained silently).
  const int64_t tokenizer_vocab = plan_.tokenizer.empty() ? 0 : tokenizer_ids(plan_.tokenizer);
  loader_ = std::make_unique<DataLoader>(opt_.data, opt_.batch, opt_.seq_len, c_.V, parse_data_order(opt_.data_order),
                                         &data_rng_, ranks_ * opt_.accum, tokenizer_vocab, plan_.tokenizer);
  if (!quiet_) {
    for (const std::string& s : loader_->skipped()) std::printf("data: left out %s\n", s.c_str());
    if (tokenizer_vocab > 0 && tokenizer_vocab != c_.V)
      std::printf("note: the model has %lld vocabulary rows and its tokenizer %s %lld tokens: %s\n",
                  static_cast<long long>(c_.V), plan_.tokenizer.c_str(), static_cast<long long>(tokenizer_vocab),
                  tokenizer_vocab < c_.V ? "the rows past the tokenizer's are never a target of this data, and "
                                           "generate decodes them to nothing (docs/inference.md)"
                                         : "ids past the model's rows cannot be trained on (the data is checked)");
  }
  if (!opt_.val_data.empty()) {
    val_ = std::make_unique<TokenFile>(opt_.val_data);
    val_->check_vocab(c_.V);
  }
  settings_ = plan_.settings.is_null() ? run_settings(opt_) : plan_.settings;  // a new run's: its data fingerprinted
  if (!quiet_ && !plan_.threads_note.empty()) std::printf("threads: %d per rank (%s)\n", plan_.threads, plan_.threads_note.c_str());
  const Precision precision = parse_precision(opt_.precision);
  ContextOptions co{plan_.threads, opt_.device, precision};
  co.time_ops = opt_.profile;
  ctx_ = open_context(co);
  // The memory plan first: a run that cannot fit allocates nothing.
  const ModelOptions mo = opt_.model_options();
  check_memory(mo);
  // A conversion is measured next, with models of its own that are gone
  // before the trained one (and its optimizer) take their memory.
  if (!plan_.init_dir.empty()) {
    const Config saved = Config::load(plan_.init_dir + "/config.json");
    if (saved.d != c_.d || saved.L != c_.L || saved.H != c_.H || saved.KV != c_.KV || saved.hd != c_.hd ||
        saved.F != c_.F || saved.V != c_.V || saved.tied != c_.tied)
      fail(plan_.init_dir, ": its model shape (config.json) differs from the model being trained");
    if (saved.to_json() != c_.to_json() && !quiet_) {
      if (opt_.zero == 3)  // it runs two whole models in one process: what ZeRO-3 is there to avoid
        std::printf("conversion %s -> %s: not measured under --zero 3 (it would hold two whole models on rank 0)\n",
                    saved.mode_label(), c_.mode_label());
      else
        report_conversion(*ctx_, opt_, saved, plan_.init_dir, rng_, data_rng_);
    }
  }
  model_ = std::make_unique<Model>(*ctx_, c_, mo);
  if (opt_.zero == 3) {
    // ZeRO stage 3: each rank holds its piece of every matrix and every vector
    // (train/zero3.h); its AdamW updates those.
    zero3_ = std::make_unique<Zero3>(*model_, comm_);
    if (hooks_.save_fault_rank == rank_) zero3_->fail_saves_for_testing();
    shards_ = std::make_unique<Shards>(model_->layout().total(), 1);
    adamw_ = std::make_unique<AdamW>(ctx_->ops(), model_->layout(), opt_.adamw(), opt_.freeze_base, zero3_->owned());
  } else {
    // ZeRO stage 1: each rank keeps the AdamW moments of its range of the arena
    // (with a frozen base, the few routing parameters' moments are not sharded).
    shards_ = std::make_unique<Shards>(model_->layout().total(), opt_.freeze_base ? 1 : ranks_);
    const int shard = opt_.freeze_base ? 0 : rank_;
    adamw_ = std::make_unique<AdamW>(ctx_->ops(), model_->layout(), opt_.adamw(), opt_.freeze_base,
                                     shards_->lo(shard), shards_->hi(shard));
  }
  if (!plan_.resume_dir.empty()) {
    const std::string& dir = plan_.resume_dir;
    // Every rank reads the weights and its own range of the moments (the
    // checkpoint is the same for any number of ranks).
    TrainerState st;
    if (zero3_) {
      st = zero3_->load_checkpoint(dir, *adamw_, [&](const TensorSpec& s) { return trained(s); });
    } else {  // the arenas as host memory while the checkpoint is read into them
      Backend& ops = ctx_->ops();
      const size_t moments = static_cast<size_t>(adamw_->hi() - adamw_->lo());
      const HostView<float> params(ops, model_->params(), static_cast<size_t>(model_->layout().total()));
      const HostView<float> m(ops, adamw_->m(), moments), v(ops, adamw_->v(), moments);
      st = load_checkpoint(dir, model_->layout(), params.data(), m.data(), v.data(),
                           [&](const TensorSpec& s) { return trained(s); }, ctx_->threads(), adamw_->lo(),
                           adamw_->hi());
      model_->refresh_bf16();
    }
    for (const std::string& note : plan_.resume_notes)
      if (!quiet_) std::printf("resume: %s\n", note.c_str());
    start_ = st.step;
    loader_->set_position(st.data);
    data_rng_.set_state(st.rng);
    if (!quiet_) std::printf("resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(start_));
  } else {
    if (zero3_) zero3_->init(rng_);  // each rank its part of the same draws
    else model_->init(rng_);         // the same draws on every rank: the same weights
    if (!plan_.init_dir.empty()) {
      const std::string& dir = plan_.init_dir;
      // Routing tensors missing from a plain checkpoint keep their init (zero
      // queries, unit norms, zero gates): a pretrained model converts in place.
      const double t0 = now_seconds();
      const int64_t kept = zero3_ ? zero3_->load_weights(dir, /*keep_missing_routing=*/true)
                                  : load_weights(*model_, dir, /*keep_missing_routing=*/true);
      if (!quiet_)
        std::printf("initialised from %s in %.1f s%s\n", dir.c_str(), now_seconds() - t0,
                    kept ? cat(" (", kept, " routing tensors not in the checkpoint start from their init)").c_str()
                         : "");
    }
  }
  open_log();
  // MFU is against every rank's peak: one rank's (measured on rank 0) × ranks.
  flops_per_token_ = model_->flops_per_token(opt_.seq_len);
  peak_flops_ = opt_.peak_gflops * 1e9;
  if (peak_flops_ <= 0) peak_flops_ = root_ ? ctx_->ops().peak_gflops(precision) * 1e9 : 1;
  if (!quiet_)
    std::printf("kernels: %s %s (the CPU's best level unless ATTNRES_CPU_LEVEL names a lower one)%s%s\n",
                ctx_->ops().name(), ctx_->ops().kernels(),
                precision == Precision::kBF16 ? ", attention's bf16 tiles on " : "",
                precision == Precision::kBF16 ? ctx_->ops().attention_tiles() : "");
  if (!quiet_ && opt_.peak_gflops <= 0)
    std::printf("MFU against this machine's %s rate, measured now: %.1f GFLOP/s%s\n",
                ctx_->ops().peak_name(precision), peak_flops_ / 1e9,
                ranks_ > 1 ? " per rank" : "");
  peak_flops_ *= ranks_;
  std::fflush(stdout);
  tokens_per_step_ = opt_.batch * opt_.seq_len * opt_.accum * ranks_;
  print_start();
  save_options();
}

// The memory plan (train/memory_plan.h), printed, and a run beyond the
// limit refused before the model allocates anything.
void Run::check_memory(const ModelOptions& mo) {
  const MemoryPlan plan = plan_memory(c_, mo, ranks_, static_cast<int>(opt_.zero));
  std::string why;
  const int64_t limit = memory_limit(opt_.max_memory, comm_.local_size(), &why);
  if (!quiet_) std::printf("memory plan (ZeRO-%lld): %s\n", static_cast<long long>(opt_.zero), plan.line().c_str());
  // Every rank decides together (their machines' limits may differ).
  const bool fits = limit < 0 || plan.total() <= limit;
  const std::vector<double> all = comm_.all_gather({fits ? 1.0 : 0.0}, "the start: the memory plan of each rank");
  if (fits) {
    for (int r = 0; r < ranks_; ++r)
      if (all[static_cast<size_t>(r)] == 0.0)
        fail("rank ", r, "'s memory plan exceeds what it may use (its error says why); nothing was allocated");
    return;
  }
  std::string change;
  if (opt_.zero == 1 && ranks_ > 1) {
    change = cat("--zero 3 plans ", plan_memory(c_, mo, ranks_, 3).line());
  } else {
    // The fewest ranks (up to 1024) whose ZeRO-3 plan fits.
    int need = 0;
    for (int n = std::max(2, ranks_ + 1); n <= 1024 && !need; n *= 2)
      if (plan_memory(c_, mo, n, 3).total() <= limit) need = n;
    change = need ? cat("--zero 3 over ", need, " ranks plans ", plan_memory(c_, mo, need, 3).line())
                  : std::string("the model state alone does not fit under ZeRO-3 over 1024 ranks");
    if (opt_.zero == 1 && ranks_ == 1) change = cat("run it over several ranks with --zero 3 (", change, ")");
  }
  const bool acts = plan.activations > plan.total() / 3;
  fail("the memory plan of this run needs ", plan.line(), ", over the ", static_cast<double>(limit) / (1 << 30),
       " GiB a rank may use (", why, "); ", change,
       acts ? "; its activations are a large part: a smaller --batch or --seq-len, or --recompute, shrink them" : "",
       " (nothing was allocated)");
}

void Run::open_log() {
  if (!root_) return;
  // A resumed run's log continues from the checkpoint's step: lines of the
  // steps it redoes (written after that checkpoint) are dropped first.
  const std::string log_path = opt_.out + "/log.jsonl";
  if (start_ > 0 && std::filesystem::exists(log_path)) truncate_log(log_path, start_);
  log_ = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (start_ > 0 ? 0 : O_TRUNC), 0644);
  if (log_ < 0) fail(log_path, ": cannot open log for writing: ", errno_text());
  log_path_ = log_path;
}

// One line of log.jsonl, whole or not at all: a failed write (a full disk)
// cuts the file back to its last complete line and ends the run, as a failed
// checkpoint does.
void Run::log_line(const nlohmann::json& j) {
  if (log_ < 0) return;
  const std::string line = j.dump() + "\n";
  const off_t good = ::lseek(log_, 0, SEEK_END);
  try {
    write_all(log_, line.data(), line.size(), log_path_);
  } catch (const Error& e) {
    // Best effort (its result unused): resume truncates the log to the checkpoint's step anyway.
    if (good >= 0) [[maybe_unused]] const int truncated = ::ftruncate(log_, good);
    stop_after_failed_write(cat(e.what(), " (", space_note(opt_.out, line.size()), ")"));
  }
}

void Run::stop_after_failed_write(const std::string& what) const {
  fail(what, "; training stopped",
       result_.last_checkpoint.empty() ? std::string("; no checkpoint was written yet")
                                       : cat("; the last good checkpoint is ", result_.last_checkpoint,
                                             " (attnres train --resume ", result_.last_checkpoint, ")"));
}

void Run::print_start() {
  if (quiet_) return;
  std::printf("model: %s%s, %lld parameters; %lld tokens/step; %lld training tokens\n", c_.mode_label(),
              !mode_spec(c_.mode).block_deltas() ? ""
              : c_.block_delta == BlockDelta::kTrue
                  ? " (attnres_block_delta true: the paper's block delta)"
                  : " (attnres_block_delta reference: the released code's x - last source)",
              static_cast<long long>(model_->num_params()), static_cast<long long>(tokens_per_step_),
              static_cast<long long>(loader_->total_tokens()));
  if (ranks_ > 1) {
    char moments[240];
    if (zero3_)
      std::snprintf(moments, sizeof moments,
                    "ZeRO-3: weights, gradients and moments in pieces (%.1f MiB of weights per rank instead of %.1f; "
                    "each layer gathered while it runs)",
                    4.0 * zero3_->owned_floats() / (1 << 20), 4.0 * model_->layout().total() / (1 << 20));
    else if (opt_.freeze_base)
      std::snprintf(moments, sizeof moments, "frozen base: the routing parameters' gradients are summed, packed");
    else
      std::snprintf(moments, sizeof moments, "AdamW moments sharded (%.1f MiB per rank instead of %.1f)",
                    2.0 * shards_->size(0) * sizeof(float) / (1 << 20),
                    2.0 * model_->layout().total() * sizeof(float) / (1 << 20));
    std::printf("data parallel: %d ranks x batch %lld x accum %lld = a global batch of %lld windows of %lld "
                "tokens; %s\n",
                ranks_, static_cast<long long>(opt_.batch), static_cast<long long>(opt_.accum),
                static_cast<long long>(ranks_ * opt_.batch * opt_.accum), static_cast<long long>(opt_.seq_len), moments);
  }
}

// What every checkpoint holds besides the weights: the moments (unless
// weights-only), the tokenizer and its companion files, and the generation
// config of the model the run started from.
void Run::save_options() {
  SaveOptions& so = save_options_;
  so.optimizer = opt_.save_optimizer;
  so.bf16 = parse_save_dtype(opt_.save_dtype, "--save-dtype");
  so.keep = opt_.keep_checkpoints;
  if (opt_.freeze_base) so.trained = [this](const TensorSpec& s) { return trained(s); };
  const std::string& tokenizer = plan_.tokenizer;
  if (!tokenizer.empty()) {
    so.copy_files.push_back(tokenizer);
    for (const std::string& f : companion_files(std::filesystem::path(tokenizer).parent_path().string())) {
      const std::string name = std::filesystem::path(f).filename().string();
      if (name != "tokenizer.json" && name != "generation_config.json") so.copy_files.push_back(f);
    }
  }
  for (const std::string& d : {plan_.resume_dir, plan_.init_dir}) {
    if (d.empty()) continue;
    const std::string g = d + "/generation_config.json";
    if (std::filesystem::exists(g)) {
      so.copy_files.push_back(g);
      break;
    }
  }
  if (!quiet_) {
    std::printf("tokenizer: %s\n", tokenizer.empty() ? "none found (checkpoints will not carry one)"
                                                      : (tokenizer + " (copied into every checkpoint)").c_str());
    if (opt_.freeze_base)
      std::printf("frozen base: %lld of %lld parameters train (the routing parameters)\n",
                  static_cast<long long>(trained_params(model_->layout(), *adamw_)),
                  static_cast<long long>(model_->layout().total()));
  }
}

void Run::save(int64_t step_done) {
  Model& model = *model_;
  AdamW& adamw = *adamw_;
  TrainerState st{step_done, loader_->position(), data_rng_.state(), settings_};
  // Never write a diverged model: one pass over the weights (the same on
  // every rank, so every rank stops) before anything is written.
  const std::string finite_what = cat("step ", step_done, ": the check that the parameters are finite");
  if (zero3_ ? !zero3_->params_finite(finite_what)
             : !std::isfinite(ctx_->ops().sum_squares(model.params(), model.layout().total())))
    fail("step ", step_done, ": the parameters are not finite (NaN or Inf): training diverged (try a lower --lr); "
         "no checkpoint written", result_.last_checkpoint.empty() ? "" : ", the last good one is ",
         result_.last_checkpoint);
  if (zero3_) {  // every rank's pieces stream to rank 0 as it writes (train/zero3.h)
    const int64_t chunk = hooks_.moment_chunk > 0 ? hooks_.moment_chunk : int64_t{1} << 22;
    try {
      const std::string path = zero3_->save(opt_.out, c_, adamw, st, save_options_, chunk);
      if (root_) result_.last_checkpoint = path;
    } catch (const Error& e) {
      if (!root_) throw;
      stop_after_failed_write(e.what());
    }
    return;
  }
  Backend& ops = ctx_->ops();
  ops.synchronize();
  // The arenas as host memory while they are written (MPI reads the moments too).
  const size_t moments = static_cast<size_t>(adamw.hi() - adamw.lo());
  const HostView<float> params(ops, model.params(), static_cast<size_t>(model.layout().total()));
  const HostView<float> m_view(ops, adamw.m(), moments), v_view(ops, adamw.v(), moments);
  if (shards_->bounds.size() <= 2 || !opt_.save_optimizer) {  // one process holds every moment it saves
    if (root_) try {
        result_.last_checkpoint = save_checkpoint(opt_.out, c_, model.layout(), params.data(), m_view.data(),
                                                  v_view.data(), st, save_options_);
      } catch (const Error& e) {
        stop_after_failed_write(e.what());
      }
    return;
  }
  // Sharded moments: each rank's range streams to rank 0 while it writes
  // optimizer.safetensors, one piece at a time (no process holds them whole),
  // in pieces of 16 MiB (tests: smaller, so that a tiny model crosses pieces).
  const int64_t chunk = hooks_.moment_chunk > 0 ? hooks_.moment_chunk : int64_t{1} << 22;
  const std::string what = cat("step ", step_done, ": the transfer of the AdamW moments to rank 0 for the checkpoint");
  if (!root_) {
    comm_.send_range(m_view.data(), *shards_, 1, chunk, what);
    comm_.send_range(v_view.data(), *shards_, 2, chunk, what);
    return;
  }
  RangeReader m(comm_, *shards_, m_view.data(), 1, chunk, what);
  RangeReader v(comm_, *shards_, v_view.data(), 2, chunk, what);
  SaveOptions streamed = save_options_;
  streamed.fetch_moments = [&](int k, int64_t at, std::span<float> out) {
    if (k == 1) m.finish();  // every exp_avg piece is taken before the first exp_avg_sq one
    (k == 0 ? m : v).read(at, out);
  };
  result_.last_checkpoint =
      save_checkpoint(opt_.out, c_, model.layout(), params.data(), nullptr, nullptr, st, streamed);
  m.finish();
  v.finish();
}

void Run::validate(int64_t step_done) {
  // How long validation takes: a binding time budget keeps that much for the last one.
  struct Timed {
    double t0;
    double& out;
    ~Timed() { out = now_seconds() - t0; }
  } timed{now_seconds(), last_val_seconds_};
  EvalOptions eo;
  eo.max_tokens = opt_.val_tokens;
  eo.progress = !quiet_;  // windows and ETA on stderr
  eo.part = rank_;        // the ranks share the windows, in batches dealt round-robin
  eo.parts = ranks_;
  eo.lockstep = zero3_ != nullptr;  // each forward gathers every layer: every rank runs as many
  EvalResult r = evaluate(*model_, *val_, eo);
  if (ranks_ > 1) {
    const std::vector<double> all = comm_.all_gather({r.sum, static_cast<double>(r.tokens)},
                                                     cat("step ", step_done, ": the validation sums"));
    const std::vector<double> sum = sum_over_ranks(all, ranks_, 2);
    r.sum = sum[0];
    r.tokens = static_cast<int64_t>(sum[1]);
    r.loss = r.sum / static_cast<double>(r.tokens);
    r.ppl = std::exp(r.loss);
    r.seconds = now_seconds() - timed.t0;
  }
  result_.val_loss = r.loss;
  result_.val_ppl = r.ppl;
  result_.val_tokens = r.tokens;
  last_val_step_ = step_done;
  if (!quiet_)
    std::printf("step %5lld | val loss %.4f | val ppl %.2f | %lld tokens | %.1f s\n", static_cast<long long>(step_done),
                r.loss, r.ppl, static_cast<long long>(r.tokens), r.seconds);
  log_line({{"step", step_done}, {"val_loss", r.loss}, {"val_ppl", r.ppl}, {"val_tokens", r.tokens}});
}

// The steps: each one's update, its log line, the time budget's decision, a
// stop signal, and the periodic validations and checkpoints.
void Run::step_loop() {
  Model& model = *model_;
  run_start_ = now_seconds();
  // Routing statistics of every routing_every-th step (all its micro-batches,
  // of every rank), one JSONL line each; the forward does no statistics work on other steps.
  const bool log_routing = opt_.routing_every > 0 && !model.routers().empty();
  LrSchedule schedule = LrSchedule::of(opt_);
  TimeBudget budget(opt_.time_budget, comm_);
  NanPolicy nan;
  const Cadence cadence{opt_.val_every, opt_.ckpt_every};
  for (step_ = start_; step_ < schedule.end; ++step_) {
    const int64_t step = step_, done = step + 1;
    const double t0 = now_seconds();
    comm_.take_seconds();
    comm_.take_bytes();
    const bool routing_step = log_routing && done % opt_.routing_every == 0;
    if (routing_step) model.collect_routing_stats(true);
    StepOptions sopt;
    sopt.accum = opt_.accum;
    sopt.t = done;
    sopt.lr = schedule.base(step);
    sopt.lr_routing = schedule.routing(step);
    sopt.clip = opt_.clip;
    sopt.skip_nonfinite = opt_.on_nan == "skip";
    sopt.received_signal = [&] { return signals_.received(); };
    if (hooks_.gradient_fault)
      sopt.gradient_fault = [this, done](StepGradients& g) { hooks_.gradient_fault(rank_, done, g); };
    sopt.comm = &comm_;
    sopt.shards = shards_.get();
    sopt.zero3 = zero3_.get();
    // Where the data stood before the step: an abandoned step puts it back, so
    // that the checkpoint of the last whole step resumes bit-identically.
    const LoaderPosition pos_before = loader_->position();
    const Rng data_rng_before = data_rng_;
    const int64_t drawn_before = drawn_;
    const StepStats st = train_step(model, *adamw_, [this](int32_t* in, int32_t* tg) { next_batch(in, tg); }, sopt);
    if (st.abandoned) {
      loader_->set_position(pos_before);
      data_rng_ = data_rng_before;
      drawn_ = drawn_before;
      if (routing_step) model.collect_routing_stats(false);
      stopped_by_ = st.signal;
      if (!quiet_)
        std::printf("%s received during step %lld: the step is abandoned; saving the checkpoint of step %lld and "
                    "stopping\n",
                    ::strsignal(stopped_by_), static_cast<long long>(done), static_cast<long long>(step));
      std::fflush(stdout);
      break;
    }
    if (routing_step) {
      const RoutingStats routing = sum_routing_over_ranks(model.routing_stats(), comm_, done);
      model.collect_routing_stats(false);
      log_line({{"step", done}, {"routing", routing.to_json()}});
    }
    const double comm_s = comm_.take_seconds();
    if (!st.skipped) {
      comm_bytes_ += comm_.take_bytes();
      ++comm_steps_;
    }
    const double dt = now_seconds() - t0;
    step_seconds_ += dt;
    nlohmann::json record;  // the step's log line, for the step callback
    if (OpTimes* times = op_times(*ctx_)) times->add(OpFamily::kCommunication, comm_s);  // --profile
    if (st.skipped) {
      const int in_a_row = nan.skipped();
      if (!quiet_)
        std::printf("step %5lld/%lld | loss %.4f | norm %.3f | not finite: update skipped (--on-nan skip, %d in a "
                    "row)\n",
                    static_cast<long long>(done), static_cast<long long>(schedule.end), st.loss, st.grad_norm,
                    in_a_row);
      record = {{"step", done}, {"skipped", "non-finite loss or gradient"}};
      log_line(record);
      nan.end_if_diverged(done, result_.last_checkpoint);
    } else {
      nan.finite();
      result_.final_loss = st.loss;
      const double tok_s = static_cast<double>(tokens_per_step_) / dt;
      const StepRecord rec{done, schedule.end, st.loss, sopt.lr, st.grad_norm, dt, tok_s,
                           tok_s * flops_per_token_ / peak_flops_, ranks_ > 1 ? comm_s : -1.0, st.route_entropy};
      if (!quiet_) std::printf("%s\n", rec.line().c_str());
      record = rec.json();
      log_line(record);
    }
    std::fflush(stdout);
    const TimeBudget::Decision time =
        budget.decide(done, schedule.end, opt_.steps, now_seconds() - run_start_, last_val_seconds_);
    if (time.end != schedule.end) {
      schedule.end = time.end;
      if (!quiet_)
        std::printf("time budget: the learning-rate schedule now ends at step %lld of the %lld planned\n",
                    static_cast<long long>(schedule.end), static_cast<long long>(opt_.steps));
      log_line({{"step", done}, {"schedule_steps", schedule.end}});
    }
    if ((stopped_by_ = st.signal)) {  // finish here, on every rank: checkpoint (no validation), say where, exit 0
      if (!quiet_)
        std::printf("%s received%s after step %lld: saving a checkpoint and stopping\n", ::strsignal(stopped_by_),
                    ranks_ > 1 ? " (by a rank)" : "", static_cast<long long>(done));
      ++step_;
      break;
    }
    const bool ending = done == schedule.end || time.out_of_time;
    if (val_ && cadence.validate(done, ending)) validate(done);
    if (cadence.checkpoint(done, ending)) save(done);
    if (on_step_) {
      if (last_val_step_ == done) {
        record["val_loss"] = result_.val_loss;
        record["val_ppl"] = result_.val_ppl;
      }
      if (!on_step_(record)) {  // as a stop signal: the checkpoint of this step (finish), no more steps
        stopped_by_callback_ = true;
        if (!quiet_)
          std::printf("the step callback asked to stop after step %lld: saving a checkpoint and stopping\n",
                      static_cast<long long>(done));
        std::fflush(stdout);
        ++step_;
        break;
      }
    }
    if (time.out_of_time) {
      if (!quiet_)
        std::printf("time budget of %.0f s reached after %lld steps\n", opt_.time_budget, static_cast<long long>(done));
      ++step_;
      break;
    }
  }
  schedule_ = schedule.end;
}

std::string percent(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * share);
  return buf;
}

// train --profile: where this run's steps went, per family of ops
// (ops/timed_backend.h), each rank's, on stdout (rank 0) and in the log.  The
// timed ops include the validations' and the conversion report's; "outside"
// is the steps' wall time not spent in an op.
void Run::report_profile(const OpTimes& times) {
  std::vector<double> mine(times.seconds.begin(), times.seconds.end());
  mine.push_back(step_seconds_);
  const std::vector<double> all = comm_.all_gather(mine, "the end of the run: the op profile of each rank");
  nlohmann::json per_rank = nlohmann::json::array();
  for (int q = 0; q < ranks_; ++q) {
    const double* r = all.data() + static_cast<size_t>(q) * mine.size();
    const double steps_s = r[kOpFamilies];
    nlohmann::json fam;
    double in_ops = 0;
    std::string line = ranks_ > 1 ? cat("where the steps went (rank ", q, "):") : "where the steps went:";
    for (int i = 0; i < kOpFamilies; ++i) {
      fam[op_family_name(static_cast<OpFamily>(i))] = r[i];
      in_ops += r[i];
      if (r[i] > 0) line += cat(" ", op_family_name(static_cast<OpFamily>(i)), " ", percent(r[i] / steps_s));
    }
    fam["outside_ops"] = steps_s - in_ops;
    fam["steps"] = steps_s;
    line += cat(" outside ops ", percent((steps_s - in_ops) / steps_s));
    if (!quiet_) std::printf("%s\n", line.c_str());
    per_rank.push_back(fam);
  }
  nlohmann::json record = {{"step", step_}, {"profile_seconds_per_rank", per_rank}};
  if (const PartialBackend* p = partial_backend(*ctx_)) {  // a partial device: what crossed its seam (this rank's)
    if (!quiet_) std::printf("%s\n", p->seam_summary().c_str());
    nlohmann::json seam;
    for (int i = 0; i < kOps; ++i)
      if (p->seam()[static_cast<size_t>(i)] > 0) seam[op_name(static_cast<Op>(i))] = p->seam()[static_cast<size_t>(i)];
    record["seam_calls"] = seam;
  }
  log_line(record);
}

// The run's end: the last validation (not after a stop signal), the last
// checkpoint, and every rank's peak memory.
TrainResult Run::finish() {
  result_.steps_done = step_;
  result_.schedule_steps = schedule_;
  result_.stopped_by = stopped_by_ ? signal_name(stopped_by_) : stopped_by_callback_ ? "callback" : "";
  if (val_ && !stopped_by_ && !stopped_by_callback_) validate(step_);
  save(step_);
  // Peak memory of every rank (ZeRO-1 shrinks each one's moments), in the log and on stdout.
  const std::vector<double> rss =
      comm_.all_gather({static_cast<double>(peak_rss_bytes())}, "the end of the run: peak memory of each rank");
  nlohmann::json per_rank = nlohmann::json::array();
  std::string rss_line = ranks_ > 1 ? "peak RSS per rank (MiB):" : "peak RSS (MiB):";
  for (double b : rss) {
    per_rank.push_back(static_cast<int64_t>(b));
    rss_line += cat(" ", static_cast<int64_t>(b) >> 20);
  }
  if (!quiet_) std::printf("%s\n", rss_line.c_str());
  log_line({{"step", step_}, {"peak_rss_bytes_per_rank", per_rank}});
  if (ranks_ > 1 && comm_steps_ > 0) {  // what a step moves (docs/distributed.md: ZeRO-1 against ZeRO-3)
    const double per_step = static_cast<double>(comm_bytes_) / static_cast<double>(comm_steps_);
    if (!quiet_)
      std::printf("communication per step (rank 0): %.1f MiB = %.2f bytes per parameter (ZeRO-%lld)\n",
                  per_step / (1 << 20), per_step / static_cast<double>(model_->num_params()),
                  static_cast<long long>(opt_.zero));
    log_line({{"step", step_}, {"comm_bytes_per_step", per_step}});
  }
  if (OpTimes* times = op_times(*ctx_)) report_profile(*times);
  if (!quiet_) std::printf("checkpoint: %s\n", result_.last_checkpoint.c_str());
  std::fflush(stdout);
  return result_;
}

}  // namespace

TrainResult train(const TrainOptions& opt, Comm* comm_in, const TrainTestHooks& hooks,
                  const std::function<void()>& started, const StepCallback& on_step) {
  std::unique_ptr<Comm> own_comm;
  if (!comm_in) own_comm = Comm::single();
  Comm& comm = comm_in ? *comm_in : *own_comm;
  ATTNRES_CHECK(opt.world == comm.size(), "TrainOptions::world (", opt.world, ") is not the number of ranks (",
                comm.size(), ")");
  comm.set_timeout(opt.collective_timeout);
  ATTNRES_CHECK(!on_step || comm.size() == 1, "a step callback runs with one process only");
  Run run(opt, comm, hooks, plan_run(opt, comm.local_size()), on_step);  // 1. settle the run's settings
  run.claim_output();
  if (started) started();  // the caller's start-up lines: only once the run is not refused
  run.build();      // 2. data, model, optimizer, weights, log
  run.step_loop();  // 3. the steps
  return run.finish();  // 4. the last validation and checkpoint
}

}  // namespace attnres
