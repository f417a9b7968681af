"""Checkpoint exchange with the reference code, both directions, against the oracle.

Usage: scripts/peers_python.sh tests/oracle/exchange.py --attnres build/attnres

1. Reference -> attnres.  Model directories written the way the reference
   code's `save_pretrained` writes them (tests/oracle/README.md §1, §7):
   `model_type: "qwen3_attnres"`, `architectures: ["Qwen3AttnResForCausalLM"]`,
   its attnres keys only (no `attnres_block_delta`, no `attnres_query_init`;
   one case without `attnres_mode`), BF16 tensors, 0-dim gates, null-source
   tensors also in block mode (where nothing reads them), one case sharded
   the hub's way (index + two shards).  `attnres eval` must give the oracle's
   loss computed under the reference's semantics (missing attnres_block_delta
   = "reference", missing attnres_mode = "block"); the test also checks that
   the other reading would have been caught.  The reference's multi-head
   names too: block_mh (no final router), full_mh without attnres_num_heads
   (8 heads), delta_mh (null source always on, whatever its config says) and
   block_mh with one head; each checks that a wrong head count, a final
   router, or the config's null-source key would have been caught.

2. attnres -> reference.  `attnres train` writes a checkpoint (F32 and BF16)
   and `attnres export` a sharded BF16 directory; each is loaded here with the
   reference's loading rules — dispatch on model_type, the reference's
   defaults for absent attnres keys, the state dict loaded strictly (every
   expected tensor present with its shape, nothing unexpected) — and the
   oracle's loss equals `attnres eval`'s on the same tokens.  The block delta
   is taken from attnres_block_delta where the file has it: the released code
   ignores that key, so only `reference` checkpoints reproduce there (the
   docs and `attnres export` say so).  Also delta_mh, block_mh and full_mh
   checkpoints, and delta_block with 4 routing heads and the paper's block
   deltas (a form the reference has no class for, read here by our keys),
   and the sigmoid gates (both directions: sigmoid_scalar's 0-dim
   *_res_gate_logit tensors, sigmoid_vector's *_res_gate_proj.{weight,bias};
   reading a gate as bias, or sigmoid_scalar's as a raw alpha, is caught).

Exit status 1 on any mismatch.  Takes a few seconds.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
np = require("numpy")
torch = require("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle as O  # noqa: E402

TOL = 2e-5  # float32 engine against the float64 oracle, same weights: measured |diff| <= 3e-7
# (a CPU's kernels change float32 roundings, not their size: 2e-5 holds on both CPUs)
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

def reference_config(mode, num_blocks, gate, null, with_mode_key=True, heads=None):
    """heads: attnres_num_heads as written, None = the key absent."""
    c = dict(BASE, **HF_EXTRA)
    c.update({"architectures": ["Qwen3AttnResForCausalLM"], "model_type": "qwen3_attnres",
              "torch_dtype": "bfloat16", "attnres_num_blocks": num_blocks, "attnres_gate_type": gate,
              "attnres_use_null_source": null})
    if with_mode_key:
        c["attnres_mode"] = mode
    if heads is not None:
        c["attnres_num_heads"] = heads
    return c


def reference_state_dict(cfg, seed):
    """Random weights with the reference's tensor names, rounded to BF16 (what
    its save_pretrained of a bf16 model holds).  Null sources exist whenever
    the option is on, as the reference creates them, in every mode (and
    always in delta_mh, which param_shapes knows)."""
    full = O.full_config({k: v for k, v in cfg.items() if k in BASE or k.startswith("attnres_")})
    g = torch.Generator().manual_seed(seed)
    shapes = list(O.param_shapes(full))
    if full["attnres_use_null_source"] and O.base_mode(full) in ("block", "full"):
        for i in range(full["num_hidden_layers"]):
            shapes += [(f"model.layers.{i}.attn_null_source", (full["hidden_size"],)),
                       (f"model.layers.{i}.mlp_null_source", (full["hidden_size"],))]
    out = {}
    for name, shape in shapes:
        n = torch.randn(shape, generator=g, dtype=torch.float64).numpy()
        if name.endswith("_alpha"):
            t = 0.5 + 0.15 * n
        elif name.endswith("_gate_logit") or name.endswith("_gate_proj.bias") or name.endswith("_pre_gate.bias"):
            t = 0.5 * n            # g = sigmoid(theta) about 0.5: the routing matters
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
    attnres config takes the reference's defaults for absent keys (heads: 8
    for the _mh names, else 1; delta_mh's null source and block delta are
    fixed by full_config).  The block delta: the key when present (this
    project's; the released code ignores it), else what the released code
    computes ("reference")."""
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
        "attnres_num_heads": cfg.get("attnres_num_heads", 8 if mode in O.MH_MODES else 1),
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
                        if not (n.endswith("_null_source") and O.base_mode(cfg) in ("block", "full")))
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


def write_reference_dir(d, cfg_json, w, sharded):
    """config.json and BF16 weights as the reference's save_pretrained writes
    them: one model.safetensors, or sharded the hub's way (index + two shards)."""
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
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


def reference_to_attnres(run, data, ids):
    cases = [
        # name, mode, num_blocks, gate, null, attnres_mode key written, sharded,
        # attnres_num_heads written (None: the key absent)
        ("delta_block_sharded", "delta_block", 3, "learnable_alpha", True, True, True, None),
        ("delta_block", "delta_block", 3, "bias", False, True, False, None),
        ("block_default_mode", "block", 3, "bias", True, False, False, None),
        ("full", "full", 8, "bias", False, True, False, None),
        # The reference's multi-head names.  full_mh without the heads key:
        # the reference's default, 8 (d 48 divides by 8).  delta_mh's config
        # says no null source, as the reference's config class writes by
        # default; the mode has one anyway, and so does its file.
        ("block_mh_sharded", "block_mh", 3, "bias", False, True, True, 4),
        ("full_mh_default_heads", "full_mh", 8, "bias", False, True, False, None),
        ("delta_mh_sharded", "delta_mh", 3, "learnable_alpha", False, True, True, 8),
        ("block_mh_one_head", "block_mh", 3, "bias", False, True, False, 1),
        # The reference's sigmoid_scalar gate: 0-dim *_res_gate_logit tensors.
        ("block_sigmoid", "block", 3, "sigmoid_scalar", False, True, False, None),
        ("delta_sigmoid_sharded", "delta", 8, "sigmoid_scalar", True, True, True, None),
        # sigmoid_vector: an nn.Linear(d, d) per router, *_res_gate_proj.{weight,bias}.
        ("full_sigmoid_vector", "full", 8, "sigmoid_vector", False, True, False, None),
        ("block_sigmoid_vector_sharded", "block", 3, "sigmoid_vector", False, True, True, None),
        # full_additive: the reference's cumulative states, added to the stream.
        ("full_additive", "full_additive", 8, "bias", False, True, False, None),
        ("full_additive_null_alpha_sharded", "full_additive", 8, "learnable_alpha", True, True, True, None),
        # delta_replace: the outputs and the stream, replacing; first_layer: the stream and a_1 from layer 2 on.
        ("delta_replace", "delta_replace", 8, "bias", False, True, False, None),
        ("delta_replace_alpha_sharded", "delta_replace", 8, "learnable_alpha", False, True, True, None),
        ("first_layer", "first_layer", 8, "bias", False, True, False, None),
        # delta_v: a value router per attention sublayer (v_res_proj, v_res_norm), its null source and gate shared.
        ("delta_v_null_alpha", "delta_v", 8, "learnable_alpha", True, True, False, None),
        ("delta_v_sigmoid_vector_sharded", "delta_v", 8, "sigmoid_vector", False, True, True, None),
        # full_v: the states and the stream (the last state twice), replacing, with the value router.
        ("full_v", "full_v", 8, "bias", False, True, False, None),
        ("full_v_alpha_sharded", "full_v", 8, "learnable_alpha", False, True, True, None),
        # pre_gated: a d x d source gate per router (*_pre_gate.{weight,bias}).
        ("pre_gated_sharded", "pre_gated", 8, "bias", False, True, True, None),
    ]
    for k, (name, mode, nb, gate, null, with_mode, sharded, heads) in enumerate(cases):
        d = os.path.join(run.tmp, "ref_" + name)
        cfg_json = reference_config(mode, nb, gate, null, with_mode, heads)
        w = reference_state_dict(cfg_json if with_mode else dict(cfg_json, attnres_mode=mode), 100 + k)
        write_reference_dir(d, cfg_json, w, sharded)
        cfg = read_config_like_reference(cfg_json)
        wr = {n: w[n] for n in dict(O.param_shapes(cfg))}
        want = oracle_loss(cfg, wr, ids)
        run.check(f"reference {name} -> attnres eval", run.eval_loss(d, data), want)
        if gate == "sigmoid_vector":  # the gate is read: without it (bias) the loss moves
            c2 = dict(cfg, attnres_gate_type="bias")
            other = oracle_loss(c2, {n: v for n, v in wr.items() if n in dict(O.param_shapes(c2))}, ids)
            run.check_true(f"  ({name}: reading its gate as bias would be off by {abs(other - want):.2e})",
                           abs(other - want) > 10 * TOL)
        if gate == "sigmoid_scalar":  # the gate is read: without it (bias), or as a raw alpha, the loss moves
            for other_gate, over in (("bias", {}),
                                     ("learnable_alpha", {n.replace("_gate_logit", "_alpha"): v
                                                          for n, v in wr.items() if n.endswith("_gate_logit")})):
                c2 = dict(cfg, attnres_gate_type=other_gate)
                w2 = {n: v for n, v in dict(wr, **over).items() if n in dict(O.param_shapes(c2))}
                other = oracle_loss(c2, w2, ids)
                run.check_true(f"  ({name}: reading its gate as {other_gate} would be off by {abs(other - want):.2e})",
                               abs(other - want) > 10 * TOL)
        if mode == "delta_block":  # the other reading of the block delta is caught
            other = oracle_loss(dict(cfg, attnres_block_delta="true"), wr, ids)
            run.check_true(f"  ({name}: reading it as block delta \"true\" would be off by {abs(other - want):.2e})",
                           abs(other - want) > 10 * TOL)
        if mode in O.MH_MODES:
            # The head count is read: 1 head where there are more, 8 (the
            # names' default, as if the key were ignored) where there is one.
            Hr = cfg["attnres_num_heads"]
            run.check_true(f"  ({name}: read with {Hr} routing head{'s' if Hr > 1 else ''}, config key "
                           f"{'absent' if heads is None else heads})", Hr == (8 if heads is None else heads))
            wrong = 1 if Hr > 1 else 8
            other = oracle_loss(dict(cfg, attnres_num_heads=wrong), wr, ids)
            run.check_true(f"  ({name}: reading it with {wrong} routing head{'s' if wrong > 1 else ''} would be off by "
                           f"{abs(other - want):.2e})", abs(other - want) > 10 * TOL)
        if mode == "block_mh":
            # No final router: the file has no final_res tensors, so a
            # reading as block (which routes the final norm's input) cannot
            # load it; and a default final router (query 0: the mean of the
            # blocks and the partial sum, norm weight 1) would change the loss.
            as_block = dict(cfg, attnres_mode="block")
            missing = sorted(set(dict(O.param_shapes(as_block))) - set(w))
            run.check_true(f"  ({name}: no final router in the file; a reading as block misses {missing})",
                           missing == ["model.final_res_norm.weight", "model.final_res_proj.weight"])
            d_ = BASE["hidden_size"]
            with_final = dict(wr, **{"model.final_res_proj.weight": np.zeros((1, d_), np.float32),
                                     "model.final_res_norm.weight": np.ones(d_, np.float32)})
            other = oracle_loss(as_block, with_final, ids)
            run.check_true(f"  ({name}: a default final router would be off by {abs(other - want):.2e})",
                           abs(other - want) > 10 * TOL)
        if mode == "delta_mh":
            # The null source is on and the block deltas are the reference's,
            # whatever the config's keys say; either other reading is caught.
            run.check_true(f"  ({name}: read with the null source and block delta "
                           f"{cfg['attnres_block_delta']!r} though its config says "
                           f"attnres_use_null_source {cfg_json['attnres_use_null_source']})",
                           cfg["attnres_use_null_source"] and cfg["attnres_block_delta"] == "reference")
            same = dict(cfg, attnres_mode="delta_block")   # delta_mh spelled out
            for label, over in (("without the null source", {"attnres_use_null_source": False}),
                                ("with block delta \"true\"", {"attnres_block_delta": "true"})):
                other = oracle_loss(dict(same, **over), wr, ids)
                run.check_true(f"  ({name}: reading it {label} would be off by {abs(other - want):.2e})",
                               abs(other - want) > 10 * TOL)


def train_checkpoint(run, name, cfg, train_data, dtype="f32"):
    """attnres train --config <cfg> for 3 steps; returns the checkpoint directory."""
    cfg_path = os.path.join(run.tmp, f"cfg_{name}.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(run.tmp, f"run_{name}_{dtype}")
    run.attnres("train", "--config", cfg_path, "--data", train_data, "--out", out,
                "--steps", "3", "--batch", "2", "--seq-len", "16", "--warmup", "1", "--threads", "1",
                "--save-dtype", dtype)
    return os.path.join(out, "step_00000003")


def attnres_to_reference(run, data, ids, train_data):
    for block_delta in ("reference", "true"):
        cfg = dict(BASE, attnres_mode="delta_block", attnres_num_blocks=3, attnres_block_delta=block_delta,
                   attnres_use_null_source=True, attnres_gate_type="learnable_alpha")
        for dtype in ("f32", "bf16"):
            ckpt = train_checkpoint(run, block_delta, cfg, train_data, dtype)
            c, w, raw = load_like_reference(ckpt)
            run.check_true(f"attnres {block_delta} {dtype} checkpoint: model_type {raw['model_type']}, "
                           f"architectures {raw['architectures']}",
                           raw["model_type"] == "qwen3_attnres" and
                           raw["architectures"] == ["Qwen3AttnResForCausalLM"])
            run.check(f"attnres {block_delta} {dtype} checkpoint -> oracle", run.eval_loss(ckpt, data),
                      oracle_loss(c, w, ids))
        hf = os.path.join(run.tmp, f"run_{block_delta}_export")
        run.attnres("export", "--model", os.path.join(run.tmp, f"run_{block_delta}_f32"), "--out", hf,
                    "--dtype", "bf16", "--max-shard-size", "100KB")
        c, w, _ = load_like_reference(hf)
        run.check_true(f"attnres export ({block_delta}) is sharded with an index",
                       os.path.exists(os.path.join(hf, "model.safetensors.index.json")))
        run.check(f"attnres export ({block_delta}, bf16, sharded) -> oracle", run.eval_loss(hf, data),
                  oracle_loss(c, w, ids))

    # Routing heads.  The _mh names are the reference's own (it loads them
    # by the same rules, so the strict load checks that block_mh has no final
    # router and delta_mh has its null sources); delta_block with 4 heads and
    # the paper's block deltas has no reference form and is read by our keys.
    heads_runs = [
        # name, attnres keys of the training config, heads the checkpoint must carry
        ("delta_mh", {"attnres_mode": "delta_mh", "attnres_num_blocks": 3, "attnres_num_heads": 4,
                      "attnres_gate_type": "learnable_alpha"}, 4),
        ("block_mh", {"attnres_mode": "block_mh", "attnres_num_blocks": 3, "attnres_num_heads": 4}, 4),
        ("full_mh", {"attnres_mode": "full_mh"}, 8),   # no heads key: the name's 8
        ("delta_block_h4", {"attnres_mode": "delta_block", "attnres_num_blocks": 3, "attnres_num_heads": 4,
                            "attnres_block_delta": "true", "attnres_use_null_source": True}, 4),
        # The sigmoid_scalar gate: 0-dim *_res_gate_logit tensors the reference's strict load expects.
        ("full_sigmoid", {"attnres_mode": "full", "attnres_gate_type": "sigmoid_scalar"}, 1),
        ("delta_sigmoid_vector", {"attnres_mode": "delta", "attnres_use_null_source": True,
                                  "attnres_gate_type": "sigmoid_vector"}, 1),
        ("full_additive", {"attnres_mode": "full_additive", "attnres_use_null_source": True}, 1),
        ("delta_replace", {"attnres_mode": "delta_replace", "attnres_gate_type": "sigmoid_scalar"}, 1),
        ("first_layer", {"attnres_mode": "first_layer"}, 1),
        ("delta_v", {"attnres_mode": "delta_v", "attnres_use_null_source": True,
                     "attnres_gate_type": "sigmoid_scalar"}, 1),
        ("full_v", {"attnres_mode": "full_v", "attnres_gate_type": "learnable_alpha"}, 1),
        ("pre_gated", {"attnres_mode": "pre_gated"}, 1),
    ]
    for name, keys, heads in heads_runs:
        ckpt = train_checkpoint(run, name, dict(BASE, **keys), train_data)
        c, w, raw = load_like_reference(ckpt)
        run.check_true(f"attnres {name} checkpoint: attnres_mode {raw.get('attnres_mode')}, "
                       f"attnres_num_heads {raw.get('attnres_num_heads')}",
                       raw.get("attnres_mode") == keys["attnres_mode"] and
                       raw.get("attnres_num_heads") == heads and c["attnres_num_heads"] == heads)
        if name == "delta_mh":
            run.check_true(f"  (delta_mh checkpoint: attnres_use_null_source {raw.get('attnres_use_null_source')}, "
                           f"attnres_block_delta {raw.get('attnres_block_delta')!r}, null sources in the file)",
                           raw.get("attnres_use_null_source") is True and
                           raw.get("attnres_block_delta") == "reference" and "model.layers.0.attn_null_source" in w)
        if name == "delta_block_h4":
            run.check_true(f"  (delta_block_h4 checkpoint: attnres_block_delta {raw.get('attnres_block_delta')!r})",
                           raw.get("attnres_block_delta") == "true" and c["attnres_block_delta"] == "true")
        run.check(f"attnres {name} checkpoint -> oracle", run.eval_loss(ckpt, data), oracle_loss(c, w, ids))
        if name == "delta_mh":
            hf = os.path.join(run.tmp, "run_delta_mh_export")
            run.attnres("export", "--model", os.path.dirname(ckpt), "--out", hf, "--dtype", "bf16",
                        "--max-shard-size", "100KB")
            c, w, raw = load_like_reference(hf)
            run.check_true(f"attnres export (delta_mh) is sharded with an index, attnres_num_heads "
                           f"{raw.get('attnres_num_heads')}",
                           os.path.exists(os.path.join(hf, "model.safetensors.index.json")) and
                           raw.get("attnres_num_heads") == 4)
            run.check("attnres export (delta_mh, bf16, sharded) -> oracle", run.eval_loss(hf, data),
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
