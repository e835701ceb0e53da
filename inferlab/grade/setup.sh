#!/usr/bin/env bash
# Gradescope runs this once when it builds the image ($ROOT/source holds the zip): install the lock into .venv
# (torch from PyTorch's CPU index), then make the course's specimen ready offline.
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
cd "$ROOT/source"
if [ -z "${AUTOGRADER_PYTHON:-}" ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" -r requirements.lock
  .venv/bin/python -m pip install --quiet --no-deps -e .
fi
PY=${AUTOGRADER_PYTHON:-$ROOT/source/.venv/bin/python}
unset PYTHONPATH PYTHONSTARTUP
AUTOGRADER_ROOT=$ROOT "$PY" -m inferlab.grade.bundle prepare
