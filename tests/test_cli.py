"""The entry points' own rules: every command and `python -m inferlab.*` entry refuses a Python without the
project's packages before it reads or writes anything (exit 2, one line naming the Python to use), and what each
command refuses to judge (a plan folder, one folder twice, a run its session is still writing)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.read.verify import integrity_problems, verify_run

from child_process import popen_signallable
from fixtures_records import kill_after
from grading_helpers import answered_explanation
from fixture_runs import runs  # noqa: F401 (a fixture)

REPO_ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")


def system_python_lacks_the_project() -> bool:
    return SYSTEM_PYTHON is not None and subprocess.run([SYSTEM_PYTHON, "-c", "import torch, safetensors"],
                                                        capture_output=True).returncode != 0


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


SLEEPING_HARNESS = '''
from shared_runs import experiment_here


def test_first(tmp_path):
    def sleeping(project):
        (project / "experiments" / "test_sleep.py").write_text(
            "import time\\ndef test_sleeps():\\n    open(%r, 'w').close()\\n    time.sleep(60)\\n")
    experiment_here(tmp_path, "-k", "sleeps", prepare=sleeping)


def test_second():
    open(%r, "w").close()
'''


@pytest.mark.process
def test_the_first_ctrl_c_stops_a_harness_session_inside_an_inner_session(tmp_path):
    """An experiment session run inside the suite's process (shared_runs.experiment_here, as the shared runs are made)
    takes Ctrl-C with its own handler; the suite stops all the same, and runs no further test."""
    started, second = tmp_path / "started", tmp_path / "second-ran"
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "test_outer.py").write_text(SLEEPING_HARNESS % (str(started), str(second)))
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'tests'}"}
    done = popen_signallable([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_outer.py"],
                             cwd=tmp_path / "harness", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), done.communicate(timeout=60)[0]
    done.send_signal(signal.SIGINT)
    out, _ = done.communicate(timeout=20)
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out
    assert not second.exists(), out


def test_every_command_refuses_a_plan_folder_the_same_way(runs, tmp_path, capsys):
    plan = runs.get("plan")
    for argv in (["verify", plan], ["report", plan], ["report", plan, "--after"], ["grade", plan],
                 ["compare", runs.get("complete"), plan], ["pack", plan, "-o", tmp_path / "p.tar.gz"]):
        assert main([str(a) for a in argv]) == 2, argv
        said = capsys.readouterr()
        assert "plan folder (written by --plan): no test ran" in said.out + said.err, argv
        assert said.out == "" or argv[0] == "grade", argv  # no page printed; grade's result names the refusal
    assert list(tmp_path.iterdir()) == []


def test_compare_of_a_folder_with_itself_is_refused(runs, capsys):
    assert main(["compare", str(runs.get("complete")), str(runs.get("complete"))]) == 2
    assert "DIR1 and DIR2 are the same run folder" in capsys.readouterr().err


def test_attaching_the_same_bytes_again_writes_nothing_and_says_so(runs, tmp_path, capsys):
    run = runs.copy("complete", tmp_path / "run")
    explanation = tmp_path / "my_explanation.md"
    explanation.write_text(answered_explanation())
    assert main(["attach", str(run), str(explanation)]) == 0
    assert main(["attach", str(run), str(explanation)]) == 0
    assert "byte for byte the explanation already attached as addenda/my_explanation.md" in capsys.readouterr().out
    assert len((run / "addenda.jsonl").read_text().splitlines()) == 1


def test_a_killed_run_is_live_while_its_session_runs_not_packed_and_once_gone_packed_and_compared_as_unfinished(
        runs, tmp_path, capsys):
    run = kill_after(runs.copy("complete", tmp_path / "run"), 10)  # as a SIGKILL after ten outcomes leaves it
    claim = json.loads((run / "claim.json").read_text())
    (run / "claim.json").write_text(json.dumps({**claim, "pid": os.getpid(), "hostname": socket.gethostname()}))
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "the run is LIVE, its session still running" in out
    assert "killed or crashed" not in out and "STILL RUNNING" not in out
    result = verify_run(run)  # still unfinished, never an integrity problem
    assert integrity_problems(result) == []
    assert result["completeness"][0].startswith("unfinished: no session_end record yet: the run is LIVE")
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    target = tmp_path / "out" / "submission.tar.gz"
    assert main(["pack", str(run), "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{run} is still being written" in err and "wait for it to end" in err
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
    assert not target.exists() and (not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()))
    (run / "claim.json").write_text(json.dumps({**claim, "pid": 4242, "hostname": "elsewhere"}))  # its session gone
    assert main(["pack", str(run), "-o", str(tmp_path / "submission.tar.gz")]) == 1  # packed; verify: unfinished
    assert (tmp_path / "submission.tar.gz").is_file() and "unfinished: " in capsys.readouterr().out
    assert main(["compare", str(runs.get("complete")), str(run)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("compare: DIR2 fails verify as unfinished or partial: unfinished: ")
    assert "the exit is 1" in lines[1]
