// presets.cpp — see presets.h.
#include "model/presets.h"

#include "core/error.h"

namespace attnres {

namespace {

nlohmann::json qwen3(int64_t d, int64_t L, int64_t H, int64_t KV, int64_t hd, int64_t F, int64_t V,
                     int64_t max_positions = 4096) {
  return {{"hidden_size", d},          {"num_hidden_layers", L}, {"num_attention_heads", H},
          {"num_key_value_heads", KV}, {"head_dim", hd},         {"intermediate_size", F},
          {"vocab_size", V},           {"rms_norm_eps", 1e-6},   {"rope_theta", 1e6},
          {"tie_word_embeddings", true}, {"max_position_embeddings", max_positions}};
}

struct Preset {
  const char* name;
  nlohmann::json json;
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      // The smallest model: trains in minutes on 2 cores (examples and tests).
      {"tiny", qwen3(128, 4, 4, 2, 32, 384, 8192)},
      // The main job's model: tiny's width at three times its depth (12 layers,
      // 24 sublayers, as bench-small), so that depth routing has depth to route
      // over; a token costs about 1.9x tiny's (the LM head is much of both).
      {"tiny-deep", qwen3(128, 12, 4, 2, 32, 384, 8192)},
      // docs/DESIGN.md §5: the benchmark configuration.
      {"bench-small", qwen3(256, 12, 4, 2, 64, 768, 8192)},
      // The shape of Qwen3-0.6B as published (random weights when benchmarked).
      {"qwen3-0.6b", qwen3(1024, 28, 16, 8, 128, 3072, 151936, 40960)},
      // The shapes of Qwen3-1.7B and Qwen3-4B as published: models whose training
      // state outgrows one machine here (ZeRO-3's memory plans, docs/distributed.md).
      {"qwen3-1.7b", qwen3(2048, 28, 16, 8, 128, 6144, 151936, 40960)},
      {"qwen3-4b", qwen3(2560, 36, 32, 8, 128, 9728, 151936, 40960)},
  };
  return p;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.push_back(p.name);
  return out;
}

Config load_config(const std::string& name_or_path) {
  for (const auto& p : presets())
    if (name_or_path == p.name) return Config::from_json(p.json, cat("preset ", p.name));
  if (name_or_path.find('/') == std::string::npos && name_or_path.find(".json") == std::string::npos) {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    fail("unknown config '", name_or_path, "' (presets: ", names, "; or give a path to a config.json)");
  }
  return Config::load(name_or_path);
}

}  // namespace attnres
