#!/usr/bin/env bash
# The Qwen3-0.6B fine-tuning step of docs/performance.md, measured in one run:
# random BF16 weights in an HF directory (bench/random_checkpoint.py) converted
# to delta_block and fine-tuned at the paper's rates, B 1, T $T, two steps
# with a checkpoint after each, under /usr/bin/time: with and without
# --recompute, with --freeze-base, in each of $PRECISIONS; then PyTorch eager
# (bench/pytorch_finetune.py) doing the same step at T_TORCH (PyTorch eager
# needs more than this machine's 24 GiB at T 2048) beside attnres at the same
# T, like against like: fp32 against PyTorch fp32, bf16 against PyTorch under
# CPU bf16 autocast, each in eager and torch.compile on the peers' PyTorch 2
# (scripts/setup_peers.sh).  Prints one line per run.
#
# Usage: bench/finetune_0.6b.sh [WORKDIR]     (default /tmp/attnres_ft06; needs ~25 GB of disk)
# Env:   T (2048), T_TORCH (512), STEPS (2), RUNS (default "recompute no-recompute freeze-base compare"),
#        PRECISIONS (default "fp32 bf16")
set -euo pipefail
cd "$(dirname "$0")/.."
w="${1:-/tmp/attnres_ft06}"
T="${T:-2048}"
T_TORCH="${T_TORCH:-512}"
RUNS="${RUNS:-recompute no-recompute freeze-base compare}"
STEPS="${STEPS:-2}"
PRECISIONS="${PRECISIONS:-fp32 bf16}"
mkdir -p "$w"
[ -f "$w/bf16/model.safetensors" ] || scripts/peers_python.sh bench/random_checkpoint.py --shape qwen3-0.6b --dtype BF16 --out "$w/bf16"
[ -f "$w/train.bin" ] || scripts/peers_python.sh - "$w/train.bin" <<'PY'
import sys
import numpy as np
ids = np.random.default_rng(0).integers(0, 151936, 40000)
h = np.zeros(256, dtype="<i4"); h[:3] = [20240520, 2, len(ids)]
open(sys.argv[1], "wb").write(h.tobytes() + ids.astype("<u4").tobytes())
PY
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), T $T, $STEPS steps"
run() {  # name, precision, T, extra train flags...
  local name="$1" p="$2" T="$3"; shift 3
  rm -rf "$w/out_$name"
  /usr/bin/time -f "%M %e" -o "$w/time_$name" build/attnres train --init "$w/bf16" --data "$w/train.bin" \
    --out "$w/out_$name" --mode delta_block --num-blocks 4 --steps "$STEPS" --warmup 1 --batch 1 --seq-len "$T" \
    --lr 5e-5 --lr-routing 5e-3 --lr-min 5e-6 --ckpt-every 1 --precision "$p" "$@" >"$w/log_$name"
  local rss secs load toks
  read -r rss secs <"$w/time_$name"
  load=$(grep -o 'in [0-9.]* s' "$w/log_$name" | head -1)
  toks=$(grep '^step' "$w/log_$name" | tail -1 | grep -o '[0-9]* tok/s')
  printf '%-28s peak RSS %6.2f GiB | last step %s | load %s | wall %s s\n' "attnres $name" \
    "$(echo "$rss / 1048576" | bc -l)" "$toks" "$load" "$secs"
  rm -rf "$w/out_$name"  # 6.7 GB per checkpoint
}
for r in $RUNS; do
  for p in $PRECISIONS; do
    case "$r" in
      recompute) run "recompute-$p" "$p" "$T" --recompute ;;
      no-recompute) run "no-recompute-$p" "$p" "$T" ;;
      freeze-base) run "freeze-base-$p" "$p" "$T" --recompute --freeze-base ;;
      compare)
        run "T$T_TORCH-$p" "$p" "$T_TORCH"
        out=$(scripts/peers_python.sh bench/pytorch_finetune.py --config qwen3-0.6b --mode delta_block \
              --seq-len "$T_TORCH" --steps 1 --configs "eager-$p,compile-$p" 2>&1 | grep '"best"') || true
        echo "pytorch T$T_TORCH $p  $out" ;;
    esac
  done
done
