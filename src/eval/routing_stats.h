// routing_stats.h — routing statistics of a model over a token file (the
// quantities of docs/routing.md), measured with inference forwards.
#pragma once

#include <cstdint>

#include "io/token_file.h"
#include "model/model.h"

namespace attnres {

class Progress;

// Consecutive windows of T tokens from the start of `data` (at most
// max_tokens of them; 0 = all), B windows per forward; the model must be
// built for B × T.  Throws an Error when not even one window fits.
RoutingStats measure_routing(Model& model, const TokenFile& data, int64_t T, int64_t B, int64_t max_tokens,
                             Progress* progress = nullptr);

}  // namespace attnres
