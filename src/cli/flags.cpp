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

namespace {

// Two values of one flag that mean the same: equal, or for --precision the
// same precisions under their spellings ("f32" is "fp32"; a list item by item).
bool same_value(const std::string& flag, const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (flag != "precision") return false;
  auto canonical = [](const std::string& v) {
    std::string out, item;
    for (size_t i = 0; i <= v.size(); ++i) {
      if (i < v.size() && v[i] != ',') {
        item += v[i];
        continue;
      }
      if (!out.empty()) out += ',';
      out.append(item == "f32" ? "fp32" : item);
      item.clear();
    }
    return out;
  };
  return canonical(a) == canonical(b);
}

}  // namespace

bool Flags::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg == "--") {  // the end of the flags, as getopt has it; no command takes operands
      if (i + 1 < argc)
        fail("unexpected argument '", visible(argv[i + 1]), "' after -- (attnres ", command_,
             " takes flags only; see --help)");
      return true;
    }
    if (arg.rfind("--", 0) != 0)
      fail("unexpected argument '", visible(arg), "' (see attnres ", command_, " --help)");
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
    if (given_.count(name) && !spec->repeatable && !same_value(name, values_[name], value))
      fail(spelled_[name] == spelled
               ? cat("--", spelled, " is given twice (", visible(values_[name]), ", then ", visible(value),
                     "): give it once")
               : cat("--", spelled, " ", visible(value), " and --", spelled_[name], " ", visible(values_[name]),
                     " disagree (two spellings of one flag)"));
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

FlagSpec device_flag() { return {"device", "cpu", device_help()}; }

}  // namespace attnres
