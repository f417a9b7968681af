// config.cpp — see config.h.
#include "model/config.h"

#include <cmath>
#include <optional>
#include <type_traits>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "model/modes.h"

namespace attnres {

namespace {

// A field of config.json read into T: absent or null takes `fallback` (none:
// the field is required).  The type is checked before the library converts
// (it converts a float to an integer with undefined behaviour when it does
// not fit).
template <class T>
T read_field(const nlohmann::json& j, const char* key, const std::optional<T>& fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) {
    if (!fallback) fail(where, ": missing required field \"", key, "\"");
    return *fallback;
  }
  const nlohmann::json& v = j[key];
  bool ok;
  if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = is_int64(v);
  else if constexpr (std::is_floating_point_v<T>) ok = v.is_number();
  else ok = v.is_string();
  if (!ok && !fallback && std::is_integral_v<T>) fail(where, ": field \"", key, "\" must be an integer, got ", brief(v));
  if (!ok) fail(where, ": field \"", key, "\" has the wrong type: ", brief(v));
  return v.get<T>();
}

// The names a config's enumerated fields take, once each: read and written
// from these tables.
template <class T>
struct Named {
  T value;
  const char* name;
};
constexpr Named<BlockDelta> kBlockDeltaNames[] = {{BlockDelta::kTrue, "true"}, {BlockDelta::kReference, "reference"}};
constexpr Named<Gate> kGateNames[] = {
    {Gate::kBias, "bias"},
    {Gate::kLearnableAlpha, "learnable_alpha"},
    {Gate::kSigmoidScalar, "sigmoid_scalar"},
    {Gate::kSigmoidVector, "sigmoid_vector"}};
constexpr Named<bool> kQueryInitNames[] = {{false, "zero"}, {true, "normal"}};  // query_init_normal

template <class T, size_t N>
const char* name_of(const Named<T> (&names)[N], T v) {
  for (const Named<T>& n : names)
    if (n.value == v) return n.name;
  ATTNRES_CHECK(false, "a value without a name");
  return "";
}

template <class T, size_t N>
T value_of(const Named<T> (&names)[N], const std::string& s, const char* key, const std::string& where) {
  std::string known;
  for (size_t i = 0; i < N; ++i) {
    if (s == names[i].name) return names[i].value;
    known += cat(i == 0 ? "" : i + 1 == N ? " or " : ", ", "\"", names[i].name, "\"");
  }
  fail(where, ": ", key, " must be ", known, ", got \"", s, "\"");
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
  for (const UnrunName& u : kUnrunModes)
    if (s == u.name) fail("attnres_mode \"", s, "\" (a mode of the reference code): ", u.what);
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
  // Booleans are booleans, as transformers 5 reads them (its config classes
  // refuse 1, "yes" and null alike): 1 read as false would hide a model this
  // engine does not implement, and null as a default would guess.
  for (const char* key : {"use_sliding_window", "attention_bias", "tie_word_embeddings"})
    if (j.contains(key) && !j[key].is_boolean())
      fail(where, ": field \"", key, "\" is ", brief(j[key], 80), ", not true or false (transformers 5 refuses it too)");
  if (value("use_sliding_window") == true) refuse("use_sliding_window", "sliding-window attention");
  if (value("attention_bias") == true) refuse("attention_bias", "biases on q/k/v/o projections");
  if (j.contains("rope_theta") && !j["rope_theta"].is_number())
    fail(where, ": field \"rope_theta\" is ", brief(j["rope_theta"], 80), ", not a number");
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
      if (k == "rope_theta" && !it.value().is_number())
        fail(where, ": field \"rope_parameters\".rope_theta is ", brief(it.value(), 80), ", not a number");
      const bool plain = k == "rope_type" || k == "type" || k == "rope_theta" || it.value().is_null() ||
                         (k == "partial_rotary_factor" && it.value() == 1.0);
      if (!plain) refuse("rope_parameters", cat("RoPE with \"", k, "\"").c_str());
    }
  }
}

// The keys of config.json, once: fields() visits each with the member it
// fills and its default (std::nullopt: required), in an order in which a
// default may use the fields before it; from_json reads them and to_json
// writes them from this one list.  The mode's name, the enumerated fields
// (their names above) and RoPE's transformers 5 spelling are beside it.
template <class C, class Visit>
void Config::fields(C& c, const Defaults& dflt, Visit&& visit) {
  using I = std::optional<int64_t>;
  visit("hidden_size", c.d, I{});
  visit("num_hidden_layers", c.L, I{});
  visit("num_attention_heads", c.H, I{});
  visit("num_key_value_heads", c.KV, I{c.H});                      // as transformers: the heads without GQA
  visit("head_dim", c.hd, I{c.H > 0 ? c.d / c.H : 0});             // as transformers: hidden_size / heads
  visit("intermediate_size", c.F, I{});
  visit("vocab_size", c.V, I{});
  visit("rms_norm_eps", c.rms_norm_eps, std::optional<double>{1e-6});
  visit("rope_theta", c.rope_theta, std::optional<double>{10000});        // as transformers 5: default_theta
  visit("tie_word_embeddings", c.tied, std::optional<bool>{false});      // as transformers' Qwen3: untied
  visit("max_position_embeddings", c.max_position_embeddings, I{4096});
  visit("attnres_num_heads", c.routing_heads, I{dflt.routing_heads});  // the mode name's heads (_mh: 8)
  visit("attnres_num_blocks", c.num_blocks, I{8});
  visit("attnres_use_null_source", c.null_source, std::optional<bool>{false});
}

Config Config::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": config must be a JSON object");
  refuse_unsupported(j, where);
  Config c;
  // Which code wrote the config decides the defaults of the attnres keys
  // (docs/DESIGN.md §2): the reference code writes model_type "qwen3_attnres"
  // and never an attnres_block_delta key (it always computes the block delta
  // as x − last source, our "reference"), and its default mode is block;
  // configs written here carry every key.  A plain Qwen3 config is baseline.
  const bool reference_type = j.contains("model_type") && j["model_type"] == "qwen3_attnres";
  bool has_attnres_key = false;
  for (auto it = j.begin(); it != j.end(); ++it) has_attnres_key |= it.key().rfind("attnres_", 0) == 0;
  const std::string mode = read_field<std::string>(j, "attnres_mode", reference_type ? "block" : "baseline", where);
  try {
    const ModeName& name = parse_mode_name(mode);
    c.mode = name.mode;
    c.reference_mh = name.reference_mh;
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  fields(c, Defaults{c.name_row().heads}, [&](const char* key, auto& member, const auto& fallback) {
    member = read_field(j, key, fallback, where);
  });
  // transformers 5 writes rope_parameters.rope_theta and no top-level key;
  // where both are present its value wins, as in transformers.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    c.rope_theta = read_field<double>(j["rope_parameters"], "rope_theta", c.rope_theta, where + " rope_parameters");
  const std::string bd = read_field<std::string>(
      j, "attnres_block_delta", reference_type || has_attnres_key ? "reference" : "true", where);
  c.block_delta = value_of(kBlockDeltaNames, bd, "attnres_block_delta", where);
  const std::string gate = read_field<std::string>(j, "attnres_gate_type", "bias", where);
  c.gate = value_of(kGateNames, gate, "attnres_gate_type", where);
  c.query_init_normal = value_of(kQueryInitNames, read_field<std::string>(j, "attnres_query_init", "zero", where),
                                 "attnres_query_init", where);
  if (c.name_row().fixes_delta_keys) {
    // delta_mh: the reference always adds the null source and computes its
    // block deltas as x − last block source, whatever the other keys say
    // (its config class writes attnres_use_null_source false by default);
    // only this project writes attnres_block_delta, so "true" is a contradiction.
    if (c.block_delta == BlockDelta::kTrue && j.contains("attnres_block_delta"))
      fail(where, ": attnres_mode delta_mh computes its block deltas as the reference code does (\"reference\"); ",
           "attnres_block_delta \"true\" contradicts it (the paper's block deltas with heads: attnres_mode ",
           "delta_block with attnres_num_heads)");
    c.block_delta = BlockDelta::kReference;
    c.null_source = true;
  }
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
  // The reference's first_layer routes between the stream and layer 1's
  // attention output from layer 2 on; its first_layer and pre_gated branches apply no gate.
  if (mode == Mode::kFirstLayer && L < 3)
    fail(where, ": attnres_mode first_layer routes from layer 2 on (between the stream and layer 1's attention ",
         "output): it needs num_hidden_layers >= 3, got ", L);
  if ((mode == Mode::kFirstLayer || mode == Mode::kPreGated) && gate != Gate::kBias)
    fail(where, ": attnres_mode ", mode_name(mode), " applies no gate in the reference code; attnres_gate_type must be ",
         "\"bias\", got \"", name_of(kGateNames, gate), "\"");
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
  fields(*this, Defaults{}, [&](const char* key, const auto& member, const auto&) { j[key] = member; });
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["torch_dtype"] = torch_dtype;
  j["attnres_mode"] = mode_label();
  j["attnres_block_delta"] = name_of(kBlockDeltaNames, block_delta);
  j["attnres_gate_type"] = name_of(kGateNames, gate);
  j["attnres_query_init"] = name_of(kQueryInitNames, query_init_normal);
  return j;
}

void check_positions(const Config& c, int64_t positions, const char* flag) {
  if (positions > c.max_position_embeddings)
    fail(flag, " ", positions, " exceeds max_position_embeddings ", c.max_position_embeddings,
         " (the positions the model was trained at; every command refuses more)");
}

}  // namespace attnres
