"""The entry points' own rules: every command and `python -m inferlab.*` entry refuses a Python without the
project's packages before it reads or writes anything (exit 2, one line naming the Python to use)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")


def system_python_lacks_the_project() -> bool:
    if SYSTEM_PYTHON is None:
        return False
    done = subprocess.run([SYSTEM_PYTHON, "-c", "import torch, safetensors"], capture_output=True)
    return done.returncode != 0


@pytest.mark.process
@pytest.mark.skipif(not system_python_lacks_the_project(), reason="no system Python without the project's packages")
@pytest.mark.parametrize("entry", [["-m", "inferlab", "verify", "RUN"], ["-m", "inferlab", "grade", "RUN"],
                                   ["-m", "inferlab", "pack", "RUN", "-o", "OUT"],
                                   ["-m", "inferlab.grade.bundle", "run"]])
def test_a_python_without_the_project_is_refused_in_one_line_and_nothing_is_written(tmp_path, entry):
    run = tmp_path / "run"
    run.mkdir()
    argv = [str(run) if a == "RUN" else str(tmp_path / "out.tar.gz") if a == "OUT" else a for a in entry]
    done = subprocess.run([SYSTEM_PYTHON, *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "AUTOGRADER_ROOT": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr and ".venv/bin/python" in lines[0], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written
