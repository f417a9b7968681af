// generate.h — text generation with a KV cache: prefill each prompt, then
// decode one token per sequence per step, all live sequences batched.
//
// The model runs through a KV cache (infer/kv_cache.h): sequence i of a call
// lives in cache slot i.  A
// prompt is prefilled in chunks of the model's T; each decode step runs the
// last token of every unfinished sequence as one batch (B = live sequences,
// T = 1), each at its own position.  Depth routing needs nothing across time
// (it mixes the sources of one position), so the cache holds only attention's
// keys and values.  A sequence ends at an end-of-sequence id (kept in its
// ids), at a stop string (the text is cut before it), or after
// max_new_tokens.  Sampling per sequence uses its own generator seeded from
// (seed, i), so a sequence's tokens do not depend on the batch it ran in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "infer/kv_cache.h"
#include "infer/load.h"
#include "infer/sampler.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  uint64_t seed = 0;
  // The index of prompts[0] among all the prompts of the command: prompt i
  // samples from a generator of (seed, first_index + i), so its tokens are
  // the same whatever batch it is decoded in.
  uint64_t first_index = 0;
  std::vector<int32_t> eos_ids;            // end-of-sequence ids
  std::vector<std::string> stop;           // stop strings (need a tokenizer)
  const Tokenizer* tokenizer = nullptr;    // for text and stop strings; null: ids only
};

// The ids that end a sequence: the model's (generation_config.json,
// config.json), or where it names none, the tokenizer's <|endoftext|> when it has one.
std::vector<int32_t> end_of_sequence_ids(std::vector<int32_t> model_ids, const Tokenizer* tok);

struct GenerateResult {
  std::vector<int32_t> ids;   // the generated ids (an end-of-sequence id included)
  std::string text;           // their text (without the end-of-sequence token or a stop string)
  std::string finish_reason;  // "eos", "stop" or "length"
};

struct GenerateTimes {
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;  // tokens run through the model in each phase
};

// Called with text of sequence i as soon as it is final (streaming).
using OnText = std::function<void(size_t i, std::string_view piece)>;

// Checks a prompt against a model's config: not empty, ids in [0, V), and
// room for max_new_tokens within max_position_embeddings and a KV cache of
// cache_len positions.  Error otherwise.
void check_prompt(const Config& c, int64_t cache_len, const std::vector<int32_t>& prompt, int64_t max_new_tokens);

// The model a generation needs: `batch` sequences decoded together, prompts
// of at most `longest` tokens prefilled in chunks of up to 512, a KV cache
// for the prompt and max_new_tokens (within max_position_embeddings).  The
// chunk decides the prefill's products, so every caller (attnres generate,
// the Python module) builds the same shape for the same prompts.
InferenceShape generation_shape(const Config& c, int64_t batch, int64_t longest, int64_t max_new_tokens);

std::vector<GenerateResult> generate(KvCache& cache, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& opt, GenerateTimes* times = nullptr,
                                     const OnText& on_text = {});

// End-of-sequence ids of a model directory: generation_config.json's
// eos_token_id, else config.json's (an id or a list); empty when neither has one.
std::vector<int32_t> read_eos_ids(const std::string& model_dir);
// Sampling settings of generation_config.json when it asks for sampling
// (do_sample: its temperature, top_k, top_p); greedy otherwise or without one.
SamplingOptions read_sampling_defaults(const std::string& model_dir);

}  // namespace attnres
