// generate.cpp — see generate.h.
#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "core/timer.h"
#include "model/overflow.h"

namespace attnres {

std::vector<int32_t> end_of_sequence_ids(std::vector<int32_t> ids, const Tokenizer* tok) {
  if (ids.empty() && tok && tok->token_id("<|endoftext|>") >= 0)
    ids.push_back(static_cast<int32_t>(tok->token_id("<|endoftext|>")));
  return ids;
}

namespace {

// Bytes at the end of s that may be the start of an unfinished UTF-8 character.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) != 0x80) {  // a lead byte (or ASCII): how long is its character?
      const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      return len > back ? back : 0;
    }
  }
  return 0;
}

// The longest suffix of s that is a proper prefix of one of the stop strings:
// text that a later token may turn into a stop string, so not yet final.
size_t stop_prefix_tail(std::string_view s, const std::vector<std::string>& stop) {
  size_t best = 0;
  for (const std::string& st : stop)
    for (size_t n = std::min(st.size() - 1, s.size()); n > best; --n)
      if (s.substr(s.size() - n) == std::string_view(st).substr(0, n)) {
        best = n;
        break;
      }
  return best;
}

struct Live {
  size_t i;                  // index of the sequence
  std::vector<int32_t> all;  // prompt and generated ids
  Rng rng;
  size_t emitted = 0;  // bytes of text already passed to on_text
  size_t searched = 0;  // bytes of text already searched for stop strings
};

}  // namespace

InferenceShape generation_shape(const Config& c, int64_t batch, int64_t longest, int64_t max_new_tokens) {
  const int64_t cache_len = std::min(longest + max_new_tokens, c.max_position_embeddings);
  const int64_t prefill_chunk = std::min<int64_t>(longest, 512);
  return {.batch = batch,
          .seq_len = prefill_chunk,
          .rows = std::max(batch, prefill_chunk),
          .cache_len = std::max<int64_t>(cache_len, 1)};
}

void check_prompt(const Config& c, int64_t cache_len, const std::vector<int32_t>& prompt, int64_t max_new_tokens) {
  if (prompt.empty()) fail("the prompt is empty (no token to start from)");
  for (size_t t = 0; t < prompt.size(); ++t)
    if (prompt[t] < 0 || prompt[t] >= c.V)
      fail("prompt token id ", prompt[t], " at position ", t, " is outside [0, vocab_size=", c.V, ")");
  if (max_new_tokens < 1) fail("the number of new tokens must be at least 1, got ", max_new_tokens);
  const int64_t len = static_cast<int64_t>(prompt.size());
  if (max_new_tokens > c.max_position_embeddings - len)  // not len + max_new_tokens: that can overflow
    fail("the prompt (", prompt.size(), " tokens) plus ", max_new_tokens, " new tokens is ",
         max_new_tokens > INT64_MAX - len ? std::string("more than 2^63") : cat(len + max_new_tokens),
         " positions, beyond max_position_embeddings ", c.max_position_embeddings);
  if (len + max_new_tokens > cache_len)
    fail("the prompt (", prompt.size(), " tokens) plus ", max_new_tokens, " new tokens does not fit the KV cache of ",
         cache_len, " positions");
}

std::vector<GenerateResult> generate(KvCache& cache, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& opt, GenerateTimes* times, const OnText& on_text) {
  opt.sampling.validate();
  if (!opt.stop.empty() && !opt.tokenizer) fail("stop strings need a tokenizer");
  for (const std::string& s : opt.stop)
    if (s.empty()) fail("a stop string is empty");
  const int64_t n = static_cast<int64_t>(prompts.size());
  Model& model = cache.model();
  if (n > cache.seqs()) fail(n, " prompts, but the KV cache holds ", cache.seqs(), " sequences");
  for (const auto& p : prompts) check_prompt(model.config(), cache.len(), p, opt.max_new_tokens);
  const int64_t V = model.config().V;
  GenerateTimes tm;
  std::vector<GenerateResult> out(static_cast<size_t>(n));
  std::vector<float> logits(static_cast<size_t>(std::max(n, model.B()) * V));
  Sampler sampler(opt.sampling);
  // The next id from a row of logits; a row not finite (finite weights whose
  // arithmetic overflows) is an error naming the largest weight, never an id.
  auto next_id = [&](const float* row, Rng& rng) {
    for (int64_t v = 0; v < V; ++v)
      if (!std::isfinite(row[v])) fail_overflow(model, cat("the logits are not finite (", row[v], ")"));
    return sampler.next({row, static_cast<size_t>(V)}, rng);
  };

  // Appends a token to sequence s; returns true when the sequence ends.
  auto push = [&](Live& s, int32_t id) {
    GenerateResult& r = out[s.i];
    s.all.push_back(id);
    r.ids.push_back(id);
    const bool eos = std::find(opt.eos_ids.begin(), opt.eos_ids.end(), id) != opt.eos_ids.end();
    // An id past the tokenizer's vocabulary (a model with more rows than
    // tokens, as train makes over a small prepare and as published Qwen3 is)
    // decodes to nothing, as Hugging Face's decode does; its id is kept.
    const uint32_t u = static_cast<uint32_t>(id);
    if (!eos && opt.tokenizer && u < opt.tokenizer->vocab_size()) opt.tokenizer->decode({&u, 1}, r.text);
    bool done = false;
    if (eos) {
      r.finish_reason = "eos";
      done = true;
    }
    // A stop string ends the text where it starts.
    size_t cut = std::string::npos;
    for (const std::string& st : opt.stop) {
      const size_t from = s.searched >= st.size() ? s.searched - st.size() + 1 : 0;
      const size_t at = r.text.find(st, from);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
      r.text.resize(cut);
      r.finish_reason = "stop";
      done = true;
    }
    s.searched = r.text.size();
    if (!done && static_cast<int64_t>(r.ids.size()) >= opt.max_new_tokens) {
      r.finish_reason = "length";
      done = true;
    }
    if (on_text && opt.tokenizer) {
      size_t final_bytes = r.text.size();
      if (!done) {
        const std::string_view t = r.text;
        final_bytes -= std::max(incomplete_utf8_tail(t), stop_prefix_tail(t, opt.stop));
      }
      if (final_bytes > s.emitted) {
        on_text(s.i, std::string_view(r.text).substr(s.emitted, final_bytes - s.emitted));
        s.emitted = final_bytes;
      }
    }
    return done;
  };

  // Prefill: each prompt into its cache slot, in chunks of the model's T; the
  // first new token comes from the prompt's last logits.
  std::vector<Live> live;
  double t0 = now_seconds();
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t>& p = prompts[static_cast<size_t>(i)];
    const int64_t len = static_cast<int64_t>(p.size());
    for (int64_t pos = 0; pos < len; pos += model.T()) {
      const int64_t t = std::min(model.T(), len - pos);
      cache.forward(p.data() + pos, 1, t, &i, &pos, logits.data());
    }
    tm.prefill_tokens += len;
    const uint64_t index = opt.first_index + static_cast<uint64_t>(i);  // the prompt's, among all of them
    Live s{static_cast<size_t>(i), p, Rng(opt.seed * 0x9E3779B97F4A7C15ull + index)};
    if (!push(s, next_id(logits.data(), s.rng))) live.push_back(std::move(s));
  }
  tm.prefill_s = now_seconds() - t0;

  // Decode: the last token of every live sequence, at its own position, in batches of the model's B.
  t0 = now_seconds();
  std::vector<int32_t> tokens;
  std::vector<int64_t> slot, pos;
  while (!live.empty()) {
    std::vector<Live> next;
    for (size_t j0 = 0; j0 < live.size(); j0 += static_cast<size_t>(model.B())) {
      const size_t m = std::min(live.size() - j0, static_cast<size_t>(model.B()));
      tokens.clear(), slot.clear(), pos.clear();
      for (size_t j = j0; j < j0 + m; ++j) {
        tokens.push_back(live[j].all.back());
        slot.push_back(static_cast<int64_t>(live[j].i));
        pos.push_back(static_cast<int64_t>(live[j].all.size()) - 1);
      }
      cache.forward(tokens.data(), static_cast<int64_t>(m), 1, slot.data(), pos.data(), logits.data());
      tm.decode_tokens += static_cast<int64_t>(m);
      for (size_t j = j0; j < j0 + m; ++j) {
        Live& s = live[j];
        const float* row = logits.data() + (j - j0) * static_cast<size_t>(V);
        if (!push(s, next_id(row, s.rng))) next.push_back(std::move(s));
      }
    }
    live = std::move(next);
  }
  tm.decode_s = now_seconds() - t0;
  if (times) *times = tm;
  return out;
}

namespace {

// The JSON object of a model directory's file, or null when the file is absent.
nlohmann::json read_json_if_present(const std::string& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  return parse_json(read_file(path), path);
}

}  // namespace

std::vector<int32_t> read_eos_ids(const std::string& model_dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::string path = model_dir + "/" + name;
    const nlohmann::json j = read_json_if_present(path);
    if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    const auto& e = j["eos_token_id"];
    std::vector<int32_t> ids;
    try {
      if (e.is_array())
        for (const auto& x : e) ids.push_back(x.get<int32_t>());
      else
        ids.push_back(e.get<int32_t>());
    } catch (const nlohmann::json::exception&) {
      fail(path, ": eos_token_id must be an integer or a list of integers, got ", brief(e));
    }
    return ids;
  }
  return {};
}

SamplingOptions read_sampling_defaults(const std::string& model_dir) {
  SamplingOptions s;
  const std::string path = model_dir + "/generation_config.json";
  const nlohmann::json j = read_json_if_present(path);
  if (!j.is_object()) return s;
  try {
    if (!j.value("do_sample", false)) return s;
    s.temperature = j.value("temperature", 1.0);
    s.top_k = j.value("top_k", int64_t{0});
    s.top_p = j.value("top_p", 1.0);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": ", e.what());
  }
  return s;
}

}  // namespace attnres
