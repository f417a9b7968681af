// configs.h — the small model of the tests that run whole models on a
// backend (a few layers of width 32, two attention heads over one KV head):
// `mode` its attnres_mode, and `changes` any config.json keys laid over it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace attnres::testing {

inline Config small_config(const std::string& mode, const nlohmann::json& changes = nlohmann::json::object()) {
  nlohmann::json j = {{"hidden_size", 32},      {"num_hidden_layers", 4}, {"num_attention_heads", 2},
                      {"num_key_value_heads", 1}, {"head_dim", 16},        {"intermediate_size", 48},
                      {"vocab_size", 61},        {"attnres_mode", mode},   {"attnres_num_blocks", 2},
                      {"tie_word_embeddings", true}};
  for (auto it = changes.begin(); it != changes.end(); ++it) j[it.key()] = it.value();
  return Config::from_json(j, "testing::small_config");
}

}  // namespace attnres::testing
