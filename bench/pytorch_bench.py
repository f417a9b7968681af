#!/usr/bin/env python3
"""PyTorch eager baseline for `attnres bench`: the same full training step
(forward, backward, clip, AdamW) on the same config.

The model is bench/pytorch_generate.py's, written the way a PyTorch user
writes it: HF-style nn.Modules (nn.Embedding, nn.Linear(bias=False), an
RMSNorm module, rotate_half RoPE, repeat_kv GQA, explicit causal softmax, the
routing sources stacked), its full logits into F.cross_entropy, then
clip_grad_norm_(1.0) and torch.optim.AdamW (betas 0.9/0.95, weight decay 0.1
on the matrices).  float32, or with --autocast the forward and the loss under
torch.autocast('cpu', dtype=torch.bfloat16): bf16 products, float32 weights,
gradients and optimizer — the one line a user adds for mixed precision.  One
mode per process, so the peak RSS printed is that mode's own.  Prints one
JSON line like `attnres bench --json`.

Run it with OPENBLAS_CORETYPE=SkylakeX (bench/compare.sh does): Debian's
OpenBLAS picks slow generic kernels on CPUs it does not know, in PyTorch too.

    /usr/bin/python3 bench/pytorch_bench.py --mode baseline [--steps 3] [--threads 2] [--autocast]
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_generate as G  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(G.CONFIGS), default="bench-small")
    ap.add_argument("--mode", default="baseline")
    ap.add_argument("--num-blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--autocast", action="store_true", help="CPU bf16 autocast for the forward and the loss")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = dict(G.CONFIGS[a.config], attnres_mode=a.mode, attnres_num_blocks=a.num_blocks)
    model = G.ForCausalLM(cfg)
    G.init_random_(model, 0)
    named = dict(model.named_parameters())
    decay = [p for n, p in named.items() if G.oracle.is_decayed(n)]
    rest = [p for n, p in named.items() if not G.oracle.is_decayed(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    V = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    seconds, loss = 0.0, float("nan")
    for s in range(a.warmup_steps + a.steps):
        ids = torch.randint(0, V, (a.batch, a.seq_len + 1), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with G.autocast(a.autocast):
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(named.values()), 1.0)
        opt.step()
        del logits
        if s >= a.warmup_steps:
            seconds += time.perf_counter() - t0
    tok_s = a.batch * a.seq_len * a.steps / seconds
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__, "mode": a.mode,
                      "precision": "autocast-bf16" if a.autocast else "fp32", "tok_per_s": tok_s,
                      "ms_per_step": 1e3 * seconds / a.steps,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "B": a.batch, "T": a.seq_len, "threads": a.threads, "loss": float(loss)}))


if __name__ == "__main__":
    main()
