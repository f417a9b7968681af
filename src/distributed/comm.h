// comm.h — the processes of one training run and what they exchange.
//
// A run is N ranks (processes) started by `mpirun -np N attnres train …` (or
// by a scheduler's launcher that speaks PMI/PMIx); rank 0 logs, validates and
// checkpoints.  Started alone — or built without MPI (-DATTNRES_MPI=OFF) — a
// run is a world of one and every collective below is a no-op: no MPI
// runtime is needed, none is initialised.
//
// Data parallelism with sharded optimizer state (ZeRO stage 1) needs three
// collectives over the float arenas, each over contiguous rank ranges
// (`Shards`): the gradient reduce-scatter (rank r receives the sum over ranks
// of its range), the parameter all-gather (every rank receives every range),
// and the gather of the moments to rank 0 for a checkpoint.  Scalars (losses,
// norms, flags) are all-gathered so that every rank adds them in rank order
// and holds bit-identical results.
//
// A collective that does not complete within the timeout (a rank died or
// hangs) ends this process with one error line and exit status 1: the MPI
// launcher then ends the others.  Nothing here is MPI-specific in its
// interface; another transport (NCCL, gloo) would implement the same calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace attnres {

// Contiguous ranges of an arena of `total` floats, one per rank: rank r owns
// [lo(r), hi(r)).  Sizes differ by at most one 16-float unit (64 bytes, so
// that ranges start on cache lines); the last ranges may be empty when the
// arena is small.
struct Shards {
  Shards() = default;
  Shards(int64_t total, int ranks);
  int64_t lo(int r) const { return bounds[static_cast<size_t>(r)]; }
  int64_t hi(int r) const { return bounds[static_cast<size_t>(r) + 1]; }
  int64_t size(int r) const { return hi(r) - lo(r); }
  std::vector<int64_t> bounds;  // (ranks + 1)
};

class Comm {
 public:
  // This process's place in the job: joins MPI when the environment says a
  // launcher started it (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK) and MPI is
  // built in; otherwise a world of one.  `timeout_s` bounds every collective
  // (0 = wait forever).  One per process.
  static std::unique_ptr<Comm> join(double timeout_s = 0);
  // A world of one (library callers, tests).
  static std::unique_ptr<Comm> single();
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }
  // Ranks on this machine (this one included): they share its cores.
  int local_size() const { return local_size_; }
  // Whether MPI is compiled in (not whether this run uses it).
  static bool built_with_mpi();
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // Seconds spent inside collectives since the last call (then reset).
  double take_seconds();

  // Every collective names what it is for (`what`, e.g. "step 12: gradient
  // reduce-scatter"), which the timeout's error line repeats.
  //
  // buf[lo(r), hi(r)) ← Σ_ranks buf[lo(r), hi(r)) on each rank r; the rest of
  // buf is left as it was (this rank's own contribution).
  void reduce_scatter(float* buf, const Shards& s, const std::string& what);
  // buf[lo(q), hi(q)) ← rank q's buf[lo(q), hi(q)) for every q (in place).
  void all_gather(float* buf, const Shards& s, const std::string& what);
  // Rank 0: full[lo(q), hi(q)) ← rank q's part (n = size(rank) floats); others send.
  void gather_to_root(const float* part, float* full, const Shards& s, const std::string& what);
  // Every rank's n values, rank 0's first: (size · n).
  std::vector<double> all_gather(const std::vector<double>& mine, const std::string& what);
  // Rank 0's bytes to every rank.
  void broadcast(void* data, int64_t bytes, const std::string& what);
  void barrier(const std::string& what);
  // Ends every rank of the job now (after an error on this one): MPI_Abort.
  [[noreturn]] void abort(int code);

 private:
  Comm() = default;
  struct Watchdog;
  void begin(const std::string& what);
  void end();
  int rank_ = 0, size_ = 1, local_size_ = 1;
  bool mpi_ = false;
  double timeout_s_ = 0, seconds_ = 0, t0_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
  std::vector<float> scratch_;  // the reduce-scatter's receive buffer (one range)
};

}  // namespace attnres
