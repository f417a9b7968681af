// run_log.cpp — see run_log.h.
#include "report/run_log.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

namespace attnres {

RunLog read_run_log(const std::string& path) {
  RunLog r;
  std::ifstream in(path);
  std::vector<double> speeds;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    if (!j.is_object()) continue;
    const int64_t step = j.value("step", int64_t{0});
    if (j.contains("val_loss")) {
      r.val_loss = j["val_loss"].get<double>();
      r.val_ppl = j.value("val_ppl", std::exp(r.val_loss));
      r.val_curve.push_back({{"step", step}, {"val_loss", r.val_loss}});
    } else if (j.contains("loss")) {
      r.steps = std::max(r.steps, step);
      r.loss_curve.push_back({{"step", step}, {"loss", j["loss"]}});
      speeds.push_back(j.value("tok_per_s", 0.0));
    } else if (j.contains("routing")) {
      r.routing_curve.push_back({{"step", step}, {"token_max", j["routing"]["token_max"]}});
      r.last_routing = j["routing"];
      r.last_routing_step = step;
    } else if (j.contains("schedule_steps")) {
      r.schedule_steps = j["schedule_steps"].get<int64_t>();
    } else if (j.contains("peak_rss_bytes_per_rank") && j["peak_rss_bytes_per_rank"].is_array()) {
      for (const auto& b : j["peak_rss_bytes_per_rank"])
        if (b.is_number()) r.peak_rss_bytes = std::max(r.peak_rss_bytes, b.get<int64_t>());
    }
  }
  if (!speeds.empty()) {
    std::sort(speeds.begin(), speeds.end());
    r.tok_per_s = speeds[speeds.size() / 2];
  }
  return r;
}

}  // namespace attnres
