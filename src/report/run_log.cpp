// run_log.cpp — see run_log.h.
#include "report/run_log.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"

namespace attnres {

namespace {

// The field `key` of a log line as a number (an integer where `integer`), or
// an Error naming the file, the line and the field.
double number_field(const nlohmann::json& j, const char* key, const std::string& where, bool integer = false) {
  const nlohmann::json& v = j[key];
  if (!v.is_number() || (integer && !v.is_number_integer()))
    fail(where, ": '", key, "' is ", v.is_null() ? std::string("null") : v.dump().substr(0, 40), ", not ",
         integer ? "an integer" : "a number");
  return v.get<double>();
}

}  // namespace

RunLog read_run_log(const std::string& path) {
  RunLog r;
  const std::string text = read_file(path);
  std::vector<double> speeds;
  size_t at = 0;
  for (int64_t line_no = 1; at < text.size(); ++line_no) {
    size_t end = text.find('\n', at);
    const bool last = end == std::string::npos;
    if (last) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const std::string where = cat(path, ":", line_no);
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      if (!last) ++r.skipped_lines;  // an unterminated last line is a killed run's torn write
      continue;
    }
    if (!j.is_object()) {
      ++r.skipped_lines;
      continue;
    }
    const int64_t step = j.contains("step") ? static_cast<int64_t>(number_field(j, "step", where, true)) : 0;
    if (j.contains("val_loss")) {
      r.val_loss = number_field(j, "val_loss", where);
      r.val_ppl = j.contains("val_ppl") ? number_field(j, "val_ppl", where) : std::exp(r.val_loss);
      r.val_curve.push_back({{"step", step}, {"val_loss", r.val_loss}});
    } else if (j.contains("loss")) {
      r.steps = std::max(r.steps, step);
      r.loss_curve.push_back({{"step", step}, {"loss", number_field(j, "loss", where)}});
      speeds.push_back(j.contains("tok_per_s") ? number_field(j, "tok_per_s", where) : 0.0);
    } else if (j.contains("routing")) {
      const nlohmann::json& rt = j["routing"];
      if (!rt.is_object() || !rt.contains("token_max") || !rt["token_max"].is_array())
        fail(where, ": 'routing' is not routing statistics (an object with a 'token_max' list)");
      for (const auto& x : rt["token_max"])
        if (!x.is_number()) fail(where, ": 'routing' has a 'token_max' entry that is not a number");
      r.routing_curve.push_back({{"step", step}, {"token_max", rt["token_max"]}});
      r.last_routing = rt;
      r.last_routing_step = step;
    } else if (j.contains("schedule_steps")) {
      r.schedule_steps = static_cast<int64_t>(number_field(j, "schedule_steps", where, true));
      if (r.schedule_cut_at == 0) r.schedule_cut_at = step;
    } else if (j.contains("peak_rss_bytes_per_rank")) {
      if (!j["peak_rss_bytes_per_rank"].is_array()) fail(where, ": 'peak_rss_bytes_per_rank' is not a list");
      for (const auto& b : j["peak_rss_bytes_per_rank"]) {
        if (!b.is_number_integer()) fail(where, ": 'peak_rss_bytes_per_rank' holds a value that is not an integer");
        r.peak_rss_bytes = std::max(r.peak_rss_bytes, b.get<int64_t>());
      }
    }
  }
  if (!speeds.empty()) {
    std::sort(speeds.begin(), speeds.end());
    r.tok_per_s = speeds[speeds.size() / 2];
  }
  return r;
}

namespace {

enum Kind { kString, kInteger, kNumber, kBool, kList, kObject, kNumberOrNull };
struct Field {
  const char* key;
  Kind kind;
  bool required;
};

// Every field of `fields` in r with its type (the required ones present), and
// the validation curve's points: an Error naming `where` and the first that is not.
void check_fields(const nlohmann::json& r, const std::string& where, std::span<const Field> fields) {
  static const char* kNames[] = {"a string",      "an integer", "a number",       "true or false",
                                 "a list",        "an object",  "a number or null"};
  for (const Field& f : fields) {
    if (!r.contains(f.key)) {
      if (f.required) fail(where, ": '", f.key, "' is missing");
      continue;
    }
    const nlohmann::json& v = r[f.key];
    const bool finite = v.is_number() && std::isfinite(v.get<double>());
    const bool ok = f.kind == kString          ? v.is_string()
                    : f.kind == kInteger       ? v.is_number_integer()
                    : f.kind == kNumber        ? finite
                    : f.kind == kNumberOrNull  ? finite || v.is_null()
                    : f.kind == kBool          ? v.is_boolean()
                    : f.kind == kList          ? v.is_array()
                                               : v.is_object();
    if (!ok)
      fail(where, ": '", f.key, "' is ", v.is_null() ? std::string("null") : v.dump().substr(0, 40), ", not ",
           kNames[f.kind], f.kind == kNumber || f.kind == kNumberOrNull ? " (finite)" : "");
  }
  for (const auto& w : r["val_curve"])  // compare matches runs by these
    if (!w.is_object() || !w.contains("step") || !w["step"].is_number_integer() || !w.contains("val_loss") ||
        !w["val_loss"].is_number())
      fail(where, ": 'val_curve' holds ", w.dump().substr(0, 40), ", not {\"step\": integer, \"val_loss\": number}");
}

}  // namespace

void check_run_record(const nlohmann::json& r, const std::string& where) {
  if (!r.is_object()) fail(where, ": is not a JSON object (a run's record)");
  static const Field kFields[] = {
      {"mode", kString, true},         {"seed", kInteger, true},      {"dir", kString, true},
      {"steps", kInteger, true},       {"val_loss", kNumber, true},   {"val_ppl", kNumber, true},
      {"tok_per_s", kNumber, true},    {"peak_rss_bytes", kInteger, true}, {"params", kInteger, true},
      {"cut", kBool, true},            {"val_curve", kList, true},    {"loss_curve", kList, true},
      {"routing_curve", kList, false}, {"routing", kObject, false},   {"planned_steps", kInteger, false},
      {"schedule_cut_at", kInteger, false}, {"routing_heads", kInteger, false},
      {"interventions", kObject, false}, {"lr", kNumber, false}, {"lr_routing", kNumberOrNull, false},
  };
  check_fields(r, where, kFields);
  if (r.contains("interventions")) check_interventions(r["interventions"], where + ": interventions");
}

void check_sweep_record(const nlohmann::json& r, const std::string& where) {
  if (!r.is_object()) fail(where, ": is not a JSON object (a sweep run's record)");
  static const Field kFields[] = {
      {"mode", kString, true},  {"seed", kInteger, true}, {"dir", kString, true},
      {"lr", kNumber, true},    {"lr_routing", kNumberOrNull, true}, {"steps", kInteger, true},
      {"planned_steps", kInteger, true}, {"cut", kBool, true}, {"schedule_cut_at", kInteger, true},
      {"diverged", kBool, true}, {"val_loss", kNumberOrNull, true}, {"val_curve", kList, true},
  };
  check_fields(r, where, kFields);
  if (!r["diverged"].get<bool>() && r["val_loss"].is_null())
    fail(where, ": 'val_loss' is null, yet the run did not diverge");
}

void check_interventions(const nlohmann::json& iv, const std::string& where) {
  auto effect = [&](const nlohmann::json& e, const std::string& what) {
    if (!e.is_object() || !e.contains("dloss") || !e["dloss"].is_number() ||
        !std::isfinite(e["dloss"].get<double>()) || !e.contains("se") || !(e["se"].is_number() || e["se"].is_null()))
      fail(where, ": ", what, " is ", e.dump().substr(0, 40), ", not {\"dloss\": number, \"se\": number or null}");
  };
  if (!iv.is_object() || !iv.contains("routers") || !iv["routers"].is_array())
    fail(where, ": has no 'routers' list (not the output of attnres routing --interventions --json)");
  for (size_t i = 0; i < iv["routers"].size(); ++i) {
    const nlohmann::json& r = iv["routers"][i];
    const std::string at = cat("routers[", i, "]");
    if (!r.is_object() || !r.contains("router") || !r["router"].is_string() || !r.contains("sources") ||
        !r["sources"].is_array() || !r.contains("mass") || !r["mass"].is_array() || !r.contains("ablate") ||
        !r["ablate"].is_array())
      fail(where, ": ", at, " lacks router, sources, mass or ablate");
    const size_t S = r["sources"].size();
    if (r["mass"].size() != S || r["ablate"].size() != S)
      fail(where, ": ", at, " has ", S, " sources but ", r["mass"].size(), " masses and ", r["ablate"].size(),
           " ablations");
    for (size_t j = 0; j < S; ++j) {
      if (!r["sources"][j].is_string() || !r["mass"][j].is_number()) fail(where, ": ", at, " source ", j, " is malformed");
      effect(r["ablate"][j], cat(at, ".ablate[", j, "]"));
    }
    for (const char* k : {"mean_routing", "uniform_routing"}) {
      if (!r.contains(k)) fail(where, ": ", at, " lacks ", k);
      effect(r[k], cat(at, ".", k));
    }
  }
}

}  // namespace attnres
