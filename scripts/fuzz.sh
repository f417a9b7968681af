#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into build-fuzz/ and runs
# each for SECONDS_PER_TARGET seconds from its seed corpus (fuzz/corpus/<target>,
# copied: the seeds stay as committed).  Prints executions and findings per
# target; exits 1 if any target found a crash (the input is kept in build-fuzz/crashes/).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 30)] [TARGET...]
# Env:   FUZZ_SEED (libFuzzer's -seed; 0 = a random one, the default)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
shift || true
. scripts/apt_install_missing.sh
apt_install_missing fuzz clang libomp-dev libclang-rt-14-dev
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNRES_FUZZ=ON \
  -DATTNRES_TESTS=OFF >/dev/null
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_token_file fuzz_corpus)
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"
mkdir -p build-fuzz/crashes
failed=0
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  cp -r "fuzz/corpus/${t#fuzz_}/." "$work/"
  log=build-fuzz/$t.log
  if ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 OMP_NUM_THREADS=1 \
      "build-fuzz/$t" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=262144 -timeout=10 -seed="${FUZZ_SEED:-0}" \
      -artifact_prefix="build-fuzz/crashes/$t-" "$work" >"$log" 2>&1; then
    result=ok
  else
    result="FOUND A CRASH (see $log, input in build-fuzz/crashes/)"
    failed=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  [ -z "$execs" ] && execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  printf '%-18s %8s s  %10s executions  %-10s %s\n' "$t" "$secs" "${execs:-?}" "${cov:-}" "$result"
  rm -rf "$work"
done
exit $failed
