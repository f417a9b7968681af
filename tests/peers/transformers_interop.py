"""attnres against the real Hugging Face transformers Qwen3ForCausalLM, both ways.

Usage: scripts/peers_python.sh tests/peers/transformers_interop.py --attnres build/attnres

Everything is offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE; only local
directories are loaded) and lives in a temporary directory that is removed.
The data: a small generated English-like corpus, made into token files and
a 320-token byte-level BPE by `attnres prepare --vocab-size 320`.

(a) attnres -> transformers.  Two plain (baseline) models are trained by
    `attnres train` for 30 steps from a custom config.json, so the weights are
    far from their init: GQA (4 query heads on 2 KV heads), head_dim 16 !=
    hidden/heads = 12; one untied (rope_theta 10000, rms_norm_eps 1e-6), one
    tied (50000, 1e-5).  `attnres export` writes each as F32 and as BF16,
    one of each pair sharded (--max-shard-size 40KB: index + shards) and one
    not, so all four combinations of {F32, BF16} x {one file, sharded} and
    both heads are covered.  Each directory must load with
    `Qwen3ForCausalLM.from_pretrained(dir, dtype=float32)` with no missing,
    unexpected or mismatched tensors and the config's rope_theta, eps,
    head_dim, KV heads and tying.  A BF16 export is compared like for like:
    transformers holds its bf16 weights upcast exactly to float32, and attnres
    evaluates the same directory with --precision fp32 (also the bf16 weights,
    exactly widened, float32 arithmetic); the bf16 weights must equal
    round-to-nearest-even of the F32 export's bit for bit.  (attnres's
    --precision bf16 rounds activations at the products and PyTorch's bf16
    modules round everything else too: two different functions, so they are
    not compared here; docs/inference.md measures bf16 against f32.)

(b) transformers -> attnres.  Two randomly initialised Qwen3ForCausalLM
    (Qwen3Config: GQA 4:1 and 6:2, head_dim 24 and 12, both != hidden/heads,
    rope_theta 5000 and 20000, rms_norm_eps 1e-5 and 1e-6, tied and untied,
    vocabulary 384 > the tokenizer's 320; weights drawn with std 0.1 and every
    RMSNorm weight perturbed around 1, so the norms and the head matter and
    greedy paths are not near-ties) are saved by `save_pretrained(dir,
    max_shard_size="40KB")` in bfloat16: sharded with
    model.safetensors.index.json, generation_config.json with an eos id, and
    transformers 5's config (rope_parameters, dtype, layer_types).  The
    comparison is transformers in float32 on the same bf16 weights, reloaded
    from that directory.  attnres needs no tokenizer in the directory for
    eval, generate --prompts with prompt_ids --json, and train --init (train
    copies the data's tokenizer); eval-tasks needs one and gets --tokenizer.
    `attnres train --init DIR --mode delta_block --gate learnable_alpha
    --data-order sequential --steps 1` must report "exact conversion" with
    bit-identical logits, and the unconverted loss it prints for the first
    window of the data (6 decimals) must be transformers' loss there.

Checked on every directory of (a) and (b), each a line with its measured
max |diff|:

  loss      `attnres eval --json` over the validation file in consecutive
            windows of T+1 = 65 tokens (T tokens predicted each, the last
            partial), against transformers' mean token cross-entropy over the
            same windows (float32 logits, cross-entropy and the sum in
            float64).  Tolerance 1e-5 x |loss|.
  per-token `attnres eval --max-tokens k --seq-len 40` for k = 1..40 gives the
            mean loss of the first k predictions in one window, printed as a
            double; k * mean_k - (k-1) * mean_(k-1) is attnres's k-th
            per-token cross-entropy (the float32 value, recovered to ~1e-13).
            Against transformers' per-token cross-entropy: 1e-4 absolute.
            (No attnres command prints logits; a per-token cross-entropy is
            logsumexp(logits) - logit[target], which a wrong logit moves.)
  requests  `attnres eval-tasks --tasks mc:probe --log-samples` (a
            multiple-choice task of our own, batched and padded on the
            right): every request's log-likelihood (sum of the continuation
            tokens' log-probabilities) against transformers' on the token ids
            attnres logged, 1e-4 absolute; the greedy flags equal.
  greedy    `attnres generate --prompts (prompt_ids) --batch 4 --json` against
            `model.generate(do_sample=False, max_new_tokens=16)` one prompt at
            a time (5 prompts of 1 to 30 tokens), with the same
            end-of-sequence id: in (a) the tokenizer's <|endoftext|>, which
            attnres falls back to when the config has none, passed to
            transformers; in (b) generation_config.json's, read by both, and
            chosen as a token greedy decoding reaches, so one prompt stops
            there.  The ids must be equal.  The smallest top-1 / top-2 logit
            gap on transformers' path is printed; ids that differ pass only
            where every token attnres chose is within 1e-4 of transformers'
            largest logit on attnres's path (a tie that float32 rounding
            decides, reported on the line), and fail otherwise.

Tolerances are float32 against float32 with different summation orders.
Measured (2026-12-03, 1 thread, Intel Xeon, portable build): mean loss
|diff| <= 2.9e-8, per-token <= 1.8e-6, request log-likelihoods <= 4.8e-6,
the conversion's printed loss <= 3.7e-8 (its 6 decimals), greedy ids
identical everywhere (smallest top-2 gap 1.6e-4, no ties taken), and the BF16
exports bit-identical to round-to-nearest-even of the F32 ones.  Runtime
about 8 s (the import of transformers included).

(c) The fields, as transformers 5 reads them.  One untied float32 model
    saved by save_pretrained, then edited one way at a time: without
    tie_word_embeddings, without rope_theta anywhere, with "rope_parameters":
    {} — transformers loads each, and attnres eval must give its loss; with
    1 or null for tie_word_embeddings, attention_bias or use_sliding_window,
    or a bias and a tensor of a layer past num_hidden_layers beside the
    weights, transformers refuses (or lists the tensors as unexpected) and
    attnres must refuse, naming the field or the tensors; tied with an
    lm_head.weight of its own, transformers uses that head and attnres must
    refuse with the fix; tied with a head equal to the embedding, both load
    one model.

Bugs found by this test and fixed: attnres read rope_theta only at the top
level of config.json, where transformers up to 4.x writes it; transformers 5
writes it as rope_parameters.rope_theta (and no top-level key), so attnres
silently used the default 1e6 for every model saved by transformers 5.
Config::from_json now reads rope_parameters (src/model/config.cpp; test
Config.Transformers5RopeParameters in src/io/io_test.cpp).  Issue 48: a
config with no rope_theta anywhere was 1e6 here and 10000 there, a missing
tie_word_embeddings tied here and untied there (the file's lm_head.weight
ignored), 1 read as false, and tensors the model does not use were dropped
unnamed; (c) checks each (src/model/config.cpp, src/io/checkpoint.cpp
check_leftovers; tests Config.HuggingFaceFieldsAreReadAsTransformers5ReadsThem,
Checkpoint.TensorsTheModelDoesNotUseAreNamed).

Exit status 0 when everything agrees, 1 on any mismatch (a FAIL line says
what and by how much).
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import require, versions  # noqa: E402

torch, transformers, np = require("torch", "transformers", "numpy")

# float32 against float32, each in its CPU's kernels: the measured differences (docstring, Intel Xeon) are
# 20x and more inside these, and another CPU changes which roundings, not their size.
LOSS_REL = 1e-5    # mean loss: relative
TOKEN_ABS = 1e-4   # per-token cross-entropy and per-request log-likelihood
T_EVAL = 64        # eval windows of T + 1 tokens
K_TOKENS = 40      # per-token probe length
NEW_TOKENS = 16
GREEDY_TIE = 1e-4  # logit gap below which two greedy choices are a tie that float32 rounding decides
THREADS = "1"

WORDS = {
    "det": ["the", "a", "one", "every", "that"],
    "adj": ["small", "big", "red", "green", "old", "quiet", "happy", "cold"],
    "noun": ["cat", "dog", "river", "house", "tree", "bird", "child", "garden", "boat", "stone"],
    "verb": ["sees", "likes", "follows", "finds", "hears", "carries", "paints"],
    "prep": ["near", "under", "over", "behind", "beside"],
}


def sentence(r):
    w = lambda k: r.choice(WORDS[k])  # noqa: E731
    s = f"{w('det')} {w('adj')} {w('noun')} {w('verb')} {w('det')} {w('noun')}"
    if r.random() < 0.5:
        s += f" {w('prep')} {w('det')} {w('adj')} {w('noun')}"
    return s[0].upper() + s[1:] + "."


def corpus(seed=7, paragraphs=200):
    r = random.Random(seed)
    return "\n\n".join(" ".join(sentence(r) for _ in range(r.randint(4, 9))) for _ in range(paragraphs)) + "\n"


# ---------------------------------------------------------------------------

class Check:
    def __init__(self):
        self.failures = 0

    def close(self, what, diff, tol, detail=""):
        ok = diff <= tol
        self.failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: max |diff| {diff:.2e} (tolerance {tol:.1e}){detail}", flush=True)

    def true(self, what, cond, detail=""):
        self.failures += not cond
        print(f"{'ok  ' if cond else 'FAIL'} {what}{detail}", flush=True)


class Attnres:
    def __init__(self, binary):
        self.binary = binary

    def __call__(self, *args):
        r = subprocess.run([self.binary, *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"attnres {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout


def read_tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        n = int(header[2])
        dtype = "<u2" if header[1] == 1 else "<u4"
        return np.frombuffer(f.read(), dtype=dtype)[:n].astype(np.int64)


def write_tokens(path, ids):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 2, len(ids)]
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(ids, dtype="<u4").tobytes())


def load_hf(d, check, label, want_cfg=None):
    """Qwen3ForCausalLM from a local directory in float32, strict: nothing
    missing, unexpected or mismatched; its config read as attnres reads it."""
    model, info = transformers.Qwen3ForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, local_files_only=True)
    model.eval()
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    check.true(f"{label}: transformers loads it strictly", not bad, f" ({bad})" if bad else "")
    if want_cfg is not None:
        c = model.config
        got = {"rope_theta": c.rope_parameters["rope_theta"], "rms_norm_eps": c.rms_norm_eps, "head_dim": c.head_dim,
               "num_key_value_heads": c.num_key_value_heads, "tie_word_embeddings": c.tie_word_embeddings}
        want = {k: want_cfg[k] for k in got}
        check.true(f"{label}: transformers reads the config as written", got == want,
                   "" if got == want else f" (read {got}, written {want})")
    return model


def hf_token_ce(model, ids):
    """Per-token cross-entropy of ids[1:] given the prefix, float64 from float32 logits."""
    with torch.no_grad():
        logits = model(torch.tensor(ids[:-1], dtype=torch.int64)[None]).logits[0].double()
    tgt = torch.tensor(ids[1:], dtype=torch.int64)
    return (torch.logsumexp(logits, -1) - logits[torch.arange(len(tgt)), tgt]).numpy()


def check_loss(run, check, label, d, model, val_path, val):
    j = json.loads(run("eval", "--model", d, "--data", val_path, "--seq-len", str(T_EVAL), "--batch", "4",
                       "--threads", THREADS, "--json", "--quiet"))
    total, count = 0.0, 0
    for begin in range(0, len(val) - 1, T_EVAL):
        ce = hf_token_ce(model, val[begin:begin + T_EVAL + 1])
        total += float(ce.sum())
        count += len(ce)
    want = total / count
    check.true(f"{label}: eval counts the same tokens", j["tokens"] == count, f" ({j['tokens']} vs {count})")
    check.close(f"{label}: eval loss ({count} tokens), attnres {j['loss']:.7f}, transformers {want:.7f}",
                abs(j["loss"] - want), LOSS_REL * abs(want))


def check_per_token(run, check, label, d, model, probe_path, probe):
    sums = [0.0]
    for k in range(1, K_TOKENS + 1):
        j = json.loads(run("eval", "--model", d, "--data", probe_path, "--seq-len", str(K_TOKENS), "--batch", "1",
                           "--max-tokens", str(k), "--threads", THREADS, "--json", "--quiet"))
        assert j["tokens"] == k
        sums.append(j["loss"] * k)
    ours = np.diff(np.array(sums))
    want = hf_token_ce(model, probe[:K_TOKENS + 1])
    diff = np.abs(ours - want)
    check.close(f"{label}: per-token cross-entropy of {K_TOKENS} positions (values {want.min():.2f}..{want.max():.2f})",
                float(diff.max()), TOKEN_ABS, f", worst at position {int(diff.argmax()) + 1}")


def check_requests(run, check, label, d, model, tasks_dir, tmp, tokenizer=None):
    samples = os.path.join(tmp, "samples.jsonl")
    args = ["eval-tasks", "--model", d, "--data-dir", tasks_dir, "--tasks", "mc:probe", "--batch", "4",
            "--log-samples", samples, "--threads", THREADS, "--quiet", "--json"]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    run(*args)
    worst, flags_equal, n, ntok = 0.0, True, 0, 0
    with open(samples) as f:
        for line in f:
            s = json.loads(line)
            ctx, cont = s["context_ids"], s["continuation_ids"]
            ids = ctx + cont
            with torch.no_grad():
                logits = model(torch.tensor(ids[:-1], dtype=torch.int64)[None]).logits[0]
            logp = torch.log_softmax(logits.double(), -1)
            pos = torch.arange(len(ctx) - 1, len(ids) - 1)
            tgt = torch.tensor(cont, dtype=torch.int64)
            ll = float(logp[pos, tgt].sum())
            greedy = bool((logits[pos].argmax(-1) == tgt).all())
            worst = max(worst, abs(ll - s["ll"]))
            flags_equal &= greedy == s["greedy"]
            n += 1
            ntok += len(cont)
    os.remove(samples)
    check.close(f"{label}: eval-tasks log-likelihoods of {n} requests ({ntok} continuation tokens)", worst, TOKEN_ABS)
    check.true(f"{label}: eval-tasks greedy flags equal transformers' argmax", flags_equal)


def check_greedy(run, check, label, d, model, prompts, eos, tmp):
    """eos None: transformers stops at its generation config's (read from d)."""
    path = os.path.join(tmp, "prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_ids": [int(x) for x in p]}) + "\n")
    out = run("generate", "--model", d, "--prompts", path, "--batch", "4", "--max-new-tokens", str(NEW_TOKENS),
              "--json", "--threads", THREADS)
    rows = sorted((json.loads(line) for line in out.splitlines() if line.strip()), key=lambda r: r["index"])
    os.remove(path)
    if eos is None:
        eos = model.generation_config.eos_token_id
    mismatches, ties, margin, reasons = [], [], float("inf"), []
    for i, (p, r) in enumerate(zip(prompts, rows)):
        x = torch.tensor([list(p)], dtype=torch.int64)
        with torch.no_grad():
            kw = {} if eos is None else {"eos_token_id": eos}
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW_TOKENS,
                               pad_token_id=0, **kw)
            want = y[0, len(p):].tolist()
            logits = model(y[:, :-1]).logits[0, len(p) - 1:]
        top2 = logits.topk(2, -1).values
        margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
        reasons.append(r["finish_reason"])
        if r["ids"] == want:
            continue
        # Different ids are a failure unless every token attnres chose is, by
        # transformers' own logits on attnres's path, within GREEDY_TIE of the
        # largest: a tie, decided by float32 rounding on either side.
        k = next((j for j, (a, b) in enumerate(zip(r["ids"], want)) if a != b), min(len(r["ids"]), len(want)))
        ours = torch.tensor([list(p) + r["ids"]], dtype=torch.int64)
        with torch.no_grad():
            lg = model(ours[:, :-1]).logits[0, len(p) - 1:]
        short = lg.max(-1).values - lg[torch.arange(len(r["ids"])), torch.tensor(r["ids"])]
        ended = (r["finish_reason"] == "eos" and r["ids"][-1] == eos and eos not in r["ids"][:-1]) or \
            (r["finish_reason"] == "length" and len(r["ids"]) == NEW_TOKENS and eos not in r["ids"])
        what = f"prompt {i}: attnres {r['ids']} vs transformers {want} (first difference at new token {k})"
        if float(short.max()) <= GREEDY_TIE and ended:
            ties.append(f"{what}: a tie, attnres's choices within {float(short.max()):.1e} "
                        f"of transformers' largest logit")
        else:
            mismatches.append(f"{what}; attnres's choice is {float(short.max()):.3e} below transformers' largest logit")
    check.true(f"{label}: greedy ids of {len(prompts)} prompts equal transformers' generate "
               f"(finish {','.join(reasons)}; smallest top-2 logit gap {margin:.2e})",
               not mismatches and len(rows) == len(prompts), "".join("\n      " + m for m in mismatches + ties))


def check_all(run, check, label, d, model, env, tokenizer=None, eos=None):
    check_loss(run, check, label, d, model, env["val_path"], env["val"])
    check_per_token(run, check, label, d, model, env["probe_path"], env["probe"])
    check_requests(run, check, label, d, model, env["tasks_dir"], env["tmp"], tokenizer)
    check_greedy(run, check, label, d, model, env["prompts"], eos, env["tmp"])


# ---------------------------------------------------------------------------

A_BASE = {"hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "intermediate_size": 96, "vocab_size": 320, "max_position_embeddings": 128}
A_RUNS = [  # name, config, (dtype, max shard size or None) per export
    ("untied", dict(A_BASE, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
     [("f32", None), ("bf16", "40KB")]),
    ("tied", dict(A_BASE, rope_theta=50000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
     [("f32", "40KB"), ("bf16", None)]),
]

B_MODELS = [  # name, Qwen3Config keywords
    ("tied", dict(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                  head_dim=24, intermediate_size=128, rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    ("untied", dict(vocab_size=384, hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                    head_dim=12, intermediate_size=96, rope_theta=20000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False)),
]


def attnres_to_transformers(run, check, env):
    tmp = env["tmp"]
    for name, cfg, exports in A_RUNS:
        cfg_path = os.path.join(tmp, f"cfg_{name}.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        out = os.path.join(tmp, f"run_{name}")
        run("train", "--config", cfg_path, "--data", env["train_path"], "--out", out, "--steps", "30",
            "--batch", "4", "--seq-len", "32", "--warmup", "2", "--lr", "1e-2", "--lr-min", "1e-3",
            "--threads", THREADS, "--peak-gflops", "1", "--save-optimizer", "false")
        with open(os.path.join(out, "log.jsonl")) as f:
            losses = [json.loads(line)["loss"] for line in f if '"loss"' in line]
        print(f"     attnres train ({name}): 30 steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        weights = {}
        for dtype, shard in exports:
            hf = os.path.join(tmp, f"hf_{name}_{dtype}")
            args = ["export", "--model", out, "--out", hf, "--dtype", dtype]
            if shard:
                args += ["--max-shard-size", shard]
            run(*args)
            sharded = os.path.exists(os.path.join(hf, "model.safetensors.index.json"))
            label = f"attnres {name} {dtype.upper()} export{' (sharded)' if shard else ''}"
            check.true(f"{label}: {'sharded with an index' if shard else 'one model.safetensors'}",
                       sharded == bool(shard), f" ({sorted(os.listdir(hf))})")
            model = load_hf(hf, check, label, cfg)
            weights[dtype] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            check_all(run, check, label, hf, model, env, eos=env["eos"])
        f32, b16 = weights["f32"], weights["bf16"]
        same = all(torch.equal(f32[k].to(torch.bfloat16).float(), b16[k]) for k in f32)
        check.true(f"attnres {name}: the BF16 export is the F32 export rounded to nearest even, bit for bit", same)


def transformers_to_attnres(run, check, env):
    tmp = env["tmp"]
    for k, (name, kw) in enumerate(B_MODELS):
        cfg = transformers.Qwen3Config(max_position_embeddings=128, bos_token_id=env["eos"], eos_token_id=env["eos"],
                                       initializer_range=0.1, **kw)
        torch.manual_seed(100 + k)
        model = transformers.Qwen3ForCausalLM(cfg)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.add_(0.1 * torch.randn_like(p))
        # The end-of-sequence id: a token greedy decoding of the second prompt
        # reaches at its 6th step (on the bf16-rounded weights that are
        # saved), so that stopping at generation_config.json's eos is tested.
        model = model.to(torch.bfloat16).to(torch.float32)
        x = torch.tensor([list(env["prompts"][1])], dtype=torch.int64)
        with torch.no_grad():
            path = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW_TOKENS,
                                  eos_token_id=None, pad_token_id=0)[0, x.shape[1]:].tolist()
        eos = next((t for j, t in enumerate(path) if j >= 5 and t not in path[:j]), env["eos"])
        model.config.eos_token_id = model.generation_config.eos_token_id = eos
        d = os.path.join(tmp, f"hf_saved_{name}")
        model.to(torch.bfloat16).save_pretrained(d, max_shard_size="40KB")
        with open(os.path.join(d, "generation_config.json")) as f:
            check.true(f"transformers {name}: generation_config.json's eos_token_id is {eos}",
                       json.load(f).get("eos_token_id") == eos)
        files = sorted(os.listdir(d))
        label = f"transformers {name} BF16 save_pretrained"
        check.true(f"{label}: sharded with an index and a generation_config.json, no tokenizer",
                   "model.safetensors.index.json" in files and "generation_config.json" in files
                   and "tokenizer.json" not in files, f" ({files})")
        want_cfg = dict(kw)
        ref = load_hf(d, check, label, want_cfg)   # float32 from the bf16 files
        check_all(run, check, label, d, ref, env, tokenizer=env["tokenizer"])   # eos: its generation config

        # Conversion to a routed mode: exact, and measured on the first window.
        out = os.path.join(tmp, f"conv_{name}")
        text = run("train", "--init", d, "--mode", "delta_block", "--gate", "learnable_alpha", "--data",
                   env["train_path"], "--data-order", "sequential", "--out", out, "--steps", "1", "--batch", "1",
                   "--seq-len", "32", "--threads", THREADS, "--peak-gflops", "1", "--save-optimizer", "false")
        line = next((l for l in text.splitlines() if l.startswith("conversion ")), "")
        m = re.search(r"loss ([0-9.]+) -> ([0-9.]+) \(([-+0-9.e]+)\), max \|logit change\| ([0-9.e+-]+)", text)
        check.true(f"{label}: train --init --mode delta_block --gate learnable_alpha: \"{line}\"",
                   "exact conversion" in line and m is not None and "(bit-identical logits)" in text)
        if m:
            want = float(hf_token_ce(ref, env["train"][:33]).mean())
            check.close(f"{label}: the unconverted loss train printed ({m.group(1)}) vs transformers' {want:.7f} "
                        f"on the same first window", abs(float(m.group(1)) - want), 1e-5 * abs(want) + 5e-7)
        shutil.rmtree(out)


def attempt(binary, *args):
    """attnres ARGS: (exit status, stderr)."""
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    return r.returncode, r.stderr.strip()


def hf_load_outcome(d):
    """What transformers makes of directory d: (model, unexpected tensors) or (None, the error)."""
    try:
        model, info = transformers.Qwen3ForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True, local_files_only=True)
    except Exception as e:  # noqa: BLE001 -- its refusal is the outcome compared
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return model.eval(), sorted(info["unexpected_keys"])


def hf_fields(run, check, env):
    """(c) The fields of config.json and the tensors beside it, read as transformers 5 reads them.

    One untied float32 model (rope_theta 10000) saved by save_pretrained, then
    edited one way at a time.  Where transformers loads the edit, attnres eval
    must give its loss (so attnres read the same model); where transformers
    refuses it, attnres must refuse it too, naming the field or the tensors."""
    tmp = env["tmp"]
    from safetensors.torch import load_file, save_file
    cfg = transformers.Qwen3Config(vocab_size=384, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=12, intermediate_size=96, rope_theta=10000.0,
                                   max_position_embeddings=128, tie_word_embeddings=False, initializer_range=0.1)
    torch.manual_seed(300)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(os.path.join(tmp, "fields_base"))
    base_cfg = json.load(open(os.path.join(tmp, "fields_base", "config.json")))
    tensors = load_file(os.path.join(tmp, "fields_base", "model.safetensors"))

    def variant(name, edit_cfg=None, edit_tensors=None):
        d = os.path.join(tmp, f"fields_{name}")
        os.makedirs(d)
        c, t = json.loads(json.dumps(base_cfg)), dict(tensors)
        if edit_cfg:
            edit_cfg(c)
        if edit_tensors:
            edit_tensors(t)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
        save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return d

    def same_model(label, d):
        model, unexpected = hf_load_outcome(d)
        if model is None or unexpected:
            check.true(f"{label}: transformers loads it", False, f" ({unexpected})")
            return
        check_loss(run, check, label, d, model, env["val_path"], env["val"])

    def both_refuse(label, d, want):
        model, why = hf_load_outcome(d)
        refused = model is None or bool(why)
        status, err = attempt(run.binary, "eval", "--model", d, "--data", env["val_path"], "--seq-len", "32",
                              "--threads", THREADS, "--quiet")
        check.true(f"{label}: transformers refuses or lists it ({why}); attnres refuses it: \"{err[:160]}\"",
                   refused and status != 0 and all(w in err for w in want))

    def drop(*keys):
        return lambda c: [c.pop(k, None) for k in keys]

    def put(key, value):
        return lambda c: c.__setitem__(key, value)

    same_model("no tie_word_embeddings (transformers: untied)", variant("no_tie", drop("tie_word_embeddings")))
    same_model("no rope_theta anywhere (transformers: 10000)", variant("no_theta", drop("rope_parameters", "rope_theta")))
    same_model("\"rope_parameters\": {} (transformers: 10000)", variant("empty_rope", put("rope_parameters", {})))
    for key, value in (("tie_word_embeddings", None), ("tie_word_embeddings", 1), ("attention_bias", 1),
                       ("use_sliding_window", 1), ("attention_bias", None)):
        both_refuse(f"{key}: {json.dumps(value)}", variant(f"{key}_{value}", put(key, value)),
                    [f'"{key}"', "not true or false"])

    def extra(t):
        t["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(48)
        t["model.layers.2.mlp.up_proj.weight"] = torch.zeros(96, 48)
    both_refuse("a bias and a third layer's tensor beside a 2-layer config", variant("extra", edit_tensors=extra),
                ["holds 2 tensors", "model.layers.0.self_attn.q_proj.bias", "model.layers.2.mlp.up_proj.weight"])
    # Tied, with a head of its own in the file: transformers 5 uses the file's
    # head (measured here); attnres refuses and says how to load it.
    tied = variant("tied_with_head", put("tie_word_embeddings", True))
    model, unexpected = hf_load_outcome(tied)
    uses_head = model is not None and torch.equal(model.lm_head.weight, tensors["lm_head.weight"])
    status, err = attempt(run.binary, "eval", "--model", tied, "--data", env["val_path"], "--seq-len", "32",
                          "--threads", THREADS, "--quiet")
    check.true(f"tie_word_embeddings true with an lm_head.weight: transformers uses the file's head ({uses_head}); "
               f"attnres refuses it: \"{err[:160]}\"",
               uses_head and status != 0 and "set tie_word_embeddings to false" in err)
    # ... and where that head equals the embedding, both read one tied model.
    same_model("tie_word_embeddings true with lm_head.weight equal to the embedding",
               variant("tied_equal", put("tie_word_embeddings", True),
                       lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].clone())))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnres", required=True, help="the attnres binary")
    args = ap.parse_args()
    t0 = time.time()
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print("peers:", json.dumps(versions("torch", "transformers", "safetensors", "numpy")))
    run = Attnres(os.path.abspath(args.attnres))
    check = Check()
    with tempfile.TemporaryDirectory(prefix="attnres_hf_") as tmp:
        text_path = os.path.join(tmp, "corpus.txt")
        with open(text_path, "w") as f:
            f.write(corpus())
        data = os.path.join(tmp, "data")
        run("prepare", "--input", text_path, "--out", data, "--vocab-size", "320", "--val-fraction", "0.1",
            "--doc-split-kb", "1", "--threads", THREADS)
        with open(os.path.join(data, "prepare.json")) as f:
            eos = json.load(f)["eos_id"]
        train, val = read_tokens(os.path.join(data, "train.bin")), read_tokens(os.path.join(data, "val.bin"))
        probe_path = os.path.join(tmp, "probe.bin")
        probe = val[5:5 + K_TOKENS + 1]
        write_tokens(probe_path, probe)
        tasks_dir = os.path.join(tmp, "tasks")
        os.makedirs(tasks_dir)
        r = random.Random(3)
        with open(os.path.join(tasks_dir, "probe.jsonl"), "w") as f:
            for i in range(6):
                ctx = " ".join(sentence(r) for _ in range(1 + i % 3))
                choices = [sentence(r)[:-1].lower() for _ in range(3)] + [r.choice(WORDS["noun"])]
                f.write(json.dumps({"context": ctx, "choices": choices, "gold": i % 4}) + "\n")
        g = np.random.default_rng(11)
        prompts = [train[s:s + n] for s, n in ((0, 1), (100, 5), (700, 12), (1500, 30))]
        prompts.append(g.integers(0, 320, 9))   # ids the data never has in that order
        env = {"tmp": tmp, "train_path": os.path.join(data, "train.bin"), "train": train,
               "val_path": os.path.join(data, "val.bin"), "val": val, "probe_path": probe_path, "probe": probe,
               "tasks_dir": tasks_dir, "prompts": prompts, "eos": eos,
               "tokenizer": os.path.join(data, "tokenizer.json")}
        print(f"     data: {len(train)} training and {len(val)} validation tokens, 320-token BPE, eos id {eos}")
        attnres_to_transformers(run, check, env)
        transformers_to_attnres(run, check, env)
        hf_fields(run, check, env)
    print(f"transformers interop: {'all ok' if not check.failures else f'{check.failures} failure(s)'} "
          f"({time.time() - t0:.1f} s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
