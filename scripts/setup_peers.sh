#!/usr/bin/env bash
# Installs the peers attnres is checked and measured against — PyTorch 2,
# transformers, tokenizers, safetensors, lm-evaluation-harness, numpy — into
# a virtual environment inside the repository, .venv/ (git-ignored), from
# PyPI, every version pinned in scripts/peers_requirements.txt.
#
#   scripts/setup_peers.sh          install or update; a no-op when .venv matches the pins
#   scripts/setup_peers.sh --check  only say whether .venv matches (exit 1 if not)
#
# The interop tests (tests/peers/), the float64 oracle (tests/oracle/) and
# the PyTorch comparators (bench/pytorch_*.py) run on .venv/bin/python.
# Prints the versions, the time it took and the disk it uses.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
REQ=scripts/peers_requirements.txt
STAMP=$VENV/attnres-peers.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)
# Every module the tests and comparators import: a venv that cannot import
# one of them is rebuilt, whatever its stamp says.
IMPORTS="import torch, transformers, tokenizers, safetensors, lm_eval, accelerate, numpy"

matches() {
  [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] &&
    "$VENV/bin/python" -c "$IMPORTS" >/dev/null 2>&1
}

versions() {
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as m, sys
names = ["torch", "transformers", "tokenizers", "safetensors", "lm_eval", "numpy"]
print("setup_peers: python " + sys.version.split()[0] + ", " +
      ", ".join(f"{n} {m.version(n)}" for n in names))
EOF
}

if [ "${1:-}" = "--check" ]; then
  if matches; then versions; exit 0; fi
  echo "setup_peers: $VENV is missing or does not match $REQ; install it with scripts/setup_peers.sh" >&2
  exit 1
fi

if matches; then
  versions
  echo "setup_peers: $VENV already matches $REQ ($(du -sh "$VENV" | cut -f1))"
  exit 0
fi

start=$(date +%s)
# Debian's python3 (3.11) and its venv module; PyPI's wheels for cp311.
. scripts/apt_install_missing.sh
apt_install_missing setup_peers python3 python3-venv
if [ ! -x "$VENV/bin/python" ]; then
  /usr/bin/python3 -m venv "$VENV"
fi
rm -f "$STAMP"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip==26.3"
# --no-deps: exactly the pinned set (see the file's header for what is left out and why).
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$REQ"
# Anything installed before that the pins no longer name is removed, so the
# environment is the file and nothing else.
extra=$("$VENV/bin/python" -m pip freeze --disable-pip-version-check --exclude pip |
  sed 's/[=@ ].*//' | tr 'A-Z_' 'a-z-' | sort -u |
  comm -23 - <(grep -v '^#' "$REQ" | sed 's/[=@ ].*//' | tr 'A-Z_' 'a-z-' | sort -u))
if [ -n "$extra" ]; then
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y $extra
fi
"$VENV/bin/python" -c "$IMPORTS"
echo "$want" >"$STAMP"
versions
echo "setup_peers: $VENV ready in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1) on disk"
