"""What the Python layer costs: model.loss called from Python against the
same work timed inside C++ (the module's loss_seconds_in_cpp runs the very
code path of one loss call — the ids checked and converted, the forwards,
the sums — in a C++ loop), on a tiny model, for a few window shapes.  The
two are measured alternately, several rounds, and the median of the rounds' ratios reported.

Usage: scripts/test_python.sh (or pip install .) once, then
    .venv/bin/python bench/python_overhead.py [--threads N] [--rounds R] [--json]
Prints the CPU, OPENBLAS_CORETYPE, and per shape: ms per call from Python,
ms in C++, and the overhead in percent (the target: under 5%).
"""
import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import numpy as np

import attnres


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnres-bench-") as d:
        attnres.write_tokens(os.path.join(d, "t.bin"), rng.integers(0, 8192, 4096))
        attnres.train(config="tiny", data=os.path.join(d, "t.bin"), steps=1, batch=1, seq_len=16,
                      out=os.path.join(d, "run"), threads=a.threads)
        model = attnres.load(os.path.join(d, "run"), threads=a.threads)
        for windows, T in ((1, 16), (4, 64), (8, 256)):
            ids = rng.integers(0, 8192, (windows, T + 1))
            batch = windows
            model.loss(ids, batch=batch)  # built and warm
            one = time.perf_counter()
            model.loss(ids, batch=batch)
            one = time.perf_counter() - one
            repeats = max(3, int(0.15 / max(one, 1e-6)))  # about 0.15 s per measurement
            py, cpp = [], []
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                for _ in range(repeats):
                    model.loss(ids, batch=batch)
                py.append((time.perf_counter() - t0) / repeats)
                cpp.append(model._h().loss_seconds_in_cpp(np.ascontiguousarray(ids, dtype=np.int64), batch, repeats))
            p, c = statistics.median(py), statistics.median(cpp)
            # Each round's pair was measured back to back: the median of the
            # pairs' ratios cancels the host's slow drifts.
            ratios = sorted(x / y for x, y in zip(py, cpp))
            rows.append({"windows": windows, "T": T, "python_ms": 1e3 * p, "cpp_ms": 1e3 * c,
                         "overhead_percent": 100 * (statistics.median(ratios) - 1),
                         "pair_range_percent": [100 * (ratios[0] - 1), 100 * (ratios[-1] - 1)],
                         "repeats": repeats, "rounds": a.rounds})
    head = {"cpu": cpu_name(), "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"), "threads": a.threads,
            "model": "tiny (d 128, 4 layers, vocab 8192), baseline, fp32"}
    if a.json:
        print(json.dumps({**head, "rows": rows}))
        return
    print(f"python overhead of model.loss — {head['cpu']}, OPENBLAS_CORETYPE={head['OPENBLAS_CORETYPE']!r}, "
          f"threads {a.threads or 'all'}, {head['model']}")
    print(f"{'windows x T':>12} {'python ms':>10} {'C++ ms':>10} {'overhead':>9}  (range over the round pairs)")
    for r in rows:
        lo, hi = r["pair_range_percent"]
        print(f"{str(r['windows']) + ' x ' + str(r['T']):>12} {r['python_ms']:10.3f} {r['cpp_ms']:10.3f} "
              f"{r['overhead_percent']:8.2f}%  ({lo:+.1f}% … {hi:+.1f}%)")


if __name__ == "__main__":
    main()
