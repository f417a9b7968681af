// generate.cpp — `attnres generate`: text from a checkpoint, with a KV cache.
//
// One prompt (--prompt TEXT, text on stdin, or --prompt-ids 1,2,3) streams its
// text to stdout as it is produced (--json: one object at the end instead;
// ids in and no tokenizer: the new ids, comma-separated).
// A file of prompts (--prompts FILE, JSONL: {"prompt": TEXT} or
// {"prompt_ids": [...]} per line) is decoded --batch sequences at a time and
// answered with one JSON line per prompt, in order.  The tokenizer is the
// model directory's tokenizer.json (or --tokenizer); with ids in and --json
// out none is needed.  Sampling defaults to greedy; generation_config.json's
// settings apply when it asks for sampling (do_sample), flags override both.
// End-of-sequence ids: generation_config.json, else config.json, else the
// tokenizer's <|endoftext|>.
#include <climits>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "ops/context.h"
#include "core/error.h"
#include "core/json_util.h"
#include "core/timer.h"
#include "infer/generate.h"
#include "infer/load.h"
#include "core/file_util.h"
#include "model/model.h"

namespace attnres {

namespace {

std::vector<int32_t> parse_ids(const std::string& s, const std::string& what) {
  std::vector<int32_t> ids;
  if (s.find_first_not_of(" ") == std::string::npos) return ids;  // empty: reported as an empty prompt
  for (size_t i = 0;;) {  // every item between commas, the one after a last comma too ("1,2," is refused)
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end || v < INT32_MIN || v > INT32_MAX)
      fail(what, ": '", item, "' is not a token id (expected comma-separated integers)");
    ids.push_back(static_cast<int32_t>(v));
    if (j == s.size()) return ids;
    i = j + 1;
  }
}

// JSON text of j; bytes of generated text that are not UTF-8 (a token may end
// inside a character) become U+FFFD, as Hugging Face's decode does.
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

struct Prompt {
  std::vector<int32_t> ids;
  bool from_ids = false;
  std::string where;  // "FILE:LINE: " of a --prompts line, for its errors
};

// --prompts FILE: one JSON object a line, {"prompt": TEXT} or {"prompt_ids":
// [ids]}; blank lines skipped; every error names FILE:LINE.  need_tokenizer
// fails (saying why) where a text prompt has no tokenizer to encode it.
std::vector<Prompt> read_prompt_file(const std::string& path, const Config& c, const Tokenizer* tok,
                                     const std::function<void(const char*)>& need_tokenizer) {
  std::vector<Prompt> prompts;
  const std::string text = read_file(path);
  size_t line_no = 0, at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = parse_json(line, cat(path, ":", line_no));
    Prompt p;
    p.where = cat(path, ":", line_no, ": ");
    if (j.is_object() && j.contains("prompt") && j.contains("prompt_ids"))
      fail(p.where, "both \"prompt\" and \"prompt_ids\": give one (which would be meant is not for attnres to guess)");
    if (j.is_object() && j.contains("prompt_ids") && j["prompt_ids"].is_array()) {
      for (const auto& x : j["prompt_ids"]) {
        if (!x.is_number_integer()) fail(p.where, "prompt_ids must be integers");
        // Checked whole (as --prompt-ids is), never wrapped to 32 bits.
        if (x.is_number_unsigned() ? x.get<uint64_t>() >= static_cast<uint64_t>(c.V) : x.get<int64_t>() < 0 || x.get<int64_t>() >= c.V)
          fail(p.where, "prompt token id ", x.dump(), " is outside [0, vocab_size=", c.V, ")");
        p.ids.push_back(x.get<int32_t>());
      }
      p.from_ids = true;
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      need_tokenizer((p.where + "a text prompt").c_str());
      try {  // the tokenizer's own limits (a regex match limit) name the line too
        for (uint32_t id : tok->encode(j["prompt"].get<std::string>())) p.ids.push_back(static_cast<int32_t>(id));
      } catch (const Error& e) {
        fail(p.where, e.what());
      }
    } else {
      fail(p.where, "expected {\"prompt\": TEXT} or {\"prompt_ids\": [ids]}");
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) fail(path, ": no prompts");
  return prompts;
}

struct GenerateFlags {
  ModelFlags model;
  std::optional<std::string> prompt, prompt_ids;
  std::string prompts;
  int64_t max_new_tokens = 0;
  SamplingFlags sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int64_t batch = 0;
  bool json = false;
  ContextOptions context;
};

void add_generate_options(OptionList& opts, GenerateFlags& o) {
  add_model_options(opts, o.model, true);
  opts.add(o.prompt, {"prompt", "", "prompt text (default: read from stdin)"});
  opts.add(o.prompt_ids, {"prompt-ids", "", "prompt as comma-separated token ids instead of text"});
  opts.add(o.prompts,
           {"prompts", "", "JSONL file of prompts ({\"prompt\": TEXT} or {\"prompt_ids\": [...]}) -> JSONL out"});
  opts.add(o.max_new_tokens, {"max-new-tokens", "64", "tokens to generate at most per prompt"});
  add_sampling_options(opts, o.sampling);
  opts.add(o.stop, {"stop", "", "stop when the text contains this string (may be repeated)"});
  opts.add(o.ignore_eos, {"ignore-eos", "false", "do not stop at end-of-sequence tokens"});
  opts.add(o.batch, {"batch", "8", "sequences decoded together (--prompts)"});
  opts.add(o.json, {"json", "false", "print one JSON object (prompt_ids, ids, text, speeds) instead of streaming text"});
  add_context_options(opts, o.context);
}

// The prompts, from one source (two would leave one silently unused): a
// JSONL file, ids, or text (the flag, else stdin).  need_tokenizer(why)
// fails where text needs a tokenizer the model lacks.
std::vector<Prompt> read_prompts(const GenerateFlags& o, const Config& c, const Tokenizer* tok,
                                 const std::function<void(const char*)>& need_tokenizer) {
  std::vector<std::string> sources;
  if (o.prompt) sources.push_back("--prompt");
  if (o.prompt_ids) sources.push_back("--prompt-ids");
  if (!o.prompts.empty()) sources.push_back("--prompts");
  if (sources.size() > 1) fail(sources[0], " and ", sources[1], " both give the prompt: give one of them");
  if (!o.prompts.empty()) return read_prompt_file(o.prompts, c, tok, need_tokenizer);
  if (o.prompt_ids) return {{parse_ids(*o.prompt_ids, "--prompt-ids"), true, ""}};
  const std::string text = o.prompt ? *o.prompt : std::string(std::istreambuf_iterator<char>(std::cin), {});
  need_tokenizer("a text prompt");
  Prompt p;
  for (uint32_t id : tok->encode(text)) p.ids.push_back(static_cast<int32_t>(id));
  return {std::move(p)};
}

// One prompt's result as JSON: its ids, text (with a tokenizer) and speeds.
nlohmann::json result_json(const Prompt& p, const GenerateResult& r, const GenerateTimes& t, bool text) {
  nlohmann::json j = {{"prompt_ids", p.ids}, {"ids", r.ids}, {"finish_reason", r.finish_reason}};
  if (text) j["text"] = r.text;
  j["prefill_tok_per_s"] = t.prefill_s > 0 ? static_cast<double>(t.prefill_tokens) / t.prefill_s : 0.0;
  j["decode_tok_per_s"] = t.decode_s > 0 ? static_cast<double>(t.decode_tokens) / t.decode_s : 0.0;
  return j;
}

// --prompts: batches of the model's batch, a JSON line per prompt with its index.
void generate_file(KvCache& cache, const std::vector<Prompt>& prompts, GenerateOptions g, bool text) {
  const size_t batch = static_cast<size_t>(cache.seqs());
  for (size_t i0 = 0; i0 < prompts.size(); i0 += batch) {
    const size_t m = std::min(prompts.size() - i0, batch);
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = i0; i < i0 + m; ++i) ids.push_back(prompts[i].ids);
    GenerateTimes t;
    g.first_index = i0;  // sampling follows (seed, the prompt's index), not its place in the batch
    const auto results = generate(cache, ids, g, &t);
    for (size_t i = 0; i < m; ++i) {
      nlohmann::json j = result_json(prompts[i0 + i], results[i], t, text);
      j["index"] = i0 + i;
      write_stdout(dump(j) + "\n");
    }
  }
}

// One prompt: its text streamed as it decodes (or, without a tokenizer, its
// ids at the end) and the speeds on stderr; or, with --json, one object.
void generate_one(KvCache& cache, const Prompt& prompt, const GenerateOptions& g, bool json) {
  const bool text = g.tokenizer != nullptr;
  GenerateTimes t;
  OnText stream;
  if (!json && text)
    stream = [](size_t, std::string_view piece) {
      write_stdout(piece);  // a full or closed stdout ends the decoding here
    };
  const auto results = generate(cache, {prompt.ids}, g, &t, stream);
  if (json) {
    std::printf("%s\n", dump(result_json(prompt, results[0], t, text)).c_str());
    return;
  }
  if (!text)  // ids in, no tokenizer: the ids out
    for (size_t i = 0; i < results[0].ids.size(); ++i) std::printf("%s%d", i ? "," : "", results[0].ids[i]);
  std::printf("\n");
  flush_stdout();  // the text ends before the speed line on stderr
  std::fprintf(stderr, "generate: %lld prompt tokens at %.1f tok/s, %zu new tokens (%s), decode %.1f tok/s\n",
               static_cast<long long>(t.prefill_tokens),
               t.prefill_s > 0 ? static_cast<double>(t.prefill_tokens) / t.prefill_s : 0.0, results[0].ids.size(),
               results[0].finish_reason.c_str(), t.decode_s > 0 ? static_cast<double>(t.decode_tokens) / t.decode_s : 0.0);
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  GenerateFlags o;
  OptionList opts("generate", "Generate text from a checkpoint with a KV cache (greedy or sampled).");
  add_generate_options(opts, o);
  if (!opts.parse(argc, argv)) return 0;
  const ContextOptions& co = o.context;
  const ModelSource src = open_model(o.model.model, {.tokenizer = o.model.tokenizer,
                                                     .need = NeedTokenizer::kIfPresent,
                                                     .why = "",
                                                     .sampling_defaults = true,
                                                     .eos_ids = !o.ignore_eos});
  const Config& c = src.config;

  // Sampling and stopping.
  GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  g.sampling = o.sampling.apply(src.sampling);
  g.seed = o.sampling.seed;
  g.stop = o.stop;
  if (g.max_new_tokens < 1) fail("--max-new-tokens must be at least 1, got ", g.max_new_tokens);

  // The tokenizer, when there is one.
  const Tokenizer* tok = src.tokenizer ? &*src.tokenizer : nullptr;
  g.tokenizer = tok;
  auto need_tokenizer = [&](const char* why) {
    if (!tok)
      fail(why, " needs a tokenizer, and ", src.dir, " has no tokenizer.json: pass --tokenizer FILE",
           o.json ? " or give ids with --prompt-ids" : " (or --prompt-ids with --json)");
  };
  if (!g.stop.empty()) need_tokenizer("--stop");
  if (!o.ignore_eos) g.eos_ids = end_of_sequence_ids(src.eos_ids, tok);
  const std::vector<Prompt> prompts = read_prompts(o, c, tok, need_tokenizer);

  // The model: an inference model with a KV cache sized for these prompts.
  const bool batch_file = !o.prompts.empty();
  const int64_t batch = batch_file ? std::min<int64_t>(o.batch, static_cast<int64_t>(prompts.size())) : 1;
  if (batch < 1) fail("--batch must be positive");
  // Bad prompts are reported before the weights are read.
  int64_t longest = 0;
  for (const Prompt& p : prompts) {
    try {
      check_prompt(c, c.max_position_embeddings, p.ids, g.max_new_tokens);
    } catch (const Error& e) {
      if (p.where.empty()) throw;
      fail(p.where, e.what());
    }
    longest = std::max(longest, static_cast<int64_t>(p.ids.size()));
  }
  const std::unique_ptr<Context> ctx = open_context(co);
  const std::unique_ptr<Model> model =
      load_model(src, *ctx, generation_shape(c, batch, longest, g.max_new_tokens), co.precision);
  KvCache cache(*model, batch);
  if (batch_file) generate_file(cache, prompts, g, tok != nullptr);
  else generate_one(cache, prompts[0], g, o.json);
  return 0;
}

}  // namespace attnres
