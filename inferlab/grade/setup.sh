#!/usr/bin/env bash
# Gradescope runs this once when it builds the image ($ROOT/source holds the zip): install .venv as the Makefile
# does (torch from PyTorch's CPU index, then the lock, then the project editable), then make the course's specimen
# ready offline.
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
cd "$ROOT/source"
if [ -z "${AUTOGRADER_PYTHON:-}" ]; then
  python3 -m venv .venv
  PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
  CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
  "${PIP[@]}" --no-deps --index-url "$CPU_INDEX" --timeout 10 --retries 0 "$(grep '^torch==' requirements.lock)" ||
    echo "setup.sh: no torch from $CPU_INDEX; the lock's step takes the default index's (for Linux a CUDA build)"
  "${PIP[@]}" -r requirements.lock
  "${PIP[@]}" --no-deps --editable .
fi
PY=${AUTOGRADER_PYTHON:-$ROOT/source/.venv/bin/python}
unset PYTHONPATH PYTHONSTARTUP
AUTOGRADER_ROOT=$ROOT "$PY" -m inferlab.grade.bundle prepare
