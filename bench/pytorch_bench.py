#!/usr/bin/env python3
"""PyTorch peer for `attnres bench`: the same full training step (forward,
backward, clip, AdamW) on the same config, in every configuration a user
would try (bench/peer_configs.py: eager and torch.compile, float32 and bf16
autocast), each in a process of its own; prints one JSON line per
configuration, then the best per mode.

Two models:
- `--impl hand` (every mode): bench/pytorch_generate.py's model, written the
  way a PyTorch user writes it (nn.Linear(bias=False), an RMSNorm module,
  rotate_half RoPE, F.scaled_dot_product_attention with enable_gqa on
  PyTorch 2 — the explicit softmax on 1.13 —, the routing sources stacked as
  the reference code stacks them);
- `--impl transformers` (baseline only): the real `transformers`
  Qwen3ForCausalLM (attn_implementation "sdpa"), from a Qwen3Config of the
  same shape.
The step: full logits into F.cross_entropy, backward, clip_grad_norm_(1.0),
torch.optim.AdamW (betas 0.9/0.95, weight decay 0.1 on the matrices; fused
where PyTorch has it).  Compiled configurations compile the forward and the
loss together (torch.compile of one function; AOTAutograd compiles its
backward); the first step's extra time is reported as compile_s, apart from
the timed steps.  bf16 is torch.autocast('cpu', bfloat16) over float32
weights: bf16 products, float32 master weights, gradients and AdamW, what
attnres's --precision bf16 does.

    scripts/peers_python.sh bench/pytorch_bench.py --mode baseline [--impl hand|transformers]
        [--configs eager-fp32,eager-bf16,compile-fp32,compile-bf16] [--steps 3] [--threads 2]

On PyTorch 1.13 (Debian's python3-torch: /usr/bin/python3 bench/pytorch_bench.py)
only the eager configurations exist.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "peers"))
import peer_configs as PC  # noqa: E402
from peers import require  # noqa: E402

torch = require("torch")
import torch.nn.functional as F  # noqa: E402
import pytorch_generate as G  # noqa: E402


def transformers_model(cfg):
    """The real transformers Qwen3ForCausalLM of cfg's shape (float32, sdpa)."""
    transformers = require("transformers")
    hf = transformers.Qwen3Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"], tie_word_embeddings=cfg["tie_word_embeddings"],
        max_position_embeddings=cfg["max_position_embeddings"], attn_implementation="sdpa", use_cache=False)
    model = transformers.Qwen3ForCausalLM(hf)
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
    return model


def build(a, cfg):
    """The model and its named parameters."""
    if a.impl == "transformers":
        if a.mode != "baseline":
            raise SystemExit("--impl transformers: transformers has only the baseline (plain Qwen3)")
        model = transformers_model(cfg)
    else:
        model = G.ForCausalLM(cfg)
        G.init_random_(model, 0)
    return model


def is_decayed(name):
    """Matrices and embeddings decay; norms, routing vectors and gates do not
    (the oracle's rule; transformers' Qwen3 uses the same names)."""
    return G.oracle.is_decayed(name)


def make_optimizer(groups):
    """AdamW, fused where this PyTorch has a fused CPU AdamW (2.4+), else foreach."""
    try:
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8)


def time_steps(model, trainable, opt, V, a, execution, precision):
    """Runs warm-up + timed steps; returns (seconds of the timed steps,
    seconds of the first step, seconds of a timed step's mean, loss)."""
    def logits_of(ids):
        out = model(ids)
        return out.logits if hasattr(out, "logits") else out

    def loss_fn(inp, tgt):
        with PC.autocast(torch, precision):
            logits = logits_of(inp)
            return F.cross_entropy(logits.reshape(-1, V).float(), tgt.reshape(-1))

    loss_fn = PC.compiled(torch, loss_fn, execution)
    gen = torch.Generator().manual_seed(1)
    times, loss = [], float("nan")
    for s in range(a.warmup_steps + a.steps):
        ids = torch.randint(0, V, (a.batch, a.seq_len + 1), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    timed = times[a.warmup_steps:]
    step = sum(timed) / len(timed)
    return sum(timed), max(0.0, times[0] - step), float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(G.CONFIGS), default="bench-small")
    ap.add_argument("--impl", choices=("hand", "transformers"), default="hand")
    ap.add_argument("--mode", default="baseline")
    ap.add_argument("--num-blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", choices=("sdpa", "explicit"), default=G.ATTENTION)
    PC.add_args(ap)
    a = ap.parse_args()
    if PC.drive(a, os.path.abspath(__file__), key="tok_per_s", group=("mode", "precision")):
        return
    execution, precision = PC.parse(a.config_name)
    torch.set_num_threads(a.threads)
    G.set_attention(a.attention)
    cfg = dict(G.CONFIGS[a.config], attnres_mode=a.mode, attnres_num_blocks=a.num_blocks)
    model = build(a, cfg)
    named = dict(model.named_parameters())
    decay = [p for n, p in named.items() if is_decayed(n)]
    rest = [p for n, p in named.items() if not is_decayed(n)]
    opt = make_optimizer([{"params": decay, "lr": 1e-4, "weight_decay": 0.1},
                          {"params": rest, "lr": 1e-4, "weight_decay": 0.0}])
    seconds, compile_s, loss = time_steps(model, list(named.values()), opt, cfg["vocab_size"], a,
                                          execution, precision)
    print(json.dumps({"peer": PC.peer(torch, a.impl, a.config_name,
                                      attention=a.attention if a.impl == "hand" else "sdpa", env=PC.env_note()),
                      "mode": a.mode, "precision": precision, "config": a.config,
                      "tok_per_s": a.batch * a.seq_len * a.steps / seconds, "ms_per_step": 1e3 * seconds / a.steps,
                      "compile_s": compile_s, "peak_rss_bytes": PC.peak_rss_bytes(),
                      "B": a.batch, "T": a.seq_len, "threads": a.threads, "loss": loss}))


if __name__ == "__main__":
    main()
