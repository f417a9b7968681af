#!/usr/bin/env python3
"""PyTorch eager baseline for text generation with a KV cache (`attnres generate`).

A Qwen3 model with attnres depth routing written the way a PyTorch user would
write it: HF-style nn.Modules (nn.Embedding, nn.Linear(bias=False), an RMSNorm
module, rotary embedding with rotate_half, GQA by repeat_kv, explicit causal
softmax attention since torch 1.13 has no scaled_dot_product_attention) and an
HF DynamicCache-style per-layer KV cache (keys after k_norm and RoPE, values;
torch.cat per step).  All five modes (baseline, block, full, delta,
delta_block) follow tests/oracle/oracle.py's `forward` exactly.  Routing is per
position, so decoding needs no state across time besides the attention cache:
each step routes over the sources of the new token only.  Parameter names are
the oracle's, so `load_params(model, P)` takes the oracle's dict name -> tensor.

One process = one config/mode/dtype, run under torch.inference_mode(); prints
ONE JSON line: prefill tok/s (batch 1, --prompt-len tokens, one forward that
fills the cache and returns the last position's logits, after one untimed
warm-up on a shorter prompt), decode tok/s at batch 1 and at --decode-batch
(prefill --decode-prompt-len random tokens per sequence untimed, then time
--new-tokens greedy steps, each with the LM head and argmax; an untimed 2-step
warm-up decode at that batch size runs first), and peak RSS.

Random weights: matrices N(0, 0.02), norm weights 1, routing pseudo-queries
N(0, 0.02) (so routing is not uniform), null sources and gates 0.

bf16: module weights and activations in torch.bfloat16.  The modules are built
directly in that dtype (what HF's from_pretrained(torch_dtype=torch.bfloat16)
does; the same tensors as building in float32 and calling .to(torch.bfloat16),
without holding a float32 copy that would inflate the peak RSS).  As HF's Qwen3
does, RMSNorm and the attention softmax are computed in float32 and cast back,
and cos/sin are computed in float32; the routing softmax over sources is done
the same way.  Every op torch 1.13 needs here has a bf16 CPU kernel, so nothing
else is upcast.

--autocast: float32 modules run under torch.autocast('cpu', dtype=torch.bfloat16)
(the one line a user adds for mixed precision): the products in bf16 with
float32 weights, everything autocast leaves alone in float32.

    /usr/bin/python3 bench/pytorch_generate.py --config bench-small --mode block [--dtype bf16 | --autocast] [--threads 2]
    /usr/bin/python3 bench/pytorch_generate.py --check     # float64 equality with oracle.forward
"""
import argparse
import json
import math
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
torch = require("torch")
from torch import nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import oracle  # noqa: E402

_COMMON = {"rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True,
           "max_position_embeddings": 4096}
CONFIGS = {
    "tiny": dict(_COMMON, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, intermediate_size=384, vocab_size=8192),
    "bench-small": dict(_COMMON, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, intermediate_size=768, vocab_size=8192),
    "qwen3-0.6b": dict(_COMMON, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       max_position_embeddings=40960),
}


# Attention: F.scaled_dot_product_attention where PyTorch has it (2.x; its fused
# flash kernel on the CPU), the explicit softmax of PyTorch 1.13 otherwise.
# --attention explicit forces the latter (set_attention).
ATTENTION = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "explicit"


def set_attention(name):
    global ATTENTION
    if name == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        raise SystemExit(f"torch {torch.__version__} has no scaled_dot_product_attention")
    ATTENTION = name


def _acc(dtype):
    """Accumulation dtype: float32 for bf16/f16, else the dtype itself (f64 stays f64)."""
    return torch.promote_types(dtype, torch.float32)


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, n, eps, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.to(_acc(dt))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x.to(dt) * self.weight


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim, theta):
        super().__init__()
        # A plain attribute, not a buffer, so model.to(bfloat16) cannot round it.
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))

    def forward(self, start, T, dtype):
        """cos, sin (T, D) for positions start..start+T-1."""
        cdt = _acc(dtype)
        pos = torch.arange(start, start + T, dtype=cdt)
        ang = pos[:, None] * self.inv_freq.to(cdt)[None, :]  # (T, D/2)
        emb = torch.cat([ang, ang], dim=-1)                  # (T, D)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def repeat_kv(x, rep):
    """(B, KV, S, D) -> (B, KV*rep, S, D); query head h uses kv head h // rep."""
    if rep == 1:
        return x
    B, KV, S, D = x.shape
    return x[:, :, None].expand(B, KV, rep, S, D).reshape(B, KV * rep, S, D)


class KVCache:
    """Per-layer keys (after k_norm and RoPE) and values, (B, KV, S, D), grown by torch.cat."""

    def __init__(self, n_layers):
        self.k = [None] * n_layers
        self.v = [None] * n_layers

    def length(self):
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def update(self, i, k, v):
        if self.k[i] is not None:
            k = torch.cat([self.k[i], k], dim=2)
            v = torch.cat([self.v[i], v], dim=2)
        self.k[i], self.v[i] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, cfg, layer_idx, dtype=None):
        super().__init__()
        d, self.H, self.KV, self.D = (cfg["hidden_size"], cfg["num_attention_heads"],
                                      cfg["num_key_value_heads"], cfg["head_dim"])
        self.layer_idx = layer_idx
        self.scaling = self.D ** -0.5
        self.q_proj = nn.Linear(d, self.H * self.D, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(d, self.KV * self.D, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(d, self.KV * self.D, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(self.H * self.D, d, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(self.D, cfg["rms_norm_eps"], dtype)
        self.k_norm = RMSNorm(self.D, cfg["rms_norm_eps"], dtype)

    def forward(self, x, cos, sin, mask, cache):
        """mask: None (no masking: one query, or T = 1), "causal" (no cache before
        this call) or a (T, S) additive -inf mask (a cache before a T > 1 call)."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.H, self.D)).transpose(1, 2)   # (B,H,T,D)
        k = self.k_norm(self.k_proj(x).view(B, T, self.KV, self.D)).transpose(1, 2)  # (B,KV,T,D)
        v = self.v_proj(x).view(B, T, self.KV, self.D).transpose(1, 2)               # (B,KV,T,D)
        q = q * cos + rotate_half(q) * sin                    # cos, sin (T,D) broadcast
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)         # (B,KV,S,D), S = past + T
        rep = self.H // self.KV
        if ATTENTION == "sdpa":                               # PyTorch 2's fused kernel, GQA without copies
            q, k, v = q.to(v.dtype), k.to(v.dtype), v
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if isinstance(mask, str) else mask, is_causal=mask == "causal",
                scale=self.scaling, enable_gqa=rep > 1)      # (B,H,T,D)
        else:                                                 # torch 1.13: explicit softmax
            k, v = repeat_kv(k, rep), repeat_kv(v, rep)       # (B,H,S,D)
            att = (q @ k.transpose(2, 3)) * self.scaling      # (B,H,T,S)
            if mask is not None:
                if isinstance(mask, str):                     # causal, S = T
                    mask = torch.full((T, T), float("-inf"), dtype=att.dtype).triu(1)
                att = att + mask                              # -inf above the causal diagonal
            att = F.softmax(att, dim=-1, dtype=_acc(q.dtype)).to(q.dtype)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, self.H * self.D)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg, dtype=None):
        super().__init__()
        d, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(d, f, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(f, d, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def route(sources, proj, norm):
    """Depth router: alpha = softmax_i(w . RMSNorm(v_i)) per token; returns sum_i alpha_i v_i.
    sources: list of (B,T,d); proj: nn.Linear(d, 1); norm: RMSNorm(d)."""
    V = torch.stack(sources, dim=0)                           # (N,B,T,d)
    z = proj(norm(V)).squeeze(-1)                             # (N,B,T)
    a = F.softmax(z, dim=0, dtype=_acc(z.dtype)).to(V.dtype)
    return (a.unsqueeze(-1) * V).sum(0)                       # (B,T,d)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, i, dtype=None):
        super().__init__()
        d, eps, mode = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["attnres_mode"]
        self.input_layernorm = RMSNorm(d, eps, dtype)
        self.self_attn = Attention(cfg, i, dtype)
        self.post_attention_layernorm = RMSNorm(d, eps, dtype)
        self.mlp = MLP(cfg, dtype)
        self.alpha_gate = mode != "baseline" and cfg["attnres_gate_type"] == "learnable_alpha"
        self.use_null = cfg["attnres_use_null_source"] and mode in ("delta", "delta_block")
        if mode != "baseline":
            for s in ("attn", "mlp"):
                setattr(self, f"{s}_res_proj", nn.Linear(d, 1, bias=False, dtype=dtype))
                setattr(self, f"{s}_res_norm", RMSNorm(d, eps, dtype))
                if self.use_null:
                    setattr(self, f"{s}_null_source", nn.Parameter(torch.zeros(d, dtype=dtype)))
                if self.alpha_gate:
                    setattr(self, f"{s}_res_alpha", nn.Parameter(torch.zeros((), dtype=dtype)))

    def attn(self, u, cos, sin, mask, cache):
        return self.self_attn(self.input_layernorm(u), cos, sin, mask, cache)

    def ffn(self, u):
        return self.mlp(self.post_attention_layernorm(u))

    def route(self, s, srcs):
        return route(srcs, getattr(self, f"{s}_res_proj"), getattr(self, f"{s}_res_norm"))

    def gate(self, s, x, h):
        """learnable_alpha: (1-g) x + g h with the raw g; bias: h."""
        if not self.alpha_gate:
            return h
        g = getattr(self, f"{s}_res_alpha")
        return (1 - g) * x + g * h

    def additive(self, s, x, srcs):
        """Delta modes: x + route([null] + srcs); x alone when there is no source."""
        if self.use_null:
            srcs = [getattr(self, f"{s}_null_source").expand_as(x)] + srcs
        h = x + self.route(s, srcs) if srcs else x
        return self.gate(s, x, h)


class Model(nn.Module):
    def __init__(self, cfg, dtype=None):
        super().__init__()
        d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
        self.mode = cfg["attnres_mode"]
        self.nb = oracle.layers_per_block(cfg)                # layers per block
        self.block_delta = cfg["attnres_block_delta"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], d, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype) for i in range(L))
        if self.mode in ("full", "block"):
            self.final_res_proj = nn.Linear(d, 1, bias=False, dtype=dtype)
            self.final_res_norm = RMSNorm(d, cfg["rms_norm_eps"], dtype)
        self.norm = RMSNorm(d, cfg["rms_norm_eps"], dtype)
        self.rotary = RotaryEmbedding(cfg["head_dim"], float(cfg["rope_theta"]))

    def forward(self, ids, cache=None):
        """ids (B,T) -> final hidden states (B,T,d) before model.norm; appends to cache."""
        T = ids.shape[1]
        past = cache.length() if cache is not None else 0
        e = self.embed_tokens(ids)                            # (B,T,d)
        cos, sin = self.rotary(past, T, e.dtype)              # (T,D)
        mask = None
        if T > 1 and past == 0:
            mask = "causal"
        elif T > 1:                                           # query t sees keys s <= past + t
            mask = torch.full((T, past + T), float("-inf"), dtype=e.dtype).triu(past + 1)
        layers, nb = self.layers, self.nb

        def attn(i, u):
            return layers[i].attn(u, cos, sin, mask, cache)

        if self.mode == "baseline":
            x = e
            for i, ly in enumerate(layers):
                x = x + attn(i, x)
                x = x + ly.ffn(x)
            return x

        if self.mode == "full":                               # sources e, a_0, m_0, ...
            srcs, last = [], e
            for i, ly in enumerate(layers):
                a = attn(i, ly.gate("attn", last, ly.route("attn", srcs + [last])))
                srcs, last = srcs + [last], a
                m = ly.ffn(ly.gate("mlp", last, ly.route("mlp", srcs + [last])))
                srcs, last = srcs + [last], m
            return route(srcs + [last], self.final_res_proj, self.final_res_norm)

        if self.mode == "block":                              # sources: completed blocks + partial sum
            blocks, partial = [], e
            for i, ly in enumerate(layers):
                u = ly.gate("attn", partial, ly.route("attn", blocks + [partial]))
                if i % nb == 0:
                    blocks, partial = blocks + [partial], torch.zeros_like(partial)
                partial = partial + attn(i, u)
                u = ly.gate("mlp", partial, ly.route("mlp", blocks + [partial]))
                partial = partial + ly.ffn(u)
            return route(blocks + [partial], self.final_res_proj, self.final_res_norm)

        if self.mode == "delta":                              # stream x plus routed sublayer outputs
            srcs, x = [], e
            for i, ly in enumerate(layers):
                a = attn(i, ly.additive("attn", x, srcs))
                if not srcs:
                    srcs = [x]                                # e becomes a source after layer 0's attention
                x = x + a
                srcs = srcs + [a]
                m = ly.ffn(ly.additive("mlp", x, srcs))
                x = x + m
                srcs = srcs + [m]
            return x

        if self.mode == "delta_block":                        # sources: per-block stream increments
            srcs, x, x_b = [], e, None                        # x_b: stream at the previous block start
            for i, ly in enumerate(layers):
                a = attn(i, ly.additive("attn", x, srcs))
                if i % nb == 0:
                    if self.block_delta == "true":
                        src = x if i == 0 else x - x_b
                        x_b = x
                    else:                                     # "reference": x - last source
                        src = x if not srcs else x - srcs[-1]
                    srcs = srcs + [src]
                x = x + a
                m = ly.ffn(ly.additive("mlp", x, srcs))
                x = x + m
            return x

        raise ValueError(self.mode)


class ForCausalLM(nn.Module):
    def __init__(self, cfg, dtype=None):
        super().__init__()
        self.cfg = cfg = oracle.full_config(cfg)
        self.model = Model(cfg, dtype)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False, dtype=dtype)
        if cfg["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids, cache=None, logits_to_keep=0):
        """ids (B,T) -> logits (B,T,V), or of the last logits_to_keep positions only."""
        h = self.model(ids, cache)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return self.lm_head(self.model.norm(h))


def autocast(on):
    """torch.autocast('cpu', dtype=torch.bfloat16) when on, else nothing."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=on)


# ---------------------------------------------------------------------------
# Weights by the oracle's names
# ---------------------------------------------------------------------------

def _own_params(model):
    """name -> parameter; a tied lm_head.weight appears once, as model.embed_tokens.weight."""
    return dict(model.named_parameters())


def load_params(model, P):
    """Copies P (oracle name -> tensor) into the model. Null sources outside the delta modes
    are ignored (as the reference does); 0-dim alphas may also come as [1]."""
    own = _own_params(model)
    P = {n: t for n, t in P.items() if n in own or not n.endswith("_null_source")}
    if model.cfg["tie_word_embeddings"]:
        P.pop("lm_head.weight", None)
    missing, extra = sorted(set(own) - set(P)), sorted(set(P) - set(own))
    assert not missing and not extra, f"missing {missing}, unexpected {extra}"
    with torch.no_grad():
        for n, t in P.items():
            own[n].copy_(t.reshape(own[n].shape))


def init_random_(model, seed):
    """Matrices N(0, 0.02), norm weights 1, pseudo-queries N(0, 0.02), null sources and gates 0.
    Drawn in float32 in oracle.param_shapes order, so every dtype gets the same values (rounded)."""
    own = _own_params(model)
    names = [n for n, _ in oracle.param_shapes(model.cfg)]
    assert set(names) == set(own), sorted(set(names) ^ set(own))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in names:
            p = own[n]
            if n.endswith("norm.weight"):
                p.fill_(1.0)
            elif n.endswith("null_source") or n.endswith("res_alpha"):
                p.zero_()
            else:  # in row chunks, so a float32 draw of the embedding does not raise the peak RSS
                rows = p.view(-1, p.shape[-1])
                step = max(1, (1 << 20) // rows.shape[1])
                for r in range(0, rows.shape[0], step):
                    chunk = rows[r:r + step]
                    chunk.copy_(torch.empty(chunk.shape, dtype=torch.float32).normal_(0, 0.02, generator=g))


# ---------------------------------------------------------------------------
# --check: float64 equality with oracle.forward, and cached decoding = full forward
# ---------------------------------------------------------------------------

def check():
    """Each attention PyTorch has here (sdpa and explicit on 2.x), every mode."""
    impls = ["explicit"] + (["sdpa"] if hasattr(F, "scaled_dot_product_attention") else [])
    for impl in impls:
        set_attention(impl)
        print(f"torch {torch.__version__}, attention {impl}:")
        check_one()


def check_one():
    torch.set_num_threads(1)
    base = {"hidden_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "intermediate_size": 80, "vocab_size": 97, "rms_norm_eps": 1e-6,
            "rope_theta": 1e4, "tie_word_embeddings": False, "max_position_embeddings": 64}
    cases = [
        ("baseline", dict(attnres_mode="baseline")),
        ("baseline_tied", dict(attnres_mode="baseline", tie_word_embeddings=True, num_hidden_layers=3)),
        ("full", dict(attnres_mode="full")),
        ("full_alpha", dict(attnres_mode="full", attnres_gate_type="learnable_alpha")),
        ("block", dict(attnres_mode="block", attnres_num_blocks=3)),
        ("block_alpha", dict(attnres_mode="block", attnres_num_blocks=3, attnres_gate_type="learnable_alpha")),
        ("block_tied_4", dict(attnres_mode="block", attnres_num_blocks=4, tie_word_embeddings=True)),
        ("delta", dict(attnres_mode="delta")),
        ("delta_null", dict(attnres_mode="delta", attnres_use_null_source=True)),
        ("delta_null_alpha", dict(attnres_mode="delta", attnres_use_null_source=True,
                                  attnres_gate_type="learnable_alpha")),
        ("delta_block", dict(attnres_mode="delta_block", attnres_num_blocks=3)),
        ("delta_block_reference", dict(attnres_mode="delta_block", attnres_num_blocks=3,
                                       attnres_block_delta="reference")),
        ("delta_block_null", dict(attnres_mode="delta_block", attnres_num_blocks=3, attnres_use_null_source=True)),
        ("delta_block_alpha", dict(attnres_mode="delta_block", attnres_num_blocks=3,
                                   attnres_gate_type="learnable_alpha")),
        ("delta_block_ref_null_alpha", dict(attnres_mode="delta_block", attnres_num_blocks=3,
                                            attnres_block_delta="reference", attnres_use_null_source=True,
                                            attnres_gate_type="learnable_alpha")),
    ]
    B, T, tol, worst = 2, 13, 1e-10, 0.0  # float64 both: any CPU's BLAS moves ~1e-14, far inside
    for k, (name, over) in enumerate(cases):
        cfg = oracle.full_config(dict(base, **over))
        g = torch.Generator().manual_seed(1000 + k)
        P = {}
        for n, shape in oracle.param_shapes(cfg):             # non-trivial weights, as the golden cases
            r = torch.randn(shape, dtype=torch.float64, generator=g)
            if n.endswith("norm.weight"):
                t = 1 + 0.1 * r
            elif "res_proj" in n:
                t = 0.5 * r
            elif n.endswith("null_source"):
                t = 0.2 * r
            elif n.endswith("res_alpha"):
                t = 0.5 + 0.15 * r
            elif n == "model.embed_tokens.weight":
                t = r * (0.1 if cfg["tie_word_embeddings"] else 1.0)
            else:
                t = 0.1 * r
            P[n] = t
        ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
        ref = oracle.forward(P, cfg, ids)
        model = ForCausalLM(cfg, dtype=torch.float64).eval()
        load_params(model, P)
        with torch.inference_mode():
            full = model(ids)
            err_a = (full - ref).abs().max().item()
            # (b) prefill 4 tokens, then one token at a time; and one at a time from an empty cache
            errs = []
            for pre in (4, 1):
                cache = KVCache(cfg["num_hidden_layers"])
                outs = [model(ids[:, :pre], cache)]
                for t in range(pre, T):
                    outs.append(model(ids[:, t:t + 1], cache))
                assert cache.length() == T
                errs.append((torch.cat(outs, dim=1) - full).abs().max().item())
            last = model(ids, KVCache(cfg["num_hidden_layers"]), logits_to_keep=1)
            errs.append((last - full[:, -1:]).abs().max().item())
        err_b = max(errs)
        ok = err_a <= tol and err_b <= tol
        worst = max(worst, err_a, err_b)
        print(f"{'ok  ' if ok else 'FAIL'} {name:28s} vs oracle {err_a:.1e}  cached decode vs full {err_b:.1e}"
              f"  (max|logit| {ref.abs().max().item():.2f})", flush=True)
        assert ok, name
    print(f"all {len(cases)} cases within {tol:g} (worst {worst:.1e})")


# ---------------------------------------------------------------------------
# Benchmark
# ---------------------------------------------------------------------------

class HFAdapter:
    """transformers' Qwen3ForCausalLM behind this file's call shape:
    model(ids, cache, logits_to_keep) with a DynamicCache as the cache."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids, cache=None, logits_to_keep=0):
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=cache is not None,
                         logits_to_keep=logits_to_keep)
        return out.logits


def hf_model(cfg, dtype):
    """The real transformers Qwen3ForCausalLM of cfg's shape, random weights, in dtype."""
    import transformers
    hf = transformers.Qwen3Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"], tie_word_embeddings=cfg["tie_word_embeddings"],
        max_position_embeddings=cfg["max_position_embeddings"], attn_implementation="sdpa")
    torch.set_default_dtype(dtype)                            # built in dtype: no float32 copy in the peak RSS
    try:
        model = transformers.Qwen3ForCausalLM(hf).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                rows = p.view(-1, p.shape[-1])
                step = max(1, (1 << 20) // rows.shape[1])
                for r in range(0, rows.shape[0], step):
                    chunk = rows[r:r + step]
                    chunk.copy_(torch.empty(chunk.shape, dtype=torch.float32).normal_(0, 0.02, generator=g))
    return model


def new_cache(impl, cfg):
    if impl == "transformers":
        import transformers
        return transformers.DynamicCache()
    return KVCache(cfg["num_hidden_layers"])


def cache_length(cache):
    return cache.get_seq_length() if hasattr(cache, "get_seq_length") else cache.length()


def decode_tok_per_s(model, cfg, batch, prompt_len, new_tokens, gen, impl="hand"):
    V = cfg["vocab_size"]

    def run(n_steps, timed):
        cache = new_cache(impl, cfg)
        ids = torch.randint(0, V, (batch, prompt_len), generator=gen)
        nxt = model(ids, cache, logits_to_keep=1).argmax(-1)  # (B,1)
        t0 = time.perf_counter()
        for _ in range(n_steps):
            nxt = model(nxt, cache, logits_to_keep=1).argmax(-1)  # logits (B,1,V) -> (B,1)
        dt = time.perf_counter() - t0
        assert cache_length(cache) == prompt_len + n_steps
        return dt

    run(min(2, new_tokens), False)                            # warm-up at this batch size
    return batch * new_tokens / run(new_tokens, True)


def bench(a):
    """One configuration (a.config_name): fp32 = float32 weights, bf16 = bfloat16
    weights (what from_pretrained(torch_dtype=torch.bfloat16) gives: the
    fastest bf16 inference in eager PyTorch); compiled configurations wrap the
    model's forward in torch.compile(dynamic=True) (the cache grows every step)."""
    import peer_configs as PC
    execution, precision = PC.parse(a.config_name)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    set_attention(a.attention)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    cfg = oracle.full_config(dict(CONFIGS[a.config], attnres_mode=a.mode, attnres_num_blocks=a.num_blocks))
    if a.impl == "transformers":
        if a.mode != "baseline":
            raise SystemExit("--impl transformers: transformers has only the baseline (plain Qwen3)")
        model = HFAdapter(hf_model(cfg, dtype))
    else:
        model = ForCausalLM(cfg, dtype=dtype).eval()
        init_random_(model, a.seed)
    forward = PC.compiled(torch, model, execution, dynamic=True) if execution != "eager" else model
    V = cfg["vocab_size"]
    assert a.prompt_len <= cfg["max_position_embeddings"]
    assert a.decode_prompt_len + a.new_tokens <= cfg["max_position_embeddings"]
    gen = torch.Generator().manual_seed(a.seed + 1)
    with torch.inference_mode():
        # prefill: warm-up (compiles) on a shorter prompt, then one timed forward of prompt_len tokens
        t0 = time.perf_counter()
        warm = max(2, min(64, a.prompt_len // 2))
        forward(torch.randint(0, V, (1, warm), generator=gen), new_cache(a.impl, cfg), logits_to_keep=1)
        forward(torch.randint(0, V, (1, a.prompt_len), generator=gen), new_cache(a.impl, cfg), logits_to_keep=1)
        warm_s = time.perf_counter() - t0
        ids = torch.randint(0, V, (1, a.prompt_len), generator=gen)
        cache = new_cache(a.impl, cfg)
        t0 = time.perf_counter()
        logits = forward(ids, cache, logits_to_keep=1)        # (1,1,V)
        prefill_s = time.perf_counter() - t0
        assert logits.shape == (1, 1, V) and cache_length(cache) == a.prompt_len
        assert bool(torch.isfinite(logits).all())
        del cache
        t0 = time.perf_counter()
        b1 = bn = None                                        # --prefill-only: not measured
        if not a.prefill_only:
            b1 = decode_tok_per_s(forward, cfg, 1, a.decode_prompt_len, a.new_tokens, gen, a.impl)
            bn = decode_tok_per_s(forward, cfg, a.decode_batch, a.decode_prompt_len, a.new_tokens, gen, a.impl)
        decode_wall_s = time.perf_counter() - t0
    out = {"peer": PC.peer(torch, a.impl, a.config_name, attention=a.attention if a.impl == "hand" else "sdpa",
                           env=PC.env_note()),
           "config": a.config, "mode": a.mode, "precision": precision, "threads": a.threads,
           "prompt_len": a.prompt_len, "prefill_tok_per_s": a.prompt_len / prefill_s,
           "decode_prompt_len": a.decode_prompt_len, "new_tokens": a.new_tokens,
           "decode_tok_per_s_b1": b1, f"decode_tok_per_s_b{a.decode_batch}": bn,
           "warmup_s": warm_s, "decode_wall_s": decode_wall_s, "peak_rss_bytes": PC.peak_rss_bytes()}
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="float64 checks against oracle.forward, then exit")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="bench-small")
    ap.add_argument("--impl", choices=("hand", "transformers"), default="hand")
    ap.add_argument("--mode", choices=oracle.MODES, default="baseline")
    ap.add_argument("--attention", choices=("sdpa", "explicit"), default=ATTENTION)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-blocks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--decode-batch", type=int, default=8)
    ap.add_argument("--prefill-only", action="store_true",
                    help="time the prefill alone (torch.compile(dynamic=True) of the decode loop recompiles as the "
                         "cache grows and took more than 4 minutes on 2 cores)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import peer_configs as PC
    PC.add_args(ap, default="eager-fp32,eager-bf16,compile-fp32,compile-bf16")
    a = ap.parse_args()
    if a.check:
        check()
    elif not PC.drive(a, os.path.abspath(__file__), key="prefill_tok_per_s", group=("mode", "precision")):
        bench(a)


if __name__ == "__main__":
    main()
