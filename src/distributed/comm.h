// comm.h — the processes of one training run and what they exchange.
//
// A run is N ranks (processes) started by `mpirun -np N attnres train …` (or
// by a scheduler's launcher that speaks PMI/PMIx); rank 0 logs, validates and
// checkpoints.  Started alone — or built without MPI (-DATTNRES_MPI=OFF) — a
// run is a world of one and every collective below is a no-op: no MPI
// runtime is needed, none is initialised.
//
// Data parallelism with sharded optimizer state (ZeRO stage 1) needs two
// collectives over the float arenas, each over contiguous rank ranges
// (`Shards`): the gradient reduce-scatter (rank r receives the sum over ranks
// of its range; per-owner reduces in pieces, which need no arena-sized
// temporaries) and the parameter all-gather (every rank receives every
// range); a checkpoint streams the moments to rank 0 piece by piece
// (RangeReader), so that no process holds them whole.  Scalars (losses,
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
#include <span>
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
  // A test seam: at most n floats per MPI call (default: INT32_MAX, MPI's int
  // counts), so that a tiny model takes the path of arenas beyond them.
  void limit_count_for_testing(int64_t n) { max_count_ = n > 0 ? n : max_count_; }
  // Seconds spent inside collectives since the last call (then reset).
  double take_seconds();
  // Bytes of the weight and gradient collectives since the last call (then
  // reset): what this rank sent in reduce-scatters and received in
  // all-gathers — the other ranks' parts, not its own.
  int64_t take_bytes();

  // Every collective names what it is for (`what`, e.g. "step 12: gradient
  // reduce-scatter"), which the timeout's error line repeats.
  //
  // buf[lo(r), hi(r)) ← Σ_ranks buf[lo(r), hi(r)) on each rank r; the rest of
  // buf is left as it was (this rank's own contribution).
  void reduce_scatter(float* buf, const Shards& s, const std::string& what);
  // buf[lo(q), hi(q)) ← rank q's buf[lo(q), hi(q)) for every q (in place).
  void all_gather(float* buf, const Shards& s, const std::string& what);
  // The same over 16-bit values (bfloat16 weights: half the bytes).
  void all_gather(uint16_t* buf, const Shards& s, const std::string& what);
  // Point to point (a RangeReader's pieces): n floats to / from one rank.
  // Messages of one tag between two ranks arrive in the order sent.
  void send(const float* p, int64_t n, int to, int tag, const std::string& what);
  void recv(float* p, int64_t n, int from, int tag, const std::string& what);
  // This rank's part of a sharded arena (part[0] is the float at lo(rank)),
  // to rank 0 in pieces of at most `chunk` floats, for its RangeReader.
  void send_range(const float* part, const Shards& s, int tag, int64_t chunk, const std::string& what);
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
  void all_gather_(void* buf, int width, const Shards& s, const std::string& what);  // 4: floats, 2: 16-bit
  void begin(const std::string& what);
  void end();
  int rank_ = 0, size_ = 1, local_size_ = 1;
  bool mpi_ = false;
  double timeout_s_ = 0, seconds_ = 0, t0_ = 0;
  int64_t bytes_ = 0;
  int64_t max_count_ = INT32_MAX;  // floats in one MPI call (its counts are int)
  std::unique_ptr<Watchdog> watchdog_;
};

// Rank 0's reading of a sharded arena that no process holds whole (the AdamW
// moments of a ZeRO run, written into one checkpoint file): every other rank
// calls comm.send_range(its part, s, tag, chunk, …); rank 0 reads ranges in
// increasing order and calls finish(), which receives whatever was not asked
// for (a sender waits until its pieces are taken).  Rank 0 holds one piece of
// `chunk` floats at a time, not the arena.
class RangeReader {
 public:
  RangeReader(Comm& comm, const Shards& s, const float* mine, int tag, int64_t chunk, std::string what);
  // out ← arena[at, at + out.size()); `at` never goes back.
  void read(int64_t at, std::span<float> out);
  void finish();

 private:
  Comm& comm_;
  const Shards& s_;
  const float* mine_;  // rank 0's part: arena[lo(0), hi(0))
  int tag_;
  int64_t chunk_;
  std::string what_;
  int from_ = 1;          // the rank whose pieces come next
  int64_t next_ = 0;      // where its next piece starts (arena offset)
  int64_t b0_ = 0, b1_ = 0;  // the piece held: arena[b0_, b1_)
  std::vector<float> piece_;
  bool receive_next();  // false when every piece has come
};

}  // namespace attnres
