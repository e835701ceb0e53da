"""The recording plugin, exercised on small throwaway experiment suites through pytester."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def suite(pytester, monkeypatch):
    """A pytester dir whose conftest registers the plugin, with inferlab importable in subprocesses."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    pytester.makeconftest('pytest_plugins = ["inferlab.plugin"]\n')
    pytester.mkdir("experiments")
    pytester.mkdir("artifacts")
    for spec in (REPO_ROOT / "artifacts").glob("*.json"):
        (pytester.path / "artifacts" / spec.name).write_bytes(spec.read_bytes())
    return pytester


def write_experiment(pytester, source: str, name: str = "test_exp.py") -> None:
    (pytester.path / "experiments" / name).write_text(source)


def read_records(record_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (record_dir / "records.jsonl").read_text().splitlines()]


def outcomes_by_test(records: list[dict]) -> dict:
    return {r["test"].split("::")[-1]: r for r in records if r["kind"] == "test_outcome"}


def test_failing_test_is_recorded_with_its_longrepr(suite):
    write_experiment(suite, (
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
    assert manifest["complete"] is True and manifest["exit_status"] == 1
    assert manifest["outcome_counts"] == {"failed": 1}
    assert "records.jsonl" in manifest["files"] and "report.md" in manifest["files"]
    result.stdout.fnmatch_lines(["*FAILED*test_measures*measured 3, expected 4*"])


def test_existing_nonempty_record_dir_is_refused_and_untouched(suite):
    write_experiment(suite, "def test_a(record):\n    record('x')\n")
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
    result.stderr.fnmatch_lines(["*--record-dir DIR is required*"])


def test_sigint_mid_session_leaves_valid_records_and_incomplete_manifest(suite):
    write_experiment(suite, (
        "import os, signal\n"
        "def test_first(record):\n"
        "    record('before_interrupt', value=1)\n"
        "def test_interrupted(record):\n"
        "    record('about_to_interrupt')\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "def test_never_reached(record):\n"
        "    record('unreachable')\n"
    ))
    result = suite.runpytest_subprocess("experiments", "--record-dir", "run")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    records = read_records(suite.path / "run")  # every line parses
    kinds = [r["kind"] for r in records]
    assert "before_interrupt" in kinds and "about_to_interrupt" in kinds and "unreachable" not in kinds
    manifest = json.loads((suite.path / "run" / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert manifest["exit_status"] == int(pytest.ExitCode.INTERRUPTED)


def test_timeout_is_a_recorded_failure_and_the_session_goes_on(suite):
    write_experiment(suite, (
        "import time, pytest\n"
        "@pytest.mark.timeout(1, method='signal')\n"
        "def test_too_slow():\n"
        "    time.sleep(10)\n"
        "def test_next(record):\n"
        "    record('still_running')\n"
    ))
    result = suite.runpytest_subprocess("experiments", "--record-dir", "run")
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
    assert [r["kind"] for r in read_records(suite.path / "run")] == ["plan"]


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
    write_experiment(suite, "def test_a(record):\n    record('x', value=1)\n")
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
    write_experiment(suite, "def test_a(record):\n    record('x', value=float('nan'), text='a\\nb\\t\\u00e9')\n")
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
        "def test_setup(record):\n"
        "    record('setup_ran')\n"
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

    monkeypatch.setattr(protocol, "TRIAL_LIMIT_S", 1)
    write_experiment(suite, (
        "import time, pytest\n"
        "@pytest.fixture(scope='session')\n"
        "def slow_download():\n"
        "    time.sleep(1.5)\n"
        "def test_quick_after_slow_setup(slow_download):\n"
        "    pass\n"
        "def test_slow_body():\n"
        "    time.sleep(3)\n"
    ))
    suite.runpytest("experiments", "--record-dir", "run").assert_outcomes(passed=1, failed=1)
    outcomes = outcomes_by_test(read_records(suite.path / "run"))
    assert outcomes["test_quick_after_slow_setup"]["outcome"] == "passed"
    assert "Timeout" in outcomes["test_slow_body"]["longrepr"]


def test_platform_without_interval_timers_refuses_to_run(suite, monkeypatch):
    import types

    from inferlab import plugin

    monkeypatch.setattr(plugin, "signal", types.SimpleNamespace(SIGINT=2))  # no SIGALRM, no setitimer
    write_experiment(suite, "def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--record-dir", "run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no POSIX interval timers*refuse to run unbounded*"])


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
