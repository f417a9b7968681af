"""Regenerates tests/golden/<case>/ from the oracle, after self-checks.

Usage: scripts/peers_python.sh tests/oracle/make_golden.py [--out DIR] [--fp32-report]

Self-checks run first and any failure aborts before a file is written:
  1. DESIGN.md's hand-written router backward equals autograd, single-head
     and with 4 routing heads; 1 routing head is the single-head router, and
     4 heads that agree (equal slices) are one head with query w/4;
  2. learnable_alpha with every alpha = 0 gives baseline's logits exactly in
     the delta modes (delta, delta + null, delta_block true/reference,
     delta_mh, delta_block with 8 heads);
  3. learnable_alpha with every alpha = 1 gives the "bias" (no gate) logits in
     every routing mode;
  4. autograd gradients equal central finite differences (float64) on a few
     entries of several parameters in five configurations, three of them
     with 4 routing heads (full_mh, block_mh, delta_mh + learnable_alpha);
  5. the hand-written AdamW/clip loop equals torch.optim.AdamW +
     clip_grad_norm_ on one case;
  6. delta_block "true" and "reference" logits differ;
  7. the bf16 product's backward equals autograd on bf16-exact operands.
Each case is also run as --precision bf16 computes it (the products'
operands rounded to bfloat16, the rest float64): golden_bf16.safetensors.
Everything is float64 on weights stored as float32; output is deterministic.

Each case also gets greedy continuations (oracle.greedy, no cache) of
GEN_NEW tokens for len(GEN_PROMPT_LENS) prompts, on the initial weights.
Prompt j is the first GEN_PROMPT_LENS[j] tokens of row j + 3c of tokens
viewed as [steps*accum*B, T+1], for the first c = 0, 1, ... whose every step
has a top-1 minus top-2 logit margin >= GEN_MIN_MARGIN (so a float32 engine
picks the same tokens); no such c below GEN_MAX_TRIES aborts.
"""

import argparse
import json
import math
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
np = require("numpy")
torch = require("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle as O  # noqa: E402

torch.set_num_threads(1)
F64 = torch.float64

BASE = {
    "hidden_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 80,
    "vocab_size": 97, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "max_position_embeddings": 64,
}
TRAIN = {
    "steps": 10, "accum": 2, "batch_size": 2, "seq_len": 11,
    "lr_max": 3e-3, "lr_min": 3e-4, "warmup": 3, "total_steps": 10,
    "clip": 1.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
}

# name -> overrides of BASE and the attnres defaults
CASES = {
    "baseline_tied": {"num_hidden_layers": 3, "tie_word_embeddings": True},
    "baseline_untied": {"num_hidden_layers": 3},
    "full": {"attnres_mode": "full"},
    "block": {"attnres_mode": "block", "attnres_num_blocks": 3},
    "delta": {"attnres_mode": "delta"},
    "delta_null": {"attnres_mode": "delta", "attnres_use_null_source": True},
    "delta_block_true": {"attnres_mode": "delta_block", "attnres_num_blocks": 3,
                         "attnres_block_delta": "true"},
    "delta_block_reference": {"attnres_mode": "delta_block", "attnres_num_blocks": 3,
                              "attnres_block_delta": "reference"},
    "delta_block_alpha": {"attnres_mode": "delta_block", "attnres_num_blocks": 3,
                          "attnres_gate_type": "learnable_alpha"},
    "block_alpha": {"attnres_mode": "block", "attnres_num_blocks": 3,
                    "attnres_gate_type": "learnable_alpha"},
    "full_alpha": {"attnres_mode": "full", "attnres_gate_type": "learnable_alpha"},
    # Routing heads (d 48: head size 12), and the reference's multi-head names.
    "block_mh": {"attnres_mode": "block_mh", "attnres_num_blocks": 3, "attnres_num_heads": 4},
    "full_mh": {"attnres_mode": "full_mh", "attnres_num_heads": 4},
    "delta_mh": {"attnres_mode": "delta_mh", "attnres_num_blocks": 3, "attnres_num_heads": 4},
    "delta_h4": {"attnres_mode": "delta", "attnres_num_heads": 4},
    # Block's sources added to a stream (--sources partial_sums --combine add; not in the papers).
    "block_add": {"attnres_mode": "block_add", "attnres_num_blocks": 3, "attnres_use_null_source": True},
    # The reference code's sigmoid_scalar gate, replacing (block) and adding (delta + null).  (In full its
    # ten steps are chaotic here, as full_alpha's: the first micro-batch agrees, the trajectory parts.)
    "block_sigmoid": {"attnres_mode": "block", "attnres_num_blocks": 3, "attnres_gate_type": "sigmoid_scalar"},
    # sigmoid_vector's per-token, per-channel gate (a d x d product per router): replacing with 4 routing heads
    # (block, its partial sums as x_g), adding (delta_block, the stream as x_g; inputs stored as always there).
    "block_h4_sigmoid_vector": {"attnres_mode": "block", "attnres_num_blocks": 3, "attnres_num_heads": 4,
                                "attnres_gate_type": "sigmoid_vector"},
    "delta_sigmoid_vector": {"attnres_mode": "delta", "attnres_use_null_source": True,
                             "attnres_gate_type": "sigmoid_vector"},
    # The reference code's full_additive: the stream's states after each sublayer, added to the stream; plain,
    # and with the null source and 4 routing heads.  (learnable_alpha at 0 is baseline there: a self-check.)
    "full_additive": {"attnres_mode": "full_additive"},
    # The reference code's delta_replace (the outputs so far and the stream, replacing the input; plain, and
    # with a learnable_alpha gate against the stream and 4 routing heads) and first_layer (the stream and
    # layer 1's attention output, from layer 2 on).
    "delta_replace": {"attnres_mode": "delta_replace"},
    "delta_replace_alpha_h4": {"attnres_mode": "delta_replace", "attnres_gate_type": "learnable_alpha",
                               "attnres_num_heads": 4},
    "first_layer": {"attnres_mode": "first_layer"},
    # The reference code's delta_v (V-stream routing): plain, and with the null source, the sigmoid_scalar gate
    # (both shared with the value router) and 4 routing heads.
    "delta_v": {"attnres_mode": "delta_v"},
    "delta_v_null_sigmoid_h4": {"attnres_mode": "delta_v", "attnres_use_null_source": True,
                                "attnres_gate_type": "sigmoid_scalar", "attnres_num_heads": 4},
    # full_v: the states and the stream (the last state listed twice), replacing, with a value router; plain, and
    # with learnable_alpha (against the stream) and 4 routing heads.
    "full_v": {"attnres_mode": "full_v"},
    "full_v_alpha_h4": {"attnres_mode": "full_v", "attnres_gate_type": "learnable_alpha", "attnres_num_heads": 4},
    # pre_gated: the outputs gated per router (sigma(x W^T + b), a d x d linear) before the softmax; plain, and
    # with 4 routing heads.
    "pre_gated": {"attnres_mode": "pre_gated"},
    "pre_gated_h4": {"attnres_mode": "pre_gated", "attnres_num_heads": 4},
    "full_additive_null_h4": {"attnres_mode": "full_additive", "attnres_use_null_source": True,
                              "attnres_num_heads": 4},
    "delta_sigmoid": {"attnres_mode": "delta", "attnres_use_null_source": True,
                      "attnres_gate_type": "sigmoid_scalar"},
    # The entropy term (CASE_TRAIN's entropy_lambda): a mode the reference collects it in, and block with 4
    # routing heads (its final router is left out of the mean).
    "delta_block_entropy": {"attnres_mode": "delta_block", "attnres_num_blocks": 3},
    "block_h4_entropy": {"attnres_mode": "block", "attnres_num_blocks": 3, "attnres_num_heads": 4},
}
# Training options of a case beyond TRAIN (train.json): the entropy term's lambda.
CASE_TRAIN = {
    "delta_block_entropy": {"entropy_lambda": 0.5},
    "block_h4_entropy": {"entropy_lambda": 0.5},
}


def case_train(name):
    return dict(TRAIN, **CASE_TRAIN.get(name, {}))

# Random init of golden weights (not the engine's init; see README.md).
STD_MATRIX = 0.02 * 5      # every linear matrix and lm_head
STD_EMBED_UNTIED = 1.0     # embedding when untied: e is not tiny next to the outputs
STD_EMBED_TIED = 0.1       # embedding when tied: keeps the LM-head softmax unsaturated
STD_NORM = 0.1             # norm weights 1 + STD_NORM * N(0,1)
STD_QUERY = 0.25           # pseudo-queries (res_proj)
STD_NULL = 0.2             # null sources
ALPHA_MEAN, ALPHA_STD = 0.5, 0.15
GATE_LOGIT_MEAN, GATE_LOGIT_STD = 0.0, 0.5    # sigmoid_scalar's theta: g about 0.5 (the reference inits -2)

# Greedy-generation reference (golden generate.*).
GEN_PROMPT_LENS = (5, 8, 3)
GEN_NEW = 12
GEN_MIN_MARGIN = 1e-3      # logits; float32 deviations are ~1e-6 (README.md)
GEN_MAX_TRIES = 12         # candidate rows j, j+3, ..., j+33 of the 40


def make_config(over):
    c = dict(BASE)
    c.update(over)
    return O.full_config(c)


def init_weights(cfg, seed):
    """float32 numpy weights, drawn in param_shapes order from one generator."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in O.param_shapes(cfg):
        n = torch.randn(shape, generator=g, dtype=F64)
        if name.endswith("_alpha"):
            t = ALPHA_MEAN + ALPHA_STD * n
        elif name.endswith("_gate_logit") or name.endswith("_gate_proj.bias") or name.endswith("_pre_gate.bias"):
            t = GATE_LOGIT_MEAN + GATE_LOGIT_STD * n
        elif name.endswith("_null_source"):
            t = STD_NULL * n
        elif name.endswith("res_proj.weight"):
            t = STD_QUERY * n
        elif name == "model.embed_tokens.weight":
            t = (STD_EMBED_TIED if cfg["tie_word_embeddings"] else STD_EMBED_UNTIED) * n
        elif len(shape) == 1:                      # every RMSNorm weight
            t = 1.0 + STD_NORM * n
        else:
            t = STD_MATRIX * n
        out[name] = t.numpy().astype(np.float32)
    return out


def make_tokens(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (TRAIN["steps"], TRAIN["accum"], TRAIN["batch_size"], TRAIN["seq_len"] + 1)
    return torch.randint(0, cfg["vocab_size"], shape, generator=g, dtype=torch.int64)


def to_params(w, dtype=F64):
    return {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in w.items()}


def case_seed(name):
    """delta_block_true and delta_block_reference share weights and tokens, so
    their difference is the block-source arithmetic alone."""
    if name.startswith("delta_block_") and name != "delta_block_alpha":
        name = "delta_block"
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def greedy_refs(w, cfg, tokens, dtype=F64):
    """Greedy continuations of the prompts chosen as the module docstring says.
    Returns a list of (row, prompt, new_ids, margins), one per GEN_PROMPT_LENS."""
    rows = tokens.reshape(-1, tokens.shape[-1])
    assert 3 * GEN_MAX_TRIES <= rows.shape[0]
    P = to_params(w, dtype)
    out = []
    for j, n in enumerate(GEN_PROMPT_LENS):
        for c in range(GEN_MAX_TRIES):
            row = j + 3 * c
            prompt = [int(t) for t in rows[row, :n]]
            ids, margins = O.greedy(P, cfg, prompt, GEN_NEW)
            if min(margins) >= GEN_MIN_MARGIN:
                break
        else:
            raise AssertionError(f"no prompt {j} (length {n}) in {GEN_MAX_TRIES} candidate rows "
                                 f"has every greedy margin >= {GEN_MIN_MARGIN}")
        out.append((row, prompt, ids, margins))
    return out


def micro_loss_and_grads(P, cfg, seq, bf16=False, entropy_lambda=0.0):
    """logits, the cross-entropy, the gradients of the training objective
    (cross-entropy - entropy_lambda * E) and E (the entropy term's mean_entropy)."""
    names = [n for n, _ in O.param_shapes(cfg)]
    ent = []
    logits = O.forward(P, cfg, seq[:, :-1], bf16=bf16, entropy=ent)
    loss = O.loss_of(logits, seq[:, 1:])
    E = O.mean_entropy(cfg, ent)
    objective = loss - entropy_lambda * E if entropy_lambda else loss
    gs = torch.autograd.grad(objective, [P[n] for n in names], allow_unused=True)
    grads = {n: (g if g is not None else torch.zeros_like(P[n])) for n, g in zip(names, gs)}
    return logits, loss, grads, E.detach()


# ---------------------------------------------------------------------------
# Self-checks
# ---------------------------------------------------------------------------

def check_router_backward():
    """DESIGN.md section 2 backward formulas against autograd."""
    g = torch.Generator().manual_seed(7)
    N, T, d, eps = 5, 9, 48, 1e-6
    v = torch.randn(N, T, d, generator=g, dtype=F64, requires_grad=True)
    w = (0.3 * torch.randn(d, generator=g, dtype=F64)).requires_grad_()
    gam = (1 + 0.1 * torch.randn(d, generator=g, dtype=F64)).requires_grad_()
    dR = torch.randn(T, d, generator=g, dtype=F64)
    R = O.route(list(v), w.view(1, d), gam, eps)
    R.backward(dR)
    with torch.no_grad():
        r = (v.pow(2).mean(-1) + eps).rsqrt()                 # (N,T)
        q = w * gam
        a = (r * (v @ q)).softmax(0)                          # (N,T)
        da = (v * dR).sum(-1)
        dz = a * (da - (a * da).sum(0, keepdim=True))
        qv = v @ q
        dv = a[..., None] * dR + (dz * r)[..., None] * (
            q - (qv * r * r)[..., None] * v / d)
        dq = ((dz * r)[..., None] * v).sum((0, 1))
        assert torch.allclose(dv, v.grad, atol=1e-12, rtol=1e-10), "router dv"
        assert torch.allclose(dq * gam, w.grad, atol=1e-12, rtol=1e-10), "router dw"
        assert torch.allclose(dq * w, gam.grad, atol=1e-12, rtol=1e-10), "router dgamma"
    print("check: router backward formula == autograd")


def check_router_backward_heads():
    """DESIGN.md section 2's multi-head backward (per head, plus the full-d
    rstd term from every head) against autograd, H = 4."""
    g = torch.Generator().manual_seed(8)
    N, T, d, H, eps = 5, 9, 48, 4, 1e-6
    dh = d // H
    v = torch.randn(N, T, d, generator=g, dtype=F64, requires_grad=True)
    w = (0.3 * torch.randn(d, generator=g, dtype=F64)).requires_grad_()
    gam = (1 + 0.1 * torch.randn(d, generator=g, dtype=F64)).requires_grad_()
    dR = torch.randn(T, d, generator=g, dtype=F64)
    R = O.route(list(v), w.view(1, d), gam, eps, heads=H)
    R.backward(dR)
    with torch.no_grad():
        r = (v.pow(2).mean(-1) + eps).rsqrt()                 # (N,T), over the full d
        q = (w * gam).view(H, dh)
        vh = v.view(N, T, H, dh)
        z = r[..., None] * (vh * q).sum(-1)                   # (N,T,H)
        a = z.softmax(0)
        da = (vh * dR.view(T, H, dh)).sum(-1)                 # (N,T,H)
        dz = a * (da - (a * da).sum(0, keepdim=True))
        dv = (a[..., None] * dR.view(T, H, dh) + (dz * r[..., None])[..., None] * q).reshape(N, T, d)
        dv -= ((dz * z).sum(-1) * r * r)[..., None] * v / d   # every head's share of d(r_i)
        dq = ((dz * r[..., None])[..., None] * vh).sum((0, 1)).reshape(d)
        assert torch.allclose(dv, v.grad, atol=1e-12, rtol=1e-10), "multi-head router dv"
        assert torch.allclose(dq * gam, w.grad, atol=1e-12, rtol=1e-10), "multi-head router dw"
        assert torch.allclose(dq * w, gam.grad, atol=1e-12, rtol=1e-10), "multi-head router dgamma"
        # One head is the single-head router.
        assert torch.equal(O.route(list(v), w.view(1, d), gam, eps, heads=1),
                           O.route(list(v), w.view(1, d), gam, eps))
        # Heads that agree are one head: sources, gamma and query made of H
        # equal slices give every head the same logits, which are the
        # single-head logits over the full d divided by H.  So H heads with
        # query w equal one head with query w / H, alpha included.
        u = v.detach()[..., :dh]                              # (N,T,d/H)
        vt = u.repeat(1, 1, H)                                # (N,T,d), H equal slices
        gt, wt = gam.detach()[:dh].repeat(H), w.detach()[:dh].repeat(H)
        pm, p1 = [], []
        Rm = O.route(list(vt), wt.view(1, d), gt, eps, probe=pm, heads=H)
        R1 = O.route(list(vt), (wt / H).view(1, d), gt, eps, probe=p1)
        assert torch.allclose(Rm, R1, atol=1e-13, rtol=1e-12), "agreeing heads != one head"
        assert torch.allclose(pm[0], p1[0][..., None].expand_as(pm[0]), atol=1e-14, rtol=0)
    print("check: multi-head router backward formula == autograd (H = 4); "
          "H = 1 is the single-head router; H agreeing heads == one head with query w/H")


def check_alpha_identities():
    ids = make_tokens(make_config({}), 99)[0, 0, :, :-1]
    variants = [
        ("delta", {"attnres_mode": "delta"}),
        ("delta+null", {"attnres_mode": "delta", "attnres_use_null_source": True}),
        ("delta_block/true", {"attnres_mode": "delta_block", "attnres_num_blocks": 3}),
        ("delta_block/reference", {"attnres_mode": "delta_block", "attnres_num_blocks": 3,
                                   "attnres_block_delta": "reference"}),
        ("delta_block/reference+null", {"attnres_mode": "delta_block", "attnres_num_blocks": 2,
                                        "attnres_block_delta": "reference",
                                        "attnres_use_null_source": True}),
        ("block", {"attnres_mode": "block", "attnres_num_blocks": 3}),
        ("full", {"attnres_mode": "full"}),
        ("delta_mh", {"attnres_mode": "delta_mh", "attnres_num_blocks": 3}),
        ("delta_block/true, 8 heads", {"attnres_mode": "delta_block", "attnres_num_blocks": 3,
                                       "attnres_num_heads": 8}),
        ("block_mh", {"attnres_mode": "block_mh", "attnres_num_blocks": 3}),
        ("full_additive+null", {"attnres_mode": "full_additive", "attnres_use_null_source": True}),
        ("delta_replace, 4 heads", {"attnres_mode": "delta_replace", "attnres_num_heads": 4}),
        ("delta_v+null", {"attnres_mode": "delta_v", "attnres_use_null_source": True}),
        ("full_v", {"attnres_mode": "full_v"}),
    ]
    for label, over in variants:
        cfg_a = make_config(dict(over, attnres_gate_type="learnable_alpha"))
        cfg_b = make_config(over)
        w = init_weights(cfg_a, 1234)
        with torch.no_grad():
            P = to_params(w)
            base = O.forward(P, make_config({}), ids)
            bias = O.forward(P, cfg_b, ids)
            for n in P:
                if n.endswith("_alpha"):
                    P[n].fill_(1.0)
            one = O.forward(P, cfg_a, ids)
            assert (one - bias).abs().max() < 1e-12, f"alpha=1 != bias in {label}"
            for n in P:
                if n.endswith("_alpha"):
                    P[n].fill_(0.0)
            zero = O.forward(P, cfg_a, ids)
        dz = float((zero - base).abs().max())
        if over["attnres_mode"].startswith("delta") or over["attnres_mode"] in ("full_additive", "full_v"):
            assert dz < 1e-12, f"alpha=0 != baseline in {label}: {dz}"
            print(f"check: {label}: alpha=0 == baseline, alpha=1 == bias")
        else:
            # Replacement modes gate against the partial/latest source, not the
            # residual stream: alpha=0 is NOT the baseline model (README.md).
            assert dz > 1e-3, f"{label}: alpha=0 unexpectedly equals baseline"
            print(f"check: {label}: alpha=1 == bias (alpha=0 differs from baseline by {dz:.3g}, "
                  "as documented)")


def check_finite_differences():
    probes = [
        ("delta_block/reference+null+alpha",
         {"attnres_mode": "delta_block", "attnres_num_blocks": 3,
          "attnres_block_delta": "reference", "attnres_use_null_source": True,
          "attnres_gate_type": "learnable_alpha"},
         ["model.embed_tokens.weight", "model.layers.0.attn_null_source",
          "model.layers.4.attn_res_proj.weight", "model.layers.3.mlp_res_norm.weight",
          "model.layers.2.attn_res_alpha", "model.layers.5.mlp_res_alpha",
          "model.layers.1.self_attn.q_norm.weight", "model.layers.4.self_attn.k_proj.weight",
          "lm_head.weight"]),
        ("block+alpha",
         {"attnres_mode": "block", "attnres_num_blocks": 3, "attnres_gate_type": "learnable_alpha"},
         ["model.final_res_proj.weight", "model.final_res_norm.weight",
          "model.layers.2.attn_res_alpha", "model.layers.1.mlp_res_proj.weight",
          "model.layers.5.mlp.down_proj.weight", "model.norm.weight"]),
        ("full_mh (4 heads)",
         {"attnres_mode": "full_mh", "attnres_num_heads": 4},
         ["model.final_res_proj.weight", "model.final_res_norm.weight", "model.layers.3.attn_res_proj.weight",
          "model.layers.1.mlp_res_norm.weight", "model.embed_tokens.weight"]),
        ("block_mh (4 heads)",
         {"attnres_mode": "block_mh", "attnres_num_blocks": 3, "attnres_num_heads": 4},
         ["model.layers.5.mlp_res_proj.weight", "model.layers.2.attn_res_norm.weight", "model.norm.weight"]),
        ("delta_mh (4 heads) + alpha",
         {"attnres_mode": "delta_mh", "attnres_num_blocks": 3, "attnres_num_heads": 4,
          "attnres_gate_type": "learnable_alpha"},
         ["model.layers.0.attn_null_source", "model.layers.3.mlp_null_source",
          "model.layers.4.attn_res_proj.weight", "model.layers.2.mlp_res_alpha"]),
        ("full+sigmoid_scalar",
         {"attnres_mode": "full", "attnres_gate_type": "sigmoid_scalar"},
         ["model.layers.1.attn_res_gate_logit", "model.layers.4.mlp_res_gate_logit",
          "model.layers.2.attn_res_proj.weight"]),
        ("delta_block+sigmoid_vector",
         {"attnres_mode": "delta_block", "attnres_num_blocks": 3, "attnres_gate_type": "sigmoid_vector"},
         ["model.layers.2.attn_res_gate_proj.weight", "model.layers.4.mlp_res_gate_proj.bias",
          "model.layers.1.mlp_res_proj.weight", "model.embed_tokens.weight"]),
        ("delta_replace+alpha",
         {"attnres_mode": "delta_replace", "attnres_gate_type": "learnable_alpha"},
         ["model.layers.0.attn_res_alpha", "model.layers.3.mlp_res_proj.weight",
          "model.layers.2.attn_res_norm.weight", "model.embed_tokens.weight"]),
        ("delta_v+null+alpha",
         {"attnres_mode": "delta_v", "attnres_use_null_source": True, "attnres_gate_type": "learnable_alpha"},
         ["model.layers.2.v_res_proj.weight", "model.layers.3.v_res_norm.weight", "model.layers.1.attn_null_source",
          "model.layers.2.attn_res_alpha", "model.layers.4.self_attn.v_proj.weight",
          "model.layers.3.input_layernorm.weight"]),
        ("full_v+alpha",
         {"attnres_mode": "full_v", "attnres_gate_type": "learnable_alpha"},
         ["model.layers.3.v_res_proj.weight", "model.layers.2.attn_res_alpha", "model.layers.4.mlp_res_norm.weight",
          "model.embed_tokens.weight"]),
        ("pre_gated",
         {"attnres_mode": "pre_gated"},
         ["model.layers.2.attn_pre_gate.weight", "model.layers.3.mlp_pre_gate.bias", "model.layers.1.mlp_res_proj.weight",
          "model.layers.4.attn_res_norm.weight", "model.embed_tokens.weight"]),
        ("first_layer",
         {"attnres_mode": "first_layer"},
         ["model.layers.2.attn_res_proj.weight", "model.layers.5.mlp_res_norm.weight",
          "model.layers.1.self_attn.o_proj.weight", "model.embed_tokens.weight"]),
        ("delta_block+entropy 0.5",
         {"attnres_mode": "delta_block", "attnres_num_blocks": 3, "entropy_lambda": 0.5},
         ["model.layers.3.attn_res_proj.weight", "model.layers.1.mlp_res_norm.weight",
          "model.layers.4.self_attn.v_proj.weight", "model.embed_tokens.weight"]),
        ("block (4 heads)+entropy 0.5",
         {"attnres_mode": "block", "attnres_num_blocks": 3, "attnres_num_heads": 4, "entropy_lambda": 0.5},
         ["model.layers.5.mlp_res_proj.weight", "model.layers.0.mlp_res_norm.weight",
          "model.final_res_proj.weight"]),
    ]
    g = torch.Generator().manual_seed(5)
    for label, over, names in probes:
        over = dict(over)
        lam = over.pop("entropy_lambda", 0.0)
        cfg = make_config(over)
        P = to_params(init_weights(cfg, 4321))
        seq = make_tokens(cfg, 77)[0, 0]
        _, _, grads, _ = micro_loss_and_grads(P, cfg, seq, entropy_lambda=lam)
        worst = 0.0
        for n in names:
            flat = P[n].detach().view(-1)
            for _ in range(3):
                j = int(torch.randint(0, flat.numel(), (1,), generator=g))
                if n == "model.embed_tokens.weight":   # pick a row that is used
                    j = int(seq[0, 3]) * cfg["hidden_size"] + j % cfg["hidden_size"]
                h = 1e-5
                vals = []
                for sgn in (1, -1):
                    with torch.no_grad():
                        old = float(flat[j])
                        flat[j] = old + sgn * h
                        ent = []
                        ce = O.loss_of(O.forward(P, cfg, seq[:, :-1], entropy=ent), seq[:, 1:])
                        vals.append(float(ce - lam * O.mean_entropy(cfg, ent)))
                        flat[j] = old
                fd = (vals[0] - vals[1]) / (2 * h)
                ag = float(grads[n].reshape(-1)[j])
                err = abs(fd - ag)
                assert err <= 1e-8 + 1e-5 * abs(ag), f"FD {label} {n}[{j}]: fd {fd} autograd {ag}"
                worst = max(worst, err)
        print(f"check: {label}: finite differences == autograd (worst abs err {worst:.2e})")


def check_optimizer():
    cfg = make_config(CASES["delta_block_alpha"])
    w = init_weights(cfg, 11)
    tokens = make_tokens(cfg, 12)
    P = to_params(w)
    mine = O.train(P, cfg, tokens, TRAIN)["losses"]
    Q = to_params(w)
    names = [n for n, _ in O.param_shapes(cfg)]
    groups = [{"params": [Q[n] for n in names if O.is_decayed(n)], "weight_decay": TRAIN["weight_decay"]},
              {"params": [Q[n] for n in names if not O.is_decayed(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=TRAIN["lr_max"], betas=(TRAIN["beta1"], TRAIN["beta2"]),
                            eps=TRAIN["eps"])
    theirs = []
    for s in range(TRAIN["steps"]):
        opt.zero_grad()
        tot = 0.0
        for k in range(TRAIN["accum"]):
            seq = tokens[s, k]
            loss = O.loss_of(O.forward(Q, cfg, seq[:, :-1]), seq[:, 1:]) / TRAIN["accum"]
            loss.backward()
            tot += loss.item()
        torch.nn.utils.clip_grad_norm_([Q[n] for n in names], TRAIN["clip"])
        for grp in opt.param_groups:
            grp["lr"] = O.lr_at(s, TRAIN)
        opt.step()
        theirs.append(tot)
    diff = max(abs(a - b) for a, b in zip(mine, theirs))
    assert diff < 1e-10, f"optimizer loop differs from torch.optim.AdamW: {diff}"
    print(f"check: training loop == torch.optim.AdamW + clip_grad_norm_ (max diff {diff:.1e})")


def check_bf16_linear():
    """The bf16 product's hand-written backward: on operands that bf16 holds
    exactly (so that rounding changes nothing) it equals autograd of x @ W.T."""
    g = torch.Generator().manual_seed(11)
    x = O.round_bf16(torch.randn(2, 5, 7, generator=g, dtype=F64)).requires_grad_()
    W = O.round_bf16(torch.randn(3, 7, generator=g, dtype=F64)).requires_grad_()
    dy = O.round_bf16(torch.randn(2, 5, 3, generator=g, dtype=F64))
    gx, gW = torch.autograd.grad(O.linear(x, W, bf16=True), [x, W], dy)
    rx, rW = torch.autograd.grad(x @ W.T, [x, W], dy)
    assert torch.equal(gx, rx) and torch.equal(gW, rW), "bf16 linear backward"
    y = torch.randn(4, 7, generator=g, dtype=F64)
    assert not torch.equal(O.round_bf16(y), y) and torch.equal(O.round_bf16(O.round_bf16(y)), O.round_bf16(y))
    print("check: bf16 product backward == autograd on bf16-exact operands; rounding is idempotent")


# ---------------------------------------------------------------------------
# Golden cases
# ---------------------------------------------------------------------------

def run_bf16_case(name):
    """The case's micro-batch and trajectory as --precision bf16 computes them:
    the products' operands rounded to bf16, everything else float64."""
    cfg = make_config(CASES[name])
    seed = case_seed(name)
    w = init_weights(cfg, seed)
    tokens = make_tokens(cfg, seed + 1)
    P = to_params(w)
    tr = case_train(name)
    logits, loss, grads, E = micro_loss_and_grads(P, cfg, tokens[0, 0], bf16=True,
                                                  entropy_lambda=tr.get("entropy_lambda", 0.0))
    probe = []
    with torch.no_grad():
        O.forward(P, cfg, tokens[0, 0, :, :-1], probe=probe, bf16=True)
    iv = intervention_losses(P, cfg, tokens[0, 0], probe, bf16=True) if probe else None   # the initial weights
    rec = O.train(P, cfg, tokens, tr, bf16=True)
    with torch.no_grad():
        final = sum(float(O.loss_of(O.forward(P, cfg, tokens[0, k, :, :-1], bf16=True), tokens[0, k, :, 1:]))
                    for k in range(TRAIN["accum"])) / TRAIN["accum"]
    return dict(logits=logits.detach(), loss=loss.detach(), grads=grads, rec=rec, final=final, iv=iv, entropy=E, train=tr)


def intervention_specs(sizes, heads):
    """Interventions on a case's routers (sizes: each router's number of
    sources, in the order they run): a source ablated at the middle router,
    the last router left with its first source alone, fixed weights at the
    first, and two routers at once, the first left with no source."""
    mid, last = len(sizes) // 2, len(sizes) - 1

    def weights(S):
        return [[(i + 1 + h) / sum(j + 1 + h for j in range(S)) for i in range(S)] for h in range(heads)]

    return [
        ("ablate_first_source_at_middle", {mid: ("ablate", list(range(1, sizes[mid])))}),
        ("last_router_keeps_first_source", {last: ("ablate", [0])}),
        ("fixed_weights_at_first", {0: ("weights", weights(sizes[0]))}),
        ("first_empty_and_last_ablated", {0: ("ablate", []), last: ("ablate", list(range(sizes[last] - 1)))}),
    ]


def intervention_losses(P, cfg, tokens, probe, bf16=False):
    """The loss of micro-batch tokens (B, T+1) under each intervention_specs entry
    (with bf16: as --precision bf16 computes it)."""
    heads = O.full_config(cfg)["attnres_num_heads"]
    sizes = [a.shape[0] for a in probe]
    specs = intervention_specs(sizes, heads)
    with torch.no_grad():
        losses = [float(O.loss_of(O.forward(P, cfg, tokens[:, :-1], intervene=iv, bf16=bf16), tokens[:, 1:]))
                  for _, iv in specs]
    return specs, losses, sizes


def run_case(name, dtype=F64):
    cfg = make_config(CASES[name])
    seed = case_seed(name)
    w = init_weights(cfg, seed)
    tokens = make_tokens(cfg, seed + 1)
    P = to_params(w, dtype)
    probe = []
    tr = case_train(name)
    logits, loss, grads, E = micro_loss_and_grads(P, cfg, tokens[0, 0], entropy_lambda=tr.get("entropy_lambda", 0.0))
    with torch.no_grad():
        O.forward(P, cfg, tokens[0, 0, :, :-1], probe=probe)
    iv = intervention_losses(P, cfg, tokens[0, 0], probe) if probe else None   # the initial weights
    rec = O.train(P, cfg, tokens, tr)
    with torch.no_grad():   # step 0's batch after the last update
        final = sum(float(O.loss_of(O.forward(P, cfg, tokens[0, k, :, :-1]), tokens[0, k, :, 1:]))
                    for k in range(TRAIN["accum"])) / TRAIN["accum"]
    gen = greedy_refs(w, cfg, tokens, dtype)   # initial weights, not the trained P
    return dict(cfg=cfg, weights=w, tokens=tokens, logits=logits.detach(), loss=loss.detach(),
                grads=grads, rec=rec, final=final, probe=probe, gen=gen, iv=iv, entropy=E, train=tr)


def hf_config(cfg):
    c = dict(cfg)
    if c["attnres_num_heads"] == 1 and c["attnres_mode"] not in O.MH_MODES:
        del c["attnres_num_heads"]  # single-head configs as before heads existed
    routed = cfg["attnres_mode"] != "baseline"
    c.update({
        "architectures": ["Qwen3AttnResForCausalLM" if routed else "Qwen3ForCausalLM"],
        "model_type": "qwen3_attnres" if routed else "qwen3",
        "hidden_act": "silu", "attention_bias": False, "initializer_range": 0.02,
        "torch_dtype": "float32",
    })
    return c


def f32(t):
    return np.array(t.detach().to(torch.float32).numpy(), order="C")


def write_case(root, name, r):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(json.dumps(hf_config(r["cfg"]), indent=2, sort_keys=True) + "\n")
    tr = dict(r["train"])
    tr["decayed_params"] = [n for n, _ in O.param_shapes(r["cfg"]) if O.is_decayed(n)]
    with open(os.path.join(d, "train.json"), "w") as f:
        f.write(json.dumps(tr, indent=2, sort_keys=True) + "\n")
    O.write_safetensors(os.path.join(d, "model.safetensors"), r["weights"], {"format": "pt"})
    g = dict(outputs(r), tokens=r["tokens"].numpy().astype(np.int32))
    for j, (_, prompt, ids, margins) in enumerate(r["gen"]):
        g[f"generate.prompt.{j}"] = np.array(prompt, dtype=np.int32)
        g[f"generate.ids.{j}"] = np.array(ids, dtype=np.int32)
        g[f"generate.margin.{j}"] = np.array(margins, dtype=np.float32)
    O.write_safetensors(os.path.join(d, "golden.safetensors"), g,
                        {"generator": "tests/oracle/make_golden.py", "case": name})
    O.write_safetensors(os.path.join(d, "golden_bf16.safetensors"), outputs(r["bf16"]),
                        {"generator": "tests/oracle/make_golden.py", "case": name, "precision": "bf16"})
    if r["iv"]:   # routed cases: micro-batch (0, 0)'s loss under each intervention, with the specs as metadata
        specs, losses, sizes = r["iv"]
        spec_json = [{"name": n, "at": [dict(router=k, kind=v[0], value=v[1]) for k, v in sorted(iv.items())]}
                     for n, iv in specs]
        O.write_safetensors(os.path.join(d, "interventions.safetensors"),
                            {"losses": np.array(losses, dtype=np.float32),
                             "losses_bf16": np.array(r["bf16"]["iv"][1], dtype=np.float32)},
                            {"generator": "tests/oracle/make_golden.py", "case": name,
                             "interventions": json.dumps(spec_json, sort_keys=True),
                             "router_sources": json.dumps(sizes)})


def outputs(r):
    """The float32 roundings of a run's results: logits, loss, gradients, trajectory."""
    g = {
        "logits": f32(r["logits"]),
        "loss": f32(r["loss"].reshape(1)),
        "train_losses": np.array(r["rec"]["losses"], dtype=np.float32),
        "train_lrs": np.array(r["rec"]["lrs"], dtype=np.float32),
        "train_grad_norms": np.array(r["rec"]["grad_norms"], dtype=np.float32),
        "final_loss": np.array([r["final"]], dtype=np.float32),
    }
    if r["train"].get("entropy_lambda"):   # the entropy term's E of micro-batch (0, 0), where the case trains with it
        g["route_entropy"] = f32(r["entropy"].reshape(1))
    for n, t in r["grads"].items():
        g["grad." + n] = f32(t)
    return g


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "golden")))
    ap.add_argument("--fp32-report", action="store_true",
                    help="also rerun each case in float32 and print the deviations")
    args = ap.parse_args()

    check_router_backward()
    check_router_backward_heads()
    check_alpha_identities()
    check_finite_differences()
    check_optimizer()
    check_bf16_linear()

    results = {name: run_case(name) for name in CASES}
    for name, r in results.items():
        r["bf16"] = run_bf16_case(name)
    rt, rr = results["delta_block_true"], results["delta_block_reference"]
    assert all(np.array_equal(rt["weights"][n], rr["weights"][n]) for n in rt["weights"])
    assert torch.equal(rt["tokens"], rr["tokens"])
    dl = float((rt["logits"] - rr["logits"]).abs().max())
    assert dl > 1e-3, f"delta_block true/reference logits do not differ ({dl})"
    print(f"check: delta_block true vs reference logits differ on equal weights (max {dl:.3g})")

    for name, r in results.items():
        write_case(args.out, name, r)
        amax = [float(a.max(0).values.mean()) for a in r["probe"]]
        extra = f" | mean max-alpha {min(amax):.2f}..{max(amax):.2f}" if amax else ""
        print(f"{name:24s} loss {float(r['loss']):.5f} | train {r['rec']['losses'][0]:.4f} -> "
              f"{r['rec']['losses'][-1]:.4f} final {r['final']:.4f}{extra}")
        print(f"{'':24s} generate: prompt rows {[q[0] for q in r['gen']]} | min margin "
              f"{min(min(q[3]) for q in r['gen']):.4g}")
        b = r["bf16"]
        gmax = max(float(g.abs().max()) for g in r["grads"].values())
        gdiff = max(float((b["grads"][n] - g).abs().max()) for n, g in r["grads"].items())
        print(f"{'':24s} bf16 vs fp64: logits {float((b['logits'] - r['logits']).abs().max()):.2e} "
              f"(max |logit| {float(r['logits'].abs().max()):.2g}) | loss {abs(float(b['loss'] - r['loss'])):.2e} | "
              f"grad {gdiff:.2e} (largest |grad| {gmax:.2g}) | final loss {abs(b['final'] - r['final']):.2e}")
        if args.fp32_report:
            s = run_case(name, torch.float32)
            dlog = float((s["logits"].double() - r["logits"]).abs().max())
            gabs, gworst = max((float((s["grads"][n].double() - g).abs().max()), n)
                               for n, g in r["grads"].items())
            gmax = max(float(g.abs().max()) for g in r["grads"].values())
            dtr = max(abs(a - b) for a, b in zip(s["rec"]["losses"], r["rec"]["losses"]))
            same = all(a[:3] == b[:3] for a, b in zip(s["gen"], r["gen"]))
            print(f"    fp32 vs fp64: logits {dlog:.1e} | grad abs {gabs:.1e} ({gworst}; "
                  f"largest |grad| {gmax:.2g}) | train_losses {dtr:.1e} | "
                  f"final {abs(s['final'] - r['final']):.1e} | generate "
                  f"{'same' if same else 'DIFFERS'}")


if __name__ == "__main__":
    main()
