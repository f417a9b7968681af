#!/usr/bin/env bash
# The collectives of a data-parallel step alone (bench/collectives.cpp): time
# and peak-RSS growth per rank of attnres's reduce-scatter (per-owner
# MPI_Reduce in pieces), of one MPI_Reduce_scatter, and of the all-gather;
# then whether a nonblocking all-gather progresses while a rank computes.
# Usage: bench/collectives.sh [FLOATS]      Env: RANKS (2)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-50000000}" RANKS="${RANKS:-2}"
[ -x build/attnres_bench_collectives ] || { echo "collectives.sh: build/attnres_bench_collectives missing (an MPI build: cmake -DATTNRES_MPI=ON)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(mpirun --version | head -1)"
echo "| method | rank | floats | fastest of 5 calls, ms | peak RSS growth, MiB |"
echo "|---|---|---|---|---|"
for m in reduce-scatter mpi-reduce-scatter all-gather overlap; do
  mpirun --oversubscribe -np "$RANKS" build/attnres_bench_collectives "$m" "$N" | sort -t'|' -k3
done
