#!/usr/bin/env bash
# Installs Vega, Vega-Lite and vega-embed from the npm registry into
# third_party/npm/ (git-ignored).  `attnres report` (and `attnres compare`,
# which writes a report) inlines their minified builds into the HTML page, so
# the page opens offline; nothing of theirs is committed here.  Idempotent;
# needs node+npm.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(vega@6.4.0 vega-lite@6.5.0 vega-embed@7.3.0)
DIR=third_party/npm
have() { grep -q "\"version\": \"$2\"" "$DIR/node_modules/$1/package.json" 2>/dev/null; }
if have vega 6.4.0 && have vega-lite 6.5.0 && have vega-embed 7.3.0; then
  echo "fetch_vega: ${PKGS[*]} already present"
  exit 0
fi
if ! command -v npm >/dev/null; then
  . scripts/apt_install_missing.sh
  apt_install_missing fetch_vega npm
fi
mkdir -p "$DIR"
[ -f "$DIR/package.json" ] || echo '{"name": "attnres-npm", "private": true}' >"$DIR/package.json"
(cd "$DIR" && npm install --no-audit --no-fund --loglevel=error "${PKGS[@]}")
for f in vega/build/vega.min.js vega-lite/build/vega-lite.min.js vega-embed/build/vega-embed.min.js; do
  test -f "$DIR/node_modules/$f" || { echo "fetch_vega: $DIR/node_modules/$f missing after npm install" >&2; exit 1; }
done
echo "fetch_vega: installed ${PKGS[*]}"
