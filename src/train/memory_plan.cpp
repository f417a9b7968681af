// memory_plan.cpp — see memory_plan.h.
#include "train/memory_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "model/params.h"
#include "model/plan.h"

namespace attnres {

namespace {

// The program besides its arenas: libraries, OpenMP and MPI buffers, the
// kernels' workspaces.  Measured: the peak RSS of a 2-rank tiny run (d 64,
// 2 layers: its arenas are under 2 MiB) is ~60 MiB per rank.
constexpr int64_t kRuntimeBytes = int64_t{64} << 20;

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

// A number from a file of one (cgroup v2's memory.max: "max" = none), or −1.
int64_t read_limit(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  try {
    return std::stoll(s);
  } catch (...) {
    return -1;
  }
}

int64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<int64_t>(pages) * size : -1;
}

}  // namespace

std::string MemoryPlan::line() const {
  std::ostringstream o;
  o << gib(total()) << " per rank: weights " << gib(weights) << ", gradients " << gib(gradients) << ", AdamW moments "
    << gib(moments);
  if (working > 0) o << ", gathered layers " << gib(working);
  o << ", activations " << gib(activations) << ", program " << gib(runtime);
  return o.str();
}

MemoryPlan plan_memory(const Config& c, const ModelOptions& o, int ranks, int zero) {
  const ParamLayout layout(c);
  const bool b16 = o.precision == Precision::kBF16;
  const int64_t n = std::max(1, ranks);
  // Floats of matrices and vectors, all and trained; a matrix's piece is at most ⌈numel/N⌉ rounded to 16.
  int64_t pm = 0, pv = 0, piece = 0, trained_m = 0, trained_piece = 0, trained_v = 0;
  std::vector<int64_t> unit(static_cast<size_t>(layout.units()), 0);
  for (const TensorSpec& s : layout.specs()) {
    const bool trains = !o.freeze_base || s.routing();
    const int64_t p = ((s.numel + n - 1) / n + 15) / 16 * 16;
    if (s.matrix) {
      pm += s.numel;
      piece += std::min(p, s.numel);
      trained_m += trains ? s.numel : 0;
      trained_piece += trains ? std::min(p, s.numel) : 0;
      unit[static_cast<size_t>(s.unit)] += s.numel;
      if (c.tied && s.unit == 0) unit.back() += s.numel;  // the head reads the tied embedding
    } else {
      pv += s.numel;
      trained_v += trains ? s.numel : 0;
    }
  }
  MemoryPlan plan;
  if (zero == 3) {
    plan.weights = 4 * (piece + pv) + (b16 ? 2 * piece : 0);
    plan.gradients = 4 * (trained_piece + trained_v);
    plan.moments = 8 * (trained_piece + trained_v);
    if (n > 1) plan.working = *std::max_element(unit.begin(), unit.end()) * ((b16 ? 2 : 4) + 4);
  } else {
    const int64_t trained = trained_m + trained_v;
    plan.weights = 4 * (pm + pv) + (b16 ? 2 * pm : 0);
    plan.gradients = 4 * trained;
    // Sharded moments (a frozen base's routing moments are not sharded).
    plan.moments = o.freeze_base ? 8 * trained : 8 * ((trained + n - 1) / n);
  }
  plan.activations = RoutingPlan::build(c, o).arena_floats * 4;
  plan.runtime = kRuntimeBytes;
  return plan;
}

int64_t memory_limit(double max_memory_gib, int local_ranks, std::string* why) {
  if (max_memory_gib > 0) {
    if (why) *why = cat("--max-memory ", max_memory_gib, " GiB");
    return static_cast<int64_t>(max_memory_gib * (1 << 30));
  }
  int64_t avail = mem_available();
  const int64_t cgroup = read_limit("/sys/fs/cgroup/memory.max");
  std::string from = "the memory available on this machine";
  if (cgroup > 0 && (avail < 0 || cgroup < avail)) {
    avail = cgroup;
    from = "this cgroup's memory.max";
  }
  if (avail < 0) return -1;
  const int r = std::max(1, local_ranks);
  if (why) *why = r > 1 ? cat(from, " (", gib(avail), ") shared by ", r, " ranks") : cat(from, " (", gib(avail), ")");
  return avail / r;
}

}  // namespace attnres
