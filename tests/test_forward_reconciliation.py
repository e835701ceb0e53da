"""Every forward of a session, counted by the forward watch, reconciled with the plan's totals at its end and rechecked
by verify (issue 33 part 6 b): a mismatch is a failed harness-integrity fact named with both numbers."""

from __future__ import annotations

import types

import pytest

from inferlab import protocol
from inferlab.run import endings, plan
from inferlab.read.verify import verify_run

from fixtures_records import RunBuilder, all_nodeids, generation_nodeid
from fixture_runs import runs, shared  # noqa: F401 (fixtures)

complete = shared("complete", "complete", "The shared complete run in memory.", in_memory=True)

MEMORY_TEST = "experiments/test_60_memory.py::test_parameter_storage"
BATCHING_TEST = "experiments/test_70_batching.py::test_batching_calls"
FIRST_TRIAL = generation_nodeid(protocol.generation_trials()[0])
# 26 trials x 16 + 24 timing trials x 16 + the cache test's 16 + 4 batching calls x 16 new tokens
COMPLETE_PLAN_AT_MOST = 26 * 16 + 24 * 16 + 16 + 4 * 16


def entries_of(tests) -> list[dict]:
    return [{"index": i, "test": nodeid, "budget": budget} for i, (nodeid, budget) in enumerate(tests)]


def test_the_plans_forward_totals_give_each_test_its_most():
    budget = plan.forward_budget(entries_of(all_nodeids()))
    assert budget["at_most"] == COMPLETE_PLAN_AT_MOST
    assert budget["by_test"][FIRST_TRIAL] == protocol.MAX_NEW_TOKENS
    assert budget["by_test"][BATCHING_TEST] == 4 * protocol.MAX_NEW_TOKENS
    assert budget["by_test"]["experiments/test_40_cache.py::test_matched_prefix"] == 16
    assert budget["by_test"][MEMORY_TEST] == 0  # no budget: no forward


@pytest.mark.parametrize("counted, by_test, problems", [
    (9, {FIRST_TRIAL: 9, MEMORY_TEST: 0}, []),  # an EOS stops a generation early: under the budget is no problem
    (18, {FIRST_TRIAL: 16, MEMORY_TEST: 1}, ["forwards: the session ran 18, its tests ran 17: 1 ran outside every "
                                             "test", f"forwards: {MEMORY_TEST} ran 1, the plan allows it at most 0"]),
    (COMPLETE_PLAN_AT_MOST + 1, {FIRST_TRIAL: COMPLETE_PLAN_AT_MOST + 1}, [
        f"forwards: the session ran {COMPLETE_PLAN_AT_MOST + 1}, the plan allows at most {COMPLETE_PLAN_AT_MOST}",
        f"forwards: {FIRST_TRIAL} ran {COMPLETE_PLAN_AT_MOST + 1}, the plan allows it at most 16"]),
], ids=["fewer", "outside-a-test", "over-the-plan"])
def test_a_forward_outside_the_plan_is_named_with_both_numbers(counted, by_test, problems):
    found = endings.reconcile_forwards(counted, by_test, plan.forward_budget(entries_of(all_nodeids())))
    assert found["problems"] == problems and found["ok"] is not problems
    assert found["by_test"] == {nodeid: n for nodeid, n in by_test.items() if n}  # each test's most is the plan's


@pytest.mark.parametrize("counted, failed", [(17, True), (16, False)])
def test_the_session_end_says_whether_the_harness_kept_to_the_plans_forwards(tmp_path, counted, failed):
    """Through the Run, as a session ends: the watch's count and the per-test counts the plugin keeps."""
    builder = RunBuilder(tmp_path / "run", "standin", True, current_format=True, report=False)
    builder.write_plan([(FIRST_TRIAL, {"category": "generation", "selections": 16}), (MEMORY_TEST, None)])
    builder.run.forward_watch = types.SimpleNamespace(forwards=counted)
    builder.run.forwards_by_test = {FIRST_TRIAL: 16, MEMORY_TEST: counted - 16}
    builder.outcome(FIRST_TRIAL)
    builder.outcome(MEMORY_TEST)
    end = builder.end_session()
    assert end["forward_reconciliation"]["counted"] == counted and end["forward_reconciliation"]["ok"] is not failed
    assert (endings.failure_kind(end, {"passed": 2}) == "harness") is failed
    assert endings.outcome_suffix(end, {"passed": 2}) == ("-partial-failed" if failed else "-partial")  # two tests
    assert ("the HARNESS FAILED its forward count (forwards: the session ran 17, the plan allows at most 16"
            in end["status"]) is failed


@pytest.mark.parametrize("end, pytest_status, expected", [
    ({"forward_reconciliation": {"ok": False}}, 0, endings.HARNESS_FAILED_EXIT),  # every test passed
    ({"forward_reconciliation": {"ok": False}}, 1, 1),
    ({"forward_reconciliation": {"ok": False}, "interrupted": True}, 0, 2),
    ({"forward_reconciliation": {"ok": True}}, 0, 0),
    ({"forward_reconciliation": {"ok": True}, "measured_nothing": True}, 0, endings.NOTHING_MEASURED_EXIT),
    ({"interrupted": True}, 1, 2),
    ({}, 0, 0),  # an older session_end without a reconciliation: pytest's own status
])
def test_the_sessions_exit_status_carries_a_forward_count_that_does_not_match_its_plan(end, pytest_status, expected):
    assert endings.exit_status(end, pytest_status, 0, 2) == expected


def test_a_selection_that_measured_nothing_and_failed_its_forward_count_says_the_status_it_exits_with():
    base = {"tests_planned": 1, "tests_without_outcome": [], "plan_only": False, "collect_only": False,
            "interrupted": False, "stopped_early": False, "exit_code_name": "OK", "measured_nothing": True,
            "partial_reasons": ["-k deselected 116 protocol tests"], "complete": False}
    failed = {**base, "forward_reconciliation": {"ok": False, "problems": ["forwards: the session ran 1, the plan "
                                                                           "allows at most 0"]}}
    for end, status in ((base, endings.NOTHING_MEASURED_EXIT), (failed, endings.HARNESS_FAILED_EXIT)):
        assert endings.exit_status(end, 0, 0, 2) == status
        assert f"so the session exits with status {status};" in endings.status_line(end, {"skipped": 1})


UNPLANNED_FORWARD = """
import pytest
import torch


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    if item.name == "test_model_inspection":  # a test whose plan allows no forward
        with torch.inference_mode():
            item.funcargs["model"](input_ids=torch.tensor([[1, 2, 3]]))  # (1, 3)
"""


@pytest.mark.process
def test_a_session_whose_tests_all_pass_exits_failed_when_a_forward_was_not_planned(pytester, standin_dir):
    from shared_runs import experiment_in_process

    result = experiment_in_process(pytester, "--specimen", "standin", "--artifacts", str(standin_dir),
                                   "-k", "test_10_specimen", conftest_extra=UNPLANNED_FORWARD)
    found = result.records()
    outcomes = [r["outcome"] for r in found if r["kind"] == "test_outcome"]
    end = next(r for r in found if r["kind"] == "session_end")
    assert outcomes and set(outcomes) == {"passed"}, outcomes
    assert end["forward_reconciliation"]["problems"] == [
        "forwards: the session ran 1, the plan allows at most 0",
        "forwards: experiments/test_10_specimen.py::test_model_inspection ran 1, the plan allows it at most 0"]
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.tail()


def with_reconciliation(data, counted: int, by_test: dict):
    budget = plan.forward_budget(data.plan["schedule"])

    def change(records):
        end = next(r for r in records if r["kind"] == "session_end")
        end["forward_reconciliation"] = endings.reconcile_forwards(counted, by_test, budget)
        return records

    return data.changed(change).view()


def test_verify_accepts_a_session_within_its_plan_names_one_over_it_and_says_a_run_without_one_is_unchecked(complete):
    def without(records):
        next(r for r in records if r["kind"] == "session_end").pop("forward_reconciliation", None)
        return records

    assert verify_run(with_reconciliation(complete, 16, {FIRST_TRIAL: 16}))["problems"] == []
    at_most = plan.forward_budget(complete.plan["schedule"])["at_most"]
    problems = verify_run(with_reconciliation(complete, at_most + 3, {FIRST_TRIAL: at_most + 3}))["problems"]
    assert f"session_end: harness integrity failed: forwards: the session ran {at_most + 3}, the plan allows at " \
           f"most {at_most}" in problems
    assert f"session_end: harness integrity failed: forwards: {FIRST_TRIAL} ran {at_most + 3}, the plan allows it " \
           f"at most 16" in problems
    result = verify_run(complete.changed(without).view())
    assert result["problems"] == []
    assert any("session's forward count" in line for line in result["not_checked"])


@pytest.mark.slow
@pytest.mark.process
def test_a_real_session_counts_every_forward_and_keeps_to_its_plan(standin_run):
    from shared_runs import records

    found = records(standin_run)
    end = next(r for r in found if r["kind"] == "session_end")
    reconciliation = end["forward_reconciliation"]
    windows = sum(r["forward_mode"]["forwards"] for r in found if isinstance(r.get("forward_mode"), dict))
    assert reconciliation["ok"], reconciliation["problems"]
    assert reconciliation["counted"] == reconciliation["accounted_by_tests"] == windows > 0
    assert reconciliation["planned_at_most"] == COMPLETE_PLAN_AT_MOST
    timing = [forwards for t, forwards in reconciliation["by_test"].items() if "test_timing_trial[" in t]
    assert timing == [protocol.TIMING_NEW_TOKENS] * len(protocol.timing_schedule())
