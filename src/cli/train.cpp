// train.cpp — `attnres train`: train from scratch, fine-tune, or resume.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "distributed/comm.h"
#include "io/checkpoint.h"
#include "model/presets.h"
#include "train/trainer.h"

namespace attnres {

namespace {

// The test seams (train/trainer.h) that tests/distributed/mpi.py sets through
// the environment, which reaches every rank (mpirun -x):
//   ATTNRES_TEST_NAN=RANK:STEP      that rank's gradient is NaN at that step
//   ATTNRES_TEST_MOMENT_CHUNK=N     moments travel to rank 0 in pieces of N floats
//   ATTNRES_TEST_MPI_COUNT=N        at most N floats per MPI call
// Read here, at the program's edge, and nowhere in the library.
TrainTestHooks test_hooks_from_environment(Comm& comm) {
  TrainTestHooks h;
  if (const char* e = std::getenv("ATTNRES_TEST_NAN"))
    if (std::sscanf(e, "%d:%ld", &h.nan_rank, &h.nan_step) != 2) fail("ATTNRES_TEST_NAN must be RANK:STEP, got '", e, "'");
  if (const char* e = std::getenv("ATTNRES_TEST_MOMENT_CHUNK")) h.moment_chunk = std::max<int64_t>(1, std::atoll(e));
  if (const char* e = std::getenv("ATTNRES_TEST_MPI_COUNT")) comm.limit_count_for_testing(std::atoll(e));
  return h;
}

// Everything after the flags and the join: may throw on any rank.
int run_train(Flags& f, Comm& comm) {
  TrainOptions o;
  o.world = comm.size();
  std::set<std::string> given;
  for (const TrainOptionSpec& s : train_option_specs()) {
    set_option(o, s.key, f.str(s.flag));
    if (f.given(s.flag)) given.insert(s.key);
  }
  o.resume = f.str("resume");
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
  const bool preset = f.given("config") || from.empty();
  o.model = preset ? load_config(f.str("config")) : Config::load(resolve_model_dir(from) + "/config.json");
  // attnres_* overrides: converting a plain Qwen3 needs no hand-written config.
  nlohmann::json j = o.model.to_json();
  if (!f.str("mode").empty()) j["attnres_mode"] = f.str("mode");
  if (!f.str("num-blocks").empty()) j["attnres_num_blocks"] = f.i64("num-blocks");
  if (!f.str("block-delta").empty()) j["attnres_block_delta"] = f.str("block-delta");
  if (!f.str("null-source").empty()) j["attnres_use_null_source"] = f.on("null-source");
  if (!f.str("gate").empty()) j["attnres_gate_type"] = f.str("gate");
  if (!f.str("query-init").empty()) j["attnres_query_init"] = f.str("query-init");
  o.model = Config::from_json(j, "the train flags");
  o.validate();

  if (comm.root())
    std::printf("attnres train\n  config = %s\n%s%s", preset ? f.str("config").c_str() : (from + " (its config.json)").c_str(),
                options_table(o).c_str(), o.world > 1 ? cat("  ranks = ", o.world, "\n").c_str() : "");
  std::fflush(stdout);  // before any error line on stderr, also when piped
  const TrainResult r = train(o, &comm, test_hooks_from_environment(comm));
  if (!comm.root()) return 0;
  if (r.val_tokens > 0)
    std::printf("final: %lld steps, train loss %.4f, val loss %.4f, val perplexity %.2f\n",
                static_cast<long long>(r.steps_done), r.final_loss, r.val_loss, r.val_ppl);
  return 0;
}

}  // namespace

int cmd_train(int argc, char** argv) {
  // The model flags build a Config; every other flag is a training option
  // (train/options.h: one list gives the flags, --help, the table, the stored
  // settings and the resume rules).
  std::vector<FlagSpec> specs = {
      {"config", "tiny", "preset name (tiny, bench-small) or path to a config.json "
                         "(default with --init/--resume: the checkpoint's)"},
      {"mode", "", "override attnres_mode: baseline, block, full, delta, delta_block"},
      {"num-blocks", "", "override attnres_num_blocks (block modes)"},
      {"block-delta", "", "override attnres_block_delta: true (the paper's) or reference (the released code's)"},
      {"null-source", "", "override attnres_use_null_source: true or false (delta modes)"},
      {"gate", "", "override attnres_gate_type: bias or learnable_alpha (0 at init: an exact conversion "
                   "in the delta modes)"},
      {"query-init", "", "override attnres_query_init: zero or normal"},
      {"resume", "", "checkpoint or run directory to continue, bit-identically; every option not given is the "
                     "run's own"},
  };
  for (const TrainOptionSpec& s : train_option_specs()) specs.push_back({s.flag, s.default_value, s.help});
  Flags f("train", "Train a Qwen3 model (any attnres_mode) on token files; checkpoints go to --out.", specs);
  if (!f.parse(argc, argv)) return 0;

  // The ranks of the run: mpirun -np N starts N of these processes (alone: one).
  std::unique_ptr<Comm> comm = Comm::join();
  try {
    return run_train(f, *comm);
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
