#!/usr/bin/env bash
# `attnres eval-tasks` against PyTorch scoring the same requests the way
# lm-evaluation-harness does: bench/peers.sh's tasks part, one run.
# Usage: bench/compare_tasks.sh [CONFIGS...]     (default: bench-small qwen3-0.6b)
# Env:   as bench/peers.sh (CONFIGS, DOCS, OUT, NO_TORCH113)
set -euo pipefail
cd "$(dirname "$0")/.."
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(bench-small qwen3-0.6b)
TASK_CONFIGS="${configs[*]}" exec bench/peers.sh tasks
