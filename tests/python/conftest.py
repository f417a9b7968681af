"""Fixtures of the Python package's tests: a corpus made into token files and
a 320-token BPE by `attnres prepare`, and small models trained by the
`attnres train` program, which the API's results are checked against.

The program is the one built with the package (attnres.PROGRAM), unless
ATTNRES_CLI names another.  Run: scripts/test_python.sh (it builds and
installs the package first), or pytest tests/python with attnres importable.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import attnres

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
from transformers_interop import corpus, read_tokens  # noqa: E402,F401  (the interop tests' text and token files)

THREADS = "2"
T = 32  # the windows the models are trained and scored on


class Cli:
    """The attnres program: run(...) -> stdout (a failure raises with stderr);
    fail(...) -> the one-line error message it prints."""

    def __init__(self, path):
        self.path = path

    def __call__(self, *args, env=None):
        r = subprocess.run([self.path, *map(str, args)], capture_output=True, text=True,
                           env={**os.environ, **(env or {})})
        if r.returncode != 0:
            raise AssertionError(f"attnres {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
        return r.stdout

    def json(self, *args):
        return json.loads(self(*args).strip().splitlines()[-1])

    def fail(self, *args):
        r = subprocess.run([self.path, *map(str, args)], capture_output=True, text=True)
        assert r.returncode == 1, f"expected an error, got {r.returncode}: {r.stdout} {r.stderr}"
        line = r.stderr.strip().splitlines()[-1]
        prefix = f"attnres {args[0]}: error: "
        assert line.startswith(prefix), line
        return line[len(prefix):]


@pytest.fixture(scope="session")
def cli():
    return Cli(os.environ.get("ATTNRES_CLI") or str(attnres.PROGRAM))


@pytest.fixture(scope="session")
def data(tmp_path_factory, cli):
    """{dir, train, val (paths), tokenizer (path), config (a small config.json's path)}."""
    d = tmp_path_factory.mktemp("data")
    (d / "corpus.txt").write_text(corpus())
    cli("prepare", "--input", d / "corpus.txt", "--out", d, "--vocab-size", "320", "--val-fraction", "0.1",
        "--doc-split-kb", "1", "--threads", THREADS)
    config = {
        "architectures": ["Qwen3AttnResForCausalLM"], "model_type": "qwen3_attnres", "attention_bias": False,
        "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 320,
        "attnres_mode": "baseline", "attnres_num_blocks": 2, "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(config))
    return {"dir": d, "train": str(d / "train.bin"), "val": str(d / "val.bin"), "tokenizer": str(d / "tokenizer.json"),
            "config": str(d / "config.json")}


def train_args(data, mode, out, steps=20):
    return ["train", "--config", data["config"], "--mode", mode, "--data", data["train"], "--val-data", data["val"],
            "--steps", str(steps), "--batch", "4", "--seq-len", str(T), "--lr", "3e-3", "--val-every", "10",
            "--val-tokens", "2048", "--threads", THREADS, "--out", str(out)]


@pytest.fixture(scope="session")
def models(tmp_path_factory, cli, data):
    """mode -> a run directory of 20 steps, for the modes the tests read:
    one without routing, one single-head routed, one multi-head."""
    out = {}
    for mode in ("baseline", "delta", "block_mh"):
        d = tmp_path_factory.mktemp(mode) / "run"
        cli(*train_args(data, mode, d))
        out[mode] = str(d)
    return out
