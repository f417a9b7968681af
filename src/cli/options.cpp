// options.cpp — see options.h.
#include "cli/options.h"

#include <cmath>

#include "core/error.h"
#include "ops/backend.h"

namespace attnres {

bool OptionList::parse(int argc, char** argv) {
  flags_ = std::make_unique<Flags>(command_, summary_, specs_);
  if (!flags_->parse(argc, argv)) return false;
  for (const auto& read : readers_) read(*flags_);
  for (const auto& c : checks_) c();
  return true;
}

bool OptionList::parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  return parse(static_cast<int>(words.size()), argv.data());
}

std::string OptionList::help() const { return Flags(command_, summary_, specs_).help(); }

std::string OptionList::table() const {
  std::string out;
  size_t k = 0;
  for (const FlagSpec& s : specs_) {
    if (!s.spelling_of.empty()) continue;
    out += cat("  --", s.name, " = ", shows_[k++](), "\n");
  }
  return out;
}

void add_threads_option(OptionList& opts, int& threads, const std::string& what) {
  opts.add_parsed(
      {"threads", "0", what + " (0 = all cores)"},
      [&threads](const std::string& text, const std::string& flag) {
        int64_t n = 0;
        parse_value(n, flag, text);
        check_threads(n, flag);
        threads = static_cast<int>(n);
      },
      [&threads] { return cat(threads); });
}

void add_context_options(OptionList& opts, ContextOptions& o, const std::string& precision_default) {
  add_threads_option(opts, o.threads);
  opts.add(o.device, device_flag());
  opts.add_parsed({"precision", precision_default, kPrecisionHelp},
                  [&o](const std::string& text, const std::string& flag) {
                    o.precision = parse_precision(text, flag.c_str());
                  },
                  [&o] { return std::string(precision_name(o.precision)); });
  opts.add_spelling({"dtype", "", "its older spelling; f32 is fp32", "precision"});
  opts.check([&o] { check_device(o.device); });
}

int64_t flag_batch_tokens(int64_t B, int64_t T) {
  if (B <= 0 || T <= 0) fail("--batch and --seq-len must be positive (got ", B, " and ", T, ")");
  if (!fits_one_forward(B, T)) fail("--batch ", B, " x --seq-len ", T, " is more than 2^30 tokens in one forward");
  return B * T;
}

void add_model_options(OptionList& opts, ModelFlags& o, bool with_tokenizer) {
  opts.add(o.model, {"model", "", "model directory (config.json + weights) or run directory (required)"});
  if (with_tokenizer) opts.add(o.tokenizer, {"tokenizer", "", "tokenizer.json (default: the model directory's)"});
  opts.check([&o] {
    if (o.model.empty()) fail("--model is required (a model or run directory)");
  });
}

void add_window_options(OptionList& opts, WindowOptions& o, const std::string& max_tokens_default,
                        const std::string& max_tokens_help) {
  opts.add(o.data, {"data", "", "token file (required)"});
  opts.add(o.seq_len, {"seq-len", "256", "window length T"});
  opts.add(o.batch, {"batch", "8", "windows per forward pass"});
  opts.add(o.max_tokens, {"max-tokens", max_tokens_default, max_tokens_help});
  opts.check([&o] {
    if (o.data.empty()) fail("--data is required (a token file)");
    flag_batch_tokens(o.batch, o.seq_len);  // positive, and a forward that fits
    if (o.max_tokens < 0) fail("--max-tokens must be 0 (all) or positive, got ", o.max_tokens);
  });
}

void add_sampling_options(OptionList& opts, SamplingFlags& o) {
  opts.add(o.temperature, {"temperature", "", "0 = greedy (default: greedy, or generation_config.json's when it samples)"});
  opts.add(o.top_k, {"top-k", "", "sample among the k most likely tokens (0 = all)"});
  opts.add(o.top_p, {"top-p", "", "sample among the most likely tokens of total probability p, in (0, 1]"});
  opts.add(o.seed, {"seed", "0", "sampling seed"});
}

SamplingOptions SamplingFlags::apply(SamplingOptions s) const {
  // The flags by name; s.validate() then checks what generation_config.json gave.
  if (temperature && !(*temperature >= 0 && std::isfinite(*temperature)))
    fail("--temperature must be >= 0 (0 = greedy), got ", *temperature);
  if (top_k && *top_k < 0) fail("--top-k must be >= 0 (0 = all), got ", *top_k);
  if (top_p && !(*top_p > 0 && *top_p <= 1)) fail("--top-p must be in (0, 1], got ", *top_p);
  return sampling_over(s, temperature, top_k, top_p);
}

void add_train_options(OptionList& opts, TrainOptions& o,
                       const std::function<bool(const std::string& key, FlagSpec& spec)>& adjust) {
  TrainOptions::each(o, [&](auto& field, const char* key, const char* def, OnResume, const char* help) {
    FlagSpec spec(option_flag(key), def, help);
    if (adjust && !adjust(key, spec)) return;
    opts.add_parsed(
        std::move(spec), [&field, key](const std::string& text, const std::string&) { parse_option(field, key, text); },
        [&field] { return option_text(field); });
  });
}

}  // namespace attnres
