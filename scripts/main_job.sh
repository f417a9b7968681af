#!/usr/bin/env bash
# The main job — the paper in miniature: set everything up, prepare the
# built-in default corpus (real English text from Debian packages, tokenized
# with a BPE trained on it), then train the tiny-deep model (12 layers) in several routing
# modes on the same tokens in the same order from the same initial weights
# (`attnres compare`), measure each routed model's routing interventions,
# print the table, and write an HTML report.
#
# Usage: scripts/main_job.sh [--minutes M] [--tokens N] [--modes LIST] [--seeds S] [--config C] [--precision P]
#                            [--ranks R] [--zero Z]
#   --minutes M   wall-clock limit of the whole job (default 15); it only guards the
#                 limit: a run that would pass it is cut, its learning-rate decay completed
#   --tokens N    training tokens per run (default 524288: 128 steps of 16 × 256)
#   --modes LIST  default baseline,block,delta_block
#   --seeds S     runs per mode (default 2: the table gives each difference a paired 95% interval and a Holm-corrected p)
#   --config C    model preset or config.json (default tiny-deep: 12 layers of d 128)
#   --precision P fp32, bf16 or auto (default: bf16 where the CPU has bf16 matrix instructions)
#   --ranks R     train each run over R MPI ranks (compare --ranks; default 1)
#   --zero Z      with --ranks: ZeRO stage 1 or 3 (docs/distributed.md; default 1)
# A rerun resumes an unfinished job; a finished one is kept and a new
# directory (runs/main-DATE-TIME) is used.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=15 TOKENS=524288 MODES=baseline,block,delta_block SEEDS=2 CONFIG=tiny-deep PRECISION=auto RANKS=1 ZERO=1
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    --modes) MODES="$2"; shift 2 ;;
    --seeds) SEEDS="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --precision) PRECISION="$2"; shift 2 ;;
    --ranks) RANKS="$2"; shift 2 ;;
    --zero) ZERO="$2"; shift 2 ;;
    *) echo "main_job.sh: unknown argument $1 (use --minutes, --tokens, --modes, --seeds, --config, --precision," \
            "--ranks, --zero)" >&2
       exit 2 ;;
  esac
done
START=$(date +%s)

scripts/setup.sh --main
scripts/prepare_default_data.sh
scripts/fetch_vega.sh || echo "main_job: no Vega (npm unreachable?): the table is printed, the report page is not written"

# An unfinished job (compare.json without results.json) resumes; otherwise a new directory.
RUN=""
for d in $(ls -d runs/main-* 2>/dev/null | sort -r); do
  if [ -f "$d/compare.json" ] && [ ! -f "$d/results.json" ]; then RUN=$d; break; fi
done
[ -z "$RUN" ] && RUN=runs/main-$(date +%Y%m%d-%H%M%S)
LEFT=$(( MINUTES * 60 - ($(date +%s) - START) - 30 ))  # 30 s for the sample at the end
[ "$LEFT" -lt 120 ] && LEFT=120
echo "main_job: comparing $MODES x $SEEDS seeds on $TOKENS tokens each (--precision $PRECISION), within" \
  "$((LEFT / 60)) min $((LEFT % 60)) s, in $RUN"
build/attnres compare --config "$CONFIG" --modes "$MODES" --seeds "$SEEDS" --tokens "$TOKENS" --precision "$PRECISION" \
  --data data/default/train.bin --val-data data/default/val.bin --val-tokens 131072 \
  --batch 16 --seq-len 256 --lr 3e-3 --lr-min 3e-4 --interventions 8192 \
  --ranks "$RANKS" --zero "$ZERO" --minutes "$(awk "BEGIN {print $LEFT / 60}")" --out "$RUN"
# The checkpoints carry the corpus tokenizer: what the last mode's model writes.
LAST=$(echo "$MODES" | tr ',' '\n' | tail -1)
echo "main_job: a sample from $LAST (attnres generate, temperature 0.8, top-p 0.95):"
build/attnres generate --model "$RUN/$LAST-seed1337" --prompt "The Python interpreter" --max-new-tokens 48 \
  --temperature 0.8 --top-p 0.95 --seed 1
echo "main_job: done in $(( $(date +%s) - START )) s; table in $RUN/results.md, report in $RUN/report.html"
