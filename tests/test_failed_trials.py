"""A generation trial that fails is its own recorded failure: the checks that read the matrix go on, and the
diagnostics that need it say "not decidable" instead of reporting a finding."""

from __future__ import annotations

import pytest

from shared_runs import experiment_in_process

FAIL_THIRD_CALL = '''
import inferlab.measure.sampling as sampling

_real = sampling.run_generation_trial
_calls = []


def _fails_on_the_third_call(*args, **kwargs):
    _calls.append(1)
    if len(_calls) == 3:  # P1-G-rep3, in protocol order
        raise RuntimeError("injected failure of one generation trial")
    return _real(*args, **kwargs)


sampling.run_generation_trial = _fails_on_the_third_call


def pytest_unconfigure(config):
    sampling.run_generation_trial = _real  # the session ran inside the harness's process: leave it as found
'''


# The greedy trials of the matrix and the checks read here, with the specimen's and the inputs' tests they need.
GREEDY_MATRIX = ("test_10_specimen or test_20_inputs or (test_generation_trial and G-rep) or "
                 "test_processors_are_only_the_conditions_controls[G] or test_no_generation_warnings or "
                 "test_greedy_repetitions_identical")


@pytest.mark.process
def test_one_failed_trial_leaves_the_other_checks_running_and_no_false_finding(pytester, standin_dir, monkeypatch):
    import inferlab.measure.sampling

    # restored after the test on every path, whether or not the inner session got to undo its own patch
    monkeypatch.setattr(inferlab.measure.sampling, "run_generation_trial", inferlab.measure.sampling.run_generation_trial)
    result = experiment_in_process(pytester, "--specimen", "standin", "--artifacts", str(standin_dir),
                                   "-k", GREEDY_MATRIX, conftest_extra=FAIL_THIRD_CALL)
    found = result.records()
    outcomes = {r["test"].split("::")[-1]: r for r in found if r["kind"] == "test_outcome"}
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.tail()
    assert outcomes["test_generation_trial[P1-G-rep3]"]["outcome"] == "failed"
    failed_record = next(r for r in found if r["kind"] == "generation" and r["trial_id"] == "P1-G-rep3")
    assert failed_record["status"] == "failed" and "injected failure" in failed_record["error"]
    # the matrix-wide checks read the completed trials and still pass
    assert outcomes["test_processors_are_only_the_conditions_controls[G]"]["outcome"] == "passed"
    assert outcomes["test_no_generation_warnings"]["outcome"] == "passed"
    # two of three greedy repetitions cannot decide whether greedy repeats: no finding either way
    greedy = outcomes["test_greedy_repetitions_identical[P1]"]
    assert greedy["outcome"] == "skipped" and "not decidable: 2 of 3" in greedy["skip_reason"]
    assert outcomes["test_greedy_repetitions_identical[P2]"]["outcome"] == "passed"
    assert inferlab.measure.sampling.run_generation_trial.__name__ == "run_generation_trial"  # the patch was undone
