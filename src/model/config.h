// config.h — the model configuration, read from a Hugging Face style config.json.
//
// Field names are those of HF Qwen3 (docs/DESIGN.md §1) plus the attnres_* fields of
// the reference AttnRes code (§2).  Missing attnres_* fields take the
// defaults of whoever wrote the config: a plain Qwen3 is baseline; a
// "qwen3_attnres" config without attnres_mode is block, and any config with
// attnres keys but no attnres_block_delta came from the reference code, so
// its block delta is "reference".  Unknown fields are ignored, except those
// that change the math in ways the engine does not implement (rope_scaling
// not null, rope_parameters other than the plain rotation, use_sliding_window
// true, attention_bias true, hidden_act other than silu), which are refused; a
// missing required field, a wrong type or an inconsistent value is an Error
// naming the file and the field.  rope_theta is read where transformers 5
// writes it, rope_parameters.rope_theta, before the top-level key of 4.x.
//
// The Hugging Face fields are read as transformers 5 reads them: no
// tie_word_embeddings means an untied head (lm_head.weight), no rope_theta
// anywhere means 10000, and the booleans (tie_word_embeddings,
// attention_bias, use_sliding_window) must be true or false — 1 or null is
// an error, as there.  Three defaults are this engine's own, for configs
// written by hand: num_key_value_heads = num_attention_heads, head_dim =
// hidden_size / num_attention_heads, max_position_embeddings 4096
// (transformers' Qwen3Config would take 32, 128 and 32768); every config
// this engine writes carries all three, and a published checkpoint whose
// config omits one is caught by its tensors' shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/modes.h"

namespace attnres {

enum class BlockDelta { kTrue, kReference };
enum class Gate { kBias, kLearnableAlpha, kSigmoidScalar, kSigmoidVector };

const char* mode_name(Mode m);  // the mode's own name (modes.h), without the reference's _mh spellings

// The names attnres_mode takes are the rows of kModeNames (modes.h).
const ModeName& parse_mode_name(const std::string& s);  // throws Error listing the valid names
// The names, joined by `sep`: the modes' own (reference_mh false) or the
// reference's multi-head ones (true) — for help texts and defaults.
std::string mode_name_list(bool reference_mh, const char* sep = ", ");
// compare's default --modes: the table's rows marked `compared` (modes.h).
std::string compared_modes();

struct Config;
// One rule for every command that runs windows of `positions` tokens
// (train, eval, routing; eval-tasks' --max-length, generate's prompt plus new
// tokens say it in their own words): positions past max_position_embeddings,
// the range the model was trained at, are refused — an Error "FLAG N exceeds
// max_position_embeddings M" — rather than run with RoPE extrapolated.
void check_positions(const Config& c, int64_t positions, const char* flag);

struct Config {
  // Dimension letters used throughout: d = hidden, L = layers, H = query heads,
  // KV = key/value heads, hd = head_dim, F = intermediate, V = vocab.
  int64_t d = 0, L = 0, H = 0, KV = 0, hd = 0, F = 0, V = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;  // transformers 5's default_theta where a config names none
  bool tied = false;          // transformers' Qwen3 default: an lm_head of its own
  int64_t max_position_embeddings = 4096;

  // Depth routing (docs/DESIGN.md §2).
  Mode mode = Mode::kBaseline;
  int64_t num_blocks = 8;  // attnres_num_blocks
  BlockDelta block_delta = BlockDelta::kTrue;
  bool null_source = false;
  Gate gate = Gate::kBias;
  bool query_init_normal = false;  // attnres_query_init: "zero" (default) or "normal" = N(0, 0.02)
  int64_t routing_heads = 1;       // attnres_num_heads: every router's heads (each owns d / heads dimensions)
  bool reference_mh = false;       // named as the reference's block_mh / full_mh / delta_mh (see ModeName)

  // The attnres_mode this config is written with: mode_name(mode), or its _mh name.
  const char* mode_label() const;
  // Its row of kModeNames (modes.h): the facts its name fixes.
  const ModeName& name_row() const;
  // Whether the final norm reads a final router (modes.h), or, without one,
  // the stream or (block_mh) the last partial block sum.
  bool final_router() const;
  // This config with attnres_mode `name` (the name's defaults for what it
  // fixes: heads, and delta_mh's null source and block delta).
  Config with_mode(const std::string& name) const;

  int64_t layers_per_block() const { return (L + num_blocks - 1) / num_blocks; }
  int64_t q_dim() const { return H * hd; }
  int64_t kv_dim() const { return KV * hd; }

  // `where` names the source in error messages (a path, or "<json>").
  static Config from_json(const nlohmann::json& j, const std::string& where);
  static Config load(const std::string& path);
  // Every field, attnres_* included; routed modes as model_type
  // "qwen3_attnres" (architectures Qwen3AttnResForCausalLM), as the reference
  // code writes them.  torch_dtype names the dtype of the weights written beside it.
  nlohmann::json to_json(const std::string& torch_dtype = "float32") const;
  void validate(const std::string& where) const;

 private:
  // The keys of config.json and the members they fill, once, for from_json
  // and to_json (config.cpp); the defaults that depend on what was read.
  struct Defaults {
    int64_t routing_heads = 1;  // the mode name's heads
  };
  template <class C, class Visit>
  static void fields(C& c, const Defaults& dflt, Visit&& visit);
};

}  // namespace attnres
