#!/usr/bin/env bash
# attnres against PyTorch eager on bench-small, measured in one run on this
# machine, like against like: attnres fp32 against PyTorch fp32 (with
# OpenBLAS's AVX-512 kernels: OPENBLAS_CORETYPE=SkylakeX, which Debian's
# OpenBLAS does not pick by itself here), attnres bf16 against PyTorch under
# torch.autocast('cpu', dtype=torch.bfloat16).  Prints a Markdown table (tok/s
# and peak RSS per mode and precision, and the ratios).
#
# Usage: bench/compare.sh [MODES...]        (default: baseline)
#        bench/compare.sh all               (the five modes)
# Env:   STEPS (timed steps, default 3), TORCH_STEPS (default 2), NO_TORCH=1 to skip PyTorch,
#        PRECISION (fp32, bf16 or fp32,bf16; default: both where this CPU has bf16 products).
set -euo pipefail
cd "$(dirname "$0")/.."
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(baseline)
[ "${modes[0]}" = all ] && modes=(baseline block full delta delta_block)
STEPS="${STEPS:-3}"
TORCH_STEPS="${TORCH_STEPS:-2}"
if [ -z "${PRECISION:-}" ]; then
  PRECISION=fp32
  build/attnres bench --config bench-small --batch 1 --seq-len 8 --steps 1 --precision bf16 --peak-gflops 1 \
    --json >/dev/null 2>&1 && PRECISION=fp32,bf16
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
for m in "${modes[@]}"; do
  for p in ${PRECISION//,/ }; do
    build/attnres bench --config bench-small --mode "$m" --precision "$p" --steps "$STEPS" --json >>"$tmp"
    if [ -z "${NO_TORCH:-}" ]; then
      flag=""
      [ "$p" = bf16 ] && flag=--autocast
      OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/pytorch_bench.py --mode "$m" --steps "$TORCH_STEPS" $flag >>"$tmp"
    fi
  done
done
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ours = {(r["mode"], r["precision"]): r for r in rows if "impl" not in r}
torch = {(r["mode"], "bf16" if r["precision"] == "autocast-bf16" else "fp32"): r
         for r in rows if r.get("impl") == "pytorch-eager"}
gib = lambda b: b / 2**30
print("| mode | precision | attnres tok/s | attnres peak RSS | PyTorch | PyTorch tok/s | PyTorch peak RSS | speed-up "
      "| vs attnres baseline of the precision (tok/s, RSS) |")
print("|---|---|---|---|---|---|---|---|---|")
for (m, p), r in ours.items():
    t = torch.get((m, p))
    base = ours.get(("baseline", p))
    rel = f"{r['tok_per_s']/base['tok_per_s']:.2f}x, {r['peak_rss_bytes']/base['peak_rss_bytes']:.2f}x" if base else "-"
    name = "autocast bf16" if p == "bf16" else "fp32 (SkylakeX kernels)"
    print(f"| {m} | {p} | {r['tok_per_s']:.0f} | {gib(r['peak_rss_bytes']):.2f} GiB | {name} | "
          + (f"{t['tok_per_s']:.0f} | {gib(t['peak_rss_bytes']):.2f} GiB | {r['tok_per_s']/t['tok_per_s']:.2f}x" if t else "- | - | -")
          + f" | {rel} |")
print("\nattnres MFU (vs the peak of its precision, measured in the same run): "
      + ", ".join(f"{m} {p} {100*r['mfu']:.0f}% of {r['peak_gflops']:.0f} GFLOP/s" for (m, p), r in ours.items()))
PY
