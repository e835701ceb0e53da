"""A claimed run's timings beside the course's run (inferlab.grading.timing_sides): per metric the learner's median,
the course's and their ratio, as a finding; a claimed cache effect is flagged only where the course's run decides
the opposite direction beyond both runs' own noise. Two real stand-in runs of the session's shared runs, and
constructed timing records for the contradiction."""

from __future__ import annotations

import json
import math

import pytest

from inferlab import protocol
from inferlab.grading import timing_sides
from inferlab.grading.measures import key_measurements
from inferlab.reading.runview import RunView


def trial(prompt_id: str, use_cache: bool, index: int, interval_ms: float, prefill_ms: float,
          contended: bool = False) -> dict:
    """A completed, measured timing trial with the given post-first-token interval and prefill, in milliseconds."""
    tokens = protocol.TIMING_NEW_TOKENS
    ttft = prefill_ms / 1e3 + 0.0001
    times = [ttft + k * interval_ms / 1e3 for k in range(tokens)]
    return {"kind": "timing_trial", "seq": index, "status": "ok", "warmup": False, "prompt_id": prompt_id,
            "use_cache": use_cache, "schedule_index": index, "schedule_id": f"{prompt_id}-{use_cache}-{index}",
            "prefill_s": prefill_ms / 1e3, "ttft_s": ttft, "loop_s": times[-1], "token_times_s": times,
            "contended": contended}


def run_of(intervals: dict, prefill: dict, n: int = 5, wobble: float = 0.01) -> RunView:
    """A view holding n measured trials per (prompt, cache): intervals and prefill {(prompt_id, use_cache): ms},
    each trial a little apart from the next (wobble, as a fraction) so the ranges are real ranges."""
    records, index = [], 0
    for prompt_id in protocol.TIMING_PROMPTS:
        for use_cache in (True, False):
            for k in range(n):
                spread = 1 + wobble * (k - n // 2)
                records.append(trial(prompt_id, use_cache, index, intervals[(prompt_id, use_cache)] * spread,
                                     prefill[(prompt_id, use_cache)] * spread))
                index += 1
    return RunView.from_data(records, {}, {})


def both(on: float, off: float) -> dict:
    return {(p, c): (on if c else off) for p in protocol.TIMING_PROMPTS for c in (True, False)}


FLAT_PREFILL = both(5.0, 5.0)  # the A/A comparison: no noise beyond the wobble


def interval_effects(sides) -> dict:
    return {e.prompt_id: e for e in sides.effects if e.metric == "mean_post_first_interval_s"}


def test_the_medians_stand_side_by_side_with_their_ratio_never_compared_for_equality():
    learner = run_of(both(1.0, 2.0), FLAT_PREFILL)
    course = run_of(both(0.5, 1.0), both(2.5, 2.5))  # a machine twice as fast, the same effect
    sides = timing_sides.side_by_side(learner, course)
    row = next(m for m in sides.metrics if (m.prompt_id, m.use_cache, m.metric) == ("P1", True,
                                                                                     "mean_post_first_interval_s"))
    assert row.learner_median == pytest.approx(1.0e-3) and row.course_median == pytest.approx(0.5e-3)
    assert row.ratio == pytest.approx(2.0) and (row.learner_n, row.course_n) == (5, 5)
    assert len(sides.metrics) == len(protocol.TIMING_PROMPTS) * 2 * len(timing_sides.TIME_METRICS)
    assert sides.contradictions == []  # twice as slow is no contradiction: both say the cache was faster
    assert {e.learner_verdict for e in interval_effects(sides).values()} == {"faster"}
    findings = sides.findings()
    assert [f["kind"] for f in findings] == [timing_sides.TIMING_FINDING]
    assert "never compared for equality" in findings[0]["meaning"]
    assert "ratio 2.00" in findings[0]["what"]
    json.dumps(sides.as_dict())  # plain data


def test_an_effect_the_course_run_reverses_beyond_both_noises_is_flagged():
    learner = run_of(both(1.0, 2.0), FLAT_PREFILL)  # the learner's run: the cache halves each decode step
    course = run_of(both(2.0, 1.0), FLAT_PREFILL)  # the course's run: the cache doubles it
    sides = timing_sides.side_by_side(learner, course)
    effects = interval_effects(sides)
    assert all(e.contradicted for e in effects.values())
    assert (effects["P1"].learner_verdict, effects["P1"].course_verdict) == ("faster", "slower")
    flagged = [f for f in sides.findings() if f["kind"] == timing_sides.CONTRADICTED_FINDING]
    assert len(flagged) == len(sides.contradictions) >= len(protocol.TIMING_PROMPTS)
    assert "faster" in flagged[0]["what"] and "the course's run says slower" in flagged[0]["what"]
    assert "CONTRADICTED" in "\n".join(sides.lines())


def test_a_reversal_within_the_declared_threshold_is_not_flagged():
    learner = run_of(both(1.0, 2.0), FLAT_PREFILL)
    # the course's machine: the cache 2 % slower, inside the threshold every verdict is judged against
    course = run_of(both(1.02, 1.0), FLAT_PREFILL)
    effects = interval_effects(timing_sides.side_by_side(learner, course))
    assert {e.course_verdict for e in effects.values()} == {"cannot_tell"}
    assert not any(e.contradicted for e in effects.values())
    # and the reverse: a learner whose effect is inside the threshold claims nothing the course could contradict
    small = run_of(both(2.04, 2.0), FLAT_PREFILL)
    sure = run_of(both(1.0, 2.0), FLAT_PREFILL)
    assert timing_sides.side_by_side(small, sure).contradictions == []


def test_a_run_with_too_few_uncontended_samples_decides_on_all_of_them_and_says_so():
    learner = run_of(both(1.0, 2.0), FLAT_PREFILL)
    records = [dict(r, contended=True) for r in run_of(both(2.0, 1.0), FLAT_PREFILL).kind("timing_trial")]
    course = RunView.from_data(records, {}, {})
    effects = interval_effects(timing_sides.side_by_side(learner, course))
    assert {e.course_verdict for e in effects.values()} == {"slower"}
    assert all("from all samples: fewer than" in e.course_reason for e in effects.values())


def test_a_run_without_timing_trials_has_no_medians_and_contradicts_nothing():
    sides = timing_sides.side_by_side(run_of(both(1.0, 2.0), FLAT_PREFILL), RunView.from_data([], {}, {}))
    assert all(m.course_median is None and m.ratio is None and m.course_n == 0 for m in sides.metrics)
    assert sides.contradictions == [] and "course -" in sides.lines()[0]


def other_kernels_run(tmp_path_factory):
    from shared_runs import other_kernels_once

    made = other_kernels_once(tmp_path_factory)
    assert made.returncode == 0, made.tail()
    return made.run


@pytest.mark.slow
def test_two_real_standin_runs_side_by_side(standin_run, tmp_path_factory):
    learner, course = RunView.read(standin_run), RunView.read(other_kernels_run(tmp_path_factory))
    sides = timing_sides.side_by_side(learner, course)
    assert sides.learner_run == standin_run.name
    for row in sides.metrics:
        assert row.learner_n > 0 and row.course_n > 0, row
        assert math.isfinite(row.ratio) and row.ratio > 0
        assert row.ratio == pytest.approx(row.learner_median / row.course_median)
    # each side's median is the one its own run's timing_summary recorded for that metric
    for view, side in ((learner, "learner_median"), (course, "course_median")):
        for summary in view.kind("timing_summary"):
            for metric in timing_sides.TIME_METRICS:
                row = next(m for m in sides.metrics if (m.prompt_id, m.use_cache, m.metric) ==
                           (summary["prompt_id"], summary["use_cache"], metric))
                assert getattr(row, side) == pytest.approx(summary[metric]["median"], rel=1e-9), (metric, side)
    # each side's cache verdict is the one the run's own measurements give (the class table's column)
    for view, verdict in ((learner, "learner_verdict"), (course, "course_verdict")):
        measured = key_measurements(view)
        for effect in interval_effects(sides).values():
            recorded = measured[f"cache_verdict_interval_{effect.prompt_id}"]
            assert recorded is None or getattr(effect, verdict) == recorded
    assert all(e.contradicted == ({e.learner_verdict, e.course_verdict} == {"faster", "slower"})
               for e in sides.effects)
    assert sides.findings()[0]["sides"]["learner_run"] == standin_run.name
