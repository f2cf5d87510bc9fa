#!/usr/bin/env bash
# Set up ./.venv, check every op against PyTorch, then benchmark (a small interpreter run without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m gradkern check
python -m gradkern bench --json bench.json --plot bench.png "$@"
