// comm.cpp — see comm.h.
#include "distributed/comm.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/timer.h"

#ifdef ATTNRES_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings are deprecated and not linked)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace attnres {

Shards::Shards(int64_t total, int ranks) {
  // Whole 16-float units, spread as evenly as they go; the tail (< 16 floats) to the last rank.
  const int64_t units = total / 16;
  bounds.resize(static_cast<size_t>(ranks) + 1);
  for (int r = 0; r <= ranks; ++r) bounds[static_cast<size_t>(r)] = units * r / ranks * 16;
  bounds.back() = total;
}

// A thread that ends the process when a collective outlives the timeout.
// Armed by begin() and disarmed by end() around every collective; a blocking
// MPI call cannot be interrupted, so the error line and _exit(1) come from
// here, and the launcher (which sees a rank exit without MPI_Finalize) ends
// the others.
struct Comm::Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  bool armed = false, quit = false;
  uint64_t seq = 0;
  std::chrono::steady_clock::time_point deadline;
  std::string what;
  int rank = 0, size = 1;
  double timeout = 0;
  std::thread thread;

  Watchdog(int r, int n) : rank(r), size(n) {
    thread = std::thread([this] { run(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu);
      quit = true;
    }
    cv.notify_all();
    thread.join();
  }
  void arm(const std::string& w, double seconds) {
    {
      std::lock_guard<std::mutex> lock(mu);
      armed = true;
      ++seq;
      what = w;
      timeout = seconds;
      deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(seconds));
    }
    cv.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mu);
    armed = false;
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!quit) {
      if (!armed) {
        cv.wait(lock);
        continue;
      }
      const uint64_t s = seq;
      const auto d = deadline;
      cv.wait_until(lock, d, [&] { return quit || !armed || seq != s; });
      if (quit || !armed || seq != s) continue;
      std::fprintf(stderr,
                   "attnres: error: rank %d of %d: %s did not complete within %g s (--collective-timeout): another "
                   "rank died or hangs; ending this rank (the checkpoints written so far are intact)\n",
                   rank, size, what.c_str(), timeout);
      std::fflush(stderr);
      ::_exit(1);
    }
  }
};

namespace {

// The world size a launcher announces in the environment (mpirun: OMPI_*;
// PMI-2 launchers such as srun: PMI_SIZE); 2 when only a PMIx rank is set
// (MPI tells the size); 0 when no launcher started this process.
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  return std::getenv("PMIX_RANK") ? 2 : 0;
}

#ifdef ATTNRES_HAVE_MPI
void check_count(int64_t n, const std::string& what) {
  if (n > INT_MAX)
    fail(what, ": ", n, " floats in one message exceed MPI's int counts (2^31 - 1); models this large need more "
               "ranks (a smaller range each)");
}
#endif

}  // namespace

bool Comm::built_with_mpi() {
#ifdef ATTNRES_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Comm> Comm::single() { return std::unique_ptr<Comm>(new Comm()); }

std::unique_ptr<Comm> Comm::join(double timeout_s) {
  std::unique_ptr<Comm> c(new Comm());
  c->timeout_s_ = timeout_s;
  const int launched = launcher_world_size();
  if (launched <= 1) return c;  // alone (or a launcher with one rank: nothing to exchange)
#ifdef ATTNRES_HAVE_MPI
  int provided = 0;
  // Only the main thread calls MPI (the OpenMP threads compute, the watchdog never calls it).
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    fail("MPI_Init failed (started by a launcher for ", launched, " ranks)");
  c->mpi_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  // Errors come back as codes (then an Error) rather than MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm local;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank_, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
    MPI_Comm_size(local, &c->local_size_);
    MPI_Comm_free(&local);
  }
  if (c->size_ > 1) c->watchdog_ = std::make_unique<Watchdog>(c->rank_, c->size_);
  return c;
#else
  fail("started by a launcher for ", launched, " ranks, but this attnres was built without MPI "
       "(install libopenmpi-dev and rebuild; cmake -DATTNRES_MPI=ON)");
#endif
}

Comm::~Comm() {
#ifdef ATTNRES_HAVE_MPI
  if (mpi_) {  // MPI_Finalize waits for the other ranks too: watched like a collective
    begin("the end of the run (MPI_Finalize)");
    MPI_Finalize();
    end();
  }
#endif
  watchdog_.reset();
}

double Comm::take_seconds() {
  const double s = seconds_;
  seconds_ = 0;
  return s;
}

int64_t Comm::take_bytes() {
  const int64_t b = bytes_;
  bytes_ = 0;
  return b;
}

void Comm::begin(const std::string& what) {
  t0_ = now_seconds();
  if (watchdog_ && timeout_s_ > 0) watchdog_->arm(what, timeout_s_);
}

void Comm::end() {
  if (watchdog_) watchdog_->disarm();
  seconds_ += now_seconds() - t0_;
}

#ifdef ATTNRES_HAVE_MPI
namespace {
void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(what, ": MPI error: ", std::string(text, static_cast<size_t>(len)));
}
// fn(r, at, n) for every piece of at most `max` floats of every rank's range,
// in rank order, until one returns an MPI error (returned).
template <class Fn>
int for_each_piece(const Shards& s, int size, int64_t max, Fn fn) {
  for (int r = 0; r < size; ++r)
    for (int64_t a = s.lo(r); a < s.hi(r); a += max)
      if (const int rc = fn(r, a, static_cast<int>(std::min(max, s.hi(r) - a))); rc != MPI_SUCCESS) return rc;
  return MPI_SUCCESS;
}
struct Counts {
  std::vector<int> n, at;
  Counts(const Shards& s, int size, const std::string& what) {
    for (int r = 0; r < size; ++r) {
      check_count(s.hi(r), what);
      n.push_back(static_cast<int>(s.size(r)));
      at.push_back(static_cast<int>(s.lo(r)));
    }
  }
};
}  // namespace
#endif

// The gradient reduce-scatter is one MPI_Reduce per rank range, to its owner,
// in pieces of at most 2^20 floats (4 MiB).  MPI_Reduce_scatter does the same
// sums, but Open MPI's allocates temporaries the size of the whole arena —
// bench/collectives.sh, Open MPI 4.1.4, 2 ranks, 50 M floats: +286 MiB per
// rank and 267 ms, against +4 MiB and 66 ms in pieces — which would take
// back the memory that sharding the moments saves.
constexpr int64_t kReducePiece = int64_t{1} << 20;

void Comm::reduce_scatter(float* buf, const Shards& s, const std::string& what) {
  if (size_ == 1) return;
  bytes_ += (s.bounds.back() - s.size(rank_)) * static_cast<int64_t>(sizeof(float));
#ifdef ATTNRES_HAVE_MPI
  begin(what);
  const int rc = for_each_piece(s, size_, std::min(max_count_, kReducePiece), [&](int r, int64_t a, int n) {
    return r == rank_ ? MPI_Reduce(MPI_IN_PLACE, buf + a, n, MPI_FLOAT, MPI_SUM, r, MPI_COMM_WORLD)
                      : MPI_Reduce(buf + a, nullptr, n, MPI_FLOAT, MPI_SUM, r, MPI_COMM_WORLD);
  });
  end();
  check_mpi(rc, what);
#endif
}

// An arena too large for int counts and displacements (more than 2^31 - 1
// values: models beyond ~2 B parameters) is all-gathered as one broadcast per
// rank range (from its owner) and piece of at most max_count_ values.
#ifdef ATTNRES_HAVE_MPI
namespace {
template <class T>
int all_gather_mpi(T* buf, const Shards& s, int size, int64_t max_count, MPI_Datatype type, const std::string& what) {
  if (s.bounds.back() > max_count)
    return for_each_piece(s, size, max_count, [&](int r, int64_t a, int n) {
      return MPI_Bcast(buf + a, n, type, r, MPI_COMM_WORLD);
    });
  const Counts c(s, size, what);
  return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.n.data(), c.at.data(), type, MPI_COMM_WORLD);
}
}  // namespace
#endif

void Comm::all_gather(float* buf, const Shards& s, const std::string& what) { all_gather_(buf, 4, s, what); }

void Comm::all_gather(uint16_t* buf, const Shards& s, const std::string& what) { all_gather_(buf, 2, s, what); }

void Comm::all_gather_(void* buf, int width, const Shards& s, const std::string& what) {
  if (size_ == 1) return;
  bytes_ += (s.bounds.back() - s.size(rank_)) * width;
#ifdef ATTNRES_HAVE_MPI
  begin(what);
  const int rc = width == 4 ? all_gather_mpi(static_cast<float*>(buf), s, size_, max_count_, MPI_FLOAT, what)
                            : all_gather_mpi(static_cast<uint16_t*>(buf), s, size_, max_count_, MPI_UINT16_T, what);
  end();
  check_mpi(rc, what);
#else
  (void)buf, (void)width, (void)s, (void)what;
#endif
}

void Comm::send(const float* p, int64_t n, int to, int tag, const std::string& what) {
#ifdef ATTNRES_HAVE_MPI
  check_count(n, what);
  begin(what);
  const int rc = MPI_Send(p, static_cast<int>(n), MPI_FLOAT, to, tag, MPI_COMM_WORLD);
  end();
  check_mpi(rc, what);
#else
  (void)p, (void)n, (void)to, (void)tag;
  fail(what, ": a world of one has no rank to send to");
#endif
}

void Comm::recv(float* p, int64_t n, int from, int tag, const std::string& what) {
#ifdef ATTNRES_HAVE_MPI
  check_count(n, what);
  begin(what);
  const int rc = MPI_Recv(p, static_cast<int>(n), MPI_FLOAT, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  end();
  check_mpi(rc, what);
#else
  (void)p, (void)n, (void)from, (void)tag;
  fail(what, ": a world of one has no rank to receive from");
#endif
}

void Comm::send_range(const float* part, const Shards& s, int tag, int64_t chunk, const std::string& what) {
  for (int64_t at = s.lo(rank_); at < s.hi(rank_); at += chunk)
    send(part + (at - s.lo(rank_)), std::min(chunk, s.hi(rank_) - at), 0, tag, what);
}

RangeReader::RangeReader(Comm& comm, const Shards& s, const float* mine, int tag, int64_t chunk, std::string what)
    : comm_(comm), s_(s), mine_(mine), tag_(tag), chunk_(chunk), what_(std::move(what)) {
  ATTNRES_CHECK(comm.root() && chunk > 0, "a RangeReader is rank 0's");
  next_ = comm.size() > 1 ? s.lo(1) : 0;
}

bool RangeReader::receive_next() {
  while (from_ < comm_.size() && next_ >= s_.hi(from_))  // this rank's pieces have all come (or it has none)
    if (++from_ < comm_.size()) next_ = s_.lo(from_);
  if (from_ >= comm_.size()) return false;
  const int64_t n = std::min(chunk_, s_.hi(from_) - next_);
  piece_.resize(static_cast<size_t>(chunk_));
  comm_.recv(piece_.data(), n, from_, tag_, what_);
  b0_ = next_;
  b1_ = next_ + n;
  next_ += n;
  return true;
}

void RangeReader::read(int64_t at, std::span<float> out) {
  size_t done = 0;
  while (done < out.size()) {
    const int64_t a = at + static_cast<int64_t>(done);
    const float* src = nullptr;
    int64_t avail = 0;
    if (a < s_.hi(0)) {  // rank 0's own part
      src = mine_ + (a - s_.lo(0));
      avail = s_.hi(0) - a;
    } else {
      ATTNRES_CHECK(a >= b0_, what_, ": read backwards (at ", a, " after the piece from ", b0_, ")");
      while (a >= b1_)
        if (!receive_next()) fail(what_, ": asked for float ", a, " past the arena (", s_.bounds.back(), ")");
      src = piece_.data() + (a - b0_);
      avail = b1_ - a;
    }
    const size_t n = std::min(out.size() - done, static_cast<size_t>(avail));
    std::copy(src, src + n, out.data() + done);
    done += n;
  }
}

void RangeReader::finish() {
  while (receive_next()) {
  }
}

std::vector<double> Comm::all_gather(const std::vector<double>& mine, const std::string& what) {
  if (size_ == 1) return mine;
  std::vector<double> all(mine.size() * static_cast<size_t>(size_));
#ifdef ATTNRES_HAVE_MPI
  begin(what);
  const int n = static_cast<int>(mine.size());
  const int rc = MPI_Allgather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, MPI_COMM_WORLD);
  end();
  check_mpi(rc, what);
#endif
  return all;
}

void Comm::broadcast(void* data, int64_t bytes, const std::string& what) {
  if (size_ == 1) return;
#ifdef ATTNRES_HAVE_MPI
  check_count(bytes, what);
  begin(what);
  const int rc = MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
  end();
  check_mpi(rc, what);
#endif
}

void Comm::barrier(const std::string& what) {
  if (size_ == 1) return;
#ifdef ATTNRES_HAVE_MPI
  begin(what);
  const int rc = MPI_Barrier(MPI_COMM_WORLD);
  end();
  check_mpi(rc, what);
#endif
}

void Comm::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef ATTNRES_HAVE_MPI
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace attnres
