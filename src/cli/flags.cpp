// flags.cpp — see flags.h.
#include "cli/flags.h"

#include <cstdio>

#include "core/error.h"
#include "ops/backend.h"

namespace attnres {

Flags::Flags(std::string command, std::string summary, std::vector<FlagSpec> specs)
    : command_(std::move(command)), summary_(std::move(summary)), specs_(std::move(specs)) {
  for (const auto& s : specs_) values_[s.name] = s.default_value;
}

const FlagSpec* Flags::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

bool Flags::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg.rfind("--", 0) != 0)
      fail("unexpected argument '", arg, "' (see attnres ", command_, " --help)");
    std::string name = arg.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const FlagSpec* spec = find(name);
    if (!spec) fail("unknown flag --", name, " (see attnres ", command_, " --help)");
    const std::string spelled = name;
    if (!spec->spelling_of.empty()) {  // the value is the other flag's
      name = spec->spelling_of;
      spec = find(name);
      ATTNRES_CHECK(spec, "--", spelled, " spells an undeclared flag --", name);
    }
    if (spec->default_value == "false" && !inline_value) {
      value = "true";
    } else if (!inline_value) {
      if (i + 1 >= argc) fail("flag --", spelled, " needs a value");
      value = argv[++i];
    }
    if (given_.count(name) && spelled_[name] != spelled && values_[name] != value)
      fail("--", spelled, " ", value, " and --", spelled_[name], " ", values_[name],
           " disagree (two spellings of one flag)");
    values_[name] = value;
    given_[name] = given_[spelled] = true;
    spelled_[name] = spelled;
    all_[name].push_back(value);
  }
  return true;
}

const std::string& Flags::str(const std::string& name) const {
  auto it = values_.find(name);
  ATTNRES_CHECK(it != values_.end(), "flag --", name, " is not declared");
  return it->second;
}

const std::vector<std::string>& Flags::all(const std::string& name) const {
  static const std::vector<std::string> none;
  ATTNRES_CHECK(find(name), "flag --", name, " is not declared");
  auto it = all_.find(name);
  return it == all_.end() ? none : it->second;
}

std::string Flags::help() const {
  std::string out = cat("usage: attnres ", command_, " [flags]\n", summary_, "\n\nflags:\n");
  for (const auto& s : specs_) {
    if (!s.spelling_of.empty()) {
      const std::string lhs = cat("  --", s.name, " VALUE");
      out += cat(lhs, std::string(lhs.size() < 26 ? 26 - lhs.size() : 1, ' '), "the same as --", s.spelling_of,
                 s.help.empty() ? "" : " (" + s.help + ")", "\n");
      continue;
    }
    std::string lhs = cat("  --", s.name, s.default_value == "false" ? "" : " VALUE");
    out += cat(lhs, std::string(lhs.size() < 26 ? 26 - lhs.size() : 1, ' '), s.help);
    if (s.default_value != "false" && !s.default_value.empty()) out += cat(" (default: ", s.default_value, ")");
    out += "\n";
  }
  return out;
}

FlagSpec device_flag() {
  std::string devices;
  for (const std::string& n : backend_names()) devices += (devices.empty() ? "" : ", ") + n;
  return {"device", "cpu",
          "where the model runs (this build: " + devices +
              "; cpu-guarded is the CPU with its memory locked outside the op interface: slow, for "
              "checking that the code keeps to it)"};
}

}  // namespace attnres
