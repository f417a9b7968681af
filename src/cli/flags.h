// flags.h — one flag list per subcommand: name, default, help.
//
// The same list parses the command line, prints --help, and prints the
// start-up table, so a flag's name, default and help live in one place.
// Flags are `--name value` or `--name=value`; switches (default "false") take
// no value.  Unknown flags and missing values are Errors naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/precision.h"

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
  // "name = value" lines, for the start-up table of a run.
  std::string table() const;

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

class Backend;
// --precision of the commands that run a model, with --dtype, the spelling
// the inference commands had for it (help line and "f32" included).
std::vector<FlagSpec> precision_flags(const std::string& default_value = "fp32");
// Its value, refused with one clear line where `ops` cannot run it.
Precision precision_flag(const Flags& f, const Backend& ops);

}  // namespace attnres
