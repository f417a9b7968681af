"""attnres from Python: load a model, score, generate, route, intervene, train and compare.

The engine is the same C++ as the ``attnres`` program (the package is built
from the same CMake libraries): every result equals the command's for the
same model and inputs.  docs/python.md shows the API by example.

    >>> import attnres
    >>> model = attnres.load("runs/tiny")              # a run, checkpoint or HF directory
    >>> ids = model.tokenizer.encode("The cat sat")
    >>> model.logits([ids]).shape                      # (batch, T, vocab)
    >>> model.routing([ids])["layers.1.attn"].weights  # (batch, T, heads, sources)
    >>> attnres.train(config="tiny", data="train.bin", steps=100, out="runs/x")

Calls that compute release the GIL.  Errors are ``attnres.Error`` with the
one-line message the command prints.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

_HERE = Path(__file__).resolve().parent
# The attnres program built with this package: compare runs each training
# run as one, and it names the OpenBLAS kernels for this CPU.
PROGRAM = _HERE / "bin" / "attnres"


def _choose_blas_kernels() -> None:
    # OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE or the
    # CPU's model number, which virtual machines may mask (then it runs its
    # generic SSE3 kernels, 4x slower).  The program restarts itself with the
    # right value (src/ops/cpu/blas_kernels.h); a library cannot, so the
    # package asks the program before the engine (and OpenBLAS) loads.
    if "OPENBLAS_CORETYPE" in os.environ or not PROGRAM.exists():
        return
    try:
        core = subprocess.run([str(PROGRAM), "--blas-core"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core


_choose_blas_kernels()

from . import _attnres as _ext  # noqa: E402  (after the kernels are chosen)

if PROGRAM.exists():
    _ext.set_program(str(PROGRAM))

Error = _ext.Error
Error.__doc__ = "An error of the input or the environment, with the one-line message the attnres program prints."
InternalError = _ext.InternalError
InternalError.__doc__ = "A broken invariant inside attnres: a bug, please report it."

__all__ = [
    "load", "Model", "Tokenizer", "Routing", "Completion", "GenerationStream", "train", "compare",
    "TrainingInterrupted", "write_tokens", "Error", "InternalError", "PROGRAM",
]

IdsLike = Union[np.ndarray, Sequence[Sequence[int]], Sequence[int]]


def _ids_2d(ids: IdsLike, what: str) -> np.ndarray:
    """ids as a C-contiguous int64 (rows, T) array: a 1-D sequence is one row."""
    a = np.asarray(ids)
    if a.dtype == object or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise Error(f"{what}: ids must be integers (a (batch, T) array or a list of equal-length lists), got {a.dtype}")
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise Error(f"{what}: ids must be (batch, T), got an array of {a.ndim} dimensions")
    return np.ascontiguousarray(a, dtype=np.int64)


class Tokenizer:
    """A byte-level BPE tokenizer (a Hugging Face tokenizer.json), encoding as ``tokenizers`` does.

    ``Tokenizer(path)`` loads a tokenizer.json; ``model.tokenizer`` is the model's.
    """

    def __init__(self, path: Union[str, os.PathLike, None] = None, *, _handle=None):
        self._t = _handle if _handle is not None else _ext.Tokenizer.load(os.fspath(path))

    @property
    def vocab_size(self) -> int:
        """The number of token ids (added tokens included)."""
        return self._t.vocab_size

    def encode(self, text: str) -> List[int]:
        """The ids of one text (a new list)."""
        return self._t.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        """The ids of each text (new lists), encoded without the GIL."""
        return self._t.encode_batch(list(texts))

    def decode(self, ids: Sequence[int], errors: str = "replace") -> str:
        """The text of ids.  Tokens are bytes: a sequence cut inside a UTF-8
        character decodes with ``errors`` (as bytes.decode); decode_bytes gives the bytes."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The exact bytes of ids."""
        return self._t.decode_bytes([int(i) for i in ids])

    def decode_batch(self, batch: Sequence[Sequence[int]], errors: str = "replace") -> List[str]:
        """decode() of each sequence."""
        return [self.decode(ids, errors) for ids in batch]

    def token_id(self, token: str) -> Optional[int]:
        """The id of a token given by its text (e.g. "<|endoftext|>"), or None."""
        i = self._t.token_id(token)
        return None if i < 0 else i


@dataclass
class Routing:
    """One router's routing of a forward: its sources and the weight of each
    per token and routing head (each (b, t, h) row sums to 1)."""

    name: str
    sources: List[str]
    weights: np.ndarray  # (batch, T, heads, sources), float32, owned by the array (no copy)

    def mean(self) -> np.ndarray:
        """The mean weight of each source over tokens and heads (sources,)."""
        return self.weights.reshape(-1, self.weights.shape[-1]).astype(np.float64).mean(axis=0)


@dataclass
class Completion:
    """One prompt's generation: the new ids (an end-of-sequence id included),
    their text ("" without a tokenizer) and why it ended ("eos", "stop" or "length")."""

    ids: List[int]
    text: str
    finish_reason: str


class GenerationStream:
    """An iterator over (prompt index, text piece) as the generation decodes;
    ``results`` holds the Completions once it is exhausted.  Leaving it early
    (close(), or a with block) stops the decoding."""

    def __init__(self, handle):
        self._s = handle
        self.results: Optional[List[Completion]] = None

    def __iter__(self) -> Iterator[Tuple[int, str]]:
        return self

    def __next__(self) -> Tuple[int, str]:
        piece = self._s.next()
        if piece is None:
            if self.results is None:
                self.results = [Completion(list(i), t, f) for i, t, f in self._s.results()]
            raise StopIteration
        return piece

    def close(self) -> None:
        """Stops the decoding (at its next piece) and waits for it."""
        self._s.close()

    def __enter__(self) -> "GenerationStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Model:
    """A model opened for inference (see load()).  Holds its weights until
    close() or the end of a with block.  Each call builds the model for its
    own shape, as the matching attnres command does, so the results equal the
    command's; a call of a new shape reads the weights again."""

    def __init__(self, handle, tokenizer: Optional[Tokenizer]):
        self._m = handle
        self._tokenizer = tokenizer

    # ---- what it is ----
    def _h(self):
        if self._m is None:
            raise Error("the model is closed")
        return self._m

    @property
    def config(self) -> dict:
        """Its config.json as a dict (a copy), the attnres_* keys included."""
        return json.loads(self._h().config_json)

    @property
    def mode(self) -> str:
        """Its routing mode ("baseline", "delta", "block_mh", ...)."""
        return self._h().mode

    @property
    def vocab_size(self) -> int:
        return self._h().vocab_size

    @property
    def path(self) -> str:
        """The model directory it was read from (a run resolves to its latest checkpoint)."""
        return self._h().dir

    @property
    def precision(self) -> str:
        return self._h().precision

    @property
    def device(self) -> str:
        return self._h().device

    @property
    def tokenizer(self) -> Optional[Tokenizer]:
        """Its tokenizer (the directory's tokenizer.json, or load(tokenizer=...)); None without one."""
        return self._tokenizer

    def close(self) -> None:
        """Frees the model's memory; later calls raise attnres.Error."""
        self._m = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._m is None:
            return "<attnres.Model (closed)>"
        return f"<attnres.Model {self.path!r} mode={self.mode} precision={self.precision} device={self.device}>"

    # ---- scoring ----
    def logits(self, ids: IdsLike) -> np.ndarray:
        """The next-token logits of ids (batch, T) at positions 0 … T−1:
        a float32 array (batch, T, vocab) the engine wrote into (no copy;
        torch.from_dlpack(a) shares it)."""
        return self._h().logits(_ids_2d(ids, "logits"))

    def loss(self, ids: IdsLike, *, batch: int = 8) -> float:
        """The mean next-token cross-entropy, nats per token, over windows
        ids (windows, T+1): inputs ids[:, :-1], targets ids[:, 1:], ``batch``
        windows per forward — as ``attnres eval --batch`` computes it over
        the same windows (to the bit)."""
        return self._h().loss(_ids_2d(ids, "loss"), int(batch))[0]

    # ---- routing ----
    def routing(self, ids: IdsLike) -> Dict[str, Routing]:
        """Every router's weights over ids (batch, T), in forward order: name
        -> Routing(sources, weights (batch, T, heads, sources) float32, no copy).
        Their mean over tokens is `attnres routing --json`'s mean_weight."""
        return {n: Routing(n, s, w) for n, s, w in self._h().routing(_ids_2d(ids, "routing"))}

    def interventions(self, data: Union[str, os.PathLike, IdsLike], *, seq_len: int = 256, batch: int = 8,
                      tokens: int = 8192, routers: Optional[Sequence[Union[str, int]]] = None,
                      whole_sources: bool = False, progress: bool = False) -> dict:
        """The causal probes of `attnres routing --interventions` (docs/routing.md,
        "Interventions") over a token file or a 1-D array of token ids (written
        to a temporary token file: a copy): per router, Δ loss (nats per token)
        and its standard error when each source is ablated, under mean routing
        and under uniform routing.  Returns the command's --json object:
        {"loss", "tokens", "windows", "routers": [{"name", "sources", "mass",
        "ablate": [{"dloss", "se"}], "mean", "uniform"}], ...}."""
        h = self._h()
        names = [str(r) for r in routers] if routers is not None else []
        if routers is not None and not names:
            raise Error("interventions: routers is an empty list (give names or indices, or leave it out for all)")
        if isinstance(data, (str, os.PathLike)):
            return json.loads(h.interventions(os.fspath(data), int(seq_len), int(batch), int(tokens), names,
                                              bool(whole_sources), bool(progress)))
        import tempfile
        with tempfile.TemporaryDirectory(prefix="attnres-") as d:
            path = os.path.join(d, "tokens.bin")
            write_tokens(path, data)
            return json.loads(h.interventions(path, int(seq_len), int(batch), int(tokens), names,
                                              bool(whole_sources), bool(progress)))

    # ---- generation ----
    def generate(self, prompts: Union[str, Sequence[str], Sequence[Sequence[int]]], max_new_tokens: int = 64, *,
                 temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 seed: int = 0, stop: Sequence[str] = (), ignore_eos: bool = False, batch: int = 8,
                 stream: bool = False) -> Union[List[Completion], GenerationStream]:
        """Text from prompts (a text, texts, or lists of ids) with a KV cache,
        ``batch`` prompts decoded together, as `attnres generate` does: greedy
        unless temperature > 0 (or the model's generation_config.json samples);
        prompt i samples from (seed, i).  Returns a Completion per prompt, or
        with stream=True a GenerationStream of (prompt index, text piece)."""
        h = self._h()
        if isinstance(prompts, str):
            prompts = [prompts]
        ids: List[List[int]] = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if self._tokenizer is None:
                    raise Error(f"prompt {i} is text, and {self.path} has no tokenizer.json: give ids, or "
                                "attnres.load(..., tokenizer=PATH)")
                ids.append(self._tokenizer.encode(p))
            else:
                ids.append([int(t) for t in p])
        for i, p in enumerate(ids):
            bad = [t for t in p if t < 0 or t >= self.vocab_size]
            if bad:
                raise Error(f"prompt {i}: prompt token id {bad[0]} is outside [0, vocab_size={self.vocab_size})")
        args = (ids, int(max_new_tokens), temperature, top_k, top_p, int(seed), list(stop), bool(ignore_eos), int(batch))
        if stream:
            return GenerationStream(h.stream(*args))
        return [Completion(list(i), t, f) for i, t, f in h.generate(*args)]


def load(path: Union[str, os.PathLike], *, precision: str = "fp32", device: str = "cpu", threads: int = 0,
         tokenizer: Union[str, os.PathLike, None] = None) -> Model:
    """A model for inference from a run directory (its latest checkpoint), a
    checkpoint or a Hugging Face directory (config.json + safetensors).
    precision: "fp32" or "bf16" (of the matrix products); device: a backend
    of this build ("cpu"); threads: 0 = every core.  Returns a Model."""
    h = _ext.Model(os.fspath(path), precision, device, int(threads), os.fspath(tokenizer) if tokenizer else "")
    t = h.tokenizer()
    return Model(h, Tokenizer(_handle=t) if t is not None else None)


def write_tokens(path: Union[str, os.PathLike], ids: IdsLike) -> None:
    """Writes a 1-D sequence of token ids as an attnres token file (what
    `attnres prepare` writes; the --data of train, eval and routing)."""
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise Error("write_tokens: ids must be a 1-D sequence of integers")
    _ext.write_tokens(os.fspath(path), np.ascontiguousarray(a, dtype=np.int64))


# ---- training and comparisons: the commands' own option lists ----

def _flags(options: dict) -> List[str]:
    """Keyword arguments as the command's flags: lr_min=1e-4 -> --lr-min=0.0001;
    True/False -> --flag=true/false; a list repeats the flag; None leaves it out."""
    out: List[str] = []
    for key, value in options.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, os.PathLike):
                v = os.fspath(v)
            out.append(f"{flag}={v}")
    return out


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped attnres.train() as it stops `attnres train`:
    after the step in progress, with a checkpoint that resume= continues
    bit-identically.  ``result`` is the run's result (checkpoint, steps_done)."""

    def __init__(self, result: dict):
        super().__init__(f"training stopped by SIGINT after step {result['steps_done']}; "
                         f"checkpoint: {result['checkpoint']}")
        self.result = result


def train(on_step: Optional[Callable[[dict], Optional[bool]]] = None, **options) -> dict:
    """Trains (or fine-tunes, or resumes) a model as `attnres train` does,
    in this process; every option of the command is a keyword argument
    (the flag with '_' for '-': lr_min=1e-4, val_data="val.bin", mode="delta").

    on_step(record) is called after every step with its log.jsonl record
    (step, loss, lr, grad_norm, tok_s, mfu, … and val_loss/val_ppl when it
    validated); returning False stops the run there with a checkpoint, as a
    stop signal does.  An exception it raises stops the run the same way and
    is raised again.  Ctrl-C stops after the step in progress with a
    checkpoint and raises TrainingInterrupted (a KeyboardInterrupt); a second
    Ctrl-C ends the process, as it ends the program.

    Returns {"steps_done", "schedule_steps", "final_loss", "val_loss",
    "val_ppl", "val_tokens", "checkpoint", "stopped_by"}.  The run writes
    what the command writes (log.jsonl, checkpoints, its lines on stdout).
    """
    cb = None
    if on_step is not None:
        def cb(record: str) -> bool:
            return on_step(json.loads(record)) is not False
    result = _ext.train(_flags(options), cb)
    if result["stopped_by"] == "SIGINT":
        raise TrainingInterrupted(result)
    return result


def compare(**options) -> dict:
    """Matched runs of several routing modes (× seeds) as `attnres compare`
    runs them (each run is this package's attnres program), then their
    table: every option of the command is a keyword argument (modes="baseline,delta",
    data=..., val_data=..., steps=..., out=...).  Returns results.json as a
    dict with "table" (results.md, Markdown) and "out" added."""
    out = _ext.compare(_flags(options))
    if not out:
        return {}
    results = json.loads(Path(out, "results.json").read_text())
    results["table"] = Path(out, "results.md").read_text()
    results["out"] = out
    return results


# help(attnres.train) and help(attnres.compare) list every option, with the command's help.
train.__doc__ += "\nThe options (the flags of attnres train):\n\n" + _ext.train_help()
compare.__doc__ += "\nThe options (the flags of attnres compare):\n\n" + _ext.compare_help()
