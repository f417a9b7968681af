"""What every peer test and comparator shares: importing a peer package with
a clear message when it is missing, and the versions they report.

    from peers import require, versions
    torch, transformers = require("torch", "transformers")
"""

import importlib
import importlib.metadata
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL = "scripts/setup_peers.sh"

# import name -> distribution name on PyPI
_DIST = {"lm_eval": "lm_eval", "torch": "torch", "transformers": "transformers",
         "tokenizers": "tokenizers", "safetensors": "safetensors", "numpy": "numpy"}


def require(*names):
    """Imports each module; a missing or broken one is one line naming the
    package and the command that installs it, and exit status 1."""
    mods = []
    for name in names:
        try:
            mods.append(importlib.import_module(name))
        except Exception as e:  # ImportError, or a broken install failing inside the import
            print(f"peers: cannot import {name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}) "
                  f"with {sys.executable}; install the peers with {INSTALL}", file=sys.stderr)
            sys.exit(1)
    return mods[0] if len(mods) == 1 else mods


def versions(*names):
    """{name: version} of installed distributions, for JSON records."""
    out = {"python": sys.version.split()[0]}
    for n in names:
        try:
            out[n] = importlib.metadata.version(_DIST.get(n, n))
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out
