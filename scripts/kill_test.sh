#!/usr/bin/env bash
# Kills a training run with SIGKILL at random moments (many of them during a
# checkpoint save), resumes it each time (`--resume` alone, on 1 or 2 threads
# in turn), and checks what docs/hardening.md
# promises: `latest` always names a complete checkpoint, a resumed run removes
# the unfinished directories, the log reads as one run, and the final
# checkpoint is byte-identical to an uninterrupted run's.
# Usage: scripts/kill_test.sh [KILLS (default 20)] [WORKDIR (default a new temp dir)]
set -euo pipefail
cd "$(dirname "$0")/.."
kills="${1:-20}"
w="${2:-$(mktemp -d)}"
bin=build/attnres
[ -x "$bin" ] || { echo "kill_test: build first (scripts/setup.sh)" >&2; exit 2; }
/usr/bin/python3 - "$w/train.bin" <<'PY'
import struct, sys, random
r = random.Random(3)
ids = [r.randrange(8192) for _ in range(200000)]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 2, len(ids), *([0] * 253)) + struct.pack("<%dI" % len(ids), *ids))
PY
flags=(--config tiny --data "$w/train.bin" --steps 150 --batch 4 --seq-len 64 --ckpt-every 1 --keep-checkpoints 0
       --threads 2 --peak-gflops 100)
"$bin" train "${flags[@]}" --out "$w/ref" >/dev/null
bad=0 mid_save=0 stray_seen=0
rm -rf "$w/run"
"$bin" train "${flags[@]}" --out "$w/run" >/dev/null 2>&1 &
pid=$!
for ((k = 1; k <= kills; ++k)); do
  sleep "0.$((RANDOM % 9 + 1))"
  ls -a "$w/run" 2>/dev/null | grep -q '^\.step_.*\.tmp\.' && mid_save=$((mid_save + 1))
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ls -a "$w/run" | grep -q '^\.step_.*\.tmp\.' && stray_seen=$((stray_seen + 1))
  if [ -f "$w/run/latest" ]; then
    d="$w/run/$(cat "$w/run/latest")"
    for f in config.json model.safetensors optimizer.safetensors trainer_state.json; do
      [ -s "$d/$f" ] || { echo "kill $k: latest names $d without $f"; bad=$((bad + 1)); }
    done
    # The run's settings come from its checkpoint; the thread count changes no bit.
    if [ "$(cat "$w/run/latest")" = step_00000150 ]; then true &
    else "$bin" train --resume "$w/run" --threads $((k % 2 + 1)) >/dev/null 2>&1 &
    fi
  else
    "$bin" train "${flags[@]}" --out "$w/run" --overwrite >/dev/null 2>&1 &  # killed before its first checkpoint: its log goes
  fi
  pid=$!
done
wait "$pid"
ls -a "$w/run" | grep -q '^\.step_.*\.tmp\.' && { echo "unfinished directories left after the last run"; bad=$((bad + 1)); }
cmp -s "$w/ref/step_00000150/model.safetensors" "$w/run/step_00000150/model.safetensors" ||
  { echo "final weights differ from the uninterrupted run"; bad=$((bad + 1)); }
cmp -s "$w/ref/step_00000150/optimizer.safetensors" "$w/run/step_00000150/optimizer.safetensors" ||
  { echo "final moments differ from the uninterrupted run"; bad=$((bad + 1)); }
lines=$(grep -c '"loss"' "$w/run/log.jsonl")
[ "$lines" -eq 150 ] || { echo "log.jsonl has $lines step lines for 150 steps"; bad=$((bad + 1)); }
echo "kill_test: $kills kills ($mid_save during a save, $stray_seen left an unfinished directory behind), $bad problems"
[ "$bad" -eq 0 ]
