// collectives.cpp — the two collectives of a data-parallel step, alone: the
// gradient reduce-scatter and the parameter all-gather over an arena of N
// floats, as attnres does them (src/distributed/comm.h) and, for comparison,
// as one MPI_Reduce_scatter.  Prints, per rank, the time of the fastest of
// five calls and how much the calls grew the peak RSS (their temporaries).
// Peak RSS only grows, so each method runs in a process of its own:
//
//   mpirun -np 2 build/attnres_bench_collectives METHOD [FLOATS]
//   METHOD: reduce-scatter (attnres), mpi-reduce-scatter, all-gather (attnres)
//
// bench/collectives.sh runs the three and prints a table.
//
//   mpirun -np 2 build/attnres_bench_collectives overlap [FLOATS]
//
// measures whether Open MPI moves a nonblocking all-gather (MPI_Iallgatherv,
// what ZeRO-3's prefetch of the next layer would issue) while the rank
// computes: the all-gather alone, a stretch of compute alone (about twice as long),
// and the two together — the gather started, the compute run, then waited
// for — once with no MPI call during the compute and once with an MPI_Test
// after every 1/64 of it (progress driven from the compute loop).  Hidden =
// alone + alone − together, as a share of the gather.
#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/comm.h"

namespace {

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// A stretch of float work of `units` units, with `poll` called between 64 parts.
float compute(int64_t units, const std::function<void()>& poll) {
  static std::vector<float> v(1 << 16, 1.0f);
  float acc = 0;
  for (int part = 0; part < 64; ++part) {
    for (int64_t u = 0; u < units / 64; ++u)
      for (float& x : v) acc += (x = x * 0.999f + 0.001f);
    if (poll) poll();
  }
  return acc;
}

int overlap(attnres::Comm& comm, int64_t n) {
  using namespace attnres;
  const Shards s(n, comm.size());
  std::vector<float> arena(static_cast<size_t>(n), 1.0f);
  std::vector<int> counts, at;
  for (int r = 0; r < comm.size(); ++r) {
    counts.push_back(static_cast<int>(s.size(r)));
    at.push_back(static_cast<int>(s.lo(r)));
  }
  auto best_of = [&](const std::function<void()>& f) {
    double best = 1e30;
    for (int call = 0; call < 5; ++call) {
      comm.barrier("bench");
      const double t0 = MPI_Wtime();
      f();
      best = std::min(best, MPI_Wtime() - t0);
    }
    return best;
  };
  volatile float sink = 0;
  const double gather = best_of([&] { comm.all_gather(arena.data(), s, "bench"); });
  // Compute units that take about twice as long as the gather: room to hide all of it.
  const double one = best_of([&] { sink = sink + compute(64, nullptr); }) / 64;
  const int64_t units = std::max<int64_t>(64, static_cast<int64_t>(2 * gather / one));
  const double work = best_of([&] { sink = sink + compute(units, nullptr); });
  for (const bool test : {false, true}) {
    const double both = best_of([&] {
      MPI_Request req;
      MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, arena.data(), counts.data(), at.data(), MPI_FLOAT,
                      MPI_COMM_WORLD, &req);
      int done = 0;
      sink = sink + compute(units, test ? std::function<void()>([&] {
        if (!done) MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      }) : nullptr);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    });
    std::printf("| overlap, %s | %d of %d | %lld | gather %.1f, compute %.1f, together %.1f | hidden %.0f%% |\n",
                test ? "MPI_Test 64 times" : "no MPI call while computing", comm.rank(), comm.size(),
                static_cast<long long>(n), gather * 1e3, work * 1e3, both * 1e3,
                100 * (gather + work - both) / gather);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace attnres;
  const std::string method = argc > 1 ? argv[1] : "";
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 50'000'000;
  if (method != "reduce-scatter" && method != "mpi-reduce-scatter" && method != "all-gather" && method != "overlap") {
    std::fprintf(stderr, "usage: mpirun -np N %s reduce-scatter|mpi-reduce-scatter|all-gather|overlap [FLOATS]\n",
                 argv[0]);
    return 2;
  }
  std::unique_ptr<Comm> comm = Comm::join();
  if (method == "overlap") return overlap(*comm, n);
  const Shards s(n, comm->size());
  std::vector<float> arena(static_cast<size_t>(n), 1.0f);          // [n] gradients or parameters
  std::vector<float> out(static_cast<size_t>(s.size(comm->rank())));  // MPI_Reduce_scatter's receive buffer
  std::vector<int> counts;
  for (int r = 0; r < comm->size(); ++r) counts.push_back(static_cast<int>(s.size(r)));
  const double before = peak_rss_mib();
  double best = 1e30;
  for (int call = 0; call < 5; ++call) {
    comm->barrier("bench");
    const double t0 = MPI_Wtime();
    if (method == "reduce-scatter") comm->reduce_scatter(arena.data(), s, "bench");
    else if (method == "all-gather") comm->all_gather(arena.data(), s, "bench");
    else MPI_Reduce_scatter(arena.data(), out.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    best = std::min(best, MPI_Wtime() - t0);
  }
  std::printf("| %s | %d of %d | %lld | %.1f | %+.0f |\n", method.c_str(), comm->rank(), comm->size(),
              static_cast<long long>(n), best * 1e3, peak_rss_mib() - before);
  return 0;
}
