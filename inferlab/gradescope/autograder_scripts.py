"""The two scripts Gradescope runs, as they go into the autograder zip (inferlab.gradescope.autograder writes them).

setup.sh runs once, as root, when Gradescope builds the autograder's image; run_autograder runs for every
submission. Both read AUTOGRADER_ROOT (default /autograder) and AUTOGRADER_PYTHON (a Python that already has the
lock installed: setup.sh then skips its installation step, and run_autograder uses it).
"""

SETUP_SH = r"""#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder's image (the zip is unpacked in $ROOT/source).
#   1. install: a Python of the lock's version (apt on Gradescope's Ubuntu image when the default one is older),
#      .venv from requirements.lock, torch from PyTorch's CPU index first (inferlab/host/installation.py, as the
#      Makefile does), and the course's copy of inferlab itself, editable. Skipped when AUTOGRADER_PYTHON names a
#      Python that already has the lock installed.
#   2. prepare: the course's specimen acquired offline and verified (the stand-in is built here), so that no
#      submission needs the network.
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
SOURCE="$ROOT/source"
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
cd "$SOURCE"

install() {
  local base=${BASE_PYTHON:-python3}
  if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    apt-get update && apt-get install -y python3.11 python3.11-venv
    base=python3.11
  fi
  "$base" -m venv .venv
  .venv/bin/python -m inferlab.host.installation --lock requirements.lock --cpu-index "$TORCH_CPU_INDEX" --editable .
}

if [ -n "${AUTOGRADER_PYTHON:-}" ]; then
  echo "setup.sh: AUTOGRADER_PYTHON=$AUTOGRADER_PYTHON has the lock installed: the installation step is skipped"
  PY=$AUTOGRADER_PYTHON
else
  echo "== 1. install"
  install
  PY=$SOURCE/.venv/bin/python
fi
echo "== 2. prepare"
unset PYTHONPATH PYTHONSTARTUP
AUTOGRADER_ROOT=$ROOT "$PY" -m inferlab.gradescope.autograder prepare
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# Gradescope runs this for every submission: the course's copy of inferlab (in $ROOT/source) grades what
# $ROOT/submission holds and writes $ROOT/results/results.json. Nothing in the submission is executed.
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
SOURCE="$ROOT/source"
PY=${AUTOGRADER_PYTHON:-$SOURCE/.venv/bin/python}
unset PYTHONPATH PYTHONSTARTUP
cd "$SOURCE"
AUTOGRADER_ROOT=$ROOT exec "$PY" -m inferlab.gradescope.autograder run
"""

SCRIPTS = {"setup.sh": SETUP_SH, "run_autograder": RUN_AUTOGRADER}
