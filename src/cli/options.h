// options.h — a command's typed option list: each flag bound to a field.
//
// A command declares its options once, as fields of its own struct bound to
// flags (name, default, help), plus the shared groups it takes (context,
// model, windows of a token file, sampling: below).  parse() reads the
// command line, fills every field with its value or its default, checked
// for its type (core/parse_value.h) and by the group's checks; --help and
// the start-up table (table()) come from the same list.  The command then
// reads plain typed fields — no flag is looked up by name after parsing.
//
//   struct { ModelFlags model; bool json = false; ContextOptions context; } o;
//   OptionList opts("eval", "Loss and perplexity ...");
//   add_model_options(opts, o.model, false);
//   opts.add(o.json, {"json", "false", "print one JSON object"});
//   add_context_options(opts, o.context);
//   if (!opts.parse(argc, argv)) return 0;   // --help
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "core/parse_value.h"
#include "infer/sampler.h"
#include "ops/backend.h"
#include "train/options.h"

namespace attnres {

class OptionList {
 public:
  OptionList(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  // Binds field to --spec.name.  T: std::string, bool (a switch when the
  // default is "false"), int64_t, uint64_t, double; std::optional<T> (unset
  // unless given: the spec's default must be ""); std::vector<std::string>
  // (a flag that may repeat: every value given, in order).
  template <class T>
  void add(T& field, FlagSpec spec) {
    const std::string name = spec.name;
    spec.repeatable = std::is_same_v<T, std::vector<std::string>>;  // a list takes every value given
    specs_.push_back(std::move(spec));
    readers_.push_back([&field, name](const Flags& f) { read(field, name, f); });
    shows_.push_back([&field] { return show(field); });
  }
  // An option of its own type: read(text, flag) parses the value (or the
  // default) given as `flag` (the spelling used) into wherever it belongs;
  // show() prints it for the table.
  void add_parsed(FlagSpec spec, std::function<void(const std::string& text, const std::string& flag)> read,
                  std::function<std::string()> show) {
    const std::string name = spec.name;
    specs_.push_back(std::move(spec));
    readers_.push_back([name, read = std::move(read)](const Flags& f) { read(f.str(name), "--" + f.spelled(name)); });
    shows_.push_back(std::move(show));
  }
  // Another spelling of a flag added before (spec.spelling_of), e.g. --dtype of --precision.
  void add_spelling(FlagSpec spec) { specs_.push_back(std::move(spec)); }
  // A check of the values read, run by parse() after every field is filled,
  // in the order added (a group's ranges and requirements).
  void check(std::function<void()> c) { checks_.push_back(std::move(c)); }

  // Reads the command line into the fields; false when --help was given
  // (the help already printed).  Errors name the flag.
  bool parse(int argc, char** argv);
  // The same from words (a caller that is not main: cli/api.h).
  bool parse(std::vector<std::string> words);
  bool given(const std::string& flag) const { return flags_ && flags_->given(flag); }
  // "  --flag = value" per option (its value as read), for a start-up line.
  std::string table() const;
  // What --help prints.
  std::string help() const;

 private:
  template <class T>
  static void read(T& field, const std::string& name, const Flags& f) {
    if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      field = f.all(name);
    } else if constexpr (requires { typename T::value_type; } && !std::is_same_v<T, std::string>) {
      field.reset();  // std::optional<U>
      if (f.given(name)) parse_value(field.emplace(), "--" + name, f.str(name));
    } else {
      parse_value(field, "--" + name, f.str(name));
    }
  }
  template <class T>
  static std::string show(const T& field) {
    if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      std::string s;
      for (const std::string& v : field) s += (s.empty() ? "" : ", ") + v;
      return s;
    } else if constexpr (std::is_same_v<T, bool>) {
      return field ? "true" : "false";
    } else if constexpr (requires { typename T::value_type; } && !std::is_same_v<T, std::string>) {
      return field ? cat(*field) : "";
    } else {
      return cat(field);
    }
  }

  std::string command_, summary_;
  std::vector<FlagSpec> specs_;
  std::vector<std::function<void(const Flags&)>> readers_;  // one per bound option (not per spelling)
  std::vector<std::function<std::string()>> shows_;
  std::vector<std::function<void()>> checks_;
  std::unique_ptr<Flags> flags_;
};

// ---- the groups that commands share ----

// --threads (0: every core, else at most 1024; `what` says what they do, e.g.
// "encoding threads") into an int.
void add_threads_option(OptionList& opts, int& threads, const std::string& what = "threads");

// --threads, --device, --precision (and --dtype, its older spelling of the
// inference commands): where and how the model runs; checked (threads 0 …
// 1024, a known device, a precision's name); open_context builds the Context.
void add_context_options(OptionList& opts, ContextOptions& o, const std::string& precision_default = "fp32");

// --model (and, with_tokenizer, --tokenizer): a model to load for inference
// (infer/load.h: open_model takes both).
struct ModelFlags {
  std::string model, tokenizer;
};
void add_model_options(OptionList& opts, ModelFlags& o, bool with_tokenizer);

// --data, --seq-len, --batch, --max-tokens: a token file read in consecutive
// windows of T tokens, B windows per forward (WindowOptions, flags.h).
// core/error.h's batch_tokens for --batch and --seq-len: the same bounds, the flags named.
int64_t flag_batch_tokens(int64_t B, int64_t T);

void add_window_options(OptionList& opts, WindowOptions& o, const std::string& max_tokens_default,
                        const std::string& max_tokens_help);

// --temperature, --top-k, --top-p, --seed: how the next token is drawn.  The
// first three are unset unless given (a model's generation_config.json may
// set them); apply() lays what was given over those defaults and checks it.
struct SamplingFlags {
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  uint64_t seed = 0;
  SamplingOptions apply(SamplingOptions defaults) const;
};
void add_sampling_options(OptionList& opts, SamplingFlags& o);

// Every training option of train/options.h, each flag bound to its field of
// o, with the list's flag, default and help; adjust(key, spec), when given,
// may change a spec (compare's defaults) or return false to leave the option out.
void add_train_options(OptionList& opts, TrainOptions& o,
                       const std::function<bool(const std::string& key, FlagSpec& spec)>& adjust = {});

}  // namespace attnres
