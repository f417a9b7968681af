#!/usr/bin/env bash
# The whole test suite built with AddressSanitizer + UndefinedBehaviorSanitizer
# (g++, -O1) in build-asan/: any finding fails the test that triggered it.
# Usage: scripts/test_sanitizers.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null   # the packages (and the normal build the oracle tests compare against)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNRES_SANITIZE=ON -DATTNRES_WERROR=ON >/dev/null
cmake --build build-asan -j "$(nproc)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" "$@"
