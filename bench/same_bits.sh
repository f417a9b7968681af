#!/usr/bin/env bash
# Whether two builds (or two devices) compute the same bits: the workflow of
# every routing mode in fp32 and bf16 — train 6 steps with validation, routing
# statistics and checkpoints every 3, resume from step 3 to 8, then eval,
# routing statistics, greedy and sampled generation and eval-tasks of the
# final checkpoint — run by each side on the same small corpus, and every file
# written (checkpoints byte for byte; logs and JSON outputs without the
# fields that time the run, and without "device") compared.
#
# Usage: bench/same_bits.sh OLD_BIN NEW_BIN [OLD_DEVICE [NEW_DEVICE]]
#   bench/same_bits.sh /tmp/before/build/attnres build/attnres   a change against the build before it
#   bench/same_bits.sh build/attnres build/attnres cpu cpu-guarded   the guarded device against the CPU
# Env: WORK (default: a temporary directory, removed at the end), PRECISIONS (default "fp32 bf16" where the
#      CPU has bf16 products).  OPENBLAS_CORETYPE is unset: it changes SGEMM's kernels, so fp32's bits.
# Exit status 0 when every file is the same, 1 otherwise (the differing files listed).
# NEW_KEYS="key=value,…": JSON keys the new build writes and the old one did
# not (a format that gained a field); dropped where they hold that value, e.g.
# NEW_KEYS=attnres_num_heads=1.  MODES="…": the modes run (default the five;
# two devices of one build can also run block_mh full_mh delta_mh).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$(realpath "$1") NEW=$(realpath "$2") OLD_DEV="${3:-cpu}" NEW_DEV="${4:-${3:-cpu}}"
WORK="${WORK:-}"
if [ -z "$WORK" ]; then WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
unset OPENBLAS_CORETYPE
mkdir -p "$WORK/txt" "$WORK/tasks"
cp /usr/share/doc/python3.11/html/_sources/library/[a-c]*.txt "$WORK/txt/"   # about 1.3 MB of text
"$NEW" prepare --input "$WORK/txt" --out "$WORK/data" --vocab-size 1024 --val-fraction 0.05 --seed 1 >/dev/null 2>&1
python3 - "$WORK" <<'EOF'
import json, sys
w = sys.argv[1]
tok = json.load(open(f"{w}/data/tokenizer.json"))
V = max([i + 1 for i in tok["model"]["vocab"].values()] + [t["id"] + 1 for t in tok["added_tokens"]])
json.dump({"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "intermediate_size": 384, "vocab_size": V, "max_position_embeddings": 4096},
          open(f"{w}/config.json", "w"))
with open(f"{w}/tasks/mc_x.jsonl", "w") as f:
    for i in range(6):
        f.write(json.dumps({"context": f"The function {i} returns", "choices": [" a list", " the value", " None"],
                            "gold": i % 3}) + "\n")
EOF
if [ -z "${PRECISIONS:-}" ]; then
  PRECISIONS=fp32
  "$NEW" bench --measure bf16 >/dev/null 2>&1 && PRECISIONS="fp32 bf16"
fi

flow() {  # BIN OUT DEVICE
  local bin=$1 out=$2 dev=$3 d=$WORK/data r
  mkdir -p "$out"
  for p in $PRECISIONS; do
    for m in ${MODES:-baseline block full delta delta_block}; do
      r=$out/$m-$p
      local on=(--device "$dev" --precision "$p")
      "$bin" train --config "$WORK/config.json" --mode "$m" --data "$d/train.bin" --val-data "$d/val.bin" --out "$r" \
        --steps 6 --ckpt-every 3 --val-every 3 --routing-every 2 --batch 2 --seq-len 64 --threads 2 \
        "${on[@]}" >"$r.train.txt" 2>&1
      "$bin" train --resume "$r/step_00000003" --out "$r" --steps 8 --device "$dev" >"$r.resume.txt" 2>&1
      "$bin" eval --model "$r" --data "$d/val.bin" --seq-len 64 --batch 2 --json --quiet "${on[@]}" >"$r.eval.json"
      [ "$m" = baseline ] ||
        "$bin" routing --model "$r" --data "$d/val.bin" --seq-len 64 --batch 2 --json --quiet "${on[@]}" >"$r.routing.json"
      "$bin" generate --model "$r" --prompt "The function" --max-new-tokens 12 --json "${on[@]}" >"$r.greedy.json"
      "$bin" generate --model "$r" --prompt "The function" --max-new-tokens 12 --temperature 1 --seed 3 --json \
        "${on[@]}" >"$r.sampled.json"
      "$bin" eval-tasks --model "$r" --data-dir "$WORK/tasks" --tasks mc:mc_x --json --quiet "${on[@]}" >"$r.tasks.json"
    done
  done
}
echo "same_bits: $OLD ($OLD_DEV) against $NEW ($NEW_DEV); precisions: $PRECISIONS; in $WORK" >&2
flow "$OLD" "$WORK/old" "$OLD_DEV"
flow "$NEW" "$WORK/new" "$NEW_DEV"

python3 - "$WORK/old" "$WORK/new" <<'EOF'
import hashlib, json, os, sys
A, B = sys.argv[1], sys.argv[2]
NEW_KEYS = dict(kv.split("=", 1) for kv in os.environ.get("NEW_KEYS", "").split(",") if kv)
def timeless(o):
    if isinstance(o, dict):
        return {k: timeless(v) for k, v in o.items()
                if not (k in NEW_KEYS and json.dumps(v) == NEW_KEYS[k])
                and k not in ("ms", "mfu", "device", "peak_gflops") and "second" not in k and "tok_per_s" not in k
                and "rss" not in k}
    if isinstance(o, list):
        return [timeless(v) for v in o]
    if isinstance(o, str):
        return o.replace(A, "RUN").replace(B, "RUN")
    return o
def content(p):
    if p.endswith(".jsonl"):
        return [timeless(json.loads(line)) for line in open(p)]
    if p.endswith(".json"):
        return timeless(json.load(open(p)))
    return hashlib.sha256(open(p, "rb").read()).hexdigest()
n = bad = 0
for root, _, files in os.walk(A):
    for f in sorted(files):
        if f.endswith(".txt") or f == ".lock":
            continue
        a = os.path.join(root, f)
        b = os.path.join(B, os.path.relpath(a, A))
        n += 1
        if not os.path.exists(b) or content(a) != content(b):
            print("differs:", os.path.relpath(a, A))
            bad += 1
print(f"same_bits: {n} files compared, {bad} differ")
sys.exit(1 if bad else 0)
EOF
