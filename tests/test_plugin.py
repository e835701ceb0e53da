"""The recording plugin, exercised on small throwaway experiment suites through pytester."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

import inner_session
from child_process import popen_signallable
from project_help import project_help

inner_session.preload()  # before any pytester fixture: see tests/inner_session.py

REPO_ROOT = Path(__file__).resolve().parents[1]
RECORDS_X = "import pytest\n@pytest.mark.records('x')\ndef test_a(record):\n    record('x')\n"


# One test records, the next sends the session a Ctrl-C (SIGINT) from inside.
SELF_INTERRUPTING_EXPERIMENT = (
    "import os, signal, pytest\n"
    "@pytest.mark.records('before_interrupt')\n"
    "def test_first(record):\n"
    "    record('before_interrupt')\n"
    "def test_interrupted():\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
)


def write_experiment(pytester, source: str, name: str = "test_exp.py") -> None:
    (pytester.path / "experiments" / name).write_text(source)


def read_records(record_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (record_dir / "records.jsonl").read_text().splitlines()]


def outcomes_by_test(records: list[dict]) -> dict:
    return {r["test"].split("::")[-1]: r for r in records if r["kind"] == "test_outcome"}


def session_end(record_dir: Path) -> dict:
    """The run's one session_end record; it is written before the report, so a report exists after it."""
    ends = [r for r in read_records(record_dir) if r["kind"] == "session_end"]
    assert len(ends) == 1, ends
    return ends[0]


def manifest_of(record_dir: Path) -> dict:
    return json.loads((record_dir / "manifest.json").read_text())


def test_failing_test_is_recorded_with_its_longrepr(suite):
    write_experiment(suite, (
        "import pytest\n"
        "@pytest.mark.records('measurement')\n"
        "def test_measures(record):\n"
        "    record('measurement', value=3)\n"
        "    assert 3 == 4, 'measured 3, expected 4'\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(failed=1)
    records = read_records(suite.path / "run")
    assert [r["seq"] for r in records] == list(range(len(records)))
    measurement = next(r for r in records if r["kind"] == "measurement")
    assert measurement["value"] == 3 and measurement["test"].endswith("test_measures")
    outcome = outcomes_by_test(records)["test_measures"]
    assert outcome["outcome"] == "failed" and outcome["phase"] == "call"
    assert "measured 3, expected 4" in outcome["longrepr"]
    manifest = json.loads((suite.path / "run" / "manifest.json").read_text())
    assert manifest["exit_status"] == 1 and manifest["exit_code_name"] == "TESTS_FAILED"
    end = manifest["session_end"]
    assert (end["interrupted"], end["stopped_early"], end["tests_without_outcome"]) == (False, False, [])
    # One test is not the protocol: the session reached its end, but nothing here is "complete".
    assert end["protocol_complete"] is False and manifest["complete"] is False
    assert manifest["outcome_counts"] == {"failed": 1}
    assert "records.jsonl" in manifest["files"] and "report.md" in manifest["files"]
    result.stdout.fnmatch_lines(["*AssertionError: measured 3, expected 4*", "*FAILED*test_measures*seq*"])


def test_existing_nonempty_record_dir_is_refused_and_untouched(suite):
    write_experiment(suite, RECORDS_X)
    old_run = suite.mkdir("run")
    (old_run / "records.jsonl").write_text("earlier evidence\n")
    before = {p.name: p.read_bytes() for p in old_run.iterdir()}
    result = suite.runpytest("experiments", "--record-dir", "run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*run*already exists and is not empty*"])
    assert {p.name: p.read_bytes() for p in old_run.iterdir()} == before


def test_experiments_without_record_dir_are_refused(suite):
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--record-dir DIR*is required*"])


def test_sigint_mid_session_leaves_valid_records_and_incomplete_manifest(suite):
    write_experiment(suite, (
        "import os, signal, pytest\n"
        "@pytest.mark.records('before_interrupt')\n"
        "def test_first(record):\n"
        "    record('before_interrupt', value=1)\n"
        "@pytest.mark.records('about_to_interrupt')\n"
        "def test_interrupted(record):\n"
        "    record('about_to_interrupt')\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "@pytest.mark.records('unreachable')\n"
        "def test_never_reached(record):\n"
        "    record('unreachable')\n"
    ))
    done = start_pytest(suite, "experiments", "--record-dir", "run")
    done.communicate(timeout=120)
    assert done.returncode == pytest.ExitCode.INTERRUPTED
    records = read_records(suite.path / "run")  # every line parses
    kinds = [r["kind"] for r in records]
    assert "before_interrupt" in kinds and "about_to_interrupt" in kinds and "unreachable" not in kinds
    manifest = json.loads((suite.path / "run" / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert manifest["exit_status"] == int(pytest.ExitCode.INTERRUPTED)
    end = session_end(suite.path / "run")
    assert end["interrupted"] is True and end["signals"] == ["SIGINT"]
    assert end["stop_reason"] == "interrupted by SIGINT"
    assert [t.split("::")[-1] for t in end["tests_without_outcome"]] == ["test_interrupted", "test_never_reached"]


def test_timeout_is_a_recorded_failure_and_the_session_goes_on(suite):
    write_experiment(suite, (
        "import time, pytest\n"
        "@pytest.mark.timeout(0.2, method='signal')\n"
        "def test_too_slow():\n"
        "    time.sleep(60)\n"
        "@pytest.mark.records('still_running')\n"
        "def test_next(record):\n"
        "    record('still_running')\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(failed=1, passed=1)
    outcomes = outcomes_by_test(read_records(suite.path / "run"))
    assert outcomes["test_too_slow"]["outcome"] == "failed"
    assert "Timeout" in outcomes["test_too_slow"]["longrepr"]
    assert outcomes["test_next"]["outcome"] == "passed"


def test_experiments_get_the_protocols_trial_limit(suite):
    from inferlab import protocol

    write_experiment(suite, "def test_a():\n    pass\n")
    suite.runpytest("experiments", "--record-dir", "run", "--plan")
    plan = json.loads((suite.path / "run" / "plan.json").read_text())
    assert plan["schedule"][0]["timeout_s"] == protocol.TRIAL_LIMIT_S


def test_dependent_test_is_skipped_naming_its_prerequisite(suite):
    write_experiment(suite, (
        "import pytest\n"
        "@pytest.mark.provides('artifacts_verified')\n"
        "def test_verify():\n"
        "    pytest.fail('model.safetensors: expected sha256 aaa, got bbb')\n"
        "@pytest.mark.requires('artifacts_verified')\n"
        "@pytest.mark.records('should_not_exist')\n"
        "def test_uses_model(record):\n"
        "    record('should_not_exist')\n"
        "@pytest.mark.requires('never_provided')\n"
        "def test_orphan():\n"
        "    pass\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(failed=1, skipped=2)
    records = read_records(suite.path / "run")
    assert "should_not_exist" not in [r["kind"] for r in records]
    outcomes = outcomes_by_test(records)
    reason = outcomes["test_uses_model"]["skip_reason"]
    assert "artifacts_verified" in reason and "test_verify" in reason and "expected sha256 aaa" in reason
    assert "never_provided" in outcomes["test_orphan"]["skip_reason"]


def test_plan_lists_the_schedule_and_runs_nothing(suite):
    write_experiment(suite, (
        "import pytest\n"
        "@pytest.fixture(scope='session')\n"
        "def model():\n"
        "    raise AssertionError('the plan must not load a model')\n"
        "@pytest.mark.budget(category='generation', selections=16)\n"
        "@pytest.mark.parametrize('seed', [17, 23])\n"
        "def test_trial(model, seed):\n"
        "    pass\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run", "--plan")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*generation*selections=16*test_trial[[]17[]]*",
                                 "*generation*selections=16*test_trial[[]23[]]*",
                                 "*generation_trials=2/26*"])
    plan = json.loads((suite.path / "run" / "plan.json").read_text())
    assert [e["params"] for e in plan["schedule"]] == [{"seed": 17}, {"seed": 23}]
    assert plan["totals"]["generation_new_tokens"] == 32
    assert [r["kind"] for r in read_records(suite.path / "run")] == ["plan", "session_end"]


def test_plan_refuses_a_schedule_over_the_caps(suite):
    write_experiment(suite, (
        "import pytest\n"
        "@pytest.mark.budget(category='cache', forwards=17)\n"
        "def test_too_many_forwards():\n"
        "    pass\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run", "--plan")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cache_forwards: planned 17, protocol allows at most 16*"])


def test_record_hook_can_be_extended_from_a_conftest(suite):
    suite.makeconftest(
        'pytest_plugins = ["inferlab.plugin"]\n'
        "def pytest_inferlab_record(config, record):\n"
        "    record['course'] = 'lab12'\n"
        "def pytest_inferlab_manifest(config, manifest):\n"
        "    manifest['section'] = 'B'\n"
    )
    write_experiment(suite, "import pytest\n@pytest.mark.records('x')\ndef test_a(record):\n    record('x', value=1)\n")
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(passed=1)
    assert all(r["course"] == "lab12" for r in read_records(suite.path / "run"))
    assert json.loads((suite.path / "run" / "manifest.json").read_text())["section"] == "B"


def test_manifest_holds_the_environment(suite):
    write_experiment(suite, "def test_a():\n    pass\n")
    predictions = suite.path / "my_predictions.md"
    predictions.write_text("1. yes, fairly sure\n")
    suite.runpytest("experiments", "--record-dir", "run", "--predictions", str(predictions))
    manifest = json.loads((suite.path / "run" / "manifest.json").read_text())
    assert manifest["platform"]["python_version"] and manifest["platform"]["logical_cpus"] >= 1
    assert manifest["distributions"]["pytest"] == pytest.__version__
    assert "pytest-timeout" in manifest["pytest"]["plugins"]
    assert "OMP_NUM_THREADS" in manifest["thread_environment"]
    assert any("3.13.13" in d for d in manifest["deviations_from_reference"])
    assert manifest["predictions"]["supplied"] is True
    assert (suite.path / "run" / "predictions.md").read_text() == "1. yes, fairly sure\n"
    assert manifest["files"]["predictions.md"]["sha256"] == manifest["predictions"]["sha256"]


def test_non_finite_values_stay_strict_json(suite):
    write_experiment(suite, "import pytest\n@pytest.mark.records('x')\n"
                            "def test_a(record):\n    record('x', value=float('nan'), text='a\\nb\\t\\u00e9')\n")
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(passed=1)
    raw = (suite.path / "run" / "records.jsonl").read_text(encoding="ascii")
    record = next(r for r in read_records(suite.path / "run") if r["kind"] == "x")
    assert record["value"] == "nan" and record["text"] == "a\nb\t\u00e9"
    assert "\\n" in raw and "\\u00e9" in raw


def test_unknown_specimen_is_a_usage_error_before_anything_is_written(suite):
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--record-dir", "run", "--specimen", "nonesuch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--specimen nonesuch*nonesuch.json*"])
    assert not (suite.path / "run").exists()


def test_the_session_limit_counts_from_setup_and_later_tests_are_recorded_as_not_run(suite, monkeypatch):
    from inferlab import protocol

    monkeypatch.setattr(protocol, "SESSION_LIMIT_S", -1)  # the limit passes as soon as setup is done
    write_experiment(suite, (
        "import pytest\n"
        f"@pytest.mark.provides({protocol.SETUP_DONE_CHECK!r})\n"
        "@pytest.mark.records('setup_ran')\n"
        "def test_setup(record):\n"
        "    record('setup_ran')\n"
        "@pytest.mark.records('should_not_exist')\n"
        "def test_after(record):\n"
        "    record('should_not_exist')\n"
    ))
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(passed=1, skipped=1)
    records = read_records(suite.path / "run")
    kinds = [r["kind"] for r in records]
    assert "setup_ran" in kinds and "should_not_exist" not in kinds
    assert "session limit" in outcomes_by_test(records)["test_after"]["skip_reason"]


def test_the_trial_limit_covers_the_test_body_not_session_fixture_setup(suite, monkeypatch):
    from inferlab import protocol

    monkeypatch.setattr(protocol, "TRIAL_LIMIT_S", 0.2)
    write_experiment(suite, (
        "import time, pytest\n"
        "@pytest.fixture(scope='session')\n"
        "def slow_download():\n"
        "    time.sleep(0.4)  # twice the trial limit: it would fail the test if the limit covered setup\n"
        "def test_quick_after_slow_setup(slow_download):\n"
        "    pass\n"
        "def test_slow_body():\n"
        "    time.sleep(60)\n"
    ))
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(passed=1, failed=1)
    outcomes = outcomes_by_test(read_records(suite.path / "run"))
    assert outcomes["test_quick_after_slow_setup"]["outcome"] == "passed"
    assert "Timeout" in outcomes["test_slow_body"]["longrepr"]


def test_platform_without_interval_timers_refuses_to_run(suite, monkeypatch):
    import types

    from inferlab.run import hook_steps

    monkeypatch.setattr(hook_steps, "signal", types.SimpleNamespace(SIGINT=2))  # no SIGALRM, no setitimer
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--record-dir", "run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no POSIX interval timers*refuse to run unbounded*"])


def test_a_run_without_the_timeout_plugin_is_refused_before_anything_is_written(suite):
    """Issue 26 B2: -p no:timeout would remove the per-trial bound silently; the run is refused instead."""
    err = refused(suite, "--record-dir", "run", "-p", "no:timeout")
    assert "the pytest-timeout plugin is not loaded (for example by -p no:timeout)" in err
    assert "refuse to run unbounded" in err and not (suite.path / "run").exists()


def test_a_run_spread_over_xdist_workers_is_refused_before_anything_is_written(suite):
    """The lock installs pytest-xdist for tests/; the experiments themselves never run in parallel."""
    err = refused(suite, "--record-dir", "run", "-n", "2")
    assert "the experiments run in one process, one test at a time, but -n 2 (pytest-xdist)" in err


def test_a_chain_of_dependents_names_the_first_failure(suite):
    write_experiment(suite, (
        "import pytest\n"
        "@pytest.mark.provides('download')\n"
        "def test_download():\n"
        "    pytest.fail('no route to the hub')\n"
        "@pytest.mark.requires('download')\n"
        "@pytest.mark.provides('model')\n"
        "def test_load():\n"
        "    pass\n"
        "@pytest.mark.requires('model')\n"
        "def test_generate():\n"
        "    pass\n"
    ))
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(failed=1, skipped=2)
    reason = outcomes_by_test(read_records(suite.path / "run"))["test_generate"]["skip_reason"]
    assert reason.startswith("not run: prerequisite 'model' did not run, because prerequisite 'download' failed")
    assert "no route to the hub" in reason and reason.count("prerequisite") == 2


def test_outcomes_and_plan_say_whether_a_check_is_a_diagnostic(suite):
    write_experiment(suite, (
        "import pytest\n"
        "@pytest.mark.diagnostic\n"
        "def test_finding():\n"
        "    assert 1 == 2, 'a finding'\n"
        "def test_harness():\n"
        "    pass\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(failed=1, passed=1)
    outcomes = outcomes_by_test(read_records(suite.path / "run"))
    assert outcomes["test_finding"]["check_kind"] == "diagnostic"
    assert outcomes["test_harness"]["check_kind"] == "integrity"
    plan = json.loads((suite.path / "run" / "plan.json").read_text())
    assert {e["test"].split("::")[-1]: e["check_kind"] for e in plan["schedule"]} == {
        "test_finding": "diagnostic", "test_harness": "integrity"}


# --- how a session ends: signals, -x, --co (issue 15.1, 15.2) ---------------------------------------

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402


# hypothesis plays no part in a scratch suite, and its plugin's import is half of a bare pytest process's start.
PYTEST_PREFIX = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def start_pytest(suite, *args, env=None) -> subprocess.Popen:
    """A pytest process in the scratch suite (a pytester or a folder made by scratch_suite), without pytester's
    wrapping, so signals reach it directly; it starts with SIGINT and SIGTERM at their defaults even when this
    suite runs with them ignored."""
    return popen_signallable([sys.executable, "-m", "pytest", *PYTEST_PREFIX, *args], cwd=getattr(suite, "path", suite),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})


def scratch_suite(folder: Path) -> Path:
    """What the suite fixture lays out (a conftest registering the plugin, experiments/, the specimen specs), in a
    folder of a wider scope, for a real process that several tests read; start_pytest gives it inferlab's path."""
    (folder / "conftest.py").write_text('pytest_plugins = ["inferlab.plugin"]\n')
    (folder / "experiments").mkdir()
    (folder / "artifacts").mkdir()
    for spec in (REPO_ROOT / "artifacts").glob("*.json"):
        (folder / "artifacts" / spec.name).write_bytes(spec.read_bytes())
    return folder


def inferlab_path() -> dict:
    """The environment a scratch_suite process needs: this checkout's inferlab importable."""
    return {"PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def wait_for(condition, what: str, limit_s: float = 60.0) -> None:
    """Poll a condition on files; fail naming `what` if it does not hold within limit_s."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {limit_s} s for {what}")
        time.sleep(0.02)


def records_hold(record_dir: Path, kind: str) -> bool:
    path = record_dir / "records.jsonl"
    return path.exists() and f'"kind": "{kind}"' in path.read_text()


def test_a_second_ctrl_c_while_pytest_handles_the_first_still_leaves_an_incomplete_manifest(suite):
    # Deterministic form of "SIGINT, then SIGINT 0.25 s later": the second one lands inside pytest's own
    # interrupt handling, which used to leave exit status 0 and a manifest saying complete: true.
    suite.makeconftest(
        'pytest_plugins = ["inferlab.plugin"]\n'
        "import os, signal\n"
        "def pytest_keyboard_interrupt(excinfo):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
    )
    write_experiment(suite, SELF_INTERRUPTING_EXPERIMENT)
    done = start_pytest(suite, "experiments", "--record-dir", "run")
    done.communicate(timeout=120)
    assert done.returncode != 0
    manifest = manifest_of(suite.path / "run")
    assert manifest["complete"] is False and manifest["exit_status"] == int(pytest.ExitCode.INTERRUPTED)
    end = session_end(suite.path / "run")
    assert end["interrupted"] is True and end["signals"] == ["SIGINT", "SIGINT"] and end["complete"] is False


def test_double_ctrl_c_from_outside_never_reads_as_complete(suite):
    write_experiment(suite, (
        "import time, pytest\n"
        "@pytest.mark.records('waiting')\n"
        "def test_waits(record):\n"
        "    record('waiting')\n"
        "    time.sleep(120)\n"
        "def test_after():\n"
        "    pass\n"
    ))
    process = start_pytest(suite, "experiments", "--record-dir", "run")
    try:
        wait_for(lambda: records_hold(suite.path / "run", "waiting"), "the test to start")
        process.send_signal(signal.SIGINT)
        time.sleep(0.25)  # the reproduction itself: a second Ctrl-C a quarter second later
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode != 0
    manifest = manifest_of(suite.path / "run")
    assert manifest["complete"] is False and manifest["exit_status"] == int(pytest.ExitCode.INTERRUPTED)
    end = session_end(suite.path / "run")
    assert end["interrupted"] is True and end["stop_reason"].startswith("interrupted by SIGINT")
    assert [t.split("::")[-1] for t in end["tests_without_outcome"]] == ["test_waits", "test_after"]


def test_a_ctrl_c_that_abandons_the_final_records_prints_one_line_and_keeps_the_run_unfinished(suite):
    # The test interrupts itself; then one Ctrl-C arrives while session_end is written (noted), and one
    # more while the final manifest is written: that one abandons the final records. It used to raise a
    # KeyboardInterrupt out of whatever ran (a plot, a file write): a traceback of some ninety lines.
    suite.makeconftest(
        'pytest_plugins = ["inferlab.plugin"]\n'
        "import os, signal\n"
        "def pytest_inferlab_record(config, record):\n"
        "    if record['kind'] == 'session_end':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "def pytest_inferlab_manifest(config, manifest):\n"
        "    if manifest['session_end'] is not None:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
    )
    write_experiment(suite, SELF_INTERRUPTING_EXPERIMENT)
    done = start_pytest(suite, "experiments", "--record-dir", "run")
    _, err = done.communicate(timeout=120)
    assert done.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    abandoned = [line for line in err.splitlines() if "the final records are abandoned" in line]
    assert len(abandoned) == 1 and "SIGINT received again" in abandoned[0]
    assert "keeps the manifest written when the run began (complete: false)" in abandoned[0]
    run = suite.path / "run"
    manifest = manifest_of(run)
    assert manifest["complete"] is False and manifest["session_end"] is None  # the start manifest stays
    end = session_end(run)  # written whole before the abandonment, and it says what happened
    assert end["interrupted"] is True and end["complete"] is False


def test_a_run_abandoned_under_runs_dir_is_named_incomplete_at_once(suite):
    # Under --runs-dir, the second and third Ctrl-C arrive while session_end is written, before the folder is
    # renamed for how the run ended: it must not keep the plain name of a good run until a later run.
    suite.makeconftest(
        'pytest_plugins = ["inferlab.plugin"]\n'
        "import os, signal\n"
        "def pytest_inferlab_record(config, record):\n"
        "    if record['kind'] == 'session_end':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
    )
    write_experiment(suite, SELF_INTERRUPTING_EXPERIMENT)
    done = start_pytest(suite, "experiments", "--runs-dir", "runs")
    _, err = done.communicate(timeout=120)
    assert done.returncode == 128 + signal.SIGINT, err
    [run] = list((suite.path / "runs").iterdir())
    assert run.name.endswith("-incomplete"), run.name
    note = json.loads((run / "renamed-incomplete.json").read_text())
    assert note["renamed_to"] == run.name and "abandoned its final records" in note["why"]
    assert f"It is renamed {run.name} now" in err
    from inferlab.read.verify import integrity_problems, verify_run

    result = verify_run(run)
    assert integrity_problems(result) == [] and result["completeness"][0].startswith("unfinished: ")
    assert f"to {run.name} by its own session" in result["completeness"][0] and "later run" not in \
        result["completeness"][0]


def test_abandoning_says_where_the_run_stands_and_exits_with_128_plus_the_signal(capsys):
    from inferlab.run.interrupts import SignalWatch

    exits = []
    watch = SignalWatch(exit_process=exits.append)
    watch.on_abandon = lambda: "where it stands"
    watch.finishing = True
    watch._handle(signal.SIGTERM, None)  # noted: the final records go on
    assert exits == [] and "Send it once more" in capsys.readouterr().err
    watch._handle(signal.SIGTERM, None)
    assert exits == [128 + signal.SIGTERM]
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"inferlab: SIGTERM received again: the final records are abandoned, exiting "
                                        f"with status {128 + signal.SIGTERM}. where it stands"]
    assert watch.during_finish == ["SIGTERM", "SIGTERM"]


SIGTERM_ARGS = ["experiments", "--record-dir", "run", "-q", "-k", "test_terminated or b"]


@pytest.fixture(scope="module")
def sigterm_run(tmp_path_factory) -> tuple[Path, int]:
    """One real pytest process, started with a command line a learner might type (-q, a -k expression with a
    space), whose one test sends its own process SIGTERM: (its record dir, its exit status). Read, never changed."""
    folder = scratch_suite(tmp_path_factory.mktemp("sigterm-suite"))
    (folder / "experiments" / "test_exp.py").write_text(
        "import os, signal, pytest\n"
        "@pytest.mark.records('before')\n"
        "def test_terminated(record):\n"
        "    record('before')\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
    )
    done = start_pytest(folder, *SIGTERM_ARGS, env=inferlab_path())
    done.communicate(timeout=120)
    return folder / "run", done.returncode


@pytest.mark.process
def test_sigterm_ends_the_session_with_honest_records(sigterm_run):
    run, exit_status = sigterm_run
    assert exit_status == pytest.ExitCode.INTERRUPTED
    end = session_end(run)
    assert end["signals"] == ["SIGTERM"] and end["interrupted"] and end["stop_reason"] == "interrupted by SIGTERM"
    assert manifest_of(run)["complete"] is False


def test_exitfirst_is_stopped_early_and_names_the_tests_without_an_outcome(suite):
    write_experiment(suite, (
        "def test_fails():\n"
        "    assert False, 'first failure'\n"
        "def test_never_started():\n"
        "    pass\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run", "-x")
    result.assert_outcomes(failed=1)
    end = session_end(suite.path / "run")
    assert end["stopped_early"] is True and end["stop_reason"] == "-x/--maxfail after 1 failure(s)"
    assert [t.split("::")[-1] for t in end["tests_without_outcome"]] == ["test_never_started"]
    assert end["complete"] is False and manifest_of(suite.path / "run")["complete"] is False
    result.stdout.fnmatch_lines(["inferlab: the run did NOT finish (-x/--maxfail after 1 failure(s))*"])


@pytest.mark.parametrize("where", [("--record-dir", "run"), ("--runs-dir", "runs"), ()])
def test_collect_only_lists_the_tests_and_writes_no_run_folder(suite, where):
    """Issue 26 B8: --co used to leave an -incomplete run folder with a report in it."""
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", *where, "--co")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*test_a*"])
    assert not (suite.path / "run").exists() and not (suite.path / "runs").exists()


def test_a_collect_only_session_end_is_never_complete():
    """What an older inferlab recorded for --co (and verify and the report still read) is never complete."""
    from inferlab.run import session_status

    end = session_status.session_end_fields(
        exit_status=0, exit_code_name="OK", signals=[], collect_only=True, plan_only=False, stopped_reason=None,
        planned=["a"], with_outcome=set(), partial_reasons=[], optional_notes=[])
    assert end["collect_only"] is True and end["complete"] is False and end["tests_with_outcome"] == 0


# --- claiming the record dir (issue 15.4, 15.5, 15.12) ---------------------------------------------


def test_two_runs_into_one_new_dir_one_is_refused_before_it_writes(suite, tmp_path):
    go = tmp_path / "go"
    write_experiment(suite, (
        "import os, pathlib, time, pytest\n"
        "@pytest.mark.records('holding')\n"
        "def test_holds(record):\n"
        "    record('holding', pid=os.getpid())\n"
        "    go = pathlib.Path(os.environ['INFERLAB_TEST_GO'])\n"
        "    deadline = time.monotonic() + 120\n"
        "    while not go.exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
    ))
    processes = [start_pytest(suite, "experiments", "--record-dir", "run", env={"INFERLAB_TEST_GO": str(go)})
                 for _ in range(2)]
    try:
        # While the winner holds its test open, the other must already have been refused.
        wait_for(lambda: any(p.poll() is not None for p in processes), "one of the two runs to be refused")
        go.write_text("")
        outputs = [p.communicate(timeout=120) for p in processes]
    finally:
        go.write_text("")
        for process in processes:
            process.kill()
    codes = sorted(p.returncode for p in processes)
    assert codes == [pytest.ExitCode.OK, pytest.ExitCode.USAGE_ERROR], outputs
    loser = next(i for i, p in enumerate(processes) if p.returncode == pytest.ExitCode.USAGE_ERROR)
    winner = processes[1 - loser]
    assert "run" in outputs[loser][1] and ("already claimed" in outputs[loser][1] or "not empty" in outputs[loser][1])
    records = read_records(suite.path / "run")
    assert [r["kind"] for r in records].count("plan") == 1 and [r["seq"] for r in records] == list(range(len(records)))
    assert {r["pid"] for r in records if r["kind"] == "holding"} == {winner.pid}
    assert json.loads((suite.path / "run" / "claim.json").read_text())["pid"] == winner.pid


def test_a_new_run_dir_under_runs_dir_names_its_specimen_and_how_it_ended(suite):
    write_experiment(suite, "def test_a():\n    pass\n")
    suite.runpytest("experiments", "--runs-dir", "runs").assert_outcomes(passed=1)
    suite.runpytest("experiments", "--runs-dir", "runs", "--plan")
    write_experiment(suite, "def test_b():\n    assert False\n", name="test_exp2.py")
    suite.runpytest("experiments", "--runs-dir", "runs").assert_outcomes(passed=1, failed=1)
    names = sorted(p.name for p in (suite.path / "runs").iterdir())
    import re

    # A scratch suite is never the complete protocol, so its failed run is -partial-failed, not -failed.
    assert sorted(re.sub(r"^\d{8}T\d{6}Z", "<UTC>", n) for n in names) == sorted(
        ["<UTC>-pythia-14m-partial", "<UTC>-pythia-14m-plan", "<UTC>-pythia-14m-partial-failed"]) or \
        all(re.match(r"^\d{8}T\d{6}Z-pythia-14m(-\d+)?-(partial|plan|partial-failed)$", n) for n in names), names
    for name in names:
        manifest = manifest_of(suite.path / "runs" / name)
        assert manifest["record_dir"].endswith(name) and (suite.path / "runs" / name / "claim.json").is_file()


def test_two_new_run_dirs_with_the_same_name_in_the_same_second_stay_apart(tmp_path):
    from inferlab.base.records import claim_new_run_dir

    first = claim_new_run_dir(tmp_path / "runs", "20250101T000000Z-standin", {"pid": 1})
    second = claim_new_run_dir(tmp_path / "runs", "20250101T000000Z-standin", {"pid": 2})
    assert (first.name, second.name) == ("20250101T000000Z-standin", "20250101T000000Z-standin-2")
    assert json.loads((second / "claim.json").read_text())["pid"] == 2


def test_a_second_run_ending_the_same_way_in_the_same_second_gets_a_numbered_honest_name(suite, monkeypatch):
    from inferlab.run import options

    monkeypatch.setattr(options, "run_dir_name", lambda specimen, plan: "20250101T000000Z-standin")
    write_experiment(suite, "def test_a():\n    assert False\n")
    for _ in range(2):  # two failed runs in one second: the second used to keep the bare, success-claiming name
        suite.runpytest("experiments", "--runs-dir", "runs")
    names = sorted(p.name for p in (suite.path / "runs").iterdir())
    assert names == ["20250101T000000Z-standin-partial-failed", "20250101T000000Z-standin-partial-failed-2"]
    manifest = manifest_of(suite.path / "runs" / names[1])
    assert manifest["record_dir_rename"] == {"from": "20250101T000000Z-standin", "to": names[1],
                                             "suffix": "-partial-failed", "renamed": True, "error": None}


def test_a_rename_that_fails_is_recorded_and_printed(suite, monkeypatch):
    import errno

    from inferlab.base import records

    rename = os.rename

    def refuse(source, target, **kwargs):  # only for the run's own folder: pytest's cache renames too
        if Path(target).parent.name == "runs":
            raise OSError(errno.EACCES, "Permission denied", str(source))
        return rename(source, target, **kwargs)

    monkeypatch.setattr(records.os, "rename", refuse)
    write_experiment(suite, "def test_a():\n    assert False\n")
    result = suite.runpytest("experiments", "--runs-dir", "runs")
    (run,) = (suite.path / "runs").iterdir()  # the empty folder made for the new name is removed again
    rename = manifest_of(run)["record_dir_rename"]
    assert rename["renamed"] is False and rename["to"] is None and rename["suffix"] == "-partial-failed"
    assert "Permission denied (EACCES)" in rename["error"]
    result.stdout.fnmatch_lines(["record dir: NOT renamed to end in -partial-failed (*Permission denied*"])


def test_the_name_of_a_failed_run_says_whether_it_was_also_partial():
    from inferlab.run.session_status import outcome_suffix

    ended = {"plan_only": False, "interrupted": False, "stopped_early": False, "collect_only": False,
             "tests_without_outcome": [], "exit_code_name": "TESTS_FAILED", "protocol_complete": True}
    assert outcome_suffix(ended, {"failed": 1}) == "-failed"
    assert outcome_suffix({**ended, "protocol_complete": False}, {"failed": 1}) == "-partial-failed"
    assert outcome_suffix({**ended, "protocol_complete": False, "exit_code_name": "OK"}, {"passed": 3}) == "-partial"
    assert outcome_suffix({**ended, "exit_code_name": "OK"}, {"passed": 3}) is None
    assert outcome_suffix({**ended, "interrupted": True, "protocol_complete": False}, {"failed": 1}) == "-incomplete"


def test_the_name_tells_a_finding_of_the_protocol_from_a_failed_harness():
    """Issue 26 A7: a failed protocol diagnostic is a finding (-findings); a failed integrity check is not."""
    from inferlab.run.session_status import outcome_suffix

    ended = {"plan_only": False, "interrupted": False, "stopped_early": False, "collect_only": False,
             "tests_without_outcome": [], "exit_code_name": "TESTS_FAILED", "protocol_complete": True}
    findings = {**ended, "failures_by_check_kind": {"integrity": 0, "diagnostic": 2}}
    assert outcome_suffix(findings, {"failed": 2, "passed": 9}) == "-findings"
    assert outcome_suffix({**findings, "protocol_complete": False}, {"failed": 2}) == "-partial-findings"
    harness = {**ended, "failures_by_check_kind": {"integrity": 1, "diagnostic": 1}}
    assert outcome_suffix(harness, {"failed": 1, "error": 1}) == "-failed"
    assert outcome_suffix({**harness, "protocol_complete": False}, {"failed": 2}) == "-partial-failed"
    assert outcome_suffix(ended, {"failed": 1}) == "-failed"  # an older session_end: every failure the harness's


def test_a_failed_diagnostic_run_says_the_protocol_found_something_in_its_name_last_line_and_verify(suite):
    write_experiment(suite, (
        "import pytest\n"
        "def test_integrity():\n    pass\n"
        "@pytest.mark.diagnostic\n"
        "def test_finding():\n    assert 1 == 2, 'observed 1, the diagnostic expects 2'\n"
    ))
    result = suite.runpytest("experiments", "--runs-dir", "runs")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # pytest's exit status stays honest
    (run,) = (suite.path / "runs").iterdir()
    assert run.name.endswith("-pythia-14m-partial-findings"), run.name
    end = session_end(run)
    assert end["failures_by_check_kind"] == {"integrity": 0, "diagnostic": 1}
    last = [line for line in result.outlines if line.strip()][-1]
    assert last.startswith("inferlab: ") and "the protocol ran and found 1 finding(s)" in last
    assert "no harness-integrity check failed" in last and "HARNESS FAILED" not in last
    from inferlab.read.verify import verify_run

    assert verify_run(run)["failures_by_check_kind"] == {"integrity": 0, "diagnostic": 1}
    renamed = run.with_name(run.name.replace("-partial-findings", "-whatever"))
    run.rename(renamed)  # verify reads the records, not the folder's name
    assert verify_run(renamed)["failures_by_check_kind"] == {"integrity": 0, "diagnostic": 1}


def test_a_failed_integrity_check_says_the_harness_failed_on_the_last_line(suite):
    write_experiment(suite, "def test_integrity():\n    assert False, 'the harness broke'\n")
    result = suite.runpytest("experiments", "--record-dir", "run")
    last = [line for line in result.outlines if line.strip()][-1]
    assert last.startswith("inferlab: ") and "the HARNESS FAILED: 1 harness-integrity check(s)" in last


def test_renaming_never_takes_over_a_name_another_run_holds(tmp_path):
    from inferlab.base.records import rename_with_suffix

    run = tmp_path / "20250101T000000Z-standin"
    run.mkdir()
    (run / "records.jsonl").write_text("")
    (tmp_path / "20250101T000000Z-standin-failed").mkdir()  # empty: a plain rename would replace it
    renamed = rename_with_suffix(run, "-failed")
    assert renamed.name == "20250101T000000Z-standin-failed-2" and (renamed / "records.jsonl").is_file()
    assert not any((tmp_path / "20250101T000000Z-standin-failed").iterdir()) and not run.exists()


@pytest.mark.parametrize("where, reason", [("a_file/run", "a_file is a regular file, not a directory"),
                                           ("/proc/inferlab-run", "No such file or directory")])
def test_a_record_dir_that_cannot_be_made_is_a_usage_error_naming_path_and_reason(suite, where, reason):
    (suite.path / "a_file").write_text("not a directory\n")
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--record-dir", where)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([f"*--record-dir*{where}*cannot be created*{reason}*"])


def refused(suite, *args) -> str:
    """Run with these options, expect a usage error before anything is written; return stderr."""
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", *args)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + err
    assert "INTERNALERROR" not in result.stdout.str() + err and "Traceback" not in err
    written = [p for name in ("claim.json", "records.jsonl", "manifest.json") for p in suite.path.rglob(name)]
    assert written == []  # nothing written, not even a claim
    return err


def test_a_record_dir_inside_the_project_cache_is_refused_before_anything_is_written(suite):
    """Issue 26 B1: a run written into artifacts/cache would break the cache for this run and every later one."""
    cached = suite.path / "artifacts" / "cache" / "standin" / "e65bb29c"
    cached.mkdir(parents=True)
    err = refused(suite, "--specimen", "standin", "--record-dir", "artifacts/cache/standin/e65bb29c/myrun")
    assert ("--record-dir: artifacts/cache/standin/e65bb29c/myrun is inside the project's specimen cache" in err
            and "fail verification for this run and every later one" in err)
    assert sorted(p.name for p in cached.iterdir()) == []


@pytest.mark.parametrize("option", ["--record-dir", "--runs-dir"])
def test_no_run_is_written_into_any_folder_that_holds_a_specimen(tmp_path, option):
    from inferlab.run import options

    copy = tmp_path / "lab05-copy"
    copy.mkdir()
    (copy / "config.json").write_text("{}")
    (copy / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(options.PathOptionError, match=f"{option}: .* is inside {copy}, which holds a specimen's files"):
        options.check_paths({option: str(copy / "deeper" / "run")})
    with pytest.raises(options.PathOptionError, match="inside the project's specimen cache"):
        options.check_paths({option: str(tmp_path / "cache" / "x")}, cache_root=tmp_path / "cache")
    assert options.check_paths({option: str(tmp_path / "runs" / "first")}, cache_root=tmp_path / "cache") is None


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_artifacts_that_are_not_a_directory_are_a_usage_error_naming_path_and_what_it_is(suite, kind):
    where = suite.path / "lab05"
    if kind == "file":
        where.write_text("not a folder\n")
    err = refused(suite, "--record-dir", "run", "--artifacts", str(where))
    what = "does not exist" if kind == "missing" else "is a regular file"
    assert f"--artifacts: {where} {what}; expected a directory that holds the specimen's files" in err


@pytest.mark.parametrize("option, value", [("--record-dir", "lab05/run"), ("--runs-dir", "lab05")])
def test_the_run_is_never_written_into_the_artifacts_folder(suite, option, value):
    (suite.path / "lab05").mkdir()
    err = refused(suite, option, value, "--artifacts", "lab05")
    assert f"{option}: {value} is inside the --artifacts folder lab05" in err
    assert list((suite.path / "lab05").iterdir()) == []


@pytest.mark.parametrize("option", ["--record-dir", "--runs-dir"])
def test_an_empty_record_path_is_refused_rather_than_taken_as_the_current_folder(suite, option):
    err = refused(suite, option, "")
    assert f"{option}: the path is empty ('')" in err


def test_a_record_dir_name_too_long_for_the_file_system_is_a_usage_error(suite):
    err = refused(suite, "--record-dir", "r" * 300)
    assert "--record-dir: record dir rrrr" in err and "File name too long (ENAMETOOLONG)" in err
    err = refused(suite, "--runs-dir", "r" * 300)
    assert "--runs-dir: runs dir rrrr" in err and "File name too long (ENAMETOOLONG)" in err
    err = refused(suite, "--record-dir", "run", "--artifacts", "a" * 300)
    assert "--artifacts: aaaa" in err and "cannot be examined: File name too long (ENAMETOOLONG)" in err


def test_a_runs_dir_that_is_a_file_says_so(suite):
    (suite.path / "runs").write_text("a file\n")
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--runs-dir", "runs")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--runs-dir: runs dir runs cannot be created: runs is a regular file, not a "
                                 "directory*"])


def test_a_record_dir_that_is_a_dangling_symbolic_link_says_so(suite):
    (suite.path / "run").symlink_to(suite.path / "gone")
    err = refused(suite, "--record-dir", "run")
    assert f"--record-dir: record dir run is a dangling symbolic link to {suite.path / 'gone'}" in err


def test_predictions_that_are_not_a_regular_file_say_what_they_are(suite):
    os.mkfifo(suite.path / "answers")
    err = refused(suite, "--record-dir", "run", "--predictions", "answers")
    assert "--predictions: answers is a FIFO (named pipe), not a regular file" in err
    err = refused(suite, "--record-dir", "run", "--predictions", "missing.md")
    assert "--predictions: missing.md does not exist; expected your copy of predictions.md" in err
    err = refused(suite, "--record-dir", "run", "--predictions", "p" * 300)
    assert "cannot be examined: File name too long (ENAMETOOLONG); expected your copy" in err


@pytest.mark.parametrize("make, words", [
    (lambda path: path.write_bytes(random.Random(45).randbytes(3000)), "is binary (a NUL byte at offset 210)"),
    (lambda path: os.truncate(path.write_bytes(b"") or path, 200_000_000),
     "is 200,000,000 bytes, over the limit of 1,000,000"),
    (lambda path: path.write_bytes("## 1. caf\u00e9\n".encode("latin-1")), "is not UTF-8 text (byte 9"),
], ids=["random_bytes", "200MB", "latin1"])
def test_predictions_that_attach_would_refuse_are_refused_before_anything_is_written(suite, make, words):
    make(suite.path / "answers.md")
    err = refused(suite, "--record-dir", "run", "--predictions", "answers.md")
    assert f"--predictions: answers.md {words}" in err
    assert "expected a regular UTF-8 text file of at most 1,000,000 bytes (1 MB)" in err
    assert not (suite.path / "run").exists()


def test_a_read_only_record_dir_is_refused_naming_the_reason(tmp_path, monkeypatch):
    import errno

    from inferlab.base.records import RecordDirError, claim_record_dir

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(RecordDirError, match=r"cannot be created: Read-only file system \(EROFS\)"):
        claim_record_dir(tmp_path / "mnt" / "run", {"pid": 1})


def test_tilde_in_record_dir_is_the_home_directory(suite, monkeypatch):
    home = suite.mkdir("home")
    monkeypatch.setenv("HOME", str(home))
    write_experiment(suite, RECORDS_X)
    suite.runpytest("experiments", "--record-dir=~/myrun").assert_outcomes(passed=1)
    assert (home / "myrun" / "records.jsonl").is_file() and not (suite.path / "~").exists()


# --- predictions and the command line (issues 17.4, 14.8) ------------------------------------------


def test_the_blank_predictions_template_is_flagged_and_the_run_goes_on(suite):
    write_experiment(suite, "def test_a():\n    pass\n")
    blank = suite.path / "mine.md"
    blank.write_text((REPO_ROOT / "predictions.md").read_text())
    result = suite.runpytest("experiments", "--record-dir", "run", "--predictions", str(blank))
    result.assert_outcomes(passed=1)
    predictions = manifest_of(suite.path / "run")["predictions"]
    assert predictions["supplied"] is True and predictions["template_unanswered"] is True
    result.stdout.fnmatch_lines(["predictions: *mine.md is still the unanswered template*"])


def test_answered_predictions_are_not_flagged(suite):
    write_experiment(suite, "def test_a():\n    pass\n")
    answered = suite.path / "mine.md"
    answered.write_text((REPO_ROOT / "predictions.md").read_text().replace(
        "Prediction:\n", "Prediction:\nyes, identical ids\n", 1))
    suite.runpytest("experiments", "--record-dir", "run", "--predictions", str(answered))
    predictions = manifest_of(suite.path / "run")["predictions"]
    assert predictions["template_unanswered"] is False and predictions["template_check"].startswith("1 of 18")


@pytest.mark.process
def test_manifest_records_the_command_as_typed_beside_argv(sigterm_run):
    run, _ = sigterm_run  # a real process's own command line; how the session ended does not change it
    manifest = manifest_of(run)
    import shlex

    assert manifest["command"] == shlex.join([sys.executable, "-m", "pytest", *PYTEST_PREFIX, *SIGTERM_ARGS])
    assert manifest["argv"][1:] == [*PYTEST_PREFIX, *SIGTERM_ARGS]
    assert manifest["argv"][0].endswith("__main__.py") and "command_line" not in manifest  # one name: argv


def test_pytest_help_does_not_show_pytesters_options(pytester, monkeypatch):
    shown = project_help(pytester, monkeypatch)
    assert "--record-dir" in shown
    assert "--lsof" not in shown and "--runpytest" not in shown


def test_a_source_file_edited_mid_run_is_listed_and_the_report_still_regenerates(suite, capsys):
    """The manifest keeps the environment as the run started; an edit during the run is named, not swapped in."""
    write_experiment(suite, (
        "from pathlib import Path\n"
        "def test_edits_a_tracked_file():\n"
        "    Path(__file__).write_text(Path(__file__).read_text() + '# edited during the run\\n')\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(passed=1)
    run = suite.path / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    source = suite.path / "experiments" / "test_exp.py"
    from inferlab.base.records import sha256_file

    assert manifest["source_sha256"]["experiments/test_exp.py"] != sha256_file(source)  # the start's hash
    assert manifest["environment_changed_during_run"] == ["source_sha256: experiments/test_exp.py"]
    from inferlab.cli import main

    capsys.readouterr()
    assert main(["report", str(run), "--check"]) == 0, capsys.readouterr()
    # Issue 26 B4: the terminal, report.md and verify say so too, not only the manifest.
    result.stdout.fnmatch_lines(["environment: CHANGED during the run: source_sha256: experiments/test_exp.py*"])
    last = [line for line in result.outlines if line.strip()][-1]
    assert "the ENVIRONMENT CHANGED during the run (source_sha256: experiments/test_exp.py)" in last
    text = (run / "report.md").read_text()
    assert "**The environment changed during the run** (source_sha256: experiments/test_exp.py)" in text
    capsys.readouterr()
    code = main(["verify", str(run)])
    assert code == 1 and "session_end: the environment changed during the run" in capsys.readouterr().out


@pytest.mark.parametrize("name, synthetic", [("standin", True), ("pythia-14m", False)])
def test_the_summary_names_the_specimen_and_says_when_it_is_synthetic(suite, name, synthetic):
    from inferlab import protocol, specimen

    spec = specimen.load_spec(name)
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--record-dir", "run", "--specimen", name)
    line = f"specimen: {name} ({spec.repo_id} at revision {spec.revision})"
    if synthetic:
        result.stdout.fnmatch_lines([f"{line}; SYNTHETIC, not Pythia: *{protocol.PINNED_REPO_ID}"])
    else:
        result.stdout.fnmatch_lines([line])
        assert "SYNTHETIC" not in result.stdout.str()


def test_a_test_may_write_only_the_record_kinds_it_declares_and_the_plan_carries_them(suite):
    write_experiment(suite, (
        "import pytest\n"
        "@pytest.mark.records('measurement')\n"
        "def test_declared(record):\n"
        "    record('measurement', value=1)\n"
        "@pytest.mark.records('measurement')\n"
        "def test_undeclared(record):\n"
        "    record('surprise', value=2)\n"
    ))
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(passed=1, failed=1)
    records = read_records(suite.path / "run")
    assert [r["kind"] for r in records if r["kind"] in ("measurement", "surprise")] == ["measurement"]
    assert "record kind 'surprise' is not declared" in outcomes_by_test(records)["test_undeclared"]["longrepr"]
    plan = json.loads((suite.path / "run" / "plan.json").read_text())
    assert plan["schema"] == manifest_of(suite.path / "run")["schema"] == 2
    assert [entry["records"] for entry in plan["schedule"]] == [["measurement"], ["measurement"]]


def test_a_test_that_declares_no_record_kinds_may_write_none(suite):
    write_experiment(suite, "def test_silent(record):\n    record('measurement', value=1)\n")
    result = suite.runpytest("experiments", "--record-dir", "run")
    result.assert_outcomes(failed=1)
    records = read_records(suite.path / "run")
    assert "measurement" not in [r["kind"] for r in records]
    longrepr = outcomes_by_test(records)["test_silent"]["longrepr"]
    assert "record kind 'measurement' is not declared on the test, which declares no record kinds" in longrepr


def test_last_failed_of_another_specimen_is_refused_and_of_the_same_one_runs(suite):
    """Issue 26 B10: pytest keeps one last-failed list per folder; a stand-in's failures are not the replica's."""
    write_experiment(suite, "def test_a():\n    assert False\ndef test_b():\n    pass\n")
    suite.runpytest("experiments", "--runs-dir", "runs").assert_outcomes(passed=1, failed=1)
    mixed = suite.runpytest("experiments", "--runs-dir", "runs", "--specimen", "standin", "--lf")
    assert mixed.ret == pytest.ExitCode.USAGE_ERROR
    mixed.stderr.fnmatch_lines(["*--lf: the last-failed list was written by a run of specimen 'pythia-14m', and "
                                "this run is of 'standin'*"])
    assert len(list((suite.path / "runs").iterdir())) == 1  # the refused run wrote nothing
    again = suite.runpytest("experiments", "--runs-dir", "runs", "--lf")
    again.assert_outcomes(failed=1)
