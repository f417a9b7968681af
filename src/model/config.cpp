// config.cpp — see config.h.
#include "model/config.h"

#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "model/modes.h"

namespace attnres {

namespace {

int64_t need_int(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) fail(where, ": missing required field \"", key, "\"");
  const auto& v = j[key];
  if (!is_int64(v)) fail(where, ": field \"", key, "\" must be an integer, got ", brief(v));
  return v.get<int64_t>();
}

template <class T>
T opt(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const nlohmann::json& v = j[key];
  // The type is checked first: the library converts a float to an integer
  // with undefined behaviour when it does not fit.
  bool ok;
  if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = is_int64(v);
  else if constexpr (std::is_floating_point_v<T>) ok = v.is_number();
  else ok = v.is_string();
  if (!ok) fail(where, ": field \"", key, "\" has the wrong type: ", brief(v));
  return v.get<T>();
}

}  // namespace

const char* mode_name(Mode m) { return mode_spec(m).name; }

std::string mode_name_list(bool reference_mh, const char* sep) {
  std::string out;
  for (const ModeName& e : mode_names())
    if (e.reference_mh == reference_mh) out += cat(out.empty() ? "" : sep, e.name);
  return out;
}

std::string compared_modes() {
  std::string out;
  for (const ModeSpec& m : kModeSpecs)
    if (m.compared) out += cat(out.empty() ? "" : ",", m.name);
  return out;
}

const ModeName& parse_mode_name(const std::string& s) {
  std::string names;
  for (const ModeName& e : mode_names()) {
    if (s == e.name) return e;
    names += cat(names.empty() ? "" : ", ", e.name);
  }
  fail("unknown attnres_mode \"", s, "\" (expected one of: ", names, ")");
}

const ModeName& Config::name_row() const {
  for (const ModeName& e : mode_names())
    if (e.mode == mode && e.reference_mh == reference_mh) return e;
  fail("attnres_mode ", mode_name(mode), ": no _mh name");  // validate() refuses this
}

const char* Config::mode_label() const { return name_row().name; }

bool Config::final_router() const { return name_row().final_router; }

Config Config::with_mode(const std::string& name) const {
  const ModeName& to = parse_mode_name(name);
  nlohmann::json j = to_json();
  if (name != mode_label()) {  // what the new name fixes takes its defaults
    j.erase("attnres_num_heads");
    if (to.fixes_delta_keys) {
      j.erase("attnres_block_delta");
      j.erase("attnres_use_null_source");
    }
  }
  j["attnres_mode"] = name;
  return from_json(j, cat("attnres_mode ", name));
}

// Fields of HF configs that change the math in ways this engine does not
// implement: present with anything but their plain value, they are an error
// naming the field, never silently ignored.
static void refuse_unsupported(const nlohmann::json& j, const std::string& where) {
  auto value = [&](const char* key) { return j.contains(key) ? j[key] : nlohmann::json(); };
  auto refuse = [&](const char* key, const char* what) {
    fail(where, ": field \"", key, "\" is ", brief(value(key), 80), ": ", what,
         " is not implemented");
  };
  if (!value("rope_scaling").is_null()) refuse("rope_scaling", "RoPE scaling (YaRN, dynamic, linear)");
  if (value("use_sliding_window").is_boolean() && value("use_sliding_window").get<bool>())
    refuse("use_sliding_window", "sliding-window attention");
  if (value("attention_bias").is_boolean() && value("attention_bias").get<bool>())
    refuse("attention_bias", "biases on q/k/v/o projections");
  if (!value("hidden_act").is_null() && value("hidden_act") != "silu")
    refuse("hidden_act", "an MLP activation other than silu");
  // transformers 5 writes RoPE as rope_parameters {rope_type, rope_theta}
  // (rope_scaling's successor): only the plain rotation is implemented.
  const nlohmann::json rp = value("rope_parameters");
  if (!rp.is_null()) {
    if (!rp.is_object()) fail(where, ": field \"rope_parameters\" must be an object, got ", brief(rp, 80));
    nlohmann::json type = "default";
    if (rp.contains("rope_type")) type = rp["rope_type"];
    else if (rp.contains("type")) type = rp["type"];  // its older spelling
    if (type != "default") refuse("rope_parameters", "RoPE scaling (YaRN, dynamic, linear, llama3, ...)");
    for (auto it = rp.begin(); it != rp.end(); ++it) {
      const std::string& k = it.key();
      const bool plain = k == "rope_type" || k == "type" || k == "rope_theta" || it.value().is_null() ||
                         (k == "partial_rotary_factor" && it.value() == 1.0);
      if (!plain) refuse("rope_parameters", cat("RoPE with \"", k, "\"").c_str());
    }
  }
}

Config Config::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": config must be a JSON object");
  refuse_unsupported(j, where);
  Config c;
  c.d = need_int(j, "hidden_size", where);
  c.L = need_int(j, "num_hidden_layers", where);
  c.H = need_int(j, "num_attention_heads", where);
  c.KV = j.contains("num_key_value_heads") ? need_int(j, "num_key_value_heads", where) : c.H;
  c.hd = j.contains("head_dim") && !j["head_dim"].is_null() ? need_int(j, "head_dim", where)
                                                            : (c.H > 0 ? c.d / c.H : 0);
  c.F = need_int(j, "intermediate_size", where);
  c.V = need_int(j, "vocab_size", where);
  c.rms_norm_eps = opt<double>(j, "rms_norm_eps", 1e-6, where);
  c.rope_theta = opt<double>(j, "rope_theta", 1e6, where);
  // transformers 5 writes rope_parameters.rope_theta and no top-level key;
  // where both are present its value wins, as in transformers.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    c.rope_theta = opt<double>(j["rope_parameters"], "rope_theta", c.rope_theta, where + " rope_parameters");
  c.tied = opt<bool>(j, "tie_word_embeddings", true, where);
  c.max_position_embeddings = opt<int64_t>(j, "max_position_embeddings", 4096, where);

  // Which code wrote the config decides the defaults of the attnres keys
  // (docs/DESIGN.md §2): the reference code writes model_type "qwen3_attnres"
  // and never an attnres_block_delta key (it always computes the block delta
  // as x − last source, our "reference"), and its default mode is block;
  // configs written here carry every key.  A plain Qwen3 config is baseline.
  const bool reference_type = j.contains("model_type") && j["model_type"] == "qwen3_attnres";
  bool has_attnres_key = false;
  for (auto it = j.begin(); it != j.end(); ++it) has_attnres_key |= it.key().rfind("attnres_", 0) == 0;
  std::string mode = opt<std::string>(j, "attnres_mode", reference_type ? "block" : "baseline", where);
  try {
    const ModeName& name = parse_mode_name(mode);
    c.mode = name.mode;
    c.reference_mh = name.reference_mh;
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  // The name's heads (the reference's _mh names: 8) unless the key says otherwise.
  c.routing_heads = opt<int64_t>(j, "attnres_num_heads", c.name_row().heads, where);
  c.num_blocks = opt<int64_t>(j, "attnres_num_blocks", 8, where);
  std::string bd = opt<std::string>(j, "attnres_block_delta", reference_type || has_attnres_key ? "reference" : "true",
                                    where);
  if (bd == "true") c.block_delta = BlockDelta::kTrue;
  else if (bd == "reference") c.block_delta = BlockDelta::kReference;
  else fail(where, ": attnres_block_delta must be \"true\" or \"reference\", got \"", bd, "\"");
  c.null_source = opt<bool>(j, "attnres_use_null_source", false, where);
  std::string gate = opt<std::string>(j, "attnres_gate_type", "bias", where);
  if (gate == "bias") c.gate = Gate::kBias;
  else if (gate == "learnable_alpha") c.gate = Gate::kLearnableAlpha;
  else fail(where, ": attnres_gate_type must be \"bias\" or \"learnable_alpha\", got \"", gate, "\"");
  if (c.name_row().fixes_delta_keys) {
    // delta_mh: the reference always adds the null source and computes its
    // block deltas as x − last block source, whatever the other keys say
    // (its config class writes attnres_use_null_source false by default);
    // only this project writes attnres_block_delta, so "true" is a contradiction.
    if (bd == "true")
      fail(where, ": attnres_mode delta_mh computes its block deltas as the reference code does (\"reference\"); ",
           "attnres_block_delta \"true\" contradicts it (the paper's block deltas with heads: attnres_mode ",
           "delta_block with attnres_num_heads)");
    c.block_delta = BlockDelta::kReference;
    c.null_source = true;
  }
  std::string qi = opt<std::string>(j, "attnres_query_init", "zero", where);
  if (qi == "zero") c.query_init_normal = false;
  else if (qi == "normal") c.query_init_normal = true;
  else fail(where, ": attnres_query_init must be \"zero\" or \"normal\", got \"", qi, "\"");
  c.validate(where);
  return c;
}

void Config::validate(const std::string& where) const {
  // Positive, and below bounds far above any real model (the largest Qwen3
  // has d 5120, F 25600, V 151936, 64 layers), so that every size product
  // the engine forms fits in 64 bits.
  auto positive = [&](int64_t v, const char* name, int64_t most) {
    if (v <= 0) fail(where, ": ", name, " must be positive, got ", v);
    if (v > most) fail(where, ": ", name, " ", v, " is beyond what this engine supports (at most ", most, ")");
  };
  positive(d, "hidden_size", 1 << 17);
  positive(L, "num_hidden_layers", 1 << 12);
  positive(H, "num_attention_heads", 1 << 12);
  positive(KV, "num_key_value_heads", 1 << 12);
  positive(hd, "head_dim", 1 << 12);
  positive(F, "intermediate_size", 1 << 20);
  positive(V, "vocab_size", 1 << 24);
  positive(num_blocks, "attnres_num_blocks", 1 << 12);
  positive(max_position_embeddings, "max_position_embeddings", int64_t{1} << 24);
  // Routing heads: each owns d / heads dimensions of every router.
  if (routing_heads < 1) fail(where, ": attnres_num_heads must be at least 1, got ", routing_heads);
  if (routing_heads > kMaxRoutingHeads)
    fail(where, ": attnres_num_heads ", routing_heads, " is beyond what this engine supports (at most ",
         kMaxRoutingHeads, ")");
  if (d % routing_heads != 0)
    fail(where, ": attnres_num_heads ", routing_heads, " does not divide hidden_size ", d,
         " (each routing head owns hidden_size / attnres_num_heads dimensions)");
  if (routing_heads > 1 && !mode_spec(mode).routed())
    fail(where, ": attnres_num_heads ", routing_heads, " with attnres_mode ", mode_name(mode),
         ", which has no depth routing (routing heads need a routed mode)");
  name_row();  // an Error where reference_mh is set on a mode without an _mh name
  if (H % KV != 0)
    fail(where, ": num_attention_heads (", H, ") must be a multiple of num_key_value_heads (", KV, ")");
  if (hd % 2 != 0) fail(where, ": head_dim must be even for RoPE, got ", hd);
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) fail(where, ": rms_norm_eps must be positive and finite");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) fail(where, ": rope_theta must be positive and finite");
}

Config Config::load(const std::string& path) {
  return from_json(parse_json(read_file(path), path), path);
}

nlohmann::json Config::to_json(const std::string& torch_dtype) const {
  nlohmann::json j;
  // Routed models are written as the reference code writes them, so a loader
  // that dispatches on model_type builds the routed model.
  const bool routed = mode_spec(mode).routed();
  j["architectures"] = {routed ? "Qwen3AttnResForCausalLM" : "Qwen3ForCausalLM"};
  j["model_type"] = routed ? "qwen3_attnres" : "qwen3";
  j["hidden_size"] = d;
  j["num_hidden_layers"] = L;
  j["num_attention_heads"] = H;
  j["num_key_value_heads"] = KV;
  j["head_dim"] = hd;
  j["intermediate_size"] = F;
  j["vocab_size"] = V;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tied;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["torch_dtype"] = torch_dtype;
  j["attnres_mode"] = mode_label();
  j["attnres_num_heads"] = routing_heads;
  j["attnres_num_blocks"] = num_blocks;
  j["attnres_block_delta"] = block_delta == BlockDelta::kTrue ? "true" : "reference";
  j["attnres_use_null_source"] = null_source;
  j["attnres_gate_type"] = gate == Gate::kBias ? "bias" : "learnable_alpha";
  j["attnres_query_init"] = query_init_normal ? "normal" : "zero";
  return j;
}

void check_positions(const Config& c, int64_t positions, const char* flag) {
  if (positions > c.max_position_embeddings)
    fail(flag, " ", positions, " exceeds max_position_embeddings ", c.max_position_embeddings,
         " (the positions the model was trained at; every command refuses more)");
}

}  // namespace attnres
