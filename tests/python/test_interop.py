"""The package beside its peers and its own program: a Ctrl-C during
train() in a real process, the logits of an exported baseline against
transformers' Qwen3, and compare() against its results files."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import attnres
from conftest import T, THREADS, read_tokens

CTRL_C_RUN = textwrap.dedent("""
    import json, sys, attnres
    opts = json.loads(sys.argv[1])
    try:
        r = attnres.train(**opts)
        print(json.dumps({"finished": r}))
    except attnres.TrainingInterrupted as e:
        print(json.dumps({"interrupted": e.result}))
""")


def test_ctrl_c_during_train_leaves_a_resumable_checkpoint(data, tmp_path):
    opts = dict(config=data["config"], mode="delta", data=data["train"], steps=400, batch=4, seq_len=T, lr=3e-3,
                threads=1, out=str(tmp_path / "run"))
    p = subprocess.Popen([sys.executable, "-c", CTRL_C_RUN, json.dumps(opts)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    log = tmp_path / "run" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and log.read_text().count('"loss"') >= 3):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)  # what Ctrl-C sends
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    r = json.loads(out.strip().splitlines()[-1])["interrupted"]
    assert r["stopped_by"] == "SIGINT" and 3 <= r["steps_done"] < 400, r
    assert os.path.isdir(r["checkpoint"])
    # Resumed to a short end, it is the run that was never interrupted.
    end = r["steps_done"] + 2
    resumed = attnres.train(resume=r["checkpoint"], steps=end, threads=1)
    whole = attnres.train(**{**opts, "out": str(tmp_path / "whole"), "steps": end})
    assert resumed["final_loss"] == whole["final_loss"]


def test_exported_baseline_logits_equal_transformers(models, cli, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = tmp_path / "hf"
    cli("export", "--model", models["baseline"], "--out", hf, "--dtype", "f32")
    ids = np.array([[5, 17, 200, 3, 44, 9, 120, 31], [1, 2, 3, 4, 5, 6, 7, 8]])
    ours = attnres.load(hf, threads=int(THREADS)).logits(ids)
    torch.set_num_threads(int(THREADS))
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids)).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4 * max(1.0, np.abs(theirs).max())
    # The run's own checkpoint scores the same as its export (f32: the same weights).
    assert np.array_equal(attnres.load(models["baseline"], threads=int(THREADS)).logits(ids), ours)


def test_compare_returns_the_table(data, tmp_path):
    r = attnres.compare(modes="baseline,delta", config=data["config"], data=data["train"], val_data=data["val"],
                        steps=4, batch=4, seq_len=T, out=str(tmp_path / "cmp"), threads=int(THREADS), val_tokens=1024,
                        routing_tokens=1024, precision="fp32")
    assert r["out"] == str(tmp_path / "cmp")
    with open(tmp_path / "cmp" / "results.json") as f:
        on_disk = json.load(f)
    assert {k: v for k, v in r.items() if k not in ("table", "out")} == on_disk
    assert "| baseline" in r["table"] and "| delta" in r["table"]
    with pytest.raises(attnres.Error, match="--out, --data and --val-data are required"):
        attnres.compare(modes="baseline", steps=2)
