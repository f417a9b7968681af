// checkpoint.h — checkpoint directories.
//
// A model directory holds `config.json` (HF compatible) and `model.safetensors`
// (F32, HF tensor names), and `tokenizer.json` when the run knew its tokenizer.  A training checkpoint adds `optimizer.safetensors`
// (AdamW moments, `exp_avg.<name>` / `exp_avg_sq.<name>`) and
// `trainer_state.json` (step, data position, RNG, run settings).
//
// A run writes checkpoints as `<out>/step_00000100/`, each first built under a
// temporary name with every file fsynced and then renamed into place, and then
// points `<out>/latest` (a one-line file, itself replaced atomically) at it.
// A crash at any moment leaves every complete checkpoint and `latest` intact.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "model/config.h"
#include "model/params.h"
#include "train/data_loader.h"

namespace attnres {

// Writes config.json and model.safetensors into an existing directory.
void write_model_files(const std::string& dir, const Config& c, const ParamLayout& layout, const float* params);
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
// True for the parameters that exist only with depth routing.
bool is_routing_param(const std::string& name);

// A directory that holds config.json itself, or a run directory whose
// `latest` names one; Error otherwise.
std::string resolve_model_dir(const std::string& path);

struct TrainerState {
  int64_t step = 0;  // optimizer steps completed
  LoaderPosition data;
  std::array<uint64_t, 4> rng{};
  nlohmann::json settings;  // the run's flags, to check a resume against
};

// Writes <out>/step_<step>/ atomically and repoints <out>/latest; returns the
// path.  A tokenizer.json given is copied in, so the checkpoint can generate text.
std::string save_checkpoint(const std::string& out_dir, const Config& c, const ParamLayout& layout,
                            const float* params, const float* m, const float* v, const TrainerState& st,
                            const std::string& tokenizer_json = "");
// Loads parameters, moments and trainer state from a checkpoint directory.
TrainerState load_checkpoint(const std::string& dir, const ParamLayout& layout, float* params, float* m, float* v);

}  // namespace attnres
