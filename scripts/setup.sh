#!/usr/bin/env bash
# Create (or reuse) ./.venv and install gradkern into it with what the tests, check and bench need.
# Without a CUDA GPU, torch==2.13.0 (a CPU build) is installed first, so nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q torch
  else
    python -m pip install -q torch==2.13.0
  fi
fi
python -m pip install -q -e ".[test,bench]"
