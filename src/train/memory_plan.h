// memory_plan.h — what one rank of a training run will hold, planned from
// the config before anything is allocated, and the limit it is held to.
//
// Per rank, with P the arena's floats (Pm of them in matrices, Pv in
// vectors), N ranks, bf16 adding a 2-byte copy of each matrix:
//   ZeRO-1:  weights 4P (+ 2Pm),  gradients 4P,  moments 8P/N;
//   ZeRO-3:  weights 4(Pm/N + Pv) (+ 2Pm/N),  gradients 4(Pm/N + Pv),
//            moments 8(Pm/N + Pv),  plus the working set: the largest unit
//            gathered (2 or 4 bytes a float) with its gradient (4);
// with a frozen base, gradients and moments of the routing tensors only;
// plus the activations (the routing plan's arena, model/plan.h) and the
// program itself (libraries, MPI, the kernels' workspaces: kRuntimeBytes,
// measured on a tiny model).  train prints it at start and refuses a run
// whose plan exceeds --max-memory, or else the memory available on this
// machine shared by its ranks (and the cgroup's limit, where one is set).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/model_options.h"

namespace attnres {

struct MemoryPlan {
  int64_t weights = 0, gradients = 0, moments = 0, working = 0, activations = 0, runtime = 0;
  int64_t total() const { return weights + gradients + moments + working + activations + runtime; }
  std::string line() const;  // "3.21 GiB per rank: weights ..., ..."
};

// zero: 1 or 3; ranks ≥ 1.  The model options are the training model's.
MemoryPlan plan_memory(const Config& c, const ModelOptions& o, int ranks, int zero);

// The bytes a rank may use: max_memory_gib > 0, else this machine's available
// memory (MemAvailable, bounded by the cgroup's memory.max) over local_ranks.
// `why` says which.
int64_t memory_limit(double max_memory_gib, int local_ranks, std::string* why);

}  // namespace attnres
