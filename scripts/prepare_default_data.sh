#!/usr/bin/env bash
# Prepares the built-in default corpus: real English text from two Debian
# packages — the reStructuredText sources of the Python 3.11 documentation
# (python3.11-doc, ~11 MB) and the GNU Collaborative International Dictionary
# of English (dict-gcide, ~40 MB, gzip) — about 51 MB in all.  Trains an
# 8192-token byte-level BPE on all of it and writes
#   data/default/tokenizer.json  data/default/train.bin  data/default/val.bin
#   data/default/prepare.json (the summary; written last)
# Skips the work when those exist and were made by the same recipe.
# Usage: scripts/prepare_default_data.sh [--force]      (ATTNRES=path/to/attnres to override the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=data/default
ATTNRES=${ATTNRES:-build/attnres}
PYDOCS=/usr/share/doc/python3.11/html/_sources
GCIDE=/usr/share/dictd/gcide.dict.dz
VOCAB=8192
RECIPE="v1 inputs=$PYDOCS,$GCIDE vocab=$VOCAB doc-split-kb=16 val-fraction=0.03 seed=1337"

if [ "${1:-}" != "--force" ] && [ -f "$OUT/prepare.json" ] && [ -f "$OUT/tokenizer.json" ] &&
   [ -f "$OUT/train.bin" ] && [ -f "$OUT/val.bin" ] && [ "$(cat "$OUT/recipe.txt" 2>/dev/null)" = "$RECIPE" ]; then
  echo "prepare_default_data: $OUT is up to date ($(du -sh "$OUT" | cut -f1)); --force to redo"
  exit 0
fi

. scripts/apt_install_missing.sh
apt_install_missing prepare_default_data python3.11-doc dict-gcide
[ -d "$PYDOCS" ] && [ -f "$GCIDE" ] || { echo "prepare_default_data: $PYDOCS or $GCIDE missing after install" >&2; exit 1; }
[ -x "$ATTNRES" ] || { echo "prepare_default_data: $ATTNRES not built (run scripts/setup.sh)" >&2; exit 1; }

rm -f "$OUT/recipe.txt" "$OUT/prepare.json"
"$ATTNRES" prepare --input "$PYDOCS,$GCIDE" --out "$OUT" --vocab-size "$VOCAB" \
  --doc-split-kb 16 --val-fraction 0.03 --seed 1337 >/dev/null
echo "$RECIPE" >"$OUT/recipe.txt"
echo "prepare_default_data: wrote $OUT (tokenizer.json, train.bin, val.bin) in $(( $(date +%s) - START )) s"
