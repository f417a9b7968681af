#!/usr/bin/env bash
# Data parallel against threads, on this machine: `attnres train` of one
# config on the default corpus, the same global batch either way —
#   1 rank  x THREADS threads x batch 2B        (attnres train)
#   RANKS ranks x 1 thread each x batch B each  (mpirun -np RANKS attnres train)
# run alternately ROUNDS times; prints per run the median tok/s of the steps
# after the first two, the median communication time per step (the
# reduce-scatter, the exchange of scalars and the all-gather, waiting for the
# slower rank included), and the peak RSS of each process; then the ratio of
# the medians.
#
# Usage: bench/data_parallel.sh [CONFIG]     (default bench-small)
# Env:   BATCH (per rank, default 4), SEQ (512), STEPS (10), ROUNDS (2), RANKS (2), THREADS (RANKS), MODE (delta_block),
#        SAVE (false; true: the final checkpoint holds the AdamW moments, so the peak RSS includes writing them),
#        ATTNRES (the binary, default build/attnres)
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${1:-bench-small}"
BATCH="${BATCH:-4}" SEQ="${SEQ:-512}" STEPS="${STEPS:-10}" ROUNDS="${ROUNDS:-2}" RANKS="${RANKS:-2}"
THREADS="${THREADS:-$RANKS}" MODE="${MODE:-delta_block}" SAVE="${SAVE:-false}" ATTNRES="${ATTNRES:-build/attnres}"
command -v mpirun >/dev/null || { echo "data_parallel.sh: no mpirun (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
[ -f data/default/train.bin ] || scripts/prepare_default_data.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
common=(train --config "$CONFIG" --mode "$MODE" --data data/default/train.bin --steps "$STEPS" --seq-len "$SEQ"
        --save-optimizer "$SAVE" --peak-gflops 100 --warmup 2)
summary() {  # log.jsonl -> "tok/s comm_ms rss_list"
  /usr/bin/python3 - "$1" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [j for j in lines if "tok_per_s" in j and j["step"] > 2]
rss = next(j["peak_rss_bytes_per_rank"] for j in lines if "peak_rss_bytes_per_rank" in j)
rss = "/".join(str(b >> 20) for b in rss)
comm = statistics.median(j.get("comm_ms", 0) for j in steps)
print(f"{statistics.median(j['tok_per_s'] for j in steps):.0f} {comm:.0f} {rss}")
EOF
}
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $ATTNRES: $CONFIG $MODE, global batch $((RANKS * BATCH)) x $SEQ tokens, $STEPS steps (median of steps 3-$STEPS), $ROUNDS rounds, optimizer saved: $SAVE"
echo "| run | round | tok/s | comm ms/step | peak RSS MiB per process |"
echo "|---|---|---|---|---|"
one=() many=()
for round in $(seq 1 "$ROUNDS"); do
  out="$w/one-$round"
  "$ATTNRES" "${common[@]}" --threads "$THREADS" --batch $((RANKS * BATCH)) --out "$out" >/dev/null
  read -r tok comm rss <<<"$(summary "$out/log.jsonl")"
  echo "| 1 rank x $THREADS threads, batch $((RANKS * BATCH)) | $round | $tok | - | $rss |"
  one+=("$tok")
  out="$w/many-$round"
  mpirun --oversubscribe -np "$RANKS" "$ATTNRES" "${common[@]}" --threads 1 --batch "$BATCH" --out "$out" >/dev/null
  read -r tok comm rss <<<"$(summary "$out/log.jsonl")"
  echo "| $RANKS ranks x 1 thread, batch $BATCH each | $round | $tok | $comm | $rss |"
  many+=("$tok")
done
/usr/bin/python3 -c "
import statistics, sys
a = statistics.median([float(x) for x in sys.argv[1].split()]); b = statistics.median([float(x) for x in sys.argv[2].split()])
print(f'median tok/s: 1 rank x $THREADS threads {a:.0f}, $RANKS ranks x 1 thread {b:.0f}: ratio {b / a:.3f}')
" "${one[*]}" "${many[*]}"
