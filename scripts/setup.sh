#!/usr/bin/env bash
# Installs the Debian 12 packages attnres needs and builds it into build/.
# Usage: scripts/setup.sh          everything: the program, the tests and their tools
#        scripts/setup.sh --main   only what the main job needs (no GoogleTest, Node.js, MPI;
#                                  builds the attnres program alone)
#        ATTNRES_NATIVE=ON scripts/setup.sh   (-march=native, for benchmarks on this machine)
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN_ONLY=""
[ "${1:-}" = "--main" ] && MAIN_ONLY=1

BUILD_PACKAGES=(build-essential cmake ninja-build pkg-config
  libopenblas-openmp-dev libdnnl-dev libomp-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev zlib1g-dev
  python3 python3.11-doc dict-gcide)            # python3 reads bench JSON; the default corpus text
TEST_PACKAGES=(libgtest-dev python3-venv           # PyTorch and the other peers: scripts/setup_peers.sh
  python3-dev                                   # the Python package's module (pip install ., docs/python.md)
  libopenmpi-dev openmpi-bin                    # data-parallel training (mpirun) and its tests
  nodejs                                        # the oracle; tokenizer fixtures and Vega (npm)
  chromium)                                     # renders the HTML report in a test
PACKAGES=("${BUILD_PACKAGES[@]}")
[ -z "$MAIN_ONLY" ] && PACKAGES+=("${TEST_PACKAGES[@]}")

. scripts/apt_install_missing.sh
apt_install_missing setup "${PACKAGES[@]}"

# Options given in the environment are passed on; otherwise the build keeps
# what it was configured with (so the main job and the tests share one build).
opts=()
[ -n "${ATTNRES_NATIVE:-}" ] && opts+=(-DATTNRES_NATIVE="$ATTNRES_NATIVE")
[ -n "${ATTNRES_WERROR:-}" ] && opts+=(-DATTNRES_WERROR="$ATTNRES_WERROR")
if [ -n "$MAIN_ONLY" ]; then
  # Tests are configured only where GoogleTest is there already.
  is_installed libgtest-dev && opts+=(-DATTNRES_TESTS=ON) || opts+=(-DATTNRES_TESTS=OFF)
else
  opts+=(-DATTNRES_TESTS=ON -DATTNRES_MPI=ON -DATTNRES_DNNL=ON)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${opts[@]}" >/dev/null
if [ -n "$MAIN_ONLY" ]; then
  cmake --build build -j "$(nproc)" --target attnres
else
  cmake --build build -j "$(nproc)"
fi
