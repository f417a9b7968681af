#!/usr/bin/env bash
# Sets everything up (Debian packages, build, the peers' virtual environment,
# test fixtures) and runs the tests.
# Usage: scripts/test.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
ATTNRES_WERROR="${ATTNRES_WERROR:-ON}" scripts/setup.sh
scripts/setup_peers.sh  # PyTorch 2, transformers, tokenizers, lm-eval in .venv (tests/peers, tests/oracle)
if [ -x scripts/fetch_tokenizer_fixtures.sh ]; then scripts/fetch_tokenizer_fixtures.sh; fi
scripts/fetch_vega.sh   # the report inlines Vega, Vega-Lite and vega-embed
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
scripts/test_python.sh  # the Python package: its wheel, tests/python (pytest), a fresh venv
