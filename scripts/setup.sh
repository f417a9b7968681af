#!/usr/bin/env bash
# Installs the Debian 12 packages attnres needs and builds it into build/.
# Usage: scripts/setup.sh            (portable build)
#        ATTNRES_NATIVE=ON scripts/setup.sh   (-march=native, for benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config
  libopenblas-openmp-dev libomp-dev nlohmann-json3-dev libpcre2-dev
  libutf8proc-dev zlib1g-dev libgtest-dev
  python3 python3-torch python3-numpy
  nodejs python3.11-doc dict-gcide)  # tokenizer fixtures (npm); default corpus text

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Options given in the environment are passed on; otherwise the build keeps
# what it was configured with (so the main job and the tests share one build).
opts=()
[ -n "${ATTNRES_NATIVE:-}" ] && opts+=(-DATTNRES_NATIVE="$ATTNRES_NATIVE")
[ -n "${ATTNRES_WERROR:-}" ] && opts+=(-DATTNRES_WERROR="$ATTNRES_WERROR")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${opts[@]}" >/dev/null
cmake --build build -j "$(nproc)"
