// routing_stats.h — a model's routing statistics per router (docs/routing.md):
// the sums Model::routing_stats reads back from the routing ops, added over
// the ranks of a run, and written as the JSON that log.jsonl, `attnres
// routing` and the report read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/route_types.h"

namespace attnres {

// Routing statistics per router (docs/routing.md), as Model::routing_stats
// reads them; to_json gives one object of per-router arrays.
struct RoutingStats {
  std::string mode;
  int64_t heads = 1;                              // routing heads of every router (> 1: the head_* fields)
  std::vector<std::string> routers;               // router names
  std::vector<std::vector<std::string>> sources;  // per router, its source names
  std::vector<RouteStats> acc;                    // per router
  nlohmann::json to_json() const;
  // Every sum and count in one vector (to add them up over the ranks of a run), and back.
  std::vector<double> values() const;
  void set_values(const std::vector<double>& v);
};

}  // namespace attnres
