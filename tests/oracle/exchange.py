"""Checkpoint exchange with the reference code, both directions, against the oracle.

Usage: /usr/bin/python3 tests/oracle/exchange.py --attnres build/attnres

1. Reference -> attnres.  Model directories written the way the reference
   code's `save_pretrained` writes them (tests/oracle/README.md §1, §7):
   `model_type: "qwen3_attnres"`, `architectures: ["Qwen3AttnResForCausalLM"]`,
   its attnres keys only (no `attnres_block_delta`, no `attnres_query_init`;
   one case without `attnres_mode`), BF16 tensors, 0-dim gates, null-source
   tensors also in block mode (where nothing reads them), one case sharded
   the hub's way (index + two shards).  `attnres eval` must give the oracle's
   loss computed under the reference's semantics (missing attnres_block_delta
   = "reference", missing attnres_mode = "block"); the test also checks that
   the other reading would have been caught.

2. attnres -> reference.  `attnres train` writes a checkpoint (F32 and BF16)
   and `attnres export` a sharded BF16 directory; each is loaded here with the
   reference's loading rules — dispatch on model_type, the reference's
   defaults for absent attnres keys, the state dict loaded strictly (every
   expected tensor present with its shape, nothing unexpected) — and the
   oracle's loss equals `attnres eval`'s on the same tokens.  The block delta
   is taken from attnres_block_delta where the file has it: the released code
   ignores that key, so only `reference` checkpoints reproduce there (the
   docs and `attnres export` say so).

Exit status 1 on any mismatch.  Takes a few seconds.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle as O  # noqa: E402

TOL = 2e-5  # float32 engine against the float64 oracle, same weights: measured |diff| <= 3e-7
T = 32

BASE = {
    "hidden_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 80, "vocab_size": 97, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 64,
}

# What a Qwen3Config carries besides the shape (informational here).
HF_EXTRA = {
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
    "rope_scaling": None, "sliding_window": None, "use_sliding_window": False, "max_window_layers": 6,
    "use_cache": True, "bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.57.0",
}


# ---------------------------------------------------------------------------
# BF16 safetensors (the oracle's writer covers numpy dtypes only)
# ---------------------------------------------------------------------------

def to_bf16_bits(a):
    """float32 -> bfloat16 bits, round to nearest even (finite inputs)."""
    a = np.asarray(a, dtype=np.float32)
    u = a.reshape(-1).view(np.uint32).astype(np.uint64)
    s16, one = np.uint64(16), np.uint64(1)
    rounded = (u + np.uint64(0x7FFF) + ((u >> s16) & one)) >> s16
    return rounded.astype(np.uint16).reshape(a.shape)


def bf16_round(a):
    bits = to_bf16_bits(a)
    return (bits.reshape(-1).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(bits.shape)


def write_bf16_safetensors(path, tensors):
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        arr = np.asarray(tensors[name], dtype=np.float32)
        raw = to_bf16_bits(arr).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(chunks))


def write_token_file(path, ids):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 2, len(ids)]
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(ids, dtype="<u4").tobytes())


# ---------------------------------------------------------------------------
# The reference's side
# ---------------------------------------------------------------------------

def reference_config(mode, num_blocks, gate, null, with_mode_key=True):
    c = dict(BASE, **HF_EXTRA)
    c.update({"architectures": ["Qwen3AttnResForCausalLM"], "model_type": "qwen3_attnres",
              "torch_dtype": "bfloat16", "attnres_num_blocks": num_blocks, "attnres_gate_type": gate,
              "attnres_use_null_source": null})
    if with_mode_key:
        c["attnres_mode"] = mode
    return c


def reference_state_dict(cfg, seed):
    """Random weights with the reference's tensor names, rounded to BF16 (what
    its save_pretrained of a bf16 model holds).  Null sources exist whenever
    the option is on, as the reference creates them, in every mode."""
    full = O.full_config({k: v for k, v in cfg.items() if k in BASE or k.startswith("attnres_")})
    g = torch.Generator().manual_seed(seed)
    shapes = list(O.param_shapes(full))
    if full["attnres_use_null_source"] and full["attnres_mode"] in ("block", "full"):
        for i in range(full["num_hidden_layers"]):
            shapes += [(f"model.layers.{i}.attn_null_source", (full["hidden_size"],)),
                       (f"model.layers.{i}.mlp_null_source", (full["hidden_size"],))]
    out = {}
    for name, shape in shapes:
        n = torch.randn(shape, generator=g, dtype=torch.float64).numpy()
        if name.endswith("_alpha"):
            t = 0.5 + 0.15 * n
        elif name.endswith("_null_source"):
            t = 0.2 * n
        elif name.endswith("res_proj.weight"):
            t = 0.25 * n
        elif len(shape) == 1:
            t = 1.0 + 0.1 * n
        else:
            t = 0.1 * n
        out[name] = bf16_round(t.astype(np.float32))
    return out


def read_config_like_reference(cfg):
    """The config as the reference reads it: model_type picks the class; an
    attnres config takes the reference's defaults for absent keys.  The block
    delta: the key when present (this project's; the released code ignores
    it), else what the released code computes ("reference")."""
    if cfg.get("model_type") == "qwen3":
        mode = "baseline"
    elif cfg.get("model_type") == "qwen3_attnres":
        mode = cfg.get("attnres_mode", "block")
    else:
        raise ValueError(f"model_type {cfg.get('model_type')!r} is neither qwen3 nor qwen3_attnres")
    out = {k: cfg[k] for k in BASE if k in cfg}
    out.update({
        "attnres_mode": mode,
        "attnres_num_blocks": cfg.get("attnres_num_blocks", 8),
        "attnres_gate_type": cfg.get("attnres_gate_type", "bias"),
        "attnres_use_null_source": cfg.get("attnres_use_null_source", False),
        "attnres_block_delta": cfg.get("attnres_block_delta", "reference"),
    })
    return O.full_config(out)


def load_like_reference(model_dir):
    """Config and state dict of a model directory by the reference's loading
    rules: one model.safetensors or an index with shards, strict names and shapes."""
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    cfg = read_config_like_reference(raw)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = [os.path.join(model_dir, "model.safetensors")]
    if os.path.exists(index):
        with open(index) as f:
            files = sorted({os.path.join(model_dir, v) for v in json.load(f)["weight_map"].values()})
    tensors = {}
    for path in files:
        part, _ = O.read_safetensors(path)
        tensors.update(part)
    expected = dict(O.param_shapes(cfg))
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(n for n in set(tensors) - set(expected)
                        if not (n.endswith("_null_source") and cfg["attnres_mode"] in ("block", "full")))
    if missing or unexpected:
        raise ValueError(f"{model_dir}: strict load failed: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise ValueError(f"{model_dir}: {name} has shape {tensors[name].shape}, expected {shape}")
    return cfg, {n: tensors[n] for n in expected}, raw


def oracle_loss(cfg, weights, ids):
    P = {k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in weights.items()}
    x = torch.tensor(ids[:-1], dtype=torch.int64)[None]
    y = torch.tensor(ids[1:], dtype=torch.int64)[None]
    with torch.no_grad():
        return float(O.loss_of(O.forward(P, cfg, x), y))


# ---------------------------------------------------------------------------

class Run:
    def __init__(self, binary, tmp):
        self.binary, self.tmp, self.failures = binary, tmp, 0

    def attnres(self, *args):
        r = subprocess.run([self.binary, *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"attnres {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def eval_loss(self, model_dir, data):
        out = self.attnres("eval", "--model", model_dir, "--data", data, "--seq-len", str(T), "--batch", "1",
                           "--threads", "1", "--json", "--quiet")
        return json.loads(out)["loss"]

    def check(self, what, got, want, tol=TOL):
        ok = abs(got - want) <= tol
        self.failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: attnres {got:.7f}, oracle {want:.7f}, |diff| {abs(got - want):.2e}")

    def check_true(self, what, cond):
        self.failures += not cond
        print(f"{'ok  ' if cond else 'FAIL'} {what}")


def reference_to_attnres(run, data, ids):
    cases = [
        # name, mode, num_blocks, gate, null, attnres_mode key written, sharded
        ("delta_block_sharded", "delta_block", 3, "learnable_alpha", True, True, True),
        ("delta_block", "delta_block", 3, "bias", False, True, False),
        ("block_default_mode", "block", 3, "bias", True, False, False),
        ("full", "full", 8, "bias", False, True, False),
    ]
    for k, (name, mode, nb, gate, null, with_mode, sharded) in enumerate(cases):
        d = os.path.join(run.tmp, "ref_" + name)
        os.makedirs(d)
        cfg_json = reference_config(mode, nb, gate, null, with_mode)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg_json, f, indent=2)
        w = reference_state_dict(cfg_json if with_mode else dict(cfg_json, attnres_mode=mode), 100 + k)
        if sharded:
            names = sorted(w)
            half = {n: ("model-00001-of-00002.safetensors" if i < len(names) // 2
                        else "model-00002-of-00002.safetensors") for i, n in enumerate(names)}
            for shard in sorted(set(half.values())):
                write_bf16_safetensors(os.path.join(d, shard), {n: w[n] for n in names if half[n] == shard})
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": 0}, "weight_map": half}, f)
        else:
            write_bf16_safetensors(os.path.join(d, "model.safetensors"), w)
        cfg = read_config_like_reference(cfg_json)
        want = oracle_loss(cfg, {n: w[n] for n in dict(O.param_shapes(cfg))}, ids)
        run.check(f"reference {name} -> attnres eval", run.eval_loss(d, data), want)
        if mode == "delta_block":  # the other reading of the block delta is caught
            other = oracle_loss(dict(cfg, attnres_block_delta="true"),
                                {n: w[n] for n in dict(O.param_shapes(cfg))}, ids)
            run.check_true(f"  ({name}: reading it as block delta \"true\" would be off by {abs(other - want):.2e})",
                           abs(other - want) > 10 * TOL)


def attnres_to_reference(run, data, ids, train_data):
    for block_delta in ("reference", "true"):
        cfg = dict(BASE, attnres_mode="delta_block", attnres_num_blocks=3, attnres_block_delta=block_delta,
                   attnres_use_null_source=True, attnres_gate_type="learnable_alpha")
        cfg_path = os.path.join(run.tmp, f"cfg_{block_delta}.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        out = os.path.join(run.tmp, f"run_{block_delta}")
        for dtype in ("f32", "bf16"):
            run.attnres("train", "--config", cfg_path, "--data", train_data, "--out", out + "_" + dtype,
                        "--steps", "3", "--batch", "2", "--seq-len", "16", "--warmup", "1", "--threads", "1",
                        "--save-dtype", dtype)
            ckpt = os.path.join(out + "_" + dtype, "step_00000003")
            c, w, raw = load_like_reference(ckpt)
            run.check_true(f"attnres {block_delta} {dtype} checkpoint: model_type {raw['model_type']}, "
                           f"architectures {raw['architectures']}",
                           raw["model_type"] == "qwen3_attnres" and
                           raw["architectures"] == ["Qwen3AttnResForCausalLM"])
            run.check(f"attnres {block_delta} {dtype} checkpoint -> oracle", run.eval_loss(ckpt, data),
                      oracle_loss(c, w, ids))
        hf = out + "_export"
        run.attnres("export", "--model", out + "_f32", "--out", hf, "--dtype", "bf16", "--max-shard-size", "100KB")
        c, w, _ = load_like_reference(hf)
        run.check_true(f"attnres export ({block_delta}) is sharded with an index",
                       os.path.exists(os.path.join(hf, "model.safetensors.index.json")))
        run.check(f"attnres export ({block_delta}, bf16, sharded) -> oracle", run.eval_loss(hf, data),
                  oracle_loss(c, w, ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnres", required=True, help="the attnres binary")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(os.path.abspath(args.attnres), tmp)
        g = np.random.default_rng(5)
        ids = g.integers(0, BASE["vocab_size"], T + 1)
        data = os.path.join(tmp, "eval.bin")
        write_token_file(data, ids)
        train_data = os.path.join(tmp, "train.bin")
        write_token_file(train_data, g.integers(0, BASE["vocab_size"], 2000))
        reference_to_attnres(run, data, ids)
        attnres_to_reference(run, data, ids, train_data)
        print("exchange:", "all ok" if not run.failures else f"{run.failures} failure(s)")
        return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
