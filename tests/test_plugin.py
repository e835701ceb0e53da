"""The plugin in real sessions: throwaway suites run by pytester, in process or, for a signal, in their own process."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import inner_session
from child_process import popen_signallable
from inferlab import protocol, specimen
from inferlab.cli import main
from inferlab.files import sha256_file
from inferlab.read.verify import integrity_problems, verify_run
from inferlab.run import plan as run_plan, records
from project_help import project_help

inner_session.preload()  # before any pytester fixture: see tests/inner_session.py

REPO_ROOT = Path(__file__).resolve().parents[1]
PASSES = "def test_a():\n    pass\n"
# One test records, the next sends the session a Ctrl-C (SIGINT) from inside.
SELF_INTERRUPTING = ("import os, signal, pytest\n@pytest.mark.records('before_interrupt')\ndef test_first(record):\n"
                     "    record('before_interrupt')\ndef test_interrupted():\n"
                     "    os.kill(os.getpid(), signal.SIGINT)\n")
PYTEST_PREFIX = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")  # hypothesis: half a bare process's start


def write_experiment(suite, source: str, name: str = "test_exp.py") -> None:
    (suite.path / "experiments" / name).write_text(source)


def read_records(record_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (record_dir / "records.jsonl").read_text().splitlines()]


def outcomes_by_test(record_dir: Path) -> dict:
    return {r["test"].split("::")[-1]: r for r in read_records(record_dir) if r["kind"] == "test_outcome"}


def session_end(record_dir: Path) -> dict:
    [end] = [r for r in read_records(record_dir) if r["kind"] == "session_end"]
    return end


def manifest_of(record_dir: Path) -> dict:
    return json.loads((record_dir / "manifest.json").read_text())


def last_line(result) -> str:
    return [line for line in result.outlines if line.strip()][-1]


def start_pytest(suite, *args, env=None) -> subprocess.Popen:
    """A pytest process in a scratch suite, not pytester's, so signals reach it (SIGINT and SIGTERM as by default)."""
    return popen_signallable([sys.executable, "-m", "pytest", *PYTEST_PREFIX, *args], cwd=suite.path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})


# --- what a run records ---------------------------------------------------------------------------------------------


def test_a_failing_test_is_recorded_in_strict_ascii_json_extended_by_the_hooks_and_the_run_says_what_it_is(suite,
                                                                                                           monkeypatch):
    monkeypatch.setenv("HOME", str(suite.mkdir("home")))  # the record dir is given as ~/run
    suite.makeconftest('pytest_plugins = ["inferlab.plugin"]\ndef pytest_inferlab_record(config, record):\n'
                       "    record['course'] = 'lab12'\ndef pytest_inferlab_manifest(config, manifest):\n"
                       "    manifest['section'] = 'B'\n")
    write_experiment(suite, "import pytest\n@pytest.mark.records('measurement')\ndef test_measures(record):\n"
                            "    record('measurement', value=float('nan'), text='a\\nb\\t\\u00e9')\n"
                            "    assert 3 == 4, 'measured 3, expected 4'\n")
    result = suite.runpytest("experiments", "--record-dir=~/run")
    result.assert_outcomes(failed=1)
    found, run = read_records(suite.path / "home" / "run"), suite.path / "home" / "run"
    assert not (suite.path / "~").exists()
    assert [r["seq"] for r in found] == list(range(len(found))) and all(r["course"] == "lab12" for r in found)
    raw = (run / "records.jsonl").read_text(encoding="ascii")
    record = next(r for r in found if r["kind"] == "measurement")
    assert record["value"] == "nan" and record["text"] == "a\nb\t\u00e9" and "\\n" in raw and "\\u00e9" in raw
    outcome = outcomes_by_test(run)["test_measures"]
    assert outcome["outcome"] == "failed" and "measured 3, expected 4" in outcome["longrepr"]
    manifest = manifest_of(run)
    assert manifest["section"] == "B"
    assert (manifest["exit_status"], manifest["exit_code_name"], manifest["outcome_counts"]) == (1, "TESTS_FAILED",
                                                                                              {"failed": 1})
    end = manifest["session_end"]
    assert (end["interrupted"], end["stopped_early"], end["tests_without_outcome"]) == (False, False, [])
    assert end["protocol_complete"] is False and manifest["complete"] is False  # one test is not the protocol
    assert {"records.jsonl", "report.md", "plan.json"} <= set(manifest["files"])
    result.stdout.fnmatch_lines(["*AssertionError: measured 3, expected 4*", "*FAILED*test_measures*seq*"])
    assert last_line(result).startswith("inferlab: ") and "the HARNESS FAILED: 1 harness-integrity check(s)" in \
        last_line(result)


@pytest.mark.parametrize("answer, flagged", [("", True), ("yes, identical ids\n", False)], ids=["blank", "answered"])
def test_the_manifest_holds_the_environment_and_the_predictions_copied_before_any_test_a_blank_one_flagged(
        suite, answer, flagged):
    write_experiment(suite, PASSES)
    (suite.path / "mine.md").write_text((REPO_ROOT / "predictions.md").read_text().replace(
        "Prediction:\n", f"Prediction:\n{answer}", 1))
    result = suite.runpytest("experiments", "--record-dir", "run", "--predictions", "mine.md")
    result.assert_outcomes(passed=1)
    manifest = manifest_of(suite.path / "run")
    assert manifest["platform"]["python_version"] and manifest["platform"]["logical_cpus"] >= 1
    assert manifest["distributions"]["pytest"] == pytest.__version__
    assert "pytest-timeout" in manifest["pytest"]["plugins"]
    assert "OMP_NUM_THREADS" in manifest["thread_environment"]
    assert any("3.13.13" in d for d in manifest["deviations_from_reference"])
    predictions = manifest["predictions"]
    assert (suite.path / "run" / "predictions.md").read_text() == (suite.path / "mine.md").read_text()
    assert manifest["files"]["predictions.md"]["sha256"] == predictions["sha256"]
    assert predictions["copied_at_utc"] < read_records(suite.path / "run")[1]["wall_time"]
    assert predictions["template_unanswered"] is flagged and predictions["answered"] == ([] if flagged else [1])
    assert ("is still the unanswered template" in result.stdout.str()) is flagged
    assert "6 questions answered" in result.stdout.str()  # said at the start, while they can still be fixed


def test_a_test_may_write_only_the_record_kinds_it_declares_and_the_plan_carries_them_and_its_check_kind(suite):
    write_experiment(suite, "import pytest\n@pytest.mark.records('measurement')\ndef test_declared(record):\n"
                            "    record('measurement', value=1)\n@pytest.mark.records('measurement')\n"
                            "def test_undeclared(record):\n    record('surprise', value=2)\n@pytest.mark.diagnostic\n"
                            "def test_silent(record):\n    record('measurement', value=3)\n")
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(passed=1, failed=2)
    run = suite.path / "run"
    assert [r["value"] for r in read_records(run) if r["kind"] in ("measurement", "surprise")] == [1]
    outcomes = outcomes_by_test(run)
    assert "record kind 'surprise' is not declared on the test; expected one of" in outcomes["test_undeclared"][
        "longrepr"] and "the test declares no record kinds" in outcomes["test_silent"]["longrepr"]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["schema"] == manifest_of(run)["schema"] == 2
    assert [entry["records"] for entry in plan["schedule"]] == [["measurement"], ["measurement"], []]
    assert [entry["check_kind"] for entry in plan["schedule"]] == ["integrity", "integrity", "diagnostic"]
    assert session_end(run)["failures_by_check_kind"] == {"integrity": 1, "diagnostic": 1}


def test_a_source_file_edited_mid_run_is_listed_and_the_report_still_regenerates(suite, capsys):
    """The manifest keeps the environment as the run started; an edit during the run is named, not swapped in."""
    write_experiment(suite, "from pathlib import Path\ndef test_edits_a_tracked_file():\n"
                            "    Path(__file__).write_text(Path(__file__).read_text() + '# edited mid-run\\n')\n")
    result = suite.runpytest("experiments", "--record-dir", "run")
    run, changed = suite.path / "run", "source_sha256: experiments/test_exp.py"
    assert manifest_of(run)["source_sha256"]["experiments/test_exp.py"] != sha256_file(suite.path / "experiments" /
                                                                                       "test_exp.py")
    assert manifest_of(run)["environment_changed_during_run"] == [changed]
    result.stdout.fnmatch_lines([f"environment: CHANGED during the run: {changed}*"])
    assert f"the ENVIRONMENT CHANGED during the run ({changed})" in last_line(result)
    assert f"**The environment changed during the run** ({changed})" in (run / "report.md").read_text()
    capsys.readouterr()
    assert main(["report", str(run), "--check"]) == 0
    assert main(["verify", str(run)]) == 1 and "session_end: the environment changed" in capsys.readouterr().out


@pytest.mark.parametrize("name, synthetic", [("standin", True), ("pythia-14m", False)])
def test_the_summary_names_the_specimen_and_says_when_it_is_synthetic(suite, name, synthetic):
    spec = specimen.load_spec(name)
    write_experiment(suite, PASSES)
    result = suite.runpytest("experiments", "--record-dir", "run", "--specimen", name)
    line = f"specimen: {name} ({spec.repo_id} at revision {spec.revision})"
    result.stdout.fnmatch_lines([f"{line}; SYNTHETIC, not Pythia: *{protocol.PINNED_REPO_ID}" if synthetic else line])
    assert ("SYNTHETIC" in result.stdout.str()) is synthetic


# --- the plan, the prerequisites and the limits ---------------------------------------------------------------------


def test_plan_lists_the_schedule_runs_nothing_and_refuses_one_over_the_protocols_caps(suite):
    write_experiment(suite, "import pytest\n@pytest.fixture(scope='session')\ndef model():\n"
                            "    raise AssertionError('the plan must not load a model')\n"
                            "@pytest.mark.budget(category='generation', selections=16)\n"
                            "@pytest.mark.parametrize('seed', [17, 23])\ndef test_trial(model, seed):\n    pass\n")
    result = suite.runpytest("experiments", "--record-dir", "run", "--plan")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*generation*selections=16*test_trial[[]17[]]*",
                                 "*generation*selections=16*test_trial[[]23[]]*", "*generation_trials=2/26*"])
    plan = json.loads((suite.path / "run" / "plan.json").read_text())
    assert [e["params"] for e in plan["schedule"]] == [{"seed": 17}, {"seed": 23}]
    assert plan["totals"]["generation_new_tokens"] == 32
    assert [r["kind"] for r in read_records(suite.path / "run")] == ["plan", "session_end"]
    write_experiment(suite, "import pytest\n@pytest.mark.budget(category='cache', forwards=17)\ndef test_a():\n"
                            "    pass\n")
    over = suite.runpytest("experiments", "--record-dir", "over", "--plan")  # a schedule over the protocol's caps
    assert over.ret == pytest.ExitCode.USAGE_ERROR
    over.stderr.fnmatch_lines(["*cache_forwards: planned 17, protocol allows at most 16*"])


def test_the_trial_limit_is_the_protocols_covers_the_test_body_only_and_a_timeout_is_a_recorded_failure(suite,
                                                                                                      monkeypatch):
    monkeypatch.setattr(protocol, "TRIAL_LIMIT_S", 0.2)
    write_experiment(suite, "import time, pytest\n@pytest.fixture(scope='session')\ndef slow_download():\n"
                            "    time.sleep(0.4)  # twice the trial limit: a limit on setup would fail the test\n"
                            "def test_quick_after_slow_setup(slow_download):\n    pass\n"
                            "def test_slow_body():\n    time.sleep(60)\ndef test_next():\n    pass\n")
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(passed=2, failed=1)
    outcomes = outcomes_by_test(suite.path / "run")
    assert "Timeout (>0.2s) from pytest-timeout" in outcomes["test_slow_body"]["longrepr"]
    assert outcomes["test_next"]["outcome"] == "passed"  # the session goes on
    plan = json.loads((suite.path / "run" / "plan.json").read_text())
    assert {entry["timeout_s"] for entry in plan["schedule"]} == {0.2}


def test_the_session_limit_counts_from_setup_and_later_tests_are_recorded_as_not_run(suite, monkeypatch):
    monkeypatch.setattr(protocol, "SESSION_LIMIT_S", -1)  # the limit passes as soon as setup is done
    write_experiment(suite, f"import pytest\n@pytest.mark.provides({protocol.SETUP_DONE_CHECK!r})\ndef test_setup():\n"
                            "    pass\n@pytest.mark.records('should_not_exist')\ndef test_after(record):\n"
                            "    record('should_not_exist')\n")
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(passed=1, skipped=1)
    assert "should_not_exist" not in [r["kind"] for r in read_records(suite.path / "run")]
    assert "session limit" in outcomes_by_test(suite.path / "run")["test_after"]["skip_reason"]
    assert "the run did NOT finish (session limit: 1 test(s) not started" in last_line(result)


def test_a_skip_for_a_prerequisite_names_the_first_failure_of_its_chain(suite):
    write_experiment(suite, "import pytest\n@pytest.mark.provides('download')\ndef test_download():\n"
                            "    pytest.fail('no route to the hub')\n@pytest.mark.requires('download')\n"
                            "@pytest.mark.provides('model')\n@pytest.mark.records('should_not_exist')\n"
                            "def test_load(record):\n    record('should_not_exist')\n"
                            "@pytest.mark.requires('model')\ndef test_generate():\n    pass\n"
                            "@pytest.mark.requires('never_provided')\ndef test_orphan():\n    pass\n")
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(failed=1, skipped=3)
    outcomes = outcomes_by_test(suite.path / "run")
    assert "should_not_exist" not in [r["kind"] for r in read_records(suite.path / "run")]
    assert outcomes["test_load"]["skip_reason"] == ("not run: prerequisite 'download' failed in experiments/"
                                                    "test_exp.py::test_download: Failed: no route to the hub")
    reason = outcomes["test_generate"]["skip_reason"]
    assert reason.startswith("not run: prerequisite 'model' did not run, because prerequisite 'download' failed")
    assert reason.count("prerequisite") == 2 and "never_provided" in outcomes["test_orphan"]["skip_reason"]


# --- how a session ends -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig, again", [("SIGINT", False), ("SIGTERM", False), ("SIGINT", True)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-again-while-pytest-handles-it"])
def test_a_signal_mid_session_leaves_whole_records_an_unfinished_run_and_the_command_as_typed(suite, sig, again):
    """A command a learner might type (-q, a -k expression with a space); its second test signals its process. A
    second SIGINT inside pytest's own interrupt handling used to leave exit status 0 and a complete run."""
    if again:
        suite.makeconftest('pytest_plugins = ["inferlab.plugin"]\nimport os, signal\n'
                           "def pytest_keyboard_interrupt(excinfo):\n    os.kill(os.getpid(), signal.SIGINT)\n")
    never = "@pytest.mark.records('unreachable')\ndef test_never(record):\n    record('unreachable')\n"
    write_experiment(suite, SELF_INTERRUPTING.replace("SIGINT", sig) + never)
    args = ["experiments", "--record-dir", "run", "-q", "-k", "test or b"]
    done = start_pytest(suite, *args)
    done.communicate(timeout=120)
    run, end = suite.path / "run", session_end(suite.path / "run")
    manifest, kinds = manifest_of(run), [r["kind"] for r in read_records(run)]  # every line parses
    assert done.returncode == manifest["exit_status"] == pytest.ExitCode.INTERRUPTED
    assert end["complete"] is manifest["complete"] is False
    assert "before_interrupt" in kinds and "unreachable" not in kinds
    assert (end["interrupted"], end["signals"], end["stop_reason"]) == (
        True, [sig] * (1 + again), f"interrupted by {sig}" + (", then 1 more signal(s)" if again else ""))
    assert [t.split("::")[-1] for t in end["tests_without_outcome"]] == ["test_interrupted", "test_never"]
    assert manifest["command"] == shlex.join([sys.executable, "-m", "pytest", *PYTEST_PREFIX, *args])
    assert manifest["argv"][1:] == [*PYTEST_PREFIX, *args] and manifest["argv"][0].endswith("__main__.py")


def test_a_third_ctrl_c_abandons_the_final_records_in_one_line_and_the_folder_is_renamed_incomplete(suite):
    """One line (it used to be a traceback of some ninety lines), and a name that never looks like a good run's."""
    suite.makeconftest('pytest_plugins = ["inferlab.plugin"]\nimport os, signal\n'
                       "def pytest_inferlab_record(config, record):\n    if record['kind'] == 'session_end':\n"
                       "        os.kill(os.getpid(), signal.SIGINT)\n        os.kill(os.getpid(), signal.SIGINT)\n")
    write_experiment(suite, SELF_INTERRUPTING)
    done = start_pytest(suite, "experiments", "--runs-dir", "runs")
    _, err = done.communicate(timeout=120)
    assert done.returncode == 128 + signal.SIGINT and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    [abandoned] = [line for line in err.splitlines() if "the final records are abandoned" in line]
    assert "SIGINT received again" in abandoned and "keeps the manifest written when the run began" in abandoned
    [run] = list((suite.path / "runs").iterdir())
    assert manifest_of(run)["session_end"] is None  # the start manifest stays
    note = json.loads((run / "renamed-incomplete.json").read_text())
    assert run.name.endswith("-incomplete") and note["renamed_to"] == run.name
    assert f"It is renamed {run.name} now" in err
    result = verify_run(run)
    assert integrity_problems(result) == [] and result["completeness"][0].startswith("unfinished: ")
    assert f"to {run.name} by its own session" in result["completeness"][0]


def test_exitfirst_is_stopped_early_and_names_the_tests_without_an_outcome(suite):
    write_experiment(suite, "def test_fails():\n    assert False\ndef test_never_started():\n    pass\n")
    result = suite.runpytest("experiments", "--record-dir", "run", "-x")
    end = session_end(suite.path / "run")
    assert end["stopped_early"] is True and end["stop_reason"] == "-x/--maxfail after 1 failure(s)"
    assert [t.split("::")[-1] for t in end["tests_without_outcome"]] == ["test_never_started"]
    assert last_line(result).startswith("inferlab: the run did NOT finish (-x/--maxfail after 1 failure(s))")


@pytest.mark.parametrize("where", [("--record-dir", "run"), ("--runs-dir", "runs"), ()])
def test_collect_only_lists_the_tests_and_writes_no_run_folder_as_the_docs_say(suite, where):
    write_experiment(suite, PASSES)
    result = suite.runpytest("experiments", *where, "--co")
    assert result.ret == pytest.ExitCode.OK and "test_a" in result.stdout.str()
    assert not (suite.path / "run").exists() and not (suite.path / "runs").exists()
    docs = (REPO_ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith("| `-incomplete` |"))
    assert "--co" not in row and "it makes no folder at all" in docs


# --- the record folder ------------------------------------------------------------------------------------------


def test_two_runs_into_one_new_dir_exactly_one_claims_it(suite, tmp_path):
    go = tmp_path / "go"
    write_experiment(suite, "import os, pathlib, time, pytest\n@pytest.mark.records('holding')\n"
                            "def test_holds(record):\n    record('holding', pid=os.getpid())\n"
                            "    go = pathlib.Path(os.environ['INFERLAB_TEST_GO'])\n"
                            "    deadline = time.monotonic() + 120\n"
                            "    while not go.exists() and time.monotonic() < deadline:\n        time.sleep(0.02)\n")
    processes = [start_pytest(suite, "experiments", "--record-dir", "run", env={"INFERLAB_TEST_GO": str(go)})
                 for _ in range(2)]
    try:  # while the winner holds its test open, the other must already have been refused
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in processes):
            assert time.monotonic() < deadline, "waited 60 s for one of the two runs to be refused"
            time.sleep(0.02)
        go.write_text("")
        outputs = [p.communicate(timeout=120) for p in processes]
    finally:
        go.write_text("")
        for process in processes:
            process.kill()
    assert sorted(p.returncode for p in processes) == [pytest.ExitCode.OK, pytest.ExitCode.USAGE_ERROR], outputs
    winner = next(p for p in processes if p.returncode == pytest.ExitCode.OK)
    assert any("already claimed" in err or "not empty" in err for _, err in outputs)
    found = read_records(suite.path / "run")
    assert [r["kind"] for r in found].count("plan") == 1 and [r["seq"] for r in found] == list(range(len(found)))
    assert {r["pid"] for r in found if r["kind"] == "holding"} == {winner.pid}
    assert json.loads((suite.path / "run" / "claim.json").read_text())["pid"] == winner.pid


def test_a_run_dir_under_runs_dir_names_its_specimen_and_how_it_ended_and_lf_keeps_to_its_specimen(suite):
    write_experiment(suite, PASSES)
    suite.runpytest("experiments", "--runs-dir", "runs").assert_outcomes(passed=1)
    suite.runpytest("experiments", "--runs-dir", "runs", "--plan")
    write_experiment(suite, "def test_b():\n    assert False\n", name="test_exp2.py")
    suite.runpytest("experiments", "--runs-dir", "runs").assert_outcomes(passed=1, failed=1)
    names = sorted(p.name for p in (suite.path / "runs").iterdir())
    # a scratch suite is never the complete protocol, so its failed run is -partial-failed, not -failed
    assert all(re.match(r"^\d{8}T\d{6}Z-pythia-14m(-\d+)?-(partial|plan|partial-failed)$", n) for n in names), names
    assert sorted(n.rsplit("-14m", 1)[1].lstrip("-0123456789") for n in names) == ["partial", "partial-failed", "plan"]
    for name in names:
        manifest = manifest_of(suite.path / "runs" / name)
        assert manifest["record_dir"].endswith(name)
        if not name.endswith("-plan"):  # a plan is named as it starts; a run is renamed as it ends
            renamed = manifest["record_dir_rename"]
            assert (renamed["from"] + renamed["suffix"], renamed["to"], renamed["renamed"], renamed["error"]) == (
                name, name, True, None)
    # pytest keeps one last-failed list per folder; pythia-14m's failures are not the stand-in's
    mixed = suite.runpytest("experiments", "--runs-dir", "runs", "--specimen", "standin", "--lf")
    assert mixed.ret == pytest.ExitCode.USAGE_ERROR and len(list((suite.path / "runs").iterdir())) == len(names)
    mixed.stderr.fnmatch_lines(["*--lf: the last-failed list was written by a run of specimen 'pythia-14m', and "
                                "this run is of 'standin'*"])
    suite.runpytest("experiments", "--runs-dir", "runs", "--lf").assert_outcomes(failed=1)


def test_a_rename_that_fails_is_recorded_and_printed(suite, monkeypatch):
    rename = os.rename

    def refuse(source, target, **kwargs):  # only the run's own folder: pytest's cache renames too
        if Path(target).parent.name == "runs":
            raise OSError(errno.EACCES, "Permission denied", str(source))
        return rename(source, target, **kwargs)

    monkeypatch.setattr(records.os, "rename", refuse)
    write_experiment(suite, "def test_a():\n    assert False\n")
    result = suite.runpytest("experiments", "--runs-dir", "runs")
    (run,) = (suite.path / "runs").iterdir()  # the empty folder made for the new name is removed again
    renamed = manifest_of(run)["record_dir_rename"]
    assert (renamed["renamed"], renamed["to"], renamed["suffix"]) == (False, None, "-partial-failed")
    assert "Permission denied (EACCES)" in renamed["error"]
    result.stdout.fnmatch_lines(["record dir: NOT renamed to end in -partial-failed (*Permission denied*"])


IN_ORDER = "the experiment runs in the protocol's order"
RANDOMLY = "import pytest\n@pytest.hookimpl(tryfirst=True)\ndef pytest_collection_modifyitems(items):\n" \
           "    items.reverse()\n"  # a plugin that shuffles the tests (by reversing them)
REFUSED = {  # name: (what is there first, the options, what the usage error says)
    "nonempty": (lambda s, m: (s.mkdir("run") / "records.jsonl").write_text("earlier evidence\n"),
                 ["--record-dir", "run"], "run already exists and is not empty"),
    "no-record-dir": (None, [], "--record-dir DIR (or --runs-dir DIR) is required"),
    "unknown-specimen": (None, ["--record-dir", "run", "--specimen", "nonesuch"], "--specimen nonesuch: "),
    "replica-without-reference": (lambda s, m: m.setenv("INFERLAB_PYTHIA_REFERENCE", "/proc/inferlab-reference"),
                                  ["--record-dir", "run", "--specimen", "replica"], "--specimen replica: the replica "
                                  "specimen is built from pythia-14m's published small files, expected in /proc/"
                                  "inferlab-reference ("),
    "no-interval-timers": (lambda s, m: m.setattr(run_plan, "signal", types.SimpleNamespace(SIGINT=2)),  # no SIGALRM
                           ["--record-dir", "run"], "no POSIX interval timers"),
    "no-timeout-plugin": (None, ["--record-dir", "run", "-p", "no:timeout"],
                          "the pytest-timeout plugin is not loaded (for example by -p no:timeout)"),
    "xdist": (None, ["--record-dir", "run", "-n", "2"], "the experiments run in one process, one test at a time, "
                                                        "but -n 2 (pytest-xdist)"),
    "timeout": (None, ["--record-dir", "run", "--timeout", "5"],
                "--timeout 5.0: the experiment gives each trial the protocol's limit of 30 s itself"),
    "under-a-file": (lambda s, m: (s.path / "a_file").write_text("x"), ["--record-dir", "a_file/run"],
                     "record dir a_file/run cannot be created: a_file is a regular file, not a directory"),
    "under-proc": (None, ["--record-dir", "/proc/inferlab-run"], "cannot be created: No such file or directory"),
    "artifacts-missing": (None, ["--record-dir", "run", "--artifacts", "lab05"], "--artifacts: lab05 does not exist"),
    "artifacts-a-file": (lambda s, m: (s.path / "lab05").write_text("x"),
                         ["--record-dir", "run", "--artifacts", "lab05"], "--artifacts: lab05 is a regular file"),
    "inside-artifacts": (lambda s, m: s.mkdir("lab05"), ["--runs-dir", "lab05", "--artifacts", "lab05"],
                         "--runs-dir: lab05 is inside the --artifacts folder lab05"),
    "empty-path": (None, ["--record-dir", ""], "--record-dir: the path is empty ('')"),
    "name-too-long": (None, ["--runs-dir", "r" * 300], "--runs-dir: runs dir rrrr"),
    "runs-dir-a-file": (lambda s, m: (s.path / "runs").write_text("x"), ["--runs-dir", "runs"],
                        "--runs-dir: runs dir runs cannot be created: runs is a regular file, not a directory"),
    "dangling-link": (lambda s, m: (s.path / "run").symlink_to(s.path / "gone"), ["--record-dir", "run"],
                      "--record-dir: record dir run is a dangling symbolic link"),
    "predictions-fifo": (lambda s, m: os.mkfifo(s.path / "answers"),
                         ["--record-dir", "run", "--predictions", "answers"], "answers is a FIFO (named pipe), not"),
    "predictions-missing": (None, ["--record-dir", "run", "--predictions", "missing.md"],
                            "--predictions: missing.md does not exist; expected your copy of predictions.md"),
    "predictions-binary": (lambda s, m: (s.path / "a.md").write_bytes(random.Random(45).randbytes(3000)),
                           ["--record-dir", "run", "--predictions", "a.md"], "binary (a NUL byte at offset 210)"),
    "predictions-200MB": (lambda s, m: os.truncate((s.path / "a.md").write_bytes(b"") or s.path / "a.md", 200_000_000),
                          ["--record-dir", "run", "--predictions", "a.md"], "a.md is 200,000,000 bytes"),
    "predictions-latin1": (lambda s, m: (s.path / "a.md").write_bytes("## 1. caf\u00e9\n".encode("latin-1")),
                           ["--record-dir", "run", "--predictions", "a.md"], "a.md is not UTF-8"),
    "random-order-plugin": (lambda s, m: m.syspath_prepend(s.makepyfile(randomly=RANDOMLY).parent),
                            ["--record-dir", "run", "-p", "randomly"], f"-p randomly shuffles the tests: {IN_ORDER}"),
    **{f"reordered-by{flag}": (None, ["--record-dir", "run", flag], f"{named} reorders the tests: {IN_ORDER}")
       for flag, named in (("--failed-first", "--ff (--failed-first)"), ("--nf", "--nf (--new-first)"),
                           ("--sw", "--sw (--stepwise)"), ("--sw-skip", "--sw-skip (--stepwise-skip)"))},
}


def files_of(folder: Path) -> dict:
    """Every file below the folder and its bytes, but pytest's caches and the (large) texts of the predictions cases."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.suffix != ".md"
            and not {".pytest_cache", "__pycache__"} & set(p.parts)}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_session_that_cannot_run_is_refused_in_one_line_before_anything_is_written(suite, monkeypatch, case):
    prepare, args, words = REFUSED[case]
    write_experiment(suite, PASSES)
    if prepare is not None:
        prepare(suite, monkeypatch)
    before = files_of(suite.path)
    result = suite.runpytest("experiments", *args)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and words in err, result.stdout.str() + err
    assert "INTERNALERROR" not in result.stdout.str() + err and "Traceback" not in err
    assert files_of(suite.path) == before  # nothing written, not even a claim, and nothing already there changed


@pytest.mark.parametrize("where", [[], ["--runs-dir", "runs"], ["--record-dir", "run"]])
def test_options_of_the_experiment_without_its_tests_are_refused_and_leave_no_folder(suite, where):
    (suite.path / "test_other.py").write_text(PASSES)
    result = suite.runpytest("test_other.py", "--specimen", "standin", *where)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "options of the experiment, and this command collects no experiment test" in result.stderr.str()
    assert "-m pytest experiments " + " ".join([*where, "--specimen", "standin"]) in result.stderr.str()  # as given
    assert not (suite.path / "runs").exists() and not (suite.path / "run").exists()  # refused before any claim
    suite.runpytest("test_other.py", "--timeout", "5").assert_outcomes(passed=1)  # the harness's own tests may


def test_a_test_file_this_python_cannot_import_gets_one_line_naming_the_interpreter(suite):
    (suite.path / "analytic_tests").mkdir()
    (suite.path / "analytic_tests" / "test_a.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    (suite.path / "analytic_tests" / "test_b.py").write_text("import not_a_module_of_the_project\n")
    result = suite.runpytest("analytic_tests")
    out = result.stdout.str()
    assert "analytic_tests/test_a.py: this Python (" in out and "cannot import torch: it is not the project's " \
           "environment. Run the tests with .venv/bin/python -m pytest analytic_tests" in out
    assert "raise ModuleNotFoundError" not in out  # test_a.py's raw ImportError is replaced by the one line
    assert "No module named 'not_a_module_of_the_project'" in out  # any other import error is left as it is


def test_pytest_help_does_not_show_pytesters_options(pytester, monkeypatch):
    shown = project_help(pytester, monkeypatch)
    assert "--record-dir" in shown and "--lsof" not in shown and "--runpytest" not in shown
