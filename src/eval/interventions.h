// interventions.h — causal probes of a model's depth routing (docs/routing.md,
// "Interventions"): how much the loss changes when a router may not use one of
// its sources, or may not let its weights depend on the token.
//
// For every router r (or those chosen) and every source s of r:
//   ablate s at r   s leaves r's softmax; the other weights are renormalised
//                   per token (and per routing head); in the additive modes
//                   s's term leaves the added sum with it;
// and per router:
//   mean routing    r's weights replaced by their mean over the tokens
//                   (per head): routing that ignores the token's content;
//   uniform         every source weighted 1/S;
// optionally (whole_sources) each source removed from every router reading it.
//
// Each is measured as Δ loss (nats per predicted token) against the same
// windows without intervention, with a standard error over windows (the
// per-window Δ's spread / √windows).  An intervention at router r runs the
// forward again from r's sublayer only: the windows' forward up to r is
// shared (eval/intervened_forward.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/intervened_forward.h"
#include "io/token_file.h"
#include "model/model.h"

namespace attnres {

struct InterventionOptions {
  int64_t batch = 1;     // windows per forward (the model's B() at most)
  int64_t seq_len = 0;   // T: windows of T+1 tokens sharing their boundary token, as evaluate() cuts them
  int64_t tokens = 0;    // the budget: predicted tokens, whole windows only (≥ T)
  std::vector<std::string> routers = {};  // router names or indices ("3", "layers.1.mlp", "final"); empty: all
  bool whole_sources = false;
};

struct Effect {
  double dloss = 0;  // mean over predicted tokens of (intervened − plain) loss, nats
  double se = 0;     // standard error over windows (NaN with one window)
};

struct RouterEffects {
  std::string name;                  // "layers.3.mlp", "final"
  int64_t sublayer = 0;              // the sublayer whose input it makes (2L: final)
  std::vector<std::string> sources;  // (S)
  std::vector<double> mass;          // (S) mean routing weight over tokens (and heads)
  std::vector<Effect> ablate;        // (S)
  Effect mean, uniform;
};

struct SourceEffect {
  std::string name;     // a source read by more than one router's list ("embed", "layers.0.attn", "block.1")
  int64_t routers = 0;  // how many routers read it
  Effect ablate;        // removed from all of them at once
};

struct InterventionResult {
  std::string mode;
  int64_t heads = 1;
  int64_t tokens = 0, windows = 0;
  double loss = 0;           // the plain model's mean loss on those tokens
  int64_t interventions = 0;  // forwards run with an intervention (per batch of windows)
  double seconds = 0;
  std::vector<RouterEffects> routers;      // in forward order (the chosen ones)
  std::vector<SourceEffect> whole_sources;  // with whole_sources
  nlohmann::json to_json() const;
};

// Their JSON (nlohmann's conversions, `routing --interventions --json`).
void to_json(nlohmann::json& j, const Effect& e);
void to_json(nlohmann::json& j, const RouterEffects& r);
void to_json(nlohmann::json& j, const SourceEffect& s);
void to_json(nlohmann::json& j, const InterventionResult& r);

// Throws an Error (one line) for a model without routers, a budget below one
// window, a file shorter than one window, or an unknown router.  progress:
// where a progress line goes (null: nowhere).
InterventionResult measure_interventions(Model& model, const TokenFile& data, const InterventionOptions& o,
                                         FILE* progress = nullptr);

}  // namespace attnres
