// load.h — the one way a model is opened for inference: eval, routing,
// generate and eval-tasks all come through here.
//
// Two stages, so that a command checks its inputs against the model before
// anything heavy is read:
//   open_model(path, ...)    a model or run directory (a run: through its
//                            `latest`) → its directory, config, tokenizer
//                            (--tokenizer, else the directory's
//                            tokenizer.json) and end-of-sequence ids
//                            (generation_config.json, else config.json);
//   load_model(src, ctx, …)  the inference model of the shapes the command
//                            needs (batch, window, KV cache), in a precision
//                            on the context's device, with its weights read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/precision.h"
#include "model/config.h"
#include "infer/sampler.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

class Context;       // where the model runs (ops/context.h)
class HeldModelDir;  // a model directory held for reading (io/checkpoint.h)

// Whether a command needs the model's tokenizer.
enum class NeedTokenizer {
  kNo,         // ids only (eval, routing)
  kIfPresent,  // when the directory has one or --tokenizer names one (generate)
  kYes,        // an Error without one (eval-tasks)
};

struct OpenOptions {
  std::string tokenizer;                    // --tokenizer ("" = the model directory's)
  NeedTokenizer need = NeedTokenizer::kNo;
  std::string why;                          // kYes: why ("eval-tasks scores text"), for the message without one
  std::string how = "give its tokenizer.json";  // how to give one, for that message (a command: its flag)
  bool sampling_defaults = false;           // read generation_config.json's sampling settings (generate)
  bool eos_ids = false;                     // read the end-of-sequence ids (generate, unless --ignore-eos)
};

struct ModelSource {
  std::string dir;                   // the model directory (config.json + weights)
  Config config;
  std::string tokenizer_path;        // "" when none was loaded
  std::optional<Tokenizer> tokenizer;
  // When asked for: generation_config.json's sampling settings, and its
  // end-of-sequence ids (else config.json's; [] when neither has any).
  SamplingOptions sampling;
  std::vector<int32_t> eos_ids;
  std::shared_ptr<const HeldModelDir> held;  // dir, held against its run's rotation while this lives
};

ModelSource open_model(const std::string& path, const OpenOptions& o = {});

// The shapes an inference model is built for (ModelOptions without training).
struct InferenceShape {
  int64_t batch = 1;       // the most sequences of one forward
  int64_t seq_len = 1;     // the most positions per sequence in one forward
  int64_t rows = 0;        // the most tokens of one forward (0 = batch × seq_len)
  int64_t cache_len = 0;   // the most positions of a KV cache it serves (infer/kv_cache.h; 0 = none)
};

std::unique_ptr<Model> load_model(const ModelSource& src, Context& ctx, const InferenceShape& shape,
                                  Precision precision);

}  // namespace attnres
