"""Independent PyTorch oracle for attnres: Qwen3 with depth routing.

What it is: a plain, float64, autograd-based implementation of the model in
docs/DESIGN.md (sections 1 and 2), written from that document and from
the facts recorded in tests/oracle/README.md. It exists to produce golden
files (see make_golden.py) that the C++ engine is tested against.

What it is not: fast, memory-efficient, or a copy of the reference code. It
uses no `transformers` and no `safetensors` package; a small safetensors
reader/writer lives here.

Dimension letters: B batch, T tokens, d hidden_size, H query heads,
KV key/value heads, D head_dim, F intermediate_size, V vocab_size,
L num_hidden_layers, N number of routing sources; `heads` is the routers'
attnres_num_heads (each routing head owns d/heads dimensions).
"""

import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
np = require("numpy")
torch = require("torch")

# ---------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header, raw data.
# ---------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "BOOL": np.bool_,
}
_NP_TO_ST = {np.dtype(v).str: k for k, v in _ST_DTYPES.items()}


def read_safetensors(path):
    """Returns (dict name -> numpy array, metadata dict). BF16 -> float32."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        if info["dtype"] == "BF16":
            u16 = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32)
            arr = (u16 << 16).view(np.float32)
        else:
            dt = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
            arr = np.frombuffer(data[b:e], dtype=dt)
        out[name] = np.array(arr.reshape(shape))
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """Writes tensors (name -> numpy array) sorted by name, header padded with
    spaces to a multiple of 8 bytes. Byte-for-byte deterministic."""
    header = {}
    chunks = []
    off = 0
    for name in sorted(tensors):
        arr = np.array(tensors[name], order="C")  # keeps 0-dim shapes (ascontiguousarray would not)
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        st = _NP_TO_ST[arr.dtype.str]
        raw = arr.tobytes()
        header[name] = {"dtype": st, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for c in chunks:
            f.write(c)


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

ATTNRES_DEFAULTS = {
    "attnres_mode": "baseline",
    "attnres_num_blocks": 8,            # reference default
    "attnres_block_delta": "true",      # DESIGN default; "reference" = released code
    "attnres_use_null_source": False,
    "attnres_gate_type": "bias",        # "bias" (no gate) | "learnable_alpha" | "sigmoid_scalar" | "sigmoid_vector"
    "attnres_query_init": "zero",       # init only: "zero" (DESIGN) | "normal"
    "attnres_num_heads": None,          # routing heads; absent: 8 for the _mh names, else 1
}

MODES = ("baseline", "full", "block", "delta", "delta_block", "block_add", "full_additive", "delta_replace",
         "first_layer", "delta_v", "full_v", "pre_gated")
# block_add (not in the papers): block's sources (the partial block sums) added
# to a residual stream as the delta modes add their routed sum.
# full_additive (the reference code's, not in the papers): the stream after each
# sublayer so far (its cumulative states; not e) added to the stream.
# delta_replace (the reference code's): every sublayer output so far (not e) and
# the current stream, the mix replacing the input; the stream still adds each output.
# first_layer (the reference code's): from layer 2 on, a mix of the stream and
# layer 1's attention output replaces the input; no gate.
# delta_v (the reference code's): delta's routing over the sublayer outputs (not
# e), and per attention sublayer a value router (v_res_proj, v_res_norm; the
# attention router's null source and gate) whose input feeds V alone.
# full_v (the reference code's): routing over the stream after each sublayer so
# far and the current stream (the last state again; e alone at first), replacing
# the input, with delta_v's value router; the stream adds each output.
# pre_gated (the reference code's): delta_v's sources (the outputs, not e), each
# multiplied by g = sigmoid(x W^T + b) (a d x d linear per router) before the
# softmax, the keys normalised from the gated values, added to the stream; no gate.
# The reference's multi-head names (DESIGN.md section 2, "Multi-head routing"):
# each is one of the modes above with 8 heads by default; block_mh has no
# final router, delta_mh always has the null source and the reference's block deltas.
MH_MODES = {"block_mh": "block", "full_mh": "full", "delta_mh": "delta_block"}


def base_mode(cfg):
    """The mode whose order of operations a (full) config follows."""
    return MH_MODES.get(cfg["attnres_mode"], cfg["attnres_mode"])


def full_config(cfg):
    c = dict(ATTNRES_DEFAULTS)
    c.update(cfg)
    assert c["attnres_mode"] in MODES or c["attnres_mode"] in MH_MODES, c["attnres_mode"]
    if c["attnres_num_heads"] is None:
        c["attnres_num_heads"] = 8 if c["attnres_mode"] in MH_MODES else 1
    if c["attnres_mode"] == "delta_mh":
        c["attnres_use_null_source"] = True
        c["attnres_block_delta"] = "reference"
    assert c["attnres_block_delta"] in ("true", "reference")
    assert c["attnres_gate_type"] in ("bias", "learnable_alpha", "sigmoid_scalar", "sigmoid_vector")
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0
    Hr = c["attnres_num_heads"]
    assert Hr >= 1 and c["hidden_size"] % Hr == 0, Hr
    assert Hr == 1 or c["attnres_mode"] != "baseline"
    return c


def has_final_router(cfg):
    """full and block route the final norm's input; block_mh does not (the reference's quirk)."""
    return cfg["attnres_mode"] in ("full", "block", "full_mh")


def layers_per_block(cfg):
    """B = ceil(L / num_blocks), at least 1."""
    L, nb = cfg["num_hidden_layers"], cfg["attnres_num_blocks"]
    return max(1, (L + nb - 1) // nb)


def param_shapes(cfg):
    """Canonical ordered list of (name, shape) of every trainable tensor."""
    cfg = full_config(cfg)
    d, H, KV, D = (cfg["hidden_size"], cfg["num_attention_heads"],
                   cfg["num_key_value_heads"], cfg["head_dim"])
    F, V, L = cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    mode = base_mode(cfg)
    out = [("model.embed_tokens.weight", (V, d))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (d,)),
            (p + "self_attn.q_proj.weight", (H * D, d)),
            (p + "self_attn.k_proj.weight", (KV * D, d)),
            (p + "self_attn.v_proj.weight", (KV * D, d)),
            (p + "self_attn.o_proj.weight", (d, H * D)),
            (p + "self_attn.q_norm.weight", (D,)),
            (p + "self_attn.k_norm.weight", (D,)),
            (p + "post_attention_layernorm.weight", (d,)),
            (p + "mlp.gate_proj.weight", (F, d)),
            (p + "mlp.up_proj.weight", (F, d)),
            (p + "mlp.down_proj.weight", (d, F)),
        ]
        if mode != "baseline":
            for s in ("attn", "mlp"):
                out += [(p + f"{s}_res_proj.weight", (1, d)),
                        (p + f"{s}_res_norm.weight", (d,))]
            if mode == "pre_gated":
                for s in ("attn", "mlp"):
                    out += [(p + f"{s}_pre_gate.weight", (d, d)), (p + f"{s}_pre_gate.bias", (d,))]
            if mode in ("delta_v", "full_v"):
                out += [(p + "v_res_proj.weight", (1, d)), (p + "v_res_norm.weight", (d,))]
            if cfg["attnres_use_null_source"] and mode in ("delta", "delta_block", "block_add", "full_additive",
                                                           "delta_v"):
                out += [(p + "attn_null_source", (d,)), (p + "mlp_null_source", (d,))]
            if cfg["attnres_gate_type"] == "learnable_alpha":
                # 0-dim scalars, as nn.Parameter(torch.tensor(0.0)) in the reference.
                out += [(p + "attn_res_alpha", ()), (p + "mlp_res_alpha", ())]
            if cfg["attnres_gate_type"] == "sigmoid_scalar":
                # The gate's logit theta, g = sigmoid(theta): 0-dim, -2 at the reference's init.
                out += [(p + "attn_res_gate_logit", ()), (p + "mlp_res_gate_logit", ())]
            if cfg["attnres_gate_type"] == "sigmoid_vector":
                # g = sigmoid(x_g W^T + b) per token and channel: an nn.Linear(d, d) per router.
                for s in ("attn", "mlp"):
                    out += [(p + f"{s}_res_gate_proj.weight", (d, d)), (p + f"{s}_res_gate_proj.bias", (d,))]
    if has_final_router(cfg):
        out += [("model.final_res_proj.weight", (1, d)),
                ("model.final_res_norm.weight", (d,))]
    out.append(("model.norm.weight", (d,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, d)))
    return out


_DECAYED_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                     "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def is_decayed(name):
    """Weight decay: embedding, LM head and the seven projection matrices only."""
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return True
    in_sublayer = ".self_attn." in name or ".mlp." in name
    return in_sublayer and name.endswith(_DECAYED_SUFFIXES)


# ---------------------------------------------------------------------------
# bf16 products (the engine's --precision bf16; docs/DESIGN.md section 6)
# ---------------------------------------------------------------------------

def round_bf16(t):
    """t's values as a bf16 product reads them: the engine holds float32
    values and rounds those to bfloat16, nearest even; so float32 first."""
    return t.to(torch.float32).to(torch.bfloat16).to(t.dtype)


class _Bf16Linear(torch.autograd.Function):
    """x @ W.T with both operands rounded to bfloat16 and the sums exact
    (float64 here; float32 in the engine).  The backward runs the same kind
    of products: dX = r(dY) r(W), dW = r(dY)^T r(X), r = round_bf16."""

    @staticmethod
    def forward(ctx, x, W):
        xr, Wr = round_bf16(x), round_bf16(W)
        ctx.save_for_backward(xr, Wr)
        return xr @ Wr.T

    @staticmethod
    def backward(ctx, dy):
        xr, Wr = ctx.saved_tensors
        g = round_bf16(dy)
        dW = g.reshape(-1, g.shape[-1]).T @ xr.reshape(-1, xr.shape[-1])
        return g @ Wr, dW


def linear(x, W, bf16=False):
    """x @ W.T, nn.Linear without bias; bf16: as a bf16 product."""
    return _Bf16Linear.apply(x, W) if bf16 else x @ W.T


class _Bf16Attention(torch.autograd.Function):
    """Causal attention with its products as bf16 products (the engine's
    --precision bf16; ops/backend.h): q, k, v (B, H, T, D) after RoPE, k and v
    already repeated per query head.  S = s r(q) r(k)^T, P = softmax(S),
    y = r(P) r(v); the backward, with D = rowsum(dy * y):
    dP = r(dy) r(v)^T, dS = P * (dP - D), dq = s r(dS) r(k),
    dk = s r(dS)^T r(q), dv = r(P)^T r(dy).  Sums exact (float64 here)."""

    @staticmethod
    def forward(ctx, q, k, v):
        T, D = q.shape[-2], q.shape[-1]
        scale = 1.0 / math.sqrt(D)
        qr, kr, vr = round_bf16(q), round_bf16(k), round_bf16(v)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        P = ((qr @ kr.transpose(-1, -2)) * scale).masked_fill(mask, float("-inf")).softmax(-1)
        y = round_bf16(P) @ vr
        ctx.save_for_backward(qr, kr, vr, P, y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, dy):
        qr, kr, vr, P, y = ctx.saved_tensors
        s = ctx.scale
        g = round_bf16(dy)
        dS = P * (g @ vr.transpose(-1, -2) - (dy * y).sum(-1, keepdim=True))
        dSr = round_bf16(dS)
        return s * dSr @ kr, s * dSr.transpose(-1, -2) @ qr, round_bf16(P).transpose(-1, -2) @ g


def embed_table(E, bf16=False):
    """The table the embedding lookup reads: E, or in bf16 its rounded copy
    (the one the tied LM head multiplies with), whose gradient is E's."""
    return E + (round_bf16(E) - E).detach() if bf16 else E


# ---------------------------------------------------------------------------
# Model pieces (inputs float64 tensors; params a dict name -> tensor)
# ---------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T, D, theta, dtype):
    j = torch.arange(0, D, 2, dtype=dtype)
    inv_freq = 1.0 / (theta ** (j / D))                       # (D/2,)
    ang = torch.arange(T, dtype=dtype)[:, None] * inv_freq[None, :]  # (T, D/2)
    emb = torch.cat([ang, ang], dim=-1)                       # (T, D)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def attention(P, pre, u, cfg, cos, sin, bf16=False, uv=None):
    """u (B,T,d) -> o_proj output (B,T,d); uv: the value projection's own
    input (V-stream routing), else u."""
    Bsz, T, _ = u.shape
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    q = linear(u, P[pre + "q_proj.weight"], bf16).view(Bsz, T, H, D)
    k = linear(u, P[pre + "k_proj.weight"], bf16).view(Bsz, T, KV, D)
    v = linear(u if uv is None else uv, P[pre + "v_proj.weight"], bf16).view(Bsz, T, KV, D)
    q = rmsnorm(q, P[pre + "q_norm.weight"], eps)
    k = rmsnorm(k, P[pre + "k_norm.weight"], eps)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B,heads,T,D)
    rep = H // KV
    k = k.repeat_interleave(rep, dim=1)   # query head h uses kv head h // rep
    v = v.repeat_interleave(rep, dim=1)
    if bf16:
        y = _Bf16Attention.apply(q, k, v)                     # (B,H,T,D)
    else:
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)        # (B,H,T,T)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
    y = y.transpose(1, 2).reshape(Bsz, T, H * D)
    return linear(y, P[pre + "o_proj.weight"], bf16)


def mlp(P, pre, u, bf16=False):
    g = linear(u, P[pre + "gate_proj.weight"], bf16)
    up = linear(u, P[pre + "up_proj.weight"], bf16)
    return linear(torch.nn.functional.silu(g) * up, P[pre + "down_proj.weight"], bf16)


ENTROPY_EPS = 1e-8   # the reference code's: -sum alpha ln(alpha + 1e-8)


def route_entropy(a):
    """The entropy term's per-router value from alpha (N,B,T) or (N,B,T,heads):
    the mean over tokens (and heads) of -sum_i alpha_i ln(alpha_i + 1e-8)."""
    return -(a * (a + ENTROPY_EPS).log()).sum(0).mean()


def route(sources, proj_w, norm_w, eps, probe=None, heads=1, intervention=None, entropy=None):
    """Softmax over sources of w . RMSNorm_gamma(v_i); returns sum_i alpha_i v_i.
    sources: list of (B,T,d); proj_w (1,d); norm_w (d,).
    heads > 1: the keys are the RMSNorm over the full d, viewed as `heads`
    slices of d/heads; head h's logit is its query slice . its key slice (no
    scale), a softmax over the sources per head, and the output's slice h
    mixes the raw sources' slice h.  probe gets alpha (N,B,T), or
    (N,B,T,heads) with heads.
    intervention (docs/routing.md, "Interventions"): ("ablate", keep) routes
    over the sources at the positions in keep alone (the softmax renormalised
    over them; none left: the routed sum is 0); ("weights", w) takes
    alpha[h][i] = w[h][i] for every token instead of the softmax.
    entropy: a list that receives route_entropy(alpha), differentiable."""
    if intervention is not None and intervention[0] == "ablate":
        if not intervention[1]:
            return torch.zeros_like(sources[0])
        sources = [sources[p] for p in intervention[1]]
        intervention = None
    Vs = torch.stack(sources, dim=0)                          # (N,B,T,d)
    if intervention is not None:                              # fixed weights (heads, N)
        w = torch.tensor(intervention[1], dtype=Vs.dtype)
        d = Vs.shape[-1]
        sliced = Vs.shape[:-1] + (heads, d // heads)
        a = w.T.reshape(len(sources), 1, 1, heads, 1)        # (N,1,1,heads,1)
        return (a * Vs.view(sliced)).sum(0).reshape(Vs.shape[1:])
    if heads == 1:
        z = rmsnorm(Vs, norm_w, eps) @ proj_w.reshape(-1)     # (N,B,T)
        a = z.softmax(dim=0)
        if probe is not None:
            probe.append(a.detach())
        if entropy is not None:
            entropy.append(route_entropy(a))
        return (a.unsqueeze(-1) * Vs).sum(0)
    d = Vs.shape[-1]
    sliced = Vs.shape[:-1] + (heads, d // heads)            # (N,B,T,heads,d/heads)
    K = rmsnorm(Vs, norm_w, eps).view(sliced)               # the full-d norm, then slices
    q = proj_w.reshape(heads, d // heads)
    z = (K * q).sum(-1)                                       # (N,B,T,heads)
    a = z.softmax(dim=0)
    if probe is not None:
        probe.append(a.detach())
    if entropy is not None:
        entropy.append(route_entropy(a))
    return (a.unsqueeze(-1) * Vs.view(sliced)).sum(0).reshape(Vs.shape[1:])


def forward(P, cfg, ids, probe=None, bf16=False, intervene=None, entropy=None):
    """P: dict name -> float tensor; ids: (B,T) int64. Returns logits (B,T,V).
    probe: optional list that receives every router's alpha, (N,B,T) with
    one routing head, (N,B,T,heads) with more.
    bf16: the products (projections, MLP, LM head) and the embedding lookup
    read bf16-rounded operands, as the engine's --precision bf16.
    intervene: {router: intervention} (see route), routers numbered in the
    order they run (each sublayer that has one, then the final router).
    entropy: a list that receives each sublayer router's route_entropy (not
    the final router's; the entropy term, mean_entropy)."""
    cfg = full_config(cfg)
    mode = base_mode(cfg)
    heads = cfg["attnres_num_heads"]
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    E = P["model.embed_tokens.weight"]
    Bsz, T = ids.shape
    cos, sin = rope_cos_sin(T, cfg["head_dim"], float(cfg["rope_theta"]), E.dtype)
    nb = layers_per_block(cfg)
    gate_type = cfg["attnres_gate_type"]
    use_null = cfg["attnres_use_null_source"] and mode in ("delta", "delta_block", "block_add", "full_additive",
                                                           "delta_v")

    def lp(i):
        return f"model.layers.{i}."

    def attn_of(i, h, hv=None):
        g = P[lp(i) + "input_layernorm.weight"]
        return attention(P, lp(i) + "self_attn.", rmsnorm(h, g, eps), cfg, cos, sin, bf16,
                         None if hv is None else rmsnorm(hv, g, eps))

    def mlp_of(i, h):
        return mlp(P, lp(i) + "mlp.", rmsnorm(h, P[lp(i) + "post_attention_layernorm.weight"], eps), bf16)

    ran = [0]   # routers run so far: the next one's number

    def route_next(srcs, proj_w, norm_w, ent=None):
        r = ran[0]
        ran[0] += 1
        return route(srcs, proj_w, norm_w, eps, probe, heads, (intervene or {}).get(r), ent)

    def routed(i, s, srcs, r=None):
        """r: the router's own tensors' prefix where not s's (the value router "v",
        which the entropy term does not read)."""
        r = r or s
        return route_next(srcs, P[lp(i) + f"{r}_res_proj.weight"], P[lp(i) + f"{r}_res_norm.weight"],
                          entropy if r == s else None)

    def gate(i, s, x, h):
        """learnable_alpha: (1-g) x + g h, g raw (no sigmoid); sigmoid_scalar:
        the same with g = sigmoid(theta); sigmoid_vector: g = sigmoid(x W^T + b)
        per token and channel (the product bf16 like the others); bias: h."""
        if gate_type == "learnable_alpha":
            g = P[lp(i) + f"{s}_res_alpha"]
        elif gate_type == "sigmoid_scalar":
            g = torch.sigmoid(P[lp(i) + f"{s}_res_gate_logit"])
        elif gate_type == "sigmoid_vector":
            pre = linear(x, P[lp(i) + f"{s}_res_gate_proj.weight"], bf16)
            g = torch.sigmoid(pre + P[lp(i) + f"{s}_res_gate_proj.bias"])
        else:
            return h
        return (1 - g) * x + g * h

    def additive(i, s, x, srcs, r=None):
        """Delta modes: x + route(null? + srcs); x alone when there is no source.
        r: the value router's tensors ("v"), with s's null source and gate."""
        if use_null:
            srcs = [P[lp(i) + f"{s}_null_source"].expand_as(x)] + srcs
        h = x + routed(i, s, srcs, r) if srcs else x
        return gate(i, s, x, h)

    e = embed_table(E, bf16)[ids]                             # (B,T,d)

    if mode == "baseline":
        x = e
        for i in range(L):
            x = x + attn_of(i, x)
            x = x + mlp_of(i, x)
        h = x

    elif mode == "full":
        srcs, last = [], e            # sources so far, and the latest one
        for i in range(L):
            u = gate(i, "attn", last, routed(i, "attn", srcs + [last]))
            a = attn_of(i, u)
            srcs, last = srcs + [last], a
            u = gate(i, "mlp", last, routed(i, "mlp", srcs + [last]))
            m = mlp_of(i, u)
            srcs, last = srcs + [last], m
        h = route_next(srcs + [last], P["model.final_res_proj.weight"],
                       P["model.final_res_norm.weight"])

    elif mode == "block":
        blocks, partial = [], e
        for i in range(L):
            u = gate(i, "attn", partial, routed(i, "attn", blocks + [partial]))
            if i % nb == 0:
                blocks, partial = blocks + [partial], torch.zeros_like(partial)
            partial = partial + attn_of(i, u)
            u = gate(i, "mlp", partial, routed(i, "mlp", blocks + [partial]))
            partial = partial + mlp_of(i, u)
        if has_final_router(cfg):
            h = route_next(blocks + [partial], P["model.final_res_proj.weight"],
                           P["model.final_res_norm.weight"])
        else:  # block_mh: the final norm reads the last partial sum
            h = partial

    elif mode == "block_add":
        blocks, partial, x = [], e, e
        for i in range(L):
            a = attn_of(i, additive(i, "attn", x, blocks + [partial]))
            if i % nb == 0:
                blocks, partial = blocks + [partial], torch.zeros_like(partial)
            partial = partial + a
            x = x + a
            m = mlp_of(i, additive(i, "mlp", x, blocks + [partial]))
            partial = partial + m
            x = x + m
        h = x

    elif mode == "full_additive":
        srcs, x = [], e   # S_1, S_2, ...: the stream after each sublayer
        for i in range(L):
            x = x + attn_of(i, additive(i, "attn", x, srcs))
            srcs = srcs + [x]
            x = x + mlp_of(i, additive(i, "mlp", x, srcs))
            srcs = srcs + [x]
        h = x

    elif mode == "delta_replace":
        outs, x = [], e   # a_0, m_0, ...: the outputs so far; the stream x is the last source
        for i in range(L):
            a = attn_of(i, gate(i, "attn", x, routed(i, "attn", outs + [x])))
            x = x + a
            outs = outs + [a]
            m = mlp_of(i, gate(i, "mlp", x, routed(i, "mlp", outs + [x])))
            x = x + m
            outs = outs + [m]
        h = x

    elif mode == "first_layer":
        x, a1 = e, None   # a1: layer 1's attention output, a source from layer 2 on
        for i in range(L):
            a = attn_of(i, routed(i, "attn", [x, a1]) if i >= 2 else x)
            if i == 1:
                a1 = a
            x = x + a
            x = x + mlp_of(i, routed(i, "mlp", [x, a1]) if i >= 2 else x)
        h = x

    elif mode == "delta_v":
        outs, x = [], e   # a_0, m_0, ...: the outputs so far (e is not a source)
        for i in range(L):
            hq = additive(i, "attn", x, outs)
            hv = additive(i, "attn", x, outs, "v")
            a = attn_of(i, hq, hv)
            x = x + a
            outs = outs + [a]
            m = mlp_of(i, additive(i, "mlp", x, outs))
            x = x + m
            outs = outs + [m]
        h = x

    elif mode == "full_v":
        states, x = [], e   # the stream after each sublayer; the stream itself is the last source too
        for i in range(L):
            srcs = states + [x]
            hq = gate(i, "attn", x, routed(i, "attn", srcs))
            hv = gate(i, "attn", x, routed(i, "attn", srcs, "v"))
            x = x + attn_of(i, hq, hv)
            states = states + [x]
            x = x + mlp_of(i, gate(i, "mlp", x, routed(i, "mlp", states + [x])))
            states = states + [x]
        h = x

    elif mode == "pre_gated":
        def pregated(i, s, x, srcs):
            """x + route over g * v_i, g = sigmoid(x W^T + b) (the product bf16 like the others)."""
            if not srcs:
                return x
            g = torch.sigmoid(linear(x, P[lp(i) + f"{s}_pre_gate.weight"], bf16) + P[lp(i) + f"{s}_pre_gate.bias"])
            return x + routed(i, s, [g * v for v in srcs])
        outs, x = [], e   # a_0, m_0, ...: the outputs so far (e is not a source)
        for i in range(L):
            a = attn_of(i, pregated(i, "attn", x, outs))
            x = x + a
            outs = outs + [a]
            m = mlp_of(i, pregated(i, "mlp", x, outs))
            x = x + m
            outs = outs + [m]
        h = x

    elif mode == "delta":
        srcs, x = [], e
        for i in range(L):
            a = attn_of(i, additive(i, "attn", x, srcs))
            if not srcs:
                srcs = [x]
            x = x + a
            srcs = srcs + [a]
            m = mlp_of(i, additive(i, "mlp", x, srcs))
            x = x + m
            srcs = srcs + [m]
        h = x

    elif mode == "delta_block":
        srcs, x = [], e
        x_boundary = torch.zeros_like(e)   # stream at the previous block start
        for i in range(L):
            a = attn_of(i, additive(i, "attn", x, srcs))
            if i % nb == 0:
                if cfg["attnres_block_delta"] == "true":
                    src = x if i == 0 else x - x_boundary
                    x_boundary = x
                else:  # "reference": x_now - last source
                    src = x if not srcs else x - srcs[-1]
                srcs = srcs + [src]
            x = x + a
            m = mlp_of(i, additive(i, "mlp", x, srcs))
            x = x + m
        h = x

    h = rmsnorm(h, P["model.norm.weight"], eps)
    W = E if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    return linear(h, W, bf16)


def mean_entropy(cfg, entropy):
    """The entropy term's E: the mean over the 2L sublayers of their routers'
    route_entropy, a sublayer without a router counting 0 (the reference code
    appends 0 for a router with no source)."""
    L = full_config(cfg)["num_hidden_layers"]
    return sum(entropy) / (2 * L) if entropy else torch.zeros(())


def loss_of(logits, targets):
    """Mean cross-entropy over all B*T targets."""
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def greedy(P, cfg, prompt, n_new):
    """Greedy decoding by definition: each step runs forward on the whole
    sequence so far (no cache), appends the argmax of the last position's
    logits (lowest index on a tie). prompt: list of ints. Returns (new_ids,
    margins), margins[s] = top-1 minus top-2 logit at step s."""
    cfg = full_config(cfg)
    assert len(prompt) >= 1 and len(prompt) + n_new <= cfg["max_position_embeddings"]
    seq = [int(t) for t in prompt]
    new_ids, margins = [], []
    with torch.no_grad():
        for _ in range(n_new):
            last = forward(P, cfg, torch.tensor([seq], dtype=torch.int64))[0, -1]
            top = last.topk(2).values
            nxt = int(last.argmax())
            new_ids.append(nxt)
            margins.append(float(top[0] - top[1]))
            seq.append(nxt)
    return new_ids, margins


# ---------------------------------------------------------------------------
# Training rules (README.md, "Training")
# ---------------------------------------------------------------------------

def lr_at(s, tr):
    if s < tr["warmup"]:
        return tr["lr_max"] * (s + 1) / tr["warmup"]
    total = tr["steps"]
    p = (s - tr["warmup"]) / max(1, total - tr["warmup"])
    p = min(1.0, max(0.0, p))
    return tr["lr_min"] + 0.5 * (tr["lr_max"] - tr["lr_min"]) * (1 + math.cos(math.pi * p))


def train(P, cfg, tokens, tr, stop=None, bf16=False):
    """AdamW run on P (dict of leaf tensors, modified in place).
    tokens: (steps, accum, B, T+1) int64; stop: run only steps [0, stop) of
    the schedule; bf16: forward and backward as --precision bf16 (the
    weights, gradients and update stay float64); tr["entropy_lambda"] (absent:
    0): the gradient is that of loss - lambda * mean_entropy, the recorded
    losses the cross-entropy. Returns dict of per-step records."""
    names = [n for n, _ in param_shapes(cfg)]
    m = {n: torch.zeros_like(P[n]) for n in names}
    v = {n: torch.zeros_like(P[n]) for n in names}
    b1, b2, eps, wd = tr["beta1"], tr["beta2"], tr["eps"], tr["weight_decay"]
    losses, lrs, norms = [], [], []
    for s in range(tr["steps"] if stop is None else stop):
        grads = {n: torch.zeros_like(P[n]) for n in names}
        tot = 0.0
        for k in range(tr["accum"]):
            seq = tokens[s, k]
            ent = []
            loss = loss_of(forward(P, cfg, seq[:, :-1], bf16=bf16, entropy=ent), seq[:, 1:])
            lam = tr.get("entropy_lambda", 0.0)
            objective = loss - lam * mean_entropy(cfg, ent) if lam else loss
            gs = torch.autograd.grad(objective, [P[n] for n in names], allow_unused=True)
            for n, g in zip(names, gs):
                if g is not None:
                    grads[n] += g
            tot += loss.item()
        for n in names:
            grads[n] /= tr["accum"]
        norm = math.sqrt(sum(float((grads[n] ** 2).sum()) for n in names))
        if tr["clip"] > 0:
            c = min(1.0, tr["clip"] / (norm + 1e-6))
            for n in names:
                grads[n] *= c
        lr = lr_at(s, tr)
        t = s + 1
        with torch.no_grad():
            for n in names:
                p, g = P[n], grads[n]
                if is_decayed(n):
                    p.mul_(1 - lr * wd)
                m[n].mul_(b1).add_((1 - b1) * g)
                v[n].mul_(b2).add_((1 - b2) * g * g)
                mhat = m[n] / (1 - b1 ** t)
                vhat = v[n] / (1 - b2 ** t)
                p.sub_(lr * mhat / (vhat.sqrt() + eps))
        losses.append(tot / tr["accum"])
        lrs.append(lr)
        norms.append(norm)
    return {"losses": losses, "lrs": lrs, "grad_norms": norms}


# ---------------------------------------------------------------------------
# Command line: compare two safetensors files tensor by tensor (for example a
# golden file against one the C++ engine wrote in the same format).
# ---------------------------------------------------------------------------

def _compare(a_path, b_path, atol, rtol):
    a, _ = read_safetensors(a_path)
    b, _ = read_safetensors(b_path)
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"MISSING  {name} (only in {'first' if name in a else 'second'})")
            bad += 1
            continue
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            print(f"SHAPE    {name} {x.shape} vs {y.shape}")
            bad += 1
            continue
        err = np.abs(x - y)
        ok = bool(np.all(err <= atol + rtol * np.abs(y)))
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'}     {name} max|a-b| {err.max(initial=0):.3e} "
              f"max|b| {np.abs(y).max(initial=0):.3e}")
    return bad


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="compare two safetensors files: |a-b| <= atol + rtol*|b|")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ns = ap.parse_args()
    raise SystemExit(1 if _compare(ns.a, ns.b, ns.atol, ns.rtol) else 0)
