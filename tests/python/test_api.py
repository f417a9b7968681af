"""The Python API against the attnres program, call by call, on the same
models and inputs: scores, generation, routing, interventions, training."""
import json
import os
import threading
import time

import numpy as np
import pytest

import attnres
from conftest import T, THREADS, read_tokens, train_args


def windows(path, n, length):
    """The first n consecutive windows of `length` tokens sharing their
    boundary token, as `attnres eval` cuts a file (window w = [w·T, w·T+T])."""
    ids = read_tokens(path)
    step = length - 1
    return np.stack([ids[w * step: w * step + length] for w in range(n)])


def eval_file(tmp_path, data, n_windows):
    """A token file of exactly n_windows windows of T+1 (eval's), and them as an array."""
    w = windows(data["val"], n_windows, T + 1)
    flat = np.concatenate([w[0], *[x[1:] for x in w[1:]]])
    path = tmp_path / "eval.bin"
    attnres.write_tokens(path, flat)
    return str(path), w


# ---- loading ----

def test_load_config_and_tokenizer(models, data):
    m = attnres.load(models["delta"], threads=int(THREADS))
    with open(os.path.join(m.path, "config.json")) as f:
        assert m.config == json.load(f)
    assert m.mode == "delta" and m.vocab_size == 320 and m.precision == "fp32" and m.device == "cpu"
    assert m.tokenizer is not None and m.tokenizer.vocab_size == 320
    text = "The quiet river carries the old boat."
    assert m.tokenizer.decode(m.tokenizer.encode(text)) == text
    assert attnres.Tokenizer(data["tokenizer"]).encode_batch([text, "a"]) == [m.tokenizer.encode(text),
                                                                            m.tokenizer.encode("a")]
    with attnres.load(models["baseline"]) as b:
        assert b.mode == "baseline"
    with pytest.raises(attnres.Error, match="the model is closed"):
        b.logits([[1, 2]])


# ---- scores ----

@pytest.mark.parametrize("mode", ["baseline", "delta", "block_mh"])
def test_loss_equals_eval_to_the_bit(models, data, cli, tmp_path, mode):
    path, w = eval_file(tmp_path, data, 11)  # 11 windows, batch 4: a last partial batch too
    ref = cli.json("eval", "--model", models[mode], "--data", path, "--seq-len", T, "--batch", 4, "--json",
                   "--quiet", "--threads", THREADS)
    m = attnres.load(models[mode], threads=int(THREADS))
    assert m.loss(w, batch=4) == ref["loss"]
    assert ref["tokens"] == w.shape[0] * T


@pytest.mark.parametrize("mode", ["baseline", "delta"])
def test_logits_score_as_eval(models, data, cli, tmp_path, mode):
    path, w = eval_file(tmp_path, data, 4)
    ref = cli.json("eval", "--model", models[mode], "--data", path, "--seq-len", T, "--batch", 4, "--json",
                   "--quiet", "--threads", THREADS)
    z = attnres.load(models[mode], threads=int(THREADS)).logits(w[:, :-1]).astype(np.float64)
    assert z.shape == (4, T, 320) and z.dtype == np.float64
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, w[:, 1:, None], axis=-1).mean()
    assert abs(nll - ref["loss"]) < 1e-5 * ref["loss"]


def test_logits_are_shared_not_copied(models):
    torch = pytest.importorskip("torch")
    a = attnres.load(models["delta"], threads=int(THREADS)).logits([[5, 6, 7]])
    assert not a.flags["OWNDATA"]  # the engine's buffer, owned by the array
    t = torch.from_dlpack(a)
    assert t.data_ptr() == a.ctypes.data and tuple(t.shape) == a.shape
    t[0, 0, 0] = 123.0
    assert a[0, 0, 0] == 123.0


# ---- generation ----

def test_greedy_generation_equals_generate(models, data, cli, tmp_path):
    ids = read_tokens(data["train"])
    prompts = [ids[0:1], ids[100:105], ids[700:712], ids[1500:1530], np.array([3, 200, 17, 90])]
    lines = "".join(json.dumps({"prompt_ids": [int(t) for t in p]}) + "\n" for p in prompts)
    (tmp_path / "prompts.jsonl").write_text(lines)
    model = models["delta"]
    out = cli("generate", "--model", model, "--prompts", tmp_path / "prompts.jsonl", "--max-new-tokens", 12,
              "--batch", 3, "--threads", THREADS)
    ref = [json.loads(l) for l in out.splitlines()]
    m = attnres.load(model, threads=int(THREADS))
    got = m.generate([list(p) for p in prompts], 12, batch=3)
    for r, g in zip(ref, got):
        assert g.ids == r["ids"] and g.text == r["text"] and g.finish_reason == r["finish_reason"]
    # One prompt, as `generate --prompt-ids --json` decodes it alone.
    one = cli.json("generate", "--model", model, "--prompt-ids", ",".join(map(str, prompts[2])),
                   "--max-new-tokens", 20, "--json", "--threads", THREADS)
    assert m.generate([list(prompts[2])], 20)[0].ids == one["ids"]
    # Sampled: prompt i draws from (seed, i), as the program's.
    out = cli("generate", "--model", model, "--prompts", tmp_path / "prompts.jsonl", "--max-new-tokens", 12,
              "--temperature", 0.9, "--top-p", 0.95, "--seed", 5, "--threads", THREADS)
    ref = [json.loads(l) for l in out.splitlines()]
    got = m.generate([list(p) for p in prompts], 12, temperature=0.9, top_p=0.95, seed=5)
    assert [g.ids for g in got] == [r["ids"] for r in ref]


def test_streaming_gives_the_same_text(models):
    m = attnres.load(models["delta"], threads=int(THREADS))
    prompts = ["The old man", "A small bird sings"]
    whole = m.generate(prompts, 16, ignore_eos=True)
    stream = m.generate(prompts, 16, ignore_eos=True, stream=True)
    pieces = ["", ""]
    for i, piece in stream:
        pieces[i] += piece
    assert pieces == [c.text for c in whole]
    assert [c.ids for c in stream.results] == [c.ids for c in whole]
    # Left early: the decoding stops, and the model serves the next call.
    with m.generate(prompts, 200, ignore_eos=True, stream=True) as s:
        next(s)
    assert m.generate(prompts, 16, ignore_eos=True)[0].ids == whole[0].ids


# ---- routing ----

@pytest.mark.parametrize("mode", ["delta", "block_mh"])
def test_routing_weights_average_to_the_programs(models, data, cli, mode):
    n = 8
    ref = cli.json("routing", "--model", models[mode], "--data", data["val"], "--seq-len", T, "--batch", 4,
                   "--max-tokens", n * T, "--json", "--quiet", "--threads", THREADS)
    ids = read_tokens(data["val"])[: n * T].reshape(n, T)
    r = attnres.load(models[mode], threads=int(THREADS)).routing(ids)
    assert list(r) == ref["routers"]
    heads = attnres.load(models[mode]).config.get("attnres_num_heads", 1)
    for k, name in enumerate(ref["routers"]):
        w = r[name].weights
        assert r[name].sources == ref["sources"][k]
        assert w.shape == (n, T, heads, len(ref["sources"][k])) and w.dtype == np.float32
        assert np.abs(w.sum(-1) - 1).max() < 1e-5
        assert np.abs(r[name].mean() - np.array(ref["mean_weight"][k])).max() < 1e-6


def test_interventions_equal_the_programs(models, data, cli):
    args = ["--seq-len", T, "--batch", 4, "--intervention-tokens", 256, "--routers", "0,layers.1.mlp"]
    ref = cli.json("routing", "--model", models["delta"], "--data", data["val"], "--interventions", "--json",
                   "--quiet", "--threads", THREADS, *args)
    m = attnres.load(models["delta"], threads=int(THREADS))
    got = m.interventions(data["val"], seq_len=T, batch=4, tokens=256, routers=[0, "layers.1.mlp"])
    for key in ("model", "data", "precision", "device", "seconds"):
        ref.pop(key, None)
        got.pop(key, None)
    assert got == ref
    # From an array: the same tokens, the same probes.
    again = m.interventions(read_tokens(data["val"])[:300], seq_len=T, batch=4, tokens=256, routers=[0, "layers.1.mlp"])
    again.pop("seconds")
    assert again == got


# ---- training ----

def log_records(run):
    with open(os.path.join(run, "log.jsonl")) as f:
        return [json.loads(l) for l in f if '"loss"' in l]


STEP_KEYS = ("step", "loss", "lr", "grad_norm")


def test_train_equals_the_program_to_the_bit(data, cli, tmp_path):
    cli(*train_args(data, "delta", tmp_path / "cli", steps=5))
    args = train_args(data, "delta", tmp_path / "py", steps=5)[1:]
    opts = {args[i][2:].replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}
    seen = []
    r = attnres.train(on_step=seen.append, **opts)
    a, b = log_records(tmp_path / "cli"), log_records(tmp_path / "py")
    assert len(a) == len(b) == 5
    for x, y in zip(a, b):
        assert {k: x[k] for k in STEP_KEYS} == {k: y[k] for k in STEP_KEYS}
    assert [{k: s[k] for k in STEP_KEYS} for s in seen] == [{k: y[k] for k in STEP_KEYS} for y in b]
    assert r["steps_done"] == 5 and r["stopped_by"] is None and r["val_loss"] is not None
    same = lambda p: open(os.path.join(tmp_path, "cli", "step_00000005", p), "rb").read() == \
        open(os.path.join(tmp_path, "py", "step_00000005", p), "rb").read()
    assert same("model.safetensors") and same("optimizer.safetensors")


def test_callback_stops_with_a_resumable_checkpoint(data, tmp_path):
    base = dict(config=data["config"], mode="delta", data=data["train"], steps=6, batch=4, seq_len=T, lr=3e-3,
                threads=int(THREADS))
    whole = attnres.train(out=str(tmp_path / "whole"), **base)
    r = attnres.train(on_step=lambda rec: rec["step"] < 3, out=str(tmp_path / "cut"), **base)
    assert r["stopped_by"] == "callback" and r["steps_done"] == 3 and r["checkpoint"].endswith("step_00000003")
    resumed = attnres.train(resume=r["checkpoint"])
    assert resumed["steps_done"] == 6 and resumed["final_loss"] == whole["final_loss"]
    # An exception in the callback: the run stops with its checkpoint, the exception comes back.
    def boom(rec):
        raise ValueError("stop here")
    with pytest.raises(ValueError, match="stop here"):
        attnres.train(on_step=boom, out=str(tmp_path / "boom"), **base)
    assert os.path.isdir(tmp_path / "boom" / "step_00000001")


# ---- errors: one line, as the program says it; never a crash ----

def test_errors_are_the_programs_lines(models, data, cli, tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(attnres.Error) as e:
        attnres.load(missing)
    assert str(e.value) == cli.fail("eval", "--model", missing, "--data", data["val"])
    with pytest.raises(attnres.Error) as e:
        attnres.train(config=data["config"], data=data["train"], out=str(tmp_path / "o"), steps=2, lrr=1)
    assert str(e.value) == cli.fail("train", "--config", data["config"], "--data", data["train"], "--out",
                                    tmp_path / "o", "--steps", 2, "--lrr", 1)
    with pytest.raises(attnres.Error) as e:
        attnres.train(config=data["config"], data=data["train"], out=str(tmp_path / "o"), steps=2, lr=-1)
    assert str(e.value) == cli.fail("train", "--config", data["config"], "--data", data["train"], "--out",
                                    tmp_path / "o", "--steps", 2, "--lr", -1)
    with pytest.raises(attnres.Error) as e:
        attnres.load(models["delta"], precision="fp8")
    assert "fp8" in str(e.value) and "\n" not in str(e.value)
    m = attnres.load(models["delta"], threads=int(THREADS))
    for bad, words in (([[1, 320]], "logits: token id 320 at [0, 1] is outside [0, vocab_size=320)"),
                       ([[-1, 2]], "token id -1 at [0, 0] is outside"),
                       ([[1.5, 2]], "ids must be integers"),
                       (np.zeros((1, 1, 2), dtype=np.int64), "ids must be (batch, T)"),
                       (np.zeros((1, 300), dtype=np.int64), "max_position_embeddings")):
        with pytest.raises(attnres.Error) as e:
            m.logits(bad)
        assert words in str(e.value), str(e.value)
    with pytest.raises(attnres.Error, match="outside"):
        m.generate([[1, 999]], 4)
    with pytest.raises(attnres.Error, match="max_new_tokens must be at least 1"):
        m.generate([[1, 2]], 0)
    with pytest.raises(attnres.Error, match="has no depth routing"):
        attnres.load(models["baseline"]).routing([[1, 2]])
    with pytest.raises(attnres.Error, match="at least one window"):
        m.interventions(data["val"], seq_len=T, tokens=4)


# ---- the GIL ----

def test_the_gil_is_released_while_computing(models, data):
    m = attnres.load(models["delta"], threads=1)
    w = windows(data["train"], 400, T + 1)
    m.loss(w[:8], batch=8)  # built and warm
    count, done = [0], threading.Event()

    def spin():
        while not done.is_set():
            count[0] += 1
    t = threading.Thread(target=spin)
    t.start()
    c0 = count[0]
    time.sleep(0.1)  # the spinner alone: its rate
    rate = (count[0] - c0) / 0.1
    before = count[0]
    t0 = time.perf_counter()
    m.loss(w, batch=8)  # one call
    seconds = time.perf_counter() - t0
    during = count[0] - before
    done.set()
    t.join()
    # Holding the GIL, the call would stop the spinner for all its length
    # (a switch interval of 5 ms at most before it); released, it spins on.
    assert seconds > 0.05, seconds
    assert during > 0.3 * rate * seconds, (during, rate, seconds)
