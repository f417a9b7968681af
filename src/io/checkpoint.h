// checkpoint.h — checkpoint directories.
//
// A model directory holds `config.json` (HF compatible) and `model.safetensors`
// (F32 or, on request, BF16; HF tensor names), and the tokenizer files and
// generation_config.json when the run knew them.  A training checkpoint adds
// `optimizer.safetensors` (AdamW moments, `exp_avg.<name>` / `exp_avg_sq.<name>`,
// unless saved weights-only) and `trainer_state.json` (step, data position,
// RNG, run settings).
//
// A run writes checkpoints as `<out>/step_00000100/`, each first built under a
// temporary name with every file fsynced and then renamed into place, and then
// points `<out>/latest` (a one-line file, itself replaced atomically) at it.
// A crash at any moment leaves every complete checkpoint and `latest` intact.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "model/config.h"
#include "model/params.h"
#include "io/token_file.h"

namespace attnres {

// Writes config.json and the weights (F32, or BF16 with bf16 = true) into an
// existing directory: one model.safetensors, or — when they exceed
// max_shard_bytes > 0 — the hub's sharded form, model-0000K-of-0000N.safetensors
// (tensors in layout order, a shard closed before it would pass the limit;
// a tensor larger than the limit gets a shard of its own) and
// model.safetensors.index.json.  Returns the number of weight files.
// With `fetch`, params is not read: fetch(at, out) fills out with floats
// [at, at + out.size()) of the parameter arena, asked for in increasing `at`
// (a sharded run's rank 0 receives them from their owners while it writes).
using ArenaFetch = std::function<void(int64_t at, std::span<float> out)>;
int write_model_files(const std::string& dir, const Config& c, const ParamLayout& layout, const float* params,
                      bool bf16 = false, int64_t max_shard_bytes = 0, const ArenaFetch& fetch = nullptr);
class WeightFiles;
// The weights of `files` for write_model_files' fetch, read a piece at a time
// as it asks for them (export: its memory is a piece, not the model).  Every
// tensor's presence and shape is checked here, its values (finite) as read.
// `files` and `layout` must outlive the fetch.
ArenaFetch weight_reader(const WeightFiles& files, const ParamLayout& layout);
// The tokenizer and generation files of a model directory, which travel with it.
std::vector<std::string> companion_files(const std::string& dir);
// Loads every tensor of `layout` from `path` (a model directory — one
// model.safetensors or the sharded form, io/weight_files.h — or one
// .safetensors file), checking names, shapes and dtypes; BF16/F16/F64 are
// converted, by `threads` threads.  With params16, the
// matrices (TensorSpec::matrix) go there as bf16 instead, at the same offsets.
// With keep_missing_routing, depth-routing tensors absent from the file keep
// the values already in `params` (their init): this converts a plain Qwen3
// checkpoint into a routed model for fine-tuning.  Returns how many were kept.
int64_t load_params(const std::string& path, const ParamLayout& layout, float* params, bf16* params16 = nullptr,
                    bool keep_missing_routing = false, int threads = 1);
// A rank of a sharded run (ZeRO-3): only the floats within `ranges` (sorted,
// disjoint arena ranges), into params at their arena offsets; each range
// read from the memory-mapped files, nothing else.  Routing tensors kept
// (keep_missing_routing) are counted once per tensor.
int64_t load_params(const std::string& path, const ParamLayout& layout, float* params,
                    std::span<const ArenaRange> ranges, bool keep_missing_routing, int threads);

class Model;
// Loads every tensor of a model from `path` (as load_params) into what the
// model holds, with its context's threads: a training model reads its float32
// master weights and rounds their bf16 copies (bf16); an inference model in
// bf16 reads its matrices into the bf16 arena only.  With
// keep_missing_routing, routing tensors absent from the files keep their
// current values.  Returns how many were kept.
int64_t load_weights(Model& model, const std::string& path, bool keep_missing_routing = false);

// A directory that holds config.json itself, or a run directory whose
// `latest` names one; Error otherwise.
std::string resolve_model_dir(const std::string& path);

// A model directory held for reading: resolve_model_dir(path), then a shared
// flock on the checkpoint directory itself, kept while the object lives.  A
// run removes a checkpoint (rotation past --keep, or the previous copy of a
// step saved again) only under an exclusive lock taken without waiting, so a
// checkpoint being read (export, eval, generate, a --init) stays whole until
// the run's next save after the reader is done.  One removed between the
// resolving and the locking is resolved again (a run's `latest` has moved
// on); five such losses in a row are an Error.
class HeldModelDir {
 public:
  explicit HeldModelDir(const std::string& path);
  ~HeldModelDir();
  HeldModelDir(const HeldModelDir&) = delete;
  HeldModelDir& operator=(const HeldModelDir&) = delete;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;
};

// Removes a checkpoint directory unless a reader holds it (HeldModelDir);
// whether it was removed.
bool remove_checkpoint_unless_read(const std::string& dir);

struct TrainerState {
  int64_t step = 0;  // optimizer steps completed
  LoaderPosition data;
  std::array<uint64_t, 4> rng{};  // the data generator (random windows) after `step` steps
  nlohmann::json settings;  // the run's flags, to check a resume against
};

// The dtype weights are written in, as train --save-dtype and export --dtype
// spell it: "f32" (also "fp32") or "bf16" (safetensors' F32 / BF16); true for
// bf16.  Anything else is an Error naming `flag`.
bool parse_save_dtype(const std::string& dtype, const char* flag);

struct SaveOptions {
  bool optimizer = true;  // write optimizer.safetensors; false: a weights-only snapshot (no resume)
  bool bf16 = false;      // weights as BF16 (half the size; a resume starts from the rounded weights)
  // Whose moments optimizer.safetensors holds (null: every tensor's); a run
  // with a frozen base saves the routing parameters' only.
  std::function<bool(const TensorSpec&)> trained;
  // Files copied into the checkpoint under their own names: the tokenizer
  // (tokenizer.json, tokenizer_config.json, ...) and generation_config.json.
  std::vector<std::string> copy_files;
  int64_t keep = 0;  // keep the newest `keep` step_* checkpoints of out_dir and delete older ones (0 = all)
  // Moments that no process holds whole (ZeRO: each rank keeps a range):
  // fetch(k, at, out) fills out with floats [at, at + out.size()) of the
  // arena of moment k (0: exp_avg, 1: exp_avg_sq).  Asked for in increasing
  // `at`, every exp_avg piece before the first exp_avg_sq one.  When set,
  // save_checkpoint's m and v are not read.
  std::function<void(int k, int64_t at, std::span<float> out)> fetch_moments;
};

// Writes <out>/step_<step>/ atomically and repoints <out>/latest; returns the path.
std::string save_checkpoint(const std::string& out_dir, const Config& c, const ParamLayout& layout,
                            const float* params, const float* m, const float* v, const TrainerState& st,
                            const SaveOptions& so = {});
// save_checkpoint in two halves, for a checkpoint whose files several
// processes write (ZeRO-3, train/zero3.h).  begin_checkpoint makes the
// temporary directory the files go into and returns it;
// commit_checkpoint writes trainer_state.json and so.copy_files into it and
// moves it into place as save_checkpoint does (fsynced, atomic, `latest`,
// the older ones beyond so.keep removed); returns the checkpoint's path.  A
// failure removes the temporary directory.
std::string begin_checkpoint(const std::string& out_dir, int64_t step);
std::string commit_checkpoint(const std::string& out_dir, const std::string& tmp_dir, const TrainerState& st,
                              const SaveOptions& so);
// Loads parameters, moments (of the tensors `trained` accepts; null: all) and
// trainer state from a checkpoint directory, converting with `threads` threads.
// With a range [lo, hi) of the arena, m and v receive that part only (m[0]
// is the moment at lo): a rank of a ZeRO run reads its range, nothing more.
TrainerState load_checkpoint(const std::string& dir, const ParamLayout& layout, float* params, float* m, float* v,
                             const std::function<bool(const TensorSpec&)>& trained = nullptr, int threads = 1,
                             int64_t lo = 0, int64_t hi = INT64_MAX);
// The same for a rank of a sharded run (ZeRO-3): parameters and moments of
// the arena `ranges` only, into arenas indexed by arena offset.
TrainerState load_checkpoint(const std::string& dir, const ParamLayout& layout, float* params, float* m, float* v,
                             const std::function<bool(const TensorSpec&)>& trained, int threads,
                             std::span<const ArenaRange> ranges);
// The step, data position, generator state and run settings of a checkpoint.
TrainerState read_trainer_state(const std::string& dir);
// Removes the temporary directories (.step_N.tmp.PID) that saves killed
// midway left in a run directory, where PID is no live process; returns how many.
int remove_stray_checkpoint_dirs(const std::string& out_dir);
// Tests: save_checkpoint fails at its k-th final move (0: before the rename
// into place; 1: after exchanging with a same-step checkpoint; 2: before
// `latest` is written; 3: after), as a crash there would; -1: never.
void set_checkpoint_fault_for_testing(int k);
// The step_* checkpoint directories of a run directory, oldest first.
std::vector<std::string> list_checkpoints(const std::string& out_dir);
// What a run left in a directory: its log.jsonl, its `latest` pointer and its
// step_* checkpoints (empty: no run there).  A new run may not write among
// them (train --overwrite removes them first).
std::vector<std::string> previous_run_files(const std::string& out_dir);

}  // namespace attnres
