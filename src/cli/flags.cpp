// flags.cpp — see flags.h.
#include "cli/flags.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

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
      fail("attnres ", command_, ": unexpected argument '", arg, "' (see attnres ", command_, " --help)");
    std::string name = arg.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const FlagSpec* spec = find(name);
    if (!spec) fail("attnres ", command_, ": unknown flag --", name, " (see attnres ", command_, " --help)");
    const std::string spelled = name;
    if (!spec->spelling_of.empty()) {  // the value is the other flag's
      name = spec->spelling_of;
      spec = find(name);
      ATTNRES_CHECK(spec, "--", spelled, " spells an undeclared flag --", name);
    }
    if (spec->default_value == "false" && !inline_value) {
      value = "true";
    } else if (!inline_value) {
      if (i + 1 >= argc) fail("attnres ", command_, ": flag --", spelled, " needs a value");
      value = argv[++i];
    }
    if (given_.count(name) && spelled_[name] != spelled && values_[name] != value)
      fail("attnres ", command_, ": --", spelled, " ", value, " and --", spelled_[name], " ", values_[name],
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

int64_t Flags::i64(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end) fail("attnres ", command_, ": --", name, " expects an integer, got '", v, "'");
  if (errno == ERANGE) fail("attnres ", command_, ": --", name, " ", v, " is out of the range of a 64-bit integer");
  return x;
}

double Flags::f64(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end) fail("attnres ", command_, ": --", name, " expects a number, got '", v, "'");
  return x;
}

bool Flags::on(const std::string& name) const {
  const std::string& v = str(name);
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  fail("attnres ", command_, ": --", name, " expects true or false, got '", v, "'");
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

FlagSpec threads_flag(const std::string& what) { return {"threads", "0", what + " (0 = all cores)"}; }

int threads_option(const Flags& f) {
  const int64_t threads = f.i64("threads");
  if (threads < 0 || threads > 1024) fail("--threads must be 0 (all cores) or at most 1024, got ", threads);
  return static_cast<int>(threads);
}

FlagSpec device_flag() {
  std::string devices;
  for (const std::string& n : backend_names()) devices += (devices.empty() ? "" : ", ") + n;
  return {"device", "cpu",
          "where the model runs (this build: " + devices +
              "; cpu-guarded is the CPU with its memory locked outside the op interface: slow, for "
              "checking that the code keeps to it)"};
}

std::vector<FlagSpec> context_flags(const std::string& precision_default) {
  return {threads_flag(),
          device_flag(),
          {"precision", precision_default,
           "fp32, or bf16: matrix products with bfloat16 inputs and float32 sums on the CPU's matrix units "
           "(AMX / AVX512-BF16); norms, attention and routing stay float32"},
          {"dtype", "", "its older spelling; f32 is fp32", "precision"}};
}

ContextOptions context_options(const Flags& f) {
  ContextOptions o;
  o.threads = threads_option(f);
  o.device = f.str("device");
  check_device(o.device);
  o.precision = parse_precision(f.str("precision"), f.given("dtype") ? "--dtype" : "--precision");
  return o;
}

std::vector<FlagSpec> model_flags(bool with_tokenizer) {
  std::vector<FlagSpec> f = {{"model", "", "model directory (config.json + weights) or run directory (required)"}};
  if (with_tokenizer) f.push_back({"tokenizer", "", "tokenizer.json (default: the model directory's)"});
  return f;
}

std::vector<FlagSpec> window_flags(const std::string& max_tokens_default, const std::string& max_tokens_help) {
  return {{"data", "", "token file (required)"},
          {"seq-len", "256", "window length T"},
          {"batch", "8", "windows per forward pass"},
          {"max-tokens", max_tokens_default, max_tokens_help}};
}

WindowOptions window_options(const Flags& f) {
  WindowOptions o;
  o.data = f.str("data");
  if (o.data.empty()) fail("--data is required (a token file)");
  o.seq_len = f.i64("seq-len");
  o.batch = f.i64("batch");
  batch_tokens(o.batch, o.seq_len);  // positive, and a forward that fits
  o.max_tokens = f.i64("max-tokens");
  if (o.max_tokens < 0) fail("--max-tokens must be 0 (all) or positive, got ", o.max_tokens);
  return o;
}

}  // namespace attnres
