// routing_stats.cpp — see routing_stats.h.
#include "model/routing_stats.h"

#include <algorithm>

#include "core/error.h"

namespace attnres {

std::vector<double> RoutingStats::values() const {
  std::vector<double> v;
  for (const auto& a : acc) {
    v.insert(v.end(), a.weight_sum.begin(), a.weight_sum.end());
    v.insert(v.end(), {a.token_max_sum, a.entropy_sum, a.cosine_sum, static_cast<double>(a.tokens)});
    for (int64_t h : a.token_max_hist) v.push_back(static_cast<double>(h));
    if (heads > 1) {
      for (const auto* part : {&a.head_weight_sum, &a.head_max_sum, &a.head_entropy_sum})
        v.insert(v.end(), part->begin(), part->end());
      v.push_back(a.disagreement_sum);
    }
  }
  return v;
}

void RoutingStats::set_values(const std::vector<double>& v) {
  size_t i = 0;
  for (auto& a : acc) {
    ATTNRES_CHECK(i + a.weight_sum.size() + 4 + a.token_max_hist.size() <= v.size(), "routing values of another model");
    for (double& w : a.weight_sum) w = v[i++];
    a.token_max_sum = v[i++];
    a.entropy_sum = v[i++];
    a.cosine_sum = v[i++];
    a.tokens = static_cast<int64_t>(v[i++]);
    for (int64_t& h : a.token_max_hist) h = static_cast<int64_t>(v[i++]);
    if (heads > 1) {
      const size_t n = a.head_weight_sum.size() + a.head_max_sum.size() + a.head_entropy_sum.size() + 1;
      ATTNRES_CHECK(i + n <= v.size(), "routing values of another model");
      for (auto* part : {&a.head_weight_sum, &a.head_max_sum, &a.head_entropy_sum})
        for (double& x : *part) x = v[i++];
      a.disagreement_sum = v[i++];
    }
  }
  ATTNRES_CHECK(i == v.size(), "routing values of another model");
}

nlohmann::json RoutingStats::to_json() const {
  nlohmann::json mean_weight = nlohmann::json::array(), max_weight = nlohmann::json::array(),
                 token_max = nlohmann::json::array(), entropy = nlohmann::json::array(),
                 cosine = nlohmann::json::array(), hist = nlohmann::json::array();
  int64_t tokens = 0;
  for (const auto& a : acc) {
    const double n = a.tokens > 0 ? static_cast<double>(a.tokens) : 1.0;
    tokens = std::max(tokens, a.tokens);
    std::vector<double> mw;
    double mx = 0;
    for (double w : a.weight_sum) {
      mw.push_back(w / n);
      mx = std::max(mx, w / n);
    }
    mean_weight.push_back(mw);
    max_weight.push_back(mx);
    token_max.push_back(a.token_max_sum / n);
    hist.push_back(a.token_max_hist);
    entropy.push_back(a.entropy_sum / n);
    if (a.weight_sum.size() >= 2) cosine.push_back(a.cosine_sum / n);
    else cosine.push_back(nullptr);  // one source: no pair
  }
  nlohmann::json out = {{"mode", mode},           {"tokens", tokens},         {"routers", routers},
                        {"sources", sources},     {"mean_weight", mean_weight}, {"max_weight", max_weight},
                        {"token_max", token_max}, {"entropy", entropy},       {"cosine", cosine},
                        {"token_max_hist", hist}};
  if (heads > 1) {  // per router: (H, S) mean weights, (H) token max and entropy, the disagreement
    nlohmann::json hw = nlohmann::json::array(), hm = nlohmann::json::array(), he = nlohmann::json::array(),
                   dis = nlohmann::json::array();
    for (const auto& a : acc) {
      const double n = a.tokens > 0 ? static_cast<double>(a.tokens) : 1.0;
      const size_t S = a.weight_sum.size();
      nlohmann::json rows = nlohmann::json::array(), mx = nlohmann::json::array(), en = nlohmann::json::array();
      for (size_t h = 0; h < static_cast<size_t>(heads); ++h) {
        std::vector<double> row;
        for (size_t i = 0; i < S; ++i) row.push_back(a.head_weight_sum[h * S + i] / n);
        rows.push_back(row);
        mx.push_back(a.head_max_sum[h] / n);
        en.push_back(a.head_entropy_sum[h] / n);
      }
      hw.push_back(rows);
      hm.push_back(mx);
      he.push_back(en);
      dis.push_back(a.disagreement_sum / n);
    }
    out["heads"] = heads;
    out["head_mean_weight"] = hw;
    out["head_token_max"] = hm;
    out["head_entropy"] = he;
    out["head_disagreement"] = dis;
  }
  return out;
}

}  // namespace attnres
