#!/usr/bin/env bash
# attnres against PyTorch eager on bench-small, measured in one run on this
# machine: prints a Markdown table (tok/s and peak RSS per mode, and ratios).
#
# Usage: bench/compare.sh [MODES...]        (default: baseline)
#        bench/compare.sh all               (the five modes)
# Env:   STEPS (timed steps, default 3), TORCH_STEPS (default 2), NO_TORCH=1 to skip PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(baseline)
[ "${modes[0]}" = all ] && modes=(baseline block full delta delta_block)
STEPS="${STEPS:-3}"
TORCH_STEPS="${TORCH_STEPS:-2}"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
for m in "${modes[@]}"; do
  build/attnres bench --config bench-small --mode "$m" --steps "$STEPS" --json >>"$tmp"
  if [ -z "${NO_TORCH:-}" ]; then
    /usr/bin/python3 bench/pytorch_bench.py --mode "$m" --steps "$TORCH_STEPS" >>"$tmp"
  fi
done
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ours = {r["mode"]: r for r in rows if "impl" not in r}
torch = {r["mode"]: r for r in rows if r.get("impl") == "pytorch-eager"}
gib = lambda b: b / 2**30
print("| mode | attnres tok/s | attnres peak RSS | PyTorch tok/s | PyTorch peak RSS | speed-up | vs attnres baseline (tok/s, RSS) |")
print("|---|---|---|---|---|---|---|")
base = ours.get("baseline")
for m, r in ours.items():
    t = torch.get(m)
    rel = f"{r['tok_per_s']/base['tok_per_s']:.2f}x, {r['peak_rss_bytes']/base['peak_rss_bytes']:.2f}x" if base else "-"
    print(f"| {m} | {r['tok_per_s']:.0f} | {gib(r['peak_rss_bytes']):.2f} GiB | "
          + (f"{t['tok_per_s']:.0f} | {gib(t['peak_rss_bytes']):.2f} GiB | {r['tok_per_s']/t['tok_per_s']:.1f}x" if t else "- | - | -")
          + f" | {rel} |")
print(f"\nattnres MFU (vs SGEMM 2048^3 measured in the same process): "
      + ", ".join(f"{m} {100*r['mfu']:.0f}% of {r['sgemm_peak_gflops']:.0f} GFLOP/s" for m, r in ours.items()))
PY
