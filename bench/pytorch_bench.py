#!/usr/bin/env python3
"""PyTorch eager baseline for `attnres bench`: the same full training step
(forward, backward, clip, AdamW) on the same config, in float32.

The model is tests/oracle/oracle.py's plain-torch implementation of DESIGN.md
(eager ops, HF-style attention with an explicit causal mask, stacked sources
for routing), run in float32 with 2 threads.  One mode per process, so the
peak RSS printed is that mode's own.  Prints one JSON line like
`attnres bench --json`.

    /usr/bin/python3 bench/pytorch_bench.py --mode baseline [--steps 3] [--threads 2]
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import oracle  # noqa: E402

BENCH_SMALL = {
    "hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "intermediate_size": 768, "vocab_size": 8192, "rms_norm_eps": 1e-6,
    "rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 4096,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="baseline")
    ap.add_argument("--num-blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = dict(BENCH_SMALL, attnres_mode=a.mode, attnres_num_blocks=a.num_blocks)
    params = {}
    for name, shape in oracle.param_shapes(cfg):
        t = torch.empty(shape, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        elif "res_proj" in name or "null_source" in name or "alpha" in name:
            t.zero_()
        else:
            t.normal_(0, 0.02)
        params[name] = t.requires_grad_()
    decay = [p for n, p in params.items() if oracle.is_decayed(n)]
    rest = [p for n, p in params.items() if not oracle.is_decayed(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    V = cfg["vocab_size"]
    seconds = 0.0
    for s in range(a.warmup_steps + a.steps):
        ids = torch.randint(0, V, (a.batch, a.seq_len))
        tg = torch.randint(0, V, (a.batch, a.seq_len))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = oracle.loss_of(oracle.forward(params, cfg, ids), tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        if s >= a.warmup_steps:
            seconds += time.perf_counter() - t0
    tok_s = a.batch * a.seq_len * a.steps / seconds
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__, "mode": a.mode, "tok_per_s": tok_s,
                      "ms_per_step": 1e3 * seconds / a.steps,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "B": a.batch, "T": a.seq_len, "threads": a.threads, "loss": float(loss)}))


if __name__ == "__main__":
    main()
