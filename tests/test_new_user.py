"""A new user's second trial (issue 34): the rough edges a first real use of the run and its commands met."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferlab import cli
from inferlab.__main__ import main
from inferlab.run import records
from inferlab.run.records import MANIFEST_FILE, RECORDS_FILE
from inferlab.read import parse as earlier_runs
from inferlab.read.verify import verify_run
from inferlab.report.compare import compare, format_compare

import inner_session
from child_process import popen_signallable
from fixtures_records import copy_run
from fixture_runs import runs, shared  # noqa: F401 (fixtures)
from shared_runs import records as records_of

inner_session.preload()  # before any pytester fixture: see tests/inner_session.py

REPO_ROOT = Path(__file__).resolve().parents[1]

complete_run = shared("complete_run", "complete", "The shared complete run (never change it: copy it first).")
failed_run = shared("failed_run", "failed", "The shared run that failed at acquisition.")


@pytest.mark.slow
def test_check_artifacts_never_prints_none_for_a_file_it_did_not_read(standin_copy, tmp_path, capsys):
    (standin_copy / "config.json").unlink()
    (standin_copy / "config.json").mkdir()  # present, refused before it is read
    assert main(["check-artifacts", str(standin_copy), "--specimen", "standin"]) == cli.EXIT_PROBLEMS
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if "None" in line], lines
    assert any(line.startswith("PROBLEM config.json: present, not hashed (") for line in lines), lines


# A command a reader would type: python -m, pytest with a path or an option, inferlab with a subcommand and an
# argument. Prose that names a program ("not an inferlab reference", "pytest ended with") is not one.
SUBCOMMANDS = "|".join(re.escape(name.replace("_", "-")) for name in cli.COMMANDS)
COMMAND = re.compile(r"(?<![\w/.-])(?:python3?\s+-m\s|"
                     r"(?<!-m\s)pytest\s+(?:experiments|analytic_tests|tests|-{1,2}[a-z])|"
                     rf"inferlab\s+(?:{SUBCOMMANDS})\s+[-~./A-Z{{])")


def literal_texts(path: Path):
    """(line, text) of every string a module can print: each constant that is not a docstring, and each f-string
    whole, its replacement fields as {} (so that `python -m {module} DIR` is seen as the command it is)."""
    module = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(module)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(module):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


@pytest.mark.slow
def test_no_string_in_the_library_spells_a_command_without_the_environments_prefix_as_the_scan_would_see(tmp_path):
    module = tmp_path / "m.py"  # the scan sees an unprefixed command, in an f-string too, and no prose
    module.write_text('def f(m):\n    return f"build one with `python -m {m} NEWDIR`"\n'
                      'X = "rerun `pytest experiments --record-dir DIR`"\nY = "run `inferlab verify DIR`"\n'
                      'Z = "not an inferlab reference (format 1)"\n')
    assert sorted({line for line, text in literal_texts(module) if COMMAND.search(text)}) == [2, 3, 4]
    found = sorted({f"{path.relative_to(REPO_ROOT)}:{line}: {text!r}"
                    for path in (REPO_ROOT / "inferlab").rglob("*.py") for line, text in literal_texts(path)
                    if COMMAND.search(text)})
    assert not found, "a command printed without inferlab.cli.spelled:\n" + "\n".join(found)


def test_compare_says_first_what_makes_its_rows_doubtful(complete_run, failed_run, tmp_path, capsys):
    edited = copy_run(complete_run, tmp_path / "edited")
    lines = (edited / RECORDS_FILE).read_text(encoding="ascii").splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if '"kind": "generation"' in line)
    lines[index] = json.dumps({**json.loads(lines[index]), "note": "edited by hand"}) + "\n"  # only its hash tells
    (edited / RECORDS_FILE).write_text("".join(lines), encoding="ascii")
    assert main(["compare", str(complete_run), str(edited)]) == 3
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("INTEGRITY: DIR2 fails verify ("), lines[:4]
    assert any(RECORDS_FILE in line and "sha256" in line for line in lines[3:8]), lines[:8]
    result = compare(complete_run, failed_run)
    assert result["specimens"]["equal"] is False
    assert result["runs"]["dir2"] == "the specimen was NOT acquired, so nothing was measured"
    lines = format_compare(result).splitlines()
    assert "finished, the complete protocol" not in lines[1]
    assert lines[2].startswith("DIFFERENT SPECIMENS: DIR1 is of standin (") and "SYNTHETIC" in lines[2], lines[:4]
    assert "DIR2 of pythia-14m (EleutherAI/pythia-14m" in lines[2]


@pytest.mark.process
@pytest.mark.parametrize("name", ["submission.tar.gz", "my-run.tar.gz"])
def test_git_ignores_the_archive_pack_writes(name):
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "--no-index", "-q", name], cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, f"git would commit {name}: add it to .gitignore"


@pytest.mark.parametrize("value", ["-1,0", "-1e-4,1e-3"])
def test_revise_with_a_negative_criterion_in_the_space_form_gets_the_criterions_message(value, tmp_path, capsys):
    assert main(["revise", str(tmp_path), "--cache-criterion", value, "--justification", "why"]) == \
        cli.EXIT_UNREADABLE
    err = capsys.readouterr().err
    assert "expected one argument" not in err
    assert "--cache-criterion: expected ATOL,RTOL" in err and repr(value) in err, err
    with pytest.raises(SystemExit):  # a word that is no number is still read as an option
        main(["revise", str(tmp_path), "--cache-criterion", "--justification", "why"])
    assert "argument --cache-criterion: expected one argument" in capsys.readouterr().err


@pytest.mark.slow
def test_tests_out_of_the_protocols_order_are_refused_before_the_plan_and_in_their_order_run(suite):
    """Whatever reordered them (the files named out of their order here; an unknown plugin's shuffle the same): the
    collected order tells, and the run is refused before its plan, with a session_end that says why."""
    (suite.path / "experiments" / "test_10_first.py").write_text("def test_a():\n    pass\ndef test_b():\n    pass\n")
    (suite.path / "experiments" / "test_20_second.py").write_text("def test_c():\n    pass\n")
    swapped = suite.runpytest("experiments/test_20_second.py", "experiments/test_10_first.py", "--record-dir", "a")
    assert swapped.ret == pytest.ExitCode.USAGE_ERROR
    swapped.stderr.fnmatch_lines(["*the tests are not in the protocol's order: experiments/test_20_second.py::test_c "
                                  "would run at position 1, where experiments/test_10_first.py::test_a belongs*"])
    assert not (suite.path / "a" / "plan.json").exists()  # refused before the plan: no test ran
    [end] = [r for r in records_of(suite.path / "a") if r["kind"] == "session_end"]
    assert end["stop_reason"].startswith("usage error: the tests are not in the protocol's order")
    assert end["complete"] is False
    in_order = suite.runpytest("experiments/test_10_first.py", "experiments/test_20_second.py", "--record-dir", "b")
    in_order.assert_outcomes(passed=3)


@pytest.mark.slow
def test_a_refused_artifacts_copy_prints_one_line_per_failure_and_no_traceback(project, tmp_path):
    empty = tmp_path / "empty-copy"
    empty.mkdir()
    result = project.runpytest("experiments", "--record-dir", "run", "--artifacts", str(empty))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "Traceback" not in out and "def test_" not in out and "AssertionError" not in out and "E  " not in out
    failures = out.split("= FAILURES =")[1].split("short test summary info")[0].splitlines()
    body = [line for line in failures if line.strip() and not line.startswith(("_", "="))]
    assert len(body) == 6, body  # the acquisition and each of the five required files: one line each
    assert all("printed once" in line for line in body), body
    assert "config.json in " in body[1] and "actual: missing (one of the reasons the specimen" in body[1]
    assert len([line for line in out.splitlines() if line.startswith("SKIPPED [")]) == 1
    last = out.strip().splitlines()[-1]
    assert last.startswith("inferlab: NOTHING was measured: the specimen could not be acquired (your --artifacts copy "
                           "was refused); "), last


@pytest.mark.slow
def test_a_selection_that_measures_nothing_says_so_last_and_exits_5_and_its_plan_is_still_a_plan(project):
    result = project.runpytest("experiments/test_40_cache.py", "--specimen", "standin", "--record-dir", "run")
    assert result.ret == 5
    last = result.stdout.str().strip().splitlines()[-1]
    assert last.startswith("inferlab: NOTHING was measured: every one of the "), last
    assert "selected tests was skipped" in last and "exits with status 5" in last and "PARTIAL" in last
    [end] = [r for r in records_of(project.path / "run") if r["kind"] == "session_end"]
    assert end["measured_nothing"] is True and end["complete"] is False
    report = (project.path / "run" / "report.md").read_text()
    assert "each names the failure above" not in report
    result = project.runpytest("experiments", "-k", "cache", "--specimen", "standin", "--record-dir", "plan", "--plan")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED or result.ret == pytest.ExitCode.OK
    [end] = [r for r in records_of(project.path / "plan") if r["kind"] == "session_end"]
    assert end["measured_nothing"] is False
    assert "a PLAN only" in result.stdout.str().strip().splitlines()[-1]


@pytest.mark.slow
def test_checks_whose_trials_the_selection_left_out_are_not_decidable_never_a_harness_failure(project):
    """-k keeping the timing checks without their trials: each check skips, naming what it lacks; the run is partial,
    and neither the session nor verify calls the harness failed (every one of them failed as 'harness-integrity')."""
    result = project.runpytest("experiments", "--specimen", "standin", "--record-dir", "run", "-k",
                               "test_10_specimen or test_20_inputs or test_timing_summary or test_cache_divergence or "
                               "test_loop_matches_generate or test_cache_storage_after_sixteen_tokens")
    checks = [r for r in records_of(project.path / "run") if r["kind"] == "test_outcome" and "test_10" not in r["test"]
              and "test_20" not in r["test"]]
    assert len(checks) == 9 and all(r["outcome"] == "skipped" and r["skip_reason"].startswith("not decidable: ")
                                    for r in checks), checks
    last = result.stdout.str().strip().splitlines()[-1]
    assert result.ret == pytest.ExitCode.OK and "PARTIAL" in last and "HARNESS" not in last, last
    assert [p[:13] for p in verify_run(project.path / "run")["problems"]] == ["partial: -k '"]


def ended_pid() -> int:
    """The pid of a process that has ended (started, waited for, reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def killed_folder(runs: Path, name: str, claim: dict, records: str = '{"kind": "plan", "seq": 0}\n') -> Path:
    """A run folder as a killed session leaves it: its claim, the records so far, the start manifest."""
    folder = runs / name
    folder.mkdir(parents=True)
    (folder / "claim.json").write_text(json.dumps(claim))
    (folder / RECORDS_FILE).write_text(records)
    (folder / MANIFEST_FILE).write_text(json.dumps({"mode": "run", "protocol": {}, "complete": False,
                                                    "session_end": None}))
    return folder


@pytest.mark.process
def test_only_a_run_of_this_host_whose_process_ended_without_a_session_end_is_renamed(tmp_path, capsys):
    host, runs = socket.gethostname(), tmp_path / "runs"
    dead = {"pid": ended_pid(), "hostname": host, "claimed_utc": "2026-12-01T10:00:00Z", "command": "make run"}
    killed = killed_folder(runs, "20261201T100000Z-standin", dead)
    before = {p.name: p.read_bytes() for p in killed.iterdir()}
    live = killed_folder(runs, "20261201T100001Z-standin", {"pid": os.getpid(), "hostname": host})
    elsewhere = killed_folder(runs, "20261201T100002Z-standin", {**dead, "hostname": "another-machine"})
    finished = killed_folder(runs, "20261201T100003Z-standin", dead,
                             records='{"kind": "plan", "seq": 0}\n{"kind": "session_end", "seq": 1}\n')
    suffixed = killed_folder(runs, "20261201T100004Z-standin-incomplete", dead)
    found = records.rename_ended_runs(runs, hostname=host, now="2026-12-01T11:00:00Z",
                                    by={"pid": 1, "hostname": host, "command": "make run"},
                                    claim_without_end=earlier_runs.claim_without_end)
    assert found == [f"earlier run {killed}: its session (pid {dead['pid']} on {host}) ended without its final records "
                     f"(killed or crashed); renamed {killed.name}-incomplete ({records.RENAME_NOTE} in it says so)"]
    renamed = runs / "20261201T100000Z-standin-incomplete"
    assert not killed.exists() and {n: (renamed / n).read_bytes() for n in before} == before  # nothing changed
    note = json.loads((renamed / records.RENAME_NOTE).read_text())
    assert note["renamed_from"] == killed.name and note["claim"] == dead and "no longer running" in note["why"]
    assert all(folder.exists() for folder in (live, elsewhere, finished, suffixed))
    main(["verify", str(renamed)])
    assert f"its process (pid {dead['pid']} on {host}) is no longer running; renamed from {killed.name} to " \
           f"{renamed.name} by a later run" in capsys.readouterr().out


@pytest.mark.slow
def test_a_sigkilled_run_is_found_by_the_next_run_renamed_incomplete_and_said_so(suite):
    (suite.path / "experiments" / "test_exp.py").write_text(
        "import time, pytest\n@pytest.mark.records('waiting')\ndef test_waits(record):\n    record('waiting')\n"
        "    time.sleep(120)\n")
    runs = suite.path / "runs"
    process = popen_signallable([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "experiments",
                                 "--runs-dir", str(runs)], cwd=suite.path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any('"waiting"' in p.read_text() for p in runs.glob(f"*/{RECORDS_FILE}")):
            assert time.monotonic() < deadline and process.poll() is None, "the first run never started its test"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
    [killed] = list(runs.iterdir())
    assert not killed.name.endswith("-incomplete")  # SIGKILL leaves no chance to rename itself
    (suite.path / "experiments" / "test_exp.py").write_text("def test_quick():\n    pass\n")
    again = suite.runpytest("experiments", "--runs-dir", str(runs))
    said = again.stdout.str()
    assert f"earlier run {killed}: its session (pid {process.pid} on " in said
    assert f"renamed {killed.name}-incomplete (renamed-incomplete.json in it says so)" in said
    assert (runs / f"{killed.name}-incomplete" / "renamed-incomplete.json").is_file()


def test_grade_of_a_file_that_is_no_archive_says_so_in_one_line(tmp_path, capsys):
    fake = tmp_path / "submission.tar.gz"
    fake.write_text("not an archive at all\n")
    assert main(["grade", str(fake)]) == cli.EXIT_UNREADABLE
    said = capsys.readouterr()
    lines = [line for line in (said.out + said.err).splitlines() if line.strip()]
    assert "ReadError" not in said.out + said.err and len(lines) <= 2, lines
    assert "no tar archive (neither gzip nor tar opens it)" in lines[-1]
