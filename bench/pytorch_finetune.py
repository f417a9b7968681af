#!/usr/bin/env python3
"""PyTorch eager baseline for a fine-tuning step (`attnres train --init ...`).

The model is bench/pytorch_generate.py's: a Qwen3 with depth routing written
the way a PyTorch user writes it (nn.Embedding, nn.Linear(bias=False), an
RMSNorm module, rotate_half RoPE, repeat_kv GQA, explicit causal softmax),
float32.  One step: the full logits, F.cross_entropy, backward,
clip_grad_norm_(1.0), torch.optim.AdamW (betas 0.9/0.95, weight decay 0.1 on
the matrices) with the routing parameters in a group of their own
(--lr-routing) and, with --freeze-base, requires_grad only on them — what the
reference's train_finetune.py does.  Random weights (pytorch_generate's init);
the step's cost does not depend on their values.

--autocast runs the forward and the loss under torch.autocast('cpu',
dtype=torch.bfloat16) — mixed precision the way a PyTorch user adds it: bf16
products, float32 weights, gradients and AdamW.

Prints one JSON line: tok/s over --steps timed steps after --warmup-steps,
and the process's peak RSS.

    /usr/bin/python3 bench/pytorch_finetune.py --config qwen3-0.6b --mode delta_block --seq-len 512 [--autocast]
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


def is_routing(name):
    return "res_" in name or "null_source" in name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(G.CONFIGS), default="qwen3-0.6b")
    ap.add_argument("--mode", default="delta_block")
    ap.add_argument("--num-blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--lr-routing", type=float, default=5e-3)
    ap.add_argument("--freeze-base", action="store_true")
    ap.add_argument("--autocast", action="store_true", help="CPU bf16 autocast for the forward and the loss")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = dict(G.CONFIGS[a.config], attnres_mode=a.mode, attnres_num_blocks=a.num_blocks)
    model = G.ForCausalLM(cfg)
    G.init_random_(model, 0)
    named = dict(model.named_parameters())
    for n, p in named.items():
        p.requires_grad_(is_routing(n) or not a.freeze_base)
    groups = []
    for routing in (False, True):
        for decay in (True, False):
            ps = [p for n, p in named.items()
                  if p.requires_grad and is_routing(n) == routing and G.oracle.is_decayed(n) == decay]
            if ps:
                groups.append({"params": ps, "lr": a.lr_routing if routing else a.lr,
                               "weight_decay": 0.1 if decay else 0.0})
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8)
    trainable = [p for g in groups for p in g["params"]]
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
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        del logits
        if s >= a.warmup_steps:
            seconds += time.perf_counter() - t0
    tokens = a.batch * a.seq_len * a.steps
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__, "config": a.config, "mode": a.mode,
                      "freeze_base": a.freeze_base, "autocast": a.autocast, "B": a.batch, "T": a.seq_len, "threads": a.threads,
                      "tok_per_s": tokens / seconds, "ms_per_step": 1e3 * seconds / a.steps,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "loss": float(loss)}))


if __name__ == "__main__":
    main()
