"""The near-tie rule (inferlab/measure/near_tie.py) that a reference and a replay share, the greedy steps' top two as
verify checks them, and the CPU kernels a run records and compare shows. No model: constructed steps, and
fixture runs in memory."""

from __future__ import annotations

import copy

import pytest

from inferlab.host.environment import cpu_kernels, describe_kernels
from inferlab.measure import near_tie
from inferlab.measure.near_tie import Step, compare_greedy, near_tie_limit
from inferlab.recheck.replay import replayed_step, step_fields
from inferlab.recheck.trusted import Comparison, _compare_outputs
from inferlab.report.compare import compare, format_compare
from inferlab.verify import verify_run

from fixture_runs import fixture_runs

ATOL = RTOL = 1e-4
TOP = 12.0  # near_tie_limit(12) = 2 * (1e-4 + 1.2e-3) = 2.6e-3


def steps(margins: list[float], runner_ups: list[int]) -> list[Step]:
    return [Step(TOP, TOP - m, r) for m, r in zip(margins, runner_ups)]


def test_the_limit_scales_with_the_true_top_value():
    assert near_tie_limit(TOP, ATOL, RTOL) == pytest.approx(2.6e-3)
    assert near_tie_limit(0.0, ATOL, RTOL) == pytest.approx(2e-4)  # what a top of 0.0 wrongly gave


def test_equal_ids_compare_every_step_and_flag_values_beyond_the_tolerance():
    ours = steps([0.5, 0.5, 0.5], [9, 9, 9])
    theirs = [Step(TOP, TOP - 0.5, 9), Step(TOP + 0.01, TOP - 0.5, 9), Step(TOP, TOP - 0.5, 9)]
    found = compare_greedy([1, 2, 3], [1, 2, 3], ours, theirs, ATOL, RTOL)
    assert found.status == "equal" and found.compared_steps == 3
    assert len(found.value_problems) == 1 and found.value_problems[0].startswith("step 1:")


def test_a_swap_at_a_near_tie_is_a_divergence_and_the_ids_after_it_are_not_compared():
    theirs = steps([0.5, 1e-3, 0.5], [9, 7, 9])
    ours = [Step(TOP, TOP - 0.5, 9), Step(TOP - 4e-4, TOP - 6e-4, 5), Step(TOP, TOP - 0.5, 9)]
    found = compare_greedy([1, 7, 40], [1, 5, 3], ours, theirs, ATOL, RTOL)
    assert (found.status, found.step, found.value_problems) == ("near_tie", 1, [])
    assert found.theirs_margin == pytest.approx(1e-3) and found.ours_margin == pytest.approx(2e-4)
    assert "in the run" in found.margins_text() and "in the reference" in found.margins_text()


def test_a_difference_at_a_wide_margin_or_to_another_id_is_not_a_near_tie():
    theirs = steps([0.5, 0.5], [9, 7])
    assert compare_greedy([1, 7], [1, 5], None, theirs, ATOL, RTOL).status == "differ"
    near = steps([0.5, 1e-3], [9, 7])
    assert compare_greedy([1, 8], [1, 5], None, near, ATOL, RTOL).status == "differ"  # 8 is not the runner-up
    assert compare_greedy([1, 7], [1, 5], None, None, ATOL, RTOL).status == "differ"  # no margin known


def test_the_untrusted_sides_margin_counts_only_where_its_values_were_checked():
    ours = [Step(TOP, TOP - 0.5, 9), Step(TOP, TOP - 1e-3, 5)]
    # the trusted side knows no step 1: the run's own claim of a near tie there is not taken
    assert compare_greedy([1, 7], [1, 5], ours, steps([0.5], [9]), ATOL, RTOL).status == "differ"
    # the trusted side's values at step 1 agree with the run's: the run's near tie counts
    theirs = [Step(TOP, TOP - 0.5, 9), Step(TOP, TOP - 1.5e-3, 7)]
    assert compare_greedy([1, 7], [1, 5], ours, theirs, ATOL, RTOL).status == "near_tie"


def test_a_length_difference_is_never_a_near_tie():
    assert compare_greedy([1, 2], [1, 2, 3], None, steps([0.5, 0.5, 1e-4], [9, 9, 3]), ATOL, RTOL).status == "differ"


@pytest.mark.parametrize("values, ids, expected", [
    ([[1.0, 0.5]], [[3, 4]], None),
    ([[1.0]], None, "pairs"),
    ([[0.5, 1.0]], None, "below the runner-up"),
    ([[1.0, float("nan")]], None, "finite"),
    ([[1.0, 0.5]], [[3, 4], [5, 6]], "one per"),
])
def test_the_fields_shape(values, ids, expected):
    problem = near_tie.shape_problem(values, ids)
    assert (problem is None) if expected is None else (expected in problem)


def test_replay_applies_the_same_rule():
    """A replay's greedy trial (its selections as step_fields holds them) against the run's, by the one comparison:
    ids that part from the run's at the run's near tie are a note, and a contradiction elsewhere."""
    recorded = {"prompt_id": "P1", "ids": [1, 7, 40], "step_top2_logits": [[TOP, TOP - 0.5], [TOP, TOP - 1e-3],
                                                                          [TOP, TOP - 0.5]],
                "step_top2_ids": [[1, 9], [7, 5], [40, 9]]}
    replayed = [Step(TOP, TOP - 0.5, 9), Step(TOP - 4e-4, TOP - 6e-4, 7), Step(TOP, TOP - 0.5, 9)]
    trial = {"prompt_id": "P1", "ids": [1, 5, 3], **step_fields(list(zip([1, 5, 3], replayed)))}

    def compared(ids):
        result = Comparison()
        _compare_outputs(result, {"generation": {"P1-G-rep1": {**recorded, "ids": ids}}},
                         {"generation": {"P1-G-rep1": trial}}, {"atol": ATOL, "rtol": RTOL})
        return result

    result = compared([1, 7, 40])
    assert result.contradictions == [] and result.compared["near_tie_divergences"] == 1
    assert "generation P1-G-rep1: a near-tie divergence at step 1" in result.notes[0]
    result = compared([1, 8, 40])
    assert result.contradictions[0].startswith("generation P1-G-rep1: ids first differ at step 1")


def test_replayed_step_names_the_selection_and_the_best_other():
    selected, step = replayed_step([0.0, 3.0, 2.5, 3.0])
    assert selected == 1 and (step.top, step.second, step.runner_up) == (3.0, 3.0, 3)


# --- verify --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    return fixture_runs(tmp_path_factory).data("complete")


def problems_after(complete, change) -> list[str]:
    def edit(records):
        for record in records:
            if record["kind"] in ("generation", "timing_trial") and "step_top2_logits" in record:
                change(record)
        return records
    return [p for p in verify_run(complete.changed(edit).view())["problems"] if "step_top2" in p]


def test_verify_takes_the_fixture_runs_steps_as_they_are(complete):
    assert problems_after(complete, lambda record: None) == []


def test_verify_names_steps_of_the_wrong_shape_or_of_other_ids(complete):
    def shorter(record):
        record["step_top2_logits"] = record["step_top2_logits"][:-1]
        record["step_top2_ids"] = record["step_top2_ids"][:-1]
    assert any("len(step_top2_logits)" in p for p in problems_after(complete, shorter))

    def other_selection(record):
        record["step_top2_ids"] = [[a + 1, b] for a, b in record["step_top2_ids"]]
    assert any("step_top2_ids[*][0]" in p and "greedy selects the top" in p
               for p in problems_after(complete, other_selection))

    def swapped(record):
        record["step_top2_logits"] = [[b, a] for a, b in record["step_top2_logits"]]
    assert any("below the runner-up" in p for p in problems_after(complete, swapped))


def test_verify_checks_step_0_against_the_saved_first_step_logits(complete):
    def tiny_margin(record):
        if record["kind"] == "generation":
            top = record["step_top2_logits"][0][0]
            record["step_top2_logits"] = [[top, top - 1e-6]] + record["step_top2_logits"][1:]
    found = problems_after(complete, tiny_margin)
    assert any("step_top2_logits[0]" in p and "the saved first-step logits" in p for p in found), found


# --- the CPU kernels ---------------------------------------------------------------------------------------


def test_cpu_kernels_are_asked_of_torch():
    import torch

    found = cpu_kernels()
    assert found["capability"] == torch.backends.cpu.get_cpu_capability()
    assert found["mkl_available"] == torch.backends.mkl.is_available()
    assert describe_kernels(found).startswith(f"{found['capability']} kernels")
    assert describe_kernels(None) == "did not record its CPU kernels"


def test_compare_shows_each_runs_cpu_kernels(complete):
    manifest = copy.deepcopy(complete.manifest)
    manifest["torch_build"]["cpu_kernels"] = {**manifest["torch_build"]["cpu_kernels"], "capability": "DEFAULT"}
    other = complete.changed(torch_build=manifest["torch_build"])
    text = format_compare(compare(complete.view(), other.view()))
    assert "CPU kernels" in text and ": DIFFER" in text
    assert "dir1: AVX2 kernels" in text and "dir2: DEFAULT kernels" in text
    same = format_compare(compare(complete.view(), complete.view()))
    assert "DIFFER" not in same.split("CPU kernels")[1].splitlines()[0]
