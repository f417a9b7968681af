// depth_study.cpp — see depth_study.h.
#include "experiment/depth_study.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"
#include "core/json_util.h"
#include "core/timer.h"
#include "experiment/paired_stats.h"
#include "model/config.h"
#include "model/presets.h"
#include "report/report.h"

namespace attnres {

namespace fs = std::filesystem;

std::vector<int64_t> parse_layers(const std::string& s) {
  std::vector<int64_t> out;
  for (const std::string& item : list_items(s)) {
    int64_t L = 0;
    size_t used = 0;
    try {
      L = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || L < 1 || L > 1000)
      fail("--layers '", s, "': '", item, "' is not a number of layers (1 to 1000)");
    if (std::find(out.begin(), out.end(), L) != out.end()) fail("--layers '", s, "' names ", L, " twice");
    out.push_back(L);
  }
  if (out.size() < 2) fail("--layers '", s, "': a depth study needs two depths or more (--config sets one)");
  return out;
}

DepthTable depth_table(const std::vector<std::string>& modes, const nlohmann::json& depths) {
  DepthTable out;
  // Every (mode, depth) with a p, corrected together: the family is the whole study.
  std::vector<double> p_raw;
  for (const auto& d : depths)
    for (const std::string& m : modes) {
      const nlohmann::json& s = d["summary"].value(m, nlohmann::json::object());
      if (m == "baseline" || !s.contains("vs_baseline")) continue;
      nlohmann::json e = {{"mode", m}, {"layers", d["layers"]}, {"vs_baseline", s["vs_baseline"]},
                          {"ci95", s.value("ci95", nlohmann::json(nullptr))},
                          {"p", s.value("p", nlohmann::json(nullptr))}, {"p_adjusted", nullptr},
                          {"paired_seeds", s.value("paired_seeds", 0)}};
      if (e["p"].is_number()) p_raw.push_back(e["p"].get<double>());
      out.deltas.push_back(std::move(e));
    }
  const std::vector<double> adj = holm(p_raw);
  size_t k = 0;
  for (auto& e : out.deltas)
    if (e["p"].is_number()) e["p_adjusted"] = adj[k++];

  std::string& t = out.table;
  t = "| mode |";
  std::string rule = "|---|";
  for (const auto& d : depths) {
    t += cat(" ", d["layers"].get<int64_t>(), " layers: val loss (lr) | vs baseline (95% CI; p) |");
    rule += "---|---|";
  }
  t += "\n" + rule + "\n";
  std::vector<std::string> shown;  // the differences at the 5% level after the correction
  for (const std::string& m : modes) {
    t += "| " + m + " |";
    for (const auto& d : depths) {
      const nlohmann::json& s = d["summary"].value(m, nlohmann::json::object());
      if (!s.contains("val_loss")) {
        t += " - | - |";
        continue;
      }
      const double lr = s.value("chosen_lr", s.value("lr", NAN));
      t += cat(" ", fmt(s["val_loss"].get<double>(), 4),
               s.value("seeds", 1) > 1 ? cat(" ± ", fmt((s["val_loss_max"].get<double>() - s["val_loss_min"].get<double>()) / 2, 4))
                                       : std::string(),
               std::isnan(lr) ? std::string() : cat(" (", fmt_rate(lr), ")"), " |");
      std::string vs = "-";
      for (const auto& e : out.deltas)
        if (e["mode"] == m && e["layers"] == d["layers"]) {
          const double v = e["vs_baseline"].get<double>();
          vs = cat(v >= 0 ? "+" : "", fmt(v, 4));
          if (e["ci95"].is_array())
            vs += cat(" [", fmt(e["ci95"][0].get<double>(), 4), ", ", fmt(e["ci95"][1].get<double>(), 4), "]");
          if (e["p_adjusted"].is_number()) {
            vs += cat("; p ", fmt(e["p_adjusted"].get<double>(), 3));
            if (e["p_adjusted"].get<double>() < 0.05) shown.push_back(cat(m, " at ", d["layers"].get<int64_t>(), " layers"));
          }
        }
      t += " " + vs + " |";
    }
    t += "\n";
  }
  std::string found;
  for (const std::string& s : shown) found += (found.empty() ? "" : ", ") + s;
  out.notes.push_back(cat("vs baseline: each mode's mean paired difference (its seed s − baseline's seed s) at each "
                          "depth, its 95% interval (Student t), and p Holm-adjusted over all ",
                          p_raw.size(), " (mode, depth) differences of the study; a difference at the 5% level: ",
                          found.empty() ? std::string("none") : found, "."));
  out.notes.push_back("Each depth is a comparison of its own (its table, notes, sweep and report in layers-<L>/); "
                      "the width, the tokens per run, the seeds and the schedule are the same at every depth.");
  return out;
}

namespace {

// OUT/config-L<L>.json: --config at L layers.  Written once; a rerun finds the same there.
std::string depth_config(const Comparison& o, int64_t L) {
  Config c = load_config(o.config);
  c.L = L;
  const std::string path = cat(o.out, "/config-L", L, ".json"), text = c.to_json().dump(2) + "\n";
  if (fs::exists(path)) {
    if (read_file(path) != text)
      fail(path, ": is not ", o.config, " at ", L, " layers (the config changed since the study began; use another "
           "--out)");
  } else {
    write_file_atomic(path, text);
  }
  return path;
}

}  // namespace

void run_depth_study(const Comparison& o) {
  {
    std::error_code ec;
    fs::create_directories(o.out, ec);
    if (ec) fail(o.out, ": cannot create the study's directory: ", ec.message());
  }
  const DirLock lock(o.out);  // the depths' comparisons lock their own directories below it
  check_or_write_settings(o);
  int64_t layers_left = 0;
  for (int64_t L : o.layers) layers_left += L;
  const double t_start = now_seconds();
  nlohmann::json depths = nlohmann::json::array();
  for (int64_t L : o.layers) {
    Comparison sub = o;
    sub.layers.clear();
    sub.config = depth_config(o, L);
    sub.out = cat(o.out, "/layers-", L);
    sub.settings.erase("layers");
    sub.settings["config"] = sub.config;
    // With --minutes, each depth's share of the time left in proportion to its layers (a step's cost).
    if (o.minutes > 0)
      sub.minutes = (o.minutes - (now_seconds() - t_start) / 60) * static_cast<double>(L) /
                    static_cast<double>(layers_left);
    layers_left -= L;
    std::printf("compare: %lld layers, in %s\n", static_cast<long long>(L), sub.out.c_str());
    std::fflush(stdout);
    run_comparison(sub);
    const std::string path = sub.out + "/results.json";
    const nlohmann::json r = parse_json(read_file(path), path);
    depths.push_back({{"layers", L}, {"dir", sub.out}, {"summary", r["summary"]}});
  }
  const DepthTable dt = depth_table(o.modes, depths);
  std::string text = dt.table + "\n";
  text += cat("Each run: ", o.steps, " steps of ", o.B * o.T, " tokens, ", o.seeds, " seed(s) per mode, ",
              o.precision, "; ", o.config, " at ", o.layers.size(), " depths.\n");
  for (const std::string& n : dt.notes) text += "- " + n + "\n";
  std::printf("\n%s", text.c_str());
  write_file_atomic(o.out + "/results.md", text);
  const nlohmann::json study = {{"settings", o.settings}, {"depths", depths}, {"deltas", dt.deltas},
                                {"notes", dt.notes}, {"modes", o.modes}, {"table", dt.table}};
  write_file_atomic(o.out + "/results.json", study.dump(1) + "\n");
  std::printf("results: %s/results.json, %s/results.md\n", o.out.c_str(), o.out.c_str());
  std::string vega;
  try {
    vega = find_vega_dir(o.vega_dir);
  } catch (const Error& e) {
    std::printf("report: not written: %s\n", e.what());
    return;
  }
  write_depth_report(study, o.out + "/report.html", vega);
  std::printf("report: %s/report.html\n", o.out.c_str());
}

}  // namespace attnres
