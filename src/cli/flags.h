// flags.h — one flag list per subcommand: name, default, help.
//
// The same list parses the command line and prints --help, so a flag's name,
// default and help live in one place; the groups below are the flags that
// several commands share, each read once into a typed struct.
// Flags are `--name value` or `--name=value`; switches (default "false") take
// no value.  Unknown flags and missing values are Errors naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/precision.h"
#include "ops/backend.h"

namespace attnres {

struct FlagSpec {
  std::string name;           // without the leading "--"
  std::string default_value;  // "false" marks a switch; "" means "no default"
  std::string help;
  std::string spelling_of;    // another spelling of that flag (its value is the flag's), e.g. --dtype of --precision
  FlagSpec(std::string n, std::string d, std::string h, std::string of = "")
      : name(std::move(n)), default_value(std::move(d)), help(std::move(h)), spelling_of(std::move(of)) {}
};

class Flags {
 public:
  Flags(std::string command, std::string summary, std::vector<FlagSpec> specs);

  // Returns false when --help was given (help already printed to stdout).
  bool parse(int argc, char** argv);

  const std::string& str(const std::string& name) const;
  int64_t i64(const std::string& name) const;
  double f64(const std::string& name) const;
  bool on(const std::string& name) const;
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  // Every value given for a flag that may repeat (--stop A --stop B), in order.
  const std::vector<std::string>& all(const std::string& name) const;

  std::string help() const;

 private:
  std::string command_, summary_;
  std::vector<FlagSpec> specs_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> given_;              // by flag, and by the other spelling used for it
  std::map<std::string, std::string> spelled_;     // the spelling the flag's value was last given with
  std::map<std::string, std::vector<std::string>> all_;
  const FlagSpec* find(const std::string& name) const;
};

// a followed by b (a command's own flags and a shared group).
inline std::vector<FlagSpec> join(std::vector<FlagSpec> a, const std::vector<FlagSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- the groups of flags that commands share (each joins the ones it takes) ----

// --threads of any command ("threads (0 = all cores)", or what they do:
// "encoding threads"), and its value: 0 (every core) to 1024, anything else
// an Error naming the flag.
FlagSpec threads_flag(const std::string& what = "threads");
int threads_option(const Flags& f);

// --device NAME, its help listing this build's devices.
FlagSpec device_flag();

// --threads, --device, --precision (and --dtype, the older spelling of the
// inference commands for --precision): where and how the command's model runs.
std::vector<FlagSpec> context_flags(const std::string& precision_default = "fp32");
// Their values, typed and range-checked; open_context (ops/backend.h) builds the Context.
ContextOptions context_options(const Flags& f);

// --model (and, with_tokenizer, --tokenizer): a model to load for inference
// (infer/load.h: open_model takes both).
std::vector<FlagSpec> model_flags(bool with_tokenizer);

// --data, --seq-len, --batch, --max-tokens: a token file read in consecutive
// windows of T tokens, B windows per forward.
std::vector<FlagSpec> window_flags(const std::string& max_tokens_default, const std::string& max_tokens_help);
struct WindowOptions {
  std::string data;
  int64_t seq_len = 0, batch = 0, max_tokens = 0;
};
WindowOptions window_options(const Flags& f);

}  // namespace attnres
