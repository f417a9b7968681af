#!/usr/bin/env bash
# The Python package (docs/python.md): builds its wheel (`pip wheel .`, the
# same CMake libraries as the program), installs it into the peers' venv and
# runs tests/python with pytest there, then installs the same wheel into a
# fresh venv of its own and scores a small model from it.
# Run by scripts/test.sh after ctest; needs scripts/setup.sh and
# scripts/setup_peers.sh first.  Usage: scripts/test_python.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
start=$(date +%s)

# The wheel: built without isolation, with the venv's pinned scikit-build-core
# and nanobind (scripts/peers_requirements.txt), in build/python/.
rm -rf build/python/dist
"$py" -m pip wheel . --no-build-isolation --no-deps --disable-pip-version-check --quiet -w build/python/dist
wheel=$(ls build/python/dist/attnres-*.whl)
echo "test_python: built $wheel ($(du -h "$wheel" | cut -f1)) in $(($(date +%s) - start)) s"
"$py" -m pip install --force-reinstall --no-deps --disable-pip-version-check --quiet "$wheel"

# The API against the program, call by call.
(cd tests/python && "../../$py" -m pytest -q -p no:cacheprovider "$@" .)

# A fresh venv: the wheel (numpy from PyPI) alone, then import and score.
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
/usr/bin/python3 -m venv "$fresh/venv"
"$fresh/venv/bin/pip" install --quiet --disable-pip-version-check "$wheel"
(cd "$fresh" && "$fresh/venv/bin/python" - <<'PY'
import numpy as np
import attnres

rng = np.random.default_rng(0)
attnres.write_tokens("train.bin", rng.integers(0, 512, 20000))
r = attnres.train(config="tiny", mode="delta", data="train.bin", steps=3, batch=2, seq_len=16, out="run", threads=2)
model = attnres.load("run", threads=2)
loss = model.loss(rng.integers(0, 512, (4, 17)), batch=4)
assert np.isfinite(loss) and abs(loss - np.log(model.vocab_size)) < 1.0, loss
print(f"test_python: a fresh venv with only the wheel: attnres {attnres.__file__}, {model.mode} scored, loss {loss:.4f}")
PY
)
echo "test_python: all ok in $(($(date +%s) - start)) s"
