#!/usr/bin/env bash
# attnres generation against PyTorch eager with a KV cache, measured in one run
# on this machine: prints a Markdown table (prefill, decode at batch 1 and 8,
# peak RSS; attnres over PyTorch) per config and precision: fp32 against
# PyTorch fp32 (OPENBLAS_CORETYPE=SkylakeX), bf16 against PyTorch with its
# modules in torch.bfloat16 (as HF's from_pretrained(torch_dtype=bfloat16)).
#
# Usage: bench/compare_generate.sh [CONFIGS...]    (default: tiny bench-small qwen3-0.6b)
# Env:   MODE (default baseline), PRECISIONS (default "fp32 bf16"), NO_TORCH=1 to skip PyTorch,
#        PROMPT_LEN (512), DECODE_PROMPT_LEN (64), NEW_TOKENS (32)
set -euo pipefail
cd "$(dirname "$0")/.."
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(tiny bench-small qwen3-0.6b)
MODE="${MODE:-baseline}"
PRECISIONS="${PRECISIONS:-fp32 bf16}"
lens=(--prompt-len "${PROMPT_LEN:-512}" --decode-prompt-len "${DECODE_PROMPT_LEN:-64}" --new-tokens "${NEW_TOKENS:-32}")
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg), mode $MODE"
for c in "${configs[@]}"; do
  for p in $PRECISIONS; do
    build/attnres bench --generate --config "$c" --precision "$p" --mode "$MODE" "${lens[@]}" --json >>"$tmp"
    if [ -z "${NO_TORCH:-}" ]; then
      OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/pytorch_generate.py --config "$c" --dtype "${p/fp32/f32}" \
        --mode "$MODE" --num-blocks 8 "${lens[@]}" >>"$tmp"
    fi
  done
done
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ours = {(r["config"], r["precision"]): r for r in rows if "impl" not in r}
torch = {(r["config"], "fp32" if r["dtype"] == "f32" else r["dtype"]): r for r in rows if r.get("impl") == "pytorch-eager"}
gib = lambda b: b / 2**30
print("| config | precision | prefill tok/s (attnres / PyTorch) | decode b1 tok/s | decode b8 tok/s | peak RSS GiB | b1 vs bandwidth bound | attnres prefill vs its training forward |")
print("|---|---|---|---|---|---|---|---|")
def pair(a, t, key, fmt="{:.1f}"):
    if t is None or key not in t:
        return fmt.format(a[key]) + " / -"
    return f"{fmt.format(a[key])} / {fmt.format(t[key])} ({a[key] / t[key]:.1f}x)"
for k, r in ours.items():
    t = torch.get(k)
    rss = f"{gib(r['peak_rss_bytes']):.2f} / " + (f"{gib(t['peak_rss_bytes']):.2f}" if t else "-")
    tf = f"{r['prefill_tok_per_s'] / r['train_forward_tok_per_s']:.2f}x" if "train_forward_tok_per_s" in r else "-"
    print(f"| {k[0]} | {k[1]} | {pair(r, t, 'prefill_tok_per_s')} | {pair(r, t, 'decode_tok_per_s_b1')} | "
          f"{pair(r, t, 'decode_tok_per_s_b8')} | {rss} | {r['b1_bound_ratio']:.2f}x of {r['bound_tok_per_s']:.1f} tok/s | {tf} |")
PY
