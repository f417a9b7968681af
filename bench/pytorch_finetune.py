#!/usr/bin/env python3
"""PyTorch peer for a fine-tuning step (`attnres train --init ...`), in every
configuration a user would try (bench/peer_configs.py), each in a process of
its own; one JSON line per configuration, then the best per mode and precision.

The model is bench/pytorch_generate.py's (--impl hand, every mode: a Qwen3
with depth routing written the way a PyTorch user writes it, SDPA attention
on PyTorch 2) or, for the baseline, the real transformers Qwen3ForCausalLM
(--impl transformers).  One step: the full logits, F.cross_entropy,
backward, clip_grad_norm_(1.0), AdamW (betas 0.9/0.95, weight decay 0.1 on
the matrices; fused where PyTorch has it) with the routing parameters in a
group of their own (--lr-routing) and, with --freeze-base, requires_grad only
on them — what the reference's train_finetune.py does.  Random weights; the
step's cost does not depend on their values.  Compiled configurations
compile the forward and the loss (see bench/pytorch_bench.py); compile_s is
reported apart.

    scripts/peers_python.sh bench/pytorch_finetune.py --config qwen3-0.6b --mode delta_block --seq-len 512
        [--impl hand|transformers] [--configs eager-fp32,eager-bf16,compile-fp32,compile-bf16]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_configs as PC  # noqa: E402
import pytorch_bench as PB  # noqa: E402

torch = PB.torch
G = PB.G


def is_routing(name):
    return "res_" in name or "null_source" in name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(G.CONFIGS), default="qwen3-0.6b")
    ap.add_argument("--impl", choices=("hand", "transformers"), default="hand")
    ap.add_argument("--mode", default="delta_block")
    ap.add_argument("--num-blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--lr-routing", type=float, default=5e-3)
    ap.add_argument("--freeze-base", action="store_true")
    ap.add_argument("--attention", choices=("sdpa", "explicit"), default=G.ATTENTION)
    PC.add_args(ap)
    a = ap.parse_args()
    if PC.drive(a, os.path.abspath(__file__), key="tok_per_s", group=("mode", "precision")):
        return
    execution, precision = PC.parse(a.config_name)
    torch.set_num_threads(a.threads)
    G.set_attention(a.attention)
    cfg = dict(G.CONFIGS[a.config], attnres_mode=a.mode, attnres_num_blocks=a.num_blocks)
    model = PB.build(a, cfg)
    named = dict(model.named_parameters())
    for n, p in named.items():
        p.requires_grad_(is_routing(n) or not a.freeze_base)
    groups = []
    for routing in (False, True):
        for decay in (True, False):
            ps = [p for n, p in named.items()
                  if p.requires_grad and is_routing(n) == routing and PB.is_decayed(n) == decay]
            if ps:
                groups.append({"params": ps, "lr": a.lr_routing if routing else a.lr,
                               "weight_decay": 0.1 if decay else 0.0})
    opt = PB.make_optimizer(groups)
    trainable = [p for g in groups for p in g["params"]]
    seconds, compile_s, loss = PB.time_steps(model, trainable, opt, cfg["vocab_size"], a, execution, precision)
    print(json.dumps({"peer": PC.peer(torch, a.impl, a.config_name,
                                      attention=a.attention if a.impl == "hand" else "sdpa", env=PC.env_note()),
                      "config": a.config, "mode": a.mode, "precision": precision, "freeze_base": a.freeze_base,
                      "B": a.batch, "T": a.seq_len, "threads": a.threads,
                      "tok_per_s": a.batch * a.seq_len * a.steps / seconds, "ms_per_step": 1e3 * seconds / a.steps,
                      "compile_s": compile_s, "peak_rss_bytes": PC.peak_rss_bytes(), "loss": loss}))


if __name__ == "__main__":
    main()
