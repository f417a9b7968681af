#!/usr/bin/env python3
"""Markdown tables from bench/peers.sh's JSONL: per part, mode and precision,
attnres against every PyTorch configuration, the best PyTorch 2 one named,
and attnres over that best (like precision against like).

    /usr/bin/python3 bench/peers_table.py /tmp/attnres_peers.jsonl
"""
import json
import sys

KEYS = {"train": ("tok_per_s", "tok/s"), "finetune": ("tok_per_s", "tok/s"),
        "generate": ("prefill_tok_per_s", "prefill tok/s"), "tasks": ("requests_per_s", "requests/s")}
TITLES = {"train": "bench-small training step (B 8, T 512), tok/s",
          "finetune": "Qwen3-0.6B-shaped training step (B 1, T 512), tok/s",
          "generate": "Qwen3-0.6B-shaped inference: prefill (512 tokens) tok/s; decode batch 1 tok/s",
          "tasks": "eval-tasks scoring (the mode column names the model shape), 8 tasks, batch 8, requests/s"}


def label(r):
    p = r["peer"]
    if p["name"] == "attnres":
        return "attnres"
    major = p["torch"].split("+")[0]
    impl = "transformers" if p["impl"] == "transformers" else "hand"
    return f"torch {major} {impl} {p['config'].split('-')[0]}"


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    head = next((r["header"] for r in rows if "header" in r), {})
    if head:
        print(f"# {head['date']}: {head['cpu']} ({head['isa']}), {head['cores']} cores, load {head['load']}, "
              f"commit {head['commit']}; PyTorch {head['torch2']} and {head['torch113']}; "
              f"OPENBLAS_CORETYPE={head['OPENBLAS_CORETYPE'] or 'unset'}, "
              f"OPENBLAS_L2_SIZE={head['OPENBLAS_L2_SIZE'] or 'unset'}\n")
    errors = [r for r in rows if "error" in r]
    for part, (key, unit) in KEYS.items():
        recs = [r for r in rows if r.get("part") == part and key in r and "peer" in r]
        if not recs:
            continue
        print(f"## {TITLES[part]}\n")
        print(f"| mode | precision | attnres | PyTorch configurations ({unit}) | best PyTorch 2 | attnres / best "
              "| peak RSS GiB, attnres / best |" + (" decode b1: attnres / best PyTorch 2 |" if part == "generate" else ""))
        print("|---|---|---|---|---|---|---|" + ("---|" if part == "generate" else ""))
        groups = {}
        for r in recs:
            groups.setdefault((r.get("mode", "baseline"), r["precision"]), []).append(r)
        for (mode, prec), rs in groups.items():
            ours = [r for r in rs if r["peer"]["name"] == "attnres"]
            peers = [r for r in rs if r["peer"]["name"] == "pytorch"]
            v2 = [r for r in peers if not r["peer"]["torch"].startswith("1.")]
            best = max(v2, key=lambda r: r[key]) if v2 else None
            a = ours[0][key] if ours else None
            cells = ", ".join(f"{label(r)} {r[key]:.0f}" + (f" (compile {r['compile_s']:.0f} s)"
                                                            if r.get("compile_s", 0) > 1 and not r["peer"]["config"].startswith("eager") else "")
                              for r in sorted(peers, key=lambda r: -r[key]))
            ratio = f"**{a / best[key]:.2f}x**" if a and best else "-"
            gib = lambda r: f"{r['peak_rss_bytes'] / 2**30:.2f}" if r and "peak_rss_bytes" in r else "-"
            rss = f"{gib(ours[0] if ours else None)} / {gib(best)}"
            line = (f"| {mode} | {prec} | {a:.0f} | {cells} | {label(best) + ' ' + format(best[key], '.0f') if best else '-'}"
                    f" | {ratio} | {rss} |") if a else f"| {mode} | {prec} | - | {cells} | - | - | {rss} |"
            if part == "generate":
                k = "decode_tok_per_s_b1"
                bd = max((r for r in v2 if r.get(k) is not None), key=lambda r: r[k], default=None)  # --prefill-only: none
                line += (f" {ours[0][k]:.1f} / {bd[k]:.1f} ({label(bd)}) = {ours[0][k] / bd[k]:.2f}x |"
                         if ours and bd else " - |")
            print(line)
        print()
    if errors:
        print("Configurations that did not run: " + "; ".join(f"{r['config_name']}: {r['error']}" for r in errors))


if __name__ == "__main__":
    main()
