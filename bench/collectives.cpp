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
#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  using namespace attnres;
  const std::string method = argc > 1 ? argv[1] : "";
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 50'000'000;
  if (method != "reduce-scatter" && method != "mpi-reduce-scatter" && method != "all-gather") {
    std::fprintf(stderr, "usage: mpirun -np N %s reduce-scatter|mpi-reduce-scatter|all-gather [FLOATS]\n", argv[0]);
    return 2;
  }
  std::unique_ptr<Comm> comm = Comm::join();
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
