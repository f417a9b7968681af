#!/usr/bin/env bash
# attnres generation (prefill, decode with a KV cache) against PyTorch, one run
# per config: bench/peers.sh's generate part (every PyTorch 2 configuration,
# the hand-written model and transformers' Qwen3, PyTorch 1.13 eager where
# installed); attnres's own line also gives the bandwidth bound.
# Usage: bench/compare_generate.sh [CONFIGS...]    (default: bench-small qwen3-0.6b)
# Env:   as bench/peers.sh (CONFIGS, OUT, NO_TORCH113)
set -euo pipefail
cd "$(dirname "$0")/.."
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(bench-small qwen3-0.6b)
for c in "${configs[@]}"; do
  GEN_CONFIG="$c" bench/peers.sh generate
done
