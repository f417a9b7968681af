// train.cpp — `attnres train`: train from scratch, fine-tune, or resume.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/api.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/parse_value.h"
#include "distributed/comm.h"
#include "io/checkpoint.h"
#include "model/presets.h"
#include "ops/timed_backend.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace attnres {

namespace {

// The test seams (train/trainer.h) that tests/distributed/mpi.py sets through
// the environment, which reaches every rank (mpirun -x):
//   ATTNRES_TEST_NAN=RANK:STEP      that rank's gradient is NaN at that step
//   ATTNRES_TEST_MOMENT_CHUNK=N     moments travel to rank 0 in pieces of N floats (ZeRO-3: writes of N)
//   ATTNRES_TEST_SAVE_FAULT_RANK=R  under ZeRO-3, rank R cannot write its part of a checkpoint
//   ATTNRES_TEST_MPI_COUNT=N        at most N floats per MPI call
// Read here, at the program's edge, and nowhere in the library.
TrainTestHooks test_hooks_from_environment(Comm& comm) {
  TrainTestHooks h;
  if (const char* e = std::getenv("ATTNRES_TEST_NAN")) {
    int nan_rank = -1;
    long nan_step = -1;
    if (std::sscanf(e, "%d:%ld", &nan_rank, &nan_step) != 2) fail("ATTNRES_TEST_NAN must be RANK:STEP, got '", e, "'");
    // That rank's loss and the first gradient of its range become NaN.
    h.gradient_fault = [nan_rank, nan_step](int rank, int64_t step, StepGradients& g) {
      if (rank != nan_rank || step != nan_step) return;
      g.loss = std::nan("");
      g.ops.fill(g.grads + g.lo, std::nanf(""), std::min<int64_t>(1, g.hi - g.lo));
    };
  }
  if (const char* e = std::getenv("ATTNRES_TEST_STOP_AT_MICRO"))
    if (std::sscanf(e, "%ld:%ld", &h.stop_step, &h.stop_micro) != 2)
      fail("ATTNRES_TEST_STOP_AT_MICRO must be STEP:MICRO, got '", e, "'");
  if (const char* e = std::getenv("ATTNRES_TEST_MOMENT_CHUNK")) h.moment_chunk = std::max<int64_t>(1, std::atoll(e));
  if (const char* e = std::getenv("ATTNRES_TEST_SAVE_FAULT_RANK")) h.save_fault_rank = std::atoi(e);
  if (const char* e = std::getenv("ATTNRES_TEST_MPI_COUNT")) comm.limit_count_for_testing(std::atoll(e));
  return h;
}

// The flags that build the model's Config: a preset or file, and the
// attnres_* keys laid over it (converting a plain Qwen3 needs no hand-written config).
struct ConfigFlags {
  std::string config;
  std::optional<std::string> mode, sources, combine, block_delta, gate, query_init;
  std::optional<int64_t> num_blocks, routing_heads;
  std::optional<bool> null_source;
};

// The mode named by its two axes (--sources, --combine): the row of the mode
// table with those sources and that combination, or one line saying why the
// pair has none.
std::string mode_of_axes(const std::string& sources, const std::string& combine) {
  static const std::pair<const char*, Sources> kSources[] = {
      {"outputs", Sources::kOutputs},
      {"partial_sums", Sources::kPartialSums},
      {"block_deltas", Sources::kBlockDeltas},
      {"states", Sources::kStates},
      {"outputs_stream", Sources::kOutputsAndStream}};
  static const std::pair<const char*, Combine> kCombine[] = {{"replace", Combine::kReplace}, {"add", Combine::kAdd}};
  const auto* s = std::find_if(std::begin(kSources), std::end(kSources), [&](const auto& e) { return sources == e.first; });
  const auto* c = std::find_if(std::begin(kCombine), std::end(kCombine), [&](const auto& e) { return combine == e.first; });
  if (s == std::end(kSources))
    fail("--sources '", visible(sources), "': outputs, partial_sums, block_deltas, states or outputs_stream");
  if (c == std::end(kCombine)) fail("--combine '", visible(combine), "': replace or add");
  for (const ModeSpec& m : kModeSpecs)
    if (m.sources == s->second && m.combine == c->second) return m.name;
  if (s->second == Sources::kOutputsAndStream)
    fail("--sources outputs_stream with --combine add is not defined: the stream is one of its sources, and adding "
         "the routed sum to the stream would count it twice (replace: delta_replace)");
  if (s->second == Sources::kStates)
    fail("--sources states with --combine replace is not defined in attnres (the reference's full_v replaces over "
         "the states and the stream, with a value router: attnres_mode full_v)");
  fail("--sources block_deltas with --combine replace is not defined: a block delta is what a block added to the "
       "residual stream, and a replacing router keeps no stream (replace reads partial_sums: block)");
}

void add_config_flags(OptionList& opts, ConfigFlags& m) {
  opts.add(m.config, {"config", "tiny",
                      "preset name (tiny, tiny-deep, bench-small, qwen3-0.6b, qwen3-1.7b, qwen3-4b) or path to a config.json "
                      "(default with --init/--resume: the checkpoint's)"});
  opts.add(m.mode, {"mode", "",
                    cat("override attnres_mode: ", mode_name_list(false), ", or the reference's multi-head ",
                        mode_name_list(true))});
  opts.add(m.sources, {"sources", "",
                       "with --combine, the mode by its two axes instead of --mode: what the routers read — "
                       "outputs (every sublayer's), partial_sums (the block sums), states (the stream after each "
                       "sublayer), block_deltas (what each block "
                       "added to the stream), outputs_stream (every sublayer's output, then the stream)"});
  opts.add(m.combine, {"combine", "",
                       "with --sources: how the routed sum makes a sublayer's input — replace, or add (to a "
                       "residual stream); outputs+replace = full, outputs+add = delta, partial_sums+replace = "
                       "block, partial_sums+add = block_add, block_deltas+add = delta_block, states+add = "
                       "full_additive, outputs_stream+replace = delta_replace"});
  opts.add(m.routing_heads, {"routing-heads", "",
                             "override attnres_num_heads: routing heads of every router, dividing hidden_size "
                             "(default 1; the _mh modes 8)"});
  opts.add(m.num_blocks, {"num-blocks", "", "override attnres_num_blocks (block modes)"});
  opts.add(m.block_delta,
           {"block-delta", "", "override attnres_block_delta: true (the paper's) or reference (the released code's)"});
  opts.add(m.null_source, {"null-source", "", "override attnres_use_null_source: true or false (delta modes)"});
  opts.add(m.gate, {"gate", "",
                    "override attnres_gate_type: bias, learnable_alpha (0 at init: an exact conversion "
                    "in the delta modes), sigmoid_scalar (sigmoid of a learned scalar, -2 at init) or "
                    "sigmoid_vector (sigmoid(W x + b) per token and channel, W = 0 and b = -2 at init)"});
  opts.add(m.query_init, {"query-init", "", "override attnres_query_init: zero or normal"});
}

// Everything after the flags and the join: may throw on any rank.
TrainResult run_train(TrainOptions& o, const ConfigFlags& m, const OptionList& opts, Comm& comm,
                      const std::string& plan_ranks, const StepCallback& on_step = nullptr) {
  o.world = comm.size();
  std::set<std::string> given;
  TrainOptions::each(o, [&](auto&, const char* key, const char*, OnResume, const char*) {
    if (opts.given(option_flag(key))) given.insert(key);
  });
  if (o.resume.empty() && given.count("lr") && !given.count("lr_min")) o.lr_min = TrainOptions::default_lr_min(o.lr);
  std::string resume_dir;
  if (!o.resume.empty()) {
    // The run's own settings, for every option not given here; the output
    // goes on into the run's directory (the one holding the checkpoint).
    resume_dir = resolve_model_dir(o.resume);
    take_run_settings(o, read_trainer_state(resume_dir).settings, given);
    if (!given.count("out"))
      o.out = std::filesystem::absolute(resume_dir).lexically_normal().parent_path().string();
  }
  // The model shape comes from --config, else from the checkpoint being
  // resumed or fine-tuned.
  const std::string from = !resume_dir.empty() ? resume_dir : o.init;
  const bool preset = opts.given("config") || from.empty();
  o.model = preset ? load_config(m.config) : Config::load(resolve_model_dir(from) + "/config.json");
  std::optional<std::string> mode = m.mode;
  if (m.sources || m.combine) {
    if (mode) fail("--mode and --sources/--combine both name the mode: give one of them");
    if (!m.sources || !m.combine) fail("--sources and --combine go together (the two axes of a mode)");
    mode = mode_of_axes(*m.sources, *m.combine);
  }
  if (mode) o.model = o.model.with_mode(*mode);  // with the name's defaults (heads; delta_mh's fixed keys)
  nlohmann::json j = o.model.to_json();
  if (m.routing_heads) j["attnres_num_heads"] = *m.routing_heads;
  if (m.num_blocks) j["attnres_num_blocks"] = *m.num_blocks;
  if (m.block_delta) j["attnres_block_delta"] = *m.block_delta;
  if (m.null_source) j["attnres_use_null_source"] = *m.null_source;
  if (m.gate) j["attnres_gate_type"] = *m.gate;
  if (m.query_init) j["attnres_query_init"] = *m.query_init;
  o.model = Config::from_json(j, "the train flags");
  if (o.model.name_row().fixes_delta_keys && m.null_source && !*m.null_source)
    fail("--null-source false: delta_mh always has the null source (without one: --mode delta_block "
         "--block-delta reference --routing-heads H)");
  // A routing option the mode has no use for is refused, not stored in a
  // config where it means nothing; so is a block count the model cannot have.
  auto modes_where = [](const std::function<bool(const ModeSpec&)>& f) {
    std::string names;
    for (const ModeSpec& s : kModeSpecs)
      if (f(s)) names += cat(names.empty() ? "" : ", ", s.name);
    return names;
  };
  const ModeSpec& spec = mode_spec(o.model.mode);
  const std::string mode_said = cat("attnres_mode ", o.model.mode_label());
  if (m.null_source && *m.null_source && !spec.null_source)
    fail("--null-source true: ", mode_said, " has no null source (",
         modes_where([](const ModeSpec& s) { return s.null_source; }), " have one)");
  if (m.block_delta && spec.sources != Sources::kBlockDeltas)
    fail("--block-delta: ", mode_said, " routes no block deltas (",
         modes_where([](const ModeSpec& s) { return s.sources == Sources::kBlockDeltas; }), " does)");
  if (m.num_blocks && *m.num_blocks > o.model.L)
    fail("--num-blocks ", *m.num_blocks, ": more blocks than the model's ", o.model.L, " layers (a block holds at ",
         "least one layer: at most --num-blocks ", o.model.L, ")");
  o.validate();
  if (!plan_ranks.empty()) {  // --plan-ranks: the memory plans, nothing trained
    if (comm.root())
      for (size_t at = 0; at <= plan_ranks.size();) {
        const size_t comma = std::min(plan_ranks.find(',', at), plan_ranks.size());
        int64_t n = 0;
        parse_value(n, "--plan-ranks", plan_ranks.substr(at, comma - at));
        at = comma + 1;
        if (n < 1 || n > 1 << 20) fail("--plan-ranks: ", n, " is not a number of ranks (1 to 2^20)");
        for (int zero : {1, 3})
          std::printf("memory plan, %lld rank%s, ZeRO-%d: %s\n", static_cast<long long>(n), n == 1 ? "" : "s", zero,
                      plan_memory(o.model, o.model_options(), static_cast<int>(n), zero).line().c_str());
      }
    return {};
  }

  // The start-up table once the run is accepted: a refused run prints its error alone.
  auto started = [&] {
    if (comm.root())
      std::printf("attnres train\n  config = %s\n%s%s", preset ? m.config.c_str() : (from + " (its config.json)").c_str(),
                  options_table(o).c_str(), o.world > 1 ? cat("  ranks = ", o.world, "\n").c_str() : "");
    std::fflush(stdout);  // before any error line on stderr, also when piped
  };
  const TrainResult r = train(o, &comm, test_hooks_from_environment(comm), started, on_step);
  if (comm.root() && r.val_tokens > 0 && !o.quiet)
    std::printf("final: %lld steps, train loss %.4f, val loss %.4f, val perplexity %.2f\n",
                static_cast<long long>(r.steps_done), r.final_loss, r.val_loss, r.val_ppl);
  std::fflush(stdout);
  return r;
}

// The command's flags, each bound to its field: train's option list.
struct TrainCommand {
  TrainOptions o;
  ConfigFlags m;
  std::string plan_ranks;
  OptionList opts{"train", "Train a Qwen3 model (any attnres_mode) on token files; checkpoints go to --out."};
  TrainCommand();
};

TrainCommand::TrainCommand() {
  add_config_flags(opts, m);
  opts.add(o.resume, {"resume", "",
                      "checkpoint or run directory to continue, bit-identically; every option not given is the "
                      "run's own"});
  add_train_options(opts, o);
  opts.add(o.overwrite, {"overwrite", "false",
                         "a new run into an --out that holds a run deletes that run's log and checkpoints first "
                         "(without it such an --out is refused)"});
  opts.add(o.profile, {"profile", "false", profile_help() + " (train: at the end of the run)"});
  opts.add(plan_ranks, {"plan-ranks", "",
                        "print this run's memory plan per rank under ZeRO-1 and ZeRO-3 for each of these numbers of "
                        "ranks (e.g. 8,16) and exit without training"});
}

}  // namespace

std::string train_help() { return TrainCommand().opts.help(); }

TrainResult train_command(const std::vector<std::string>& args, const StepCallback& on_step) {
  TrainCommand c;
  if (!c.opts.parse(args)) return {};
  std::unique_ptr<Comm> comm = Comm::single();
  return run_train(c.o, c.m, c.opts, *comm, c.plan_ranks, on_step);
}

int cmd_train(int argc, char** argv) {
  TrainCommand c;
  TrainOptions& o = c.o;
  const ConfigFlags& m = c.m;
  const OptionList& opts = c.opts;
  const std::string& plan_ranks = c.plan_ranks;
  if (!c.opts.parse(argc, argv)) return 0;

  // The ranks of the run: mpirun -np N starts N of these processes (alone: one).
  std::unique_ptr<Comm> comm = Comm::join();
  try {
    run_train(o, m, opts, *comm, plan_ranks);
    return 0;
  } catch (const std::exception& e) {
    if (comm->size() == 1) throw;
    // One rank's error ends the job: the others may be waiting for this one.
    // Any exception (also std::bad_alloc or a std::filesystem error): left to
    // main, it would reach MPI_Finalize, which waits for the others.
    std::fprintf(stderr, "attnres train: error: rank %d of %d: %s\n", comm->rank(), comm->size(), e.what());
    comm->abort(1);
  }
}

}  // namespace attnres
