"""Checks that tests/golden/ is what the oracle writes today.

Usage: scripts/peers_python.sh tests/oracle/check_golden.py [--golden DIR]

Regenerates every case into a temporary directory (make_golden.py) and
compares it with the committed one: JSON files and integer tensors byte for
byte, weights (model.safetensors) exactly, and the float32 roundings of the
oracle's float64 results within |a - b| <= 1e-9 + 1e-6 |b|.  The tolerance is
there because float64 BLAS kernels differ between CPUs in the last bits, which
can move a float32 rounding by one unit; anything the oracle's semantics
change moves results by far more.  Exit status 1 names every difference.
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from peers import require  # noqa: E402  (a missing package: one line naming scripts/setup_peers.sh)
np = require("numpy")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle as O  # noqa: E402

ATOL, RTOL = 1e-9, 1e-6
# In the bf16 files a float64 last bit could also move a bf16 rounding, which this bound would not absorb:
# a chance near 2^-40 each, ~1e-4 over the files' ~10^8 roundings.


def compare_tensors(path_a, path_b, exact):
    a, meta_a = O.read_safetensors(path_a)
    b, meta_b = O.read_safetensors(path_b)
    problems = []
    if meta_a != meta_b:
        problems.append(f"{path_a}: metadata {meta_a} vs {meta_b}")
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append(f"{path_a}: tensor {name} only in {'committed' if name in a else 'regenerated'}")
            continue
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{path_a}: {name} {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
        elif exact or not np.issubdtype(x.dtype, np.floating):
            if not np.array_equal(x, y):
                problems.append(f"{path_a}: {name} differs")
        else:
            err = np.abs(x.astype(np.float64) - y.astype(np.float64))
            bound = ATOL + RTOL * np.abs(y.astype(np.float64))
            if not np.all(err <= bound):
                problems.append(f"{path_a}: {name} max |diff| {err.max():.3e} beyond {ATOL} + {RTOL}|b|")
    return problems


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", default=os.path.normpath(os.path.join(here, "..", "golden")))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(here, "make_golden.py"), "--out", tmp],
                       check=True, stdout=subprocess.DEVNULL)
        problems = []
        committed = sorted(e for e in os.listdir(args.golden) if os.path.isdir(os.path.join(args.golden, e)))
        fresh = sorted(e for e in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, e)))
        if committed != fresh:
            problems.append(f"cases {committed} vs regenerated {fresh}")
        for case in sorted(set(committed) & set(fresh)):
            ca, cb = os.path.join(args.golden, case), os.path.join(tmp, case)
            files_a, files_b = sorted(os.listdir(ca)), sorted(os.listdir(cb))
            if files_a != files_b:
                problems.append(f"{case}: files {files_a} vs regenerated {files_b}")
            for f in sorted(set(files_a) & set(files_b)):
                pa, pb = os.path.join(ca, f), os.path.join(cb, f)
                if f.endswith(".safetensors"):
                    problems += compare_tensors(pa, pb, exact=(f == "model.safetensors"))
                else:
                    with open(pa, "rb") as x, open(pb, "rb") as y:
                        if x.read() != y.read():
                            problems.append(f"{pa}: differs from the regenerated file")
    for p in problems:
        print(p)
    print(f"check_golden: {'OK' if not problems else f'{len(problems)} difference(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
