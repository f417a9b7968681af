// flags.h — the command line's words: a list of flags (name, default, help)
// that parses `--name value` / `--name=value` into texts and prints --help.
// Switches (default "false") take no value.  Unknown flags and missing
// values are Errors naming the flag.  Commands do not read these texts
// themselves: cli/options.h binds each flag to a typed field and reads them
// all at once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>


namespace attnres {

struct FlagSpec {
  std::string name;           // without the leading "--"
  std::string default_value;  // "false" marks a switch; "" means "no default"
  std::string help;
  std::string spelling_of;    // another spelling of that flag (its value is the flag's), e.g. --dtype of --precision
  bool repeatable = false;    // may be given more than once (a list: each value kept); else once, or again alike
  FlagSpec(std::string n, std::string d, std::string h, std::string of = "")
      : name(std::move(n)), default_value(std::move(d)), help(std::move(h)), spelling_of(std::move(of)) {}
};

class Flags {
 public:
  Flags(std::string command, std::string summary, std::vector<FlagSpec> specs);

  // Returns false when --help was given (help already printed to stdout).
  bool parse(int argc, char** argv);

  const std::string& str(const std::string& name) const;
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  // The spelling a flag's value was given with (its own name when not given).
  const std::string& spelled(const std::string& name) const {
    auto it = spelled_.find(name);
    return it == spelled_.end() ? name : it->second;
  }
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

// --device NAME, its help listing this build's devices.
FlagSpec device_flag();

// A token file read in consecutive windows of T tokens, B windows per
// forward (cli/options.h: add_window_options).
struct WindowOptions {
  std::string data;
  int64_t seq_len = 0, batch = 0, max_tokens = 0;
};

}  // namespace attnres
