#!/usr/bin/env bash
# attnres training against PyTorch on bench-small, one run, like precision
# against like: bench/peers.sh's train part (every PyTorch 2 configuration,
# transformers' Qwen3 for the baseline, PyTorch 1.13 eager where installed).
# Usage: bench/compare.sh [MODES...]   (default: baseline; all: the five modes)
# Env:   as bench/peers.sh (CONFIGS, STEPS, OUT, NO_TORCH113)
set -euo pipefail
cd "$(dirname "$0")/.."
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(baseline)
[ "${modes[0]}" = all ] && modes=(baseline block full delta delta_block)
MODES="${modes[*]}" exec bench/peers.sh train
