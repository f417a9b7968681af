#!/usr/bin/env bash
# The main job: set everything up, prepare the built-in default corpus (real
# English text from Debian packages, tokenized with a BPE trained on it), train
# the default tiny model for the time budget, print validation perplexity, and
# let the trained model continue a prompt.
#
# Usage: scripts/main_job.sh [--minutes M] [--mode MODE]
#   --minutes M   wall-clock budget for the whole job (default 15); scales the run
#   --mode MODE   attnres_mode: baseline (default), block, full, delta, delta_block
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=15
MODE=baseline
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES="$2"; shift 2 ;;
    --mode) MODE="$2"; shift 2 ;;
    *) echo "main_job.sh: unknown argument $1 (use --minutes M, --mode MODE)" >&2; exit 2 ;;
  esac
done
START=$(date +%s)

scripts/setup.sh --main
scripts/prepare_default_data.sh

# Size the run to the time left: measure this machine's training speed on the
# tiny config first, keep a margin for validation and saving.
B=16; T=256
ELAPSED=$(( $(date +%s) - START ))
TRAIN_S=$(( MINUTES * 60 - ELAPSED - 90 ))  # margin: final validation and checkpoint
if [ "$TRAIN_S" -lt 60 ]; then TRAIN_S=60; fi
TOK_S=$(build/attnres bench --config tiny --mode "$MODE" --batch $B --seq-len $T --steps 2 --peak-gflops 1 --json \
        | python3 -c 'import json,sys; print(int(json.loads(sys.stdin.readline())["tok_per_s"]))')
STEPS=$(( TRAIN_S * TOK_S * 9 / 10 / (B * T) ))
if [ "$STEPS" -lt 20 ]; then STEPS=20; fi
echo "main_job: ${TOK_S} tok/s measured; training $STEPS steps of $((B * T)) tokens (~${TRAIN_S} s budget)"

RUN=runs/main-$MODE
rm -rf "$RUN"
build/attnres train --config tiny --mode "$MODE" \
  --data data/default/train.bin --val-data data/default/val.bin --val-tokens 500000 \
  --out "$RUN" --steps "$STEPS" --batch $B --seq-len $T --lr 3e-3 --lr-min 3e-4 --warmup $((STEPS / 20 + 1)) \
  --val-every $((STEPS / 3 + 1)) --time-budget "$TRAIN_S"
# The checkpoint carries the corpus tokenizer: a sample of what the model writes.
echo "main_job: a sample (attnres generate, temperature 0.8, top-p 0.95):"
build/attnres generate --model "$RUN" --prompt "The Python interpreter" --max-new-tokens 48 \
  --temperature 0.8 --top-p 0.95 --seed 1
echo "main_job: done in $(( $(date +%s) - START )) s; checkpoint and log.jsonl in $RUN"
