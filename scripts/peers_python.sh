#!/usr/bin/env bash
# Runs a Python program on the peers' virtual environment (.venv, made by
# scripts/setup_peers.sh): the interop tests, the oracle and the PyTorch
# comparators.  Without it, one line saying the command that installs it.
# Usage: scripts/peers_python.sh PROGRAM.py [ARGS...]
root="$(cd "$(dirname "$0")/.." && pwd)"
py="$root/.venv/bin/python"
if [ ! -x "$py" ]; then
  echo "peers: $root/.venv is missing (PyTorch 2, transformers, tokenizers, lm-eval); install it with scripts/setup_peers.sh" >&2
  exit 1
fi
exec "$py" "$@"
