#!/usr/bin/env bash
# Set up ./.venv and run the whole test suite (on CPU every kernel runs under TRITON_INTERPRET=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check src tests
python -m pytest -q -n "${PYTEST_WORKERS:-2}" tests "$@"
