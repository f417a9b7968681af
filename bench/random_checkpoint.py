#!/usr/bin/env python3
"""Writes a Qwen3-shaped checkpoint with random weights (config.json +
model.safetensors, HF names), for memory and speed measurements of the
published shapes without downloading them.  Matrices N(0, 0.02), norm weights
1, as attnres initialises them.  Uses the oracle's safetensors writer.

    scripts/peers_python.sh bench/random_checkpoint.py --shape qwen3-0.6b --dtype BF16 --out /tmp/q06
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
np = require("numpy")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import oracle  # noqa: E402

SHAPES = {
    "bench-small": {"hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768,
                    "vocab_size": 8192, "max_position_embeddings": 4096, "tie_word_embeddings": True},
    "qwen3-0.6b": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                   "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="F32", choices=["F32", "BF16"])
    ap.add_argument("--mode", default="baseline")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = dict(SHAPES[a.shape], rms_norm_eps=1e-6, rope_theta=1e6, attnres_mode=a.mode,
               model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu", torch_dtype={"F32": "float32", "BF16": "bfloat16"}[a.dtype])
    # baseline: a plain Qwen3 config, as published.  Routed: every attnres key
    # written out (the oracle's defaults), so that readers that default
    # differently (attnres reads a missing attnres_block_delta as the released
    # code's) build the same model.
    cfg = oracle.full_config(cfg)
    if a.mode == "baseline":
        cfg = {k: v for k, v in cfg.items() if not k.startswith("attnres_")}
    rng = np.random.default_rng(a.seed)
    tensors = {}
    for name, shape in oracle.param_shapes(cfg):
        if len(shape) == 1:
            t = np.ones(shape, dtype=np.float32)
        else:
            t = (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if a.dtype == "BF16":  # round to nearest even, kept as the upper 16 bits
            u = t.view(np.uint32)
            t = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        tensors[name] = t
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if a.dtype == "BF16":
        # The oracle's writer knows no BF16: store the bits as U16, then relabel.
        oracle._NP_TO_ST[np.dtype(np.uint16).newbyteorder("<").str] = "BF16"
    oracle.write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, {"format": "pt"})
    print(f"wrote {a.out}: {sum(t.size for t in tensors.values())} parameters as {a.dtype}")


if __name__ == "__main__":
    main()
