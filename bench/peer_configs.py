"""The PyTorch configurations the comparators run, and what they share.

A user comparing attnres with PyTorch would try these, so every comparator
(bench/pytorch_bench.py, pytorch_finetune.py, pytorch_generate.py,
pytorch_tasks.py) runs each of them and reports the best:

    name                 execution                          precision
    eager-fp32           eager                              float32
    eager-bf16           eager                              torch.autocast('cpu', bfloat16)
    compile-fp32         torch.compile (Inductor, default)  float32
    compile-bf16         torch.compile (Inductor, default)  autocast bf16
    autotune-fp32        torch.compile(mode="max-autotune") float32
    autotune-bf16        torch.compile(mode="max-autotune") autocast bf16

"bf16" is autocast over float32 weights for training (bf16 products, float32
master weights, gradients and AdamW: what attnres's --precision bf16 does)
and, for inference, whatever the comparator says (bf16 weights or autocast).

Each configuration runs in a process of its own, so the peak RSS printed is
its own and one configuration's compiled code cannot speed up another's.
`run_all` is that driver: it runs the comparator once per configuration with
--config-name NAME, collects the JSON lines, and prints them followed by one
line {"best": ...} per mode holding the fastest configuration by the given
key.  A configuration that fails (torch.compile cannot build one here, an
out-of-memory kill) is reported with its error, never silently dropped.

Every JSON line names the peer: {"peer": {"name": "pytorch", "torch": "2.15.0",
"transformers": ..., "impl": "hand" | "transformers", "config": NAME, ...}}
so later runs compare like with like.
"""

import contextlib
import json
import os
import subprocess
import sys
import time

CONFIGS = ["eager-fp32", "eager-bf16", "compile-fp32", "compile-bf16", "autotune-fp32", "autotune-bf16"]
DEFAULT = "eager-fp32,eager-bf16,compile-fp32,compile-bf16"


def parse(name):
    """'compile-bf16' -> ('compile', 'bf16')."""
    if name not in CONFIGS:
        raise SystemExit(f"unknown PyTorch configuration {name!r}; known: {', '.join(CONFIGS)}")
    execution, precision = name.split("-")
    return execution, precision


def has_compile(torch):
    return hasattr(torch, "compile")


def compiled(torch, fn, execution, dynamic=None):
    """fn, or torch.compile(fn) for the compiled configurations."""
    if execution == "eager":
        return fn
    if not has_compile(torch):
        raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
    mode = "max-autotune" if execution == "autotune" else None
    return torch.compile(fn, mode=mode, dynamic=dynamic)


def autocast(torch, precision):
    """torch.autocast('cpu', bfloat16) for bf16, nothing for fp32."""
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peer(torch, impl, config_name, **extra):
    """The peer's identity for a JSON record."""
    out = {"name": "pytorch", "torch": torch.__version__, "impl": impl, "config": config_name,
           "threads": torch.get_num_threads()}
    if impl == "transformers":
        import transformers
        out["transformers"] = transformers.__version__
    out.update(extra)
    return out


def run_all(script, argv, config_names, key, group=("mode",)):
    """Runs `script argv --config-name C` for each C in its own process; prints
    every JSON line and the best per group by `key` (larger is better).
    Returns the records."""
    records = []
    for c in config_names:
        parse(c)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, script] + argv + ["--config-name", c],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            err = (p.stderr.strip().splitlines() or ["exit status %d" % p.returncode])[-1]
            rec = {"config_name": c, "error": err[:300], "wall_s": time.perf_counter() - t0}
            print(json.dumps(rec), flush=True)
            records.append(rec)
            continue
        for l in lines:
            rec = json.loads(l)
            print(json.dumps(rec), flush=True)
            records.append(rec)
    ok = [r for r in records if "error" not in r]
    groups = {}
    for r in ok:
        groups.setdefault(tuple(r.get(g) for g in group), []).append(r)
    for k, rs in groups.items():
        best = max(rs, key=lambda r: r[key])
        print(json.dumps({"best": dict(zip(group, k)), "by": key, "config": best["peer"]["config"],
                          "impl": best["peer"]["impl"], key: best[key]}), flush=True)
    return records


def peak_rss_bytes():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def add_args(ap, default=DEFAULT):
    """--configs (the list to run, each in its own process) and the hidden
    --config-name (the one this process runs)."""
    import argparse
    ap.add_argument("--configs", default=default,
                    help=f"comma-separated PyTorch configurations (of {', '.join(CONFIGS)}); default {default}")
    ap.add_argument("--config-name", default=None, help=argparse.SUPPRESS)


def drive(a, script, key, group=("mode",)):
    """When this process was not given --config-name, runs every one of
    --configs in a process of its own (run_all) and returns True: the caller
    is done.  Otherwise returns False: the caller runs a.config_name."""
    if a.config_name is not None:
        parse(a.config_name)
        return False
    argv, skip = [], False
    for x in sys.argv[1:]:                      # the same arguments, less --configs
        if skip:
            skip = False
        elif x == "--configs":
            skip = True
        elif not x.startswith("--configs="):
            argv.append(x)
    run_all(script, argv, [c for c in a.configs.split(",") if c], key, group)
    return True


def env_note():
    """OPENBLAS_* and OMP settings in force, for the record."""
    return {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS")
            if k in os.environ}
