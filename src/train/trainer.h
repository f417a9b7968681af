// trainer.h — the training loop: micro-batches with gradient accumulation,
// clipping, AdamW with warmup+cosine, periodic validation, checkpoints, and
// exact resume.  One human line per step on stdout, the same fields as JSONL.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "model/config.h"
#include "train/optimizer.h"
#include "train/options.h"

namespace attnres {

struct TrainResult {
  int64_t steps_done = 0;
  int64_t schedule_steps = 0;  // where the learning-rate schedule ended (< --steps: the time budget cut the run)
  double final_loss = 0;
  double val_loss = 0, val_ppl = 0;
  int64_t val_tokens = 0;
  std::string last_checkpoint;
  std::string stopped_by;  // what ended the run early: a signal's name ("SIGINT"), "callback", or "" (it did not)
};

// Called on rank 0 at the end of every step (after its validation and
// checkpoint, if it had them) with the step's record: its line of log.jsonl
// ({"step", "loss", "lr", "grad_norm", ...} or {"step", "skipped"}), with
// "val_loss" and "val_ppl" when it validated.  Returning false ends the run
// there as a stop signal would: a checkpoint of that step, exit as usual.
// One process only (a callback on one rank cannot stop the others).
using StepCallback = std::function<bool(const nlohmann::json& record)>;

// Test seams of a run: faults and piece sizes that tests choose (unit tests
// directly; tests/distributed/mpi.py through the environment of `attnres
// train`, read in cli/train.cpp).  The defaults are production's.
struct StepGradients;
struct TrainTestHooks {
  // A fault injected into a step: called on every rank with its rank and the
  // 1-based step once the step's gradients are summed on this rank, before
  // the ranks exchange them (e.g. a NaN on one rank: cli/train.cpp's
  // ATTNRES_TEST_NAN).  Empty in production.
  std::function<void(int rank, int64_t step, StepGradients&)> gradient_fault;
  int64_t moment_chunk = 0;  // floats per piece of the moments sent to rank 0 in a save (0: 16 MiB);
                             // under ZeRO-3, per write of a rank's part of a checkpoint
  int save_fault_rank = -1;  // ZeRO-3: this rank fails to write its part of every checkpoint
  int64_t stop_step = -1;    // SIGTERM to itself once micro-batch stop_micro (1-based) of step stop_step is drawn
  int64_t stop_micro = -1;
};

// The first stage of train(): the run's settings, settled and checked before
// anything is built or written — the options validated, the device and
// precision tried, a resume checked against the run it continues (refused
// with the first option that would change its trajectory), the thread count
// (--threads 0: the cores this process may use, shared by the `local_ranks`
// ranks on this machine) and the tokenizer the checkpoints will carry.
struct RunPlan {
  nlohmann::json settings;                // a resume's run_settings (a new run's are made once its data is open)
  std::vector<std::string> resume_notes;  // one per allowed change of a resume
  std::string resume_dir, init_dir;       // resolved (a run: its latest checkpoint); "" when not given
  std::shared_ptr<HeldModelDir> init_held;  // init_dir held against its run's rotation (io/checkpoint.h)
  int threads = 1;
  std::string threads_note;               // why that many, with several ranks on this machine
  std::string tokenizer;                  // "" when none was found
};
RunPlan plan_run(const TrainOptions& opt, int local_ranks = 1);

class Comm;
// With `comm` (null: a world of one), one rank of a data-parallel run: every
// rank calls train() with the same options; rank 0 logs, validates and writes
// the checkpoints (see docs/distributed.md).
// `started`, when given, runs once the settings are settled and --out is
// claimed (before the data and the model): where a command prints its
// start-up table, so that a refused run prints only its error.
TrainResult train(const TrainOptions& opt, Comm* comm = nullptr, const TrainTestHooks& hooks = {},
                  const std::function<void()>& started = nullptr, const StepCallback& on_step = nullptr);

class Backend;
class Model;
class AdamW;
struct Shards;
class Zero3;

// One optimizer step of one rank.  The step's global batch is ranks × accum
// micro-batches; this rank computes `accum` of them (next_batch(inputs,
// targets) gives each) with the loss scaled by 1/(ranks·accum), so that the
// summed gradient is the global batch's mean.  Then:
//   reduce-scatter of the gradient arena (rank r gets the sum of its range),
//   all-gather of (loss, Σg² of the range, signal): the global loss (mean of
//   the ranks' means, in rank order) and norm, the same bits on every rank,
//   a non-finite loss or norm → Error (or, with skip_nonfinite, no update),
//   clip to `clip`, AdamW on this rank's range at 1-based step t with rate lr
//   (lr_routing for the routing parameters; < 0: lr),
//   all-gather of the parameters.
// ZeRO-3 (so.zero3): the matrices' gradients were reduce-scattered as each
// layer's backward ended; the vectors' are summed here; the norm, clip and
// AdamW are of this rank's pieces and every vector; nothing is gathered after
// the update (the next forward gathers each layer as it runs).
// With one rank the collectives are no-ops and this is plain training.
// This rank's side of a step once its micro-batches are done: its mean loss,
// and its gradient range [lo, hi) of the arena `grads` (backend memory) —
// what a TrainTestHooks fault may change.
struct StepGradients {
  double& loss;
  Backend& ops;
  float* grads;
  int64_t lo, hi;
};

struct StepOptions {
  int64_t accum = 1, t = 1;
  double lr = 0, lr_routing = -1, clip = 0;
  bool skip_nonfinite = false;
  // The stop signal this process has received (0: none), read once per step
  // (before the exchange with several ranks, which tells it to every rank).
  std::function<int()> received_signal;
  std::function<void(StepGradients&)> gradient_fault;  // tests (TrainTestHooks); empty in production
  Comm* comm = nullptr;          // null: one process
  const Shards* shards = nullptr;  // the ranks' ranges of the arena (with comm, ZeRO-1)
  Zero3* zero3 = nullptr;          // ZeRO-3 (train/zero3.h): the model's weights in pieces over the ranks
};
struct StepStats {
  double loss = 0, grad_norm = 0;  // global, before clipping
  double route_entropy = std::numeric_limits<double>::quiet_NaN();  // global: the entropy term's E, else NaN
  bool skipped = false;            // not finite, and skipped
  int signal = 0;                  // the first rank's stop signal, if any rank had one
  bool abandoned = false;          // one process: stopped between micro-batches, no update made
};
StepStats train_step(Model& model, AdamW& adamw, const std::function<void(int32_t*, int32_t*)>& next_batch,
                     const StepOptions& so);
// One process: the step above without ranks.
StepStats train_step(Model& model, AdamW& adamw, const std::function<void(int32_t*, int32_t*)>& next_batch,
                     int64_t accum, double lr, int64_t t, double clip, double lr_routing = -1);

}  // namespace attnres
