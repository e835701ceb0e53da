"""inferlab.measure.stats: the summaries, and the effect interval (Hodges-Lehmann shift of log times, Mann-Whitney
interval): its exact coverage, its coverage of a known shift, and a verdict claiming a direction where there is none
no more often than the interval misses. (Part 5's formulas: analytic_tests/test_50_timing_formulas.)"""

from __future__ import annotations

import math
import random
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab import protocol
from inferlab.measure import stats

N = 5  # the protocol's measured trials per condition
CASES = 100
THRESHOLD = protocol.SMALLEST_TIMING_EFFECT


def test_an_eos_as_the_last_allowed_token_is_no_early_stop_and_the_timing_summary_keeps_every_sample():
    def generation(trial_id, length, last):
        return {"prompt_id": "P1", "trial_id": trial_id, "condition": "S1", "seed": 17, "is_rerun": False,
                "status": "ok", "generated_ids": [5] * (length - 1) + [last], "generated_length": length,
                "stop_reason": "eos" if last == 0 else "max_new_tokens"}

    def trial(repetition, loop_s, contended):
        times = [loop_s * (i + 1) / 16 for i in range(16)]
        return {"prompt_id": "P1", "use_cache": True, "warmup": repetition == 0, "status": "ok",
                "schedule_index": repetition, "schedule_id": f"P1-cache_on-{repetition}", "repetition": repetition,
                "prompt_length": 8, "output_length": 16, "prefill_s": times[0] / 2, "ttft_s": times[0],
                "loop_s": loop_s, "token_times_s": times, "mean_post_first_interval_s": loop_s / 16,
                "contended": contended}

    summary = stats.sampling_summary([generation("a", 4, 0), generation("b", protocol.MAX_NEW_TOKENS, 0)], "P1")
    assert summary["per_condition"]["S1"]["early_eos"] == 1 and summary["early_eos_total"] == 1
    # the timing summary keeps every sample and labels the uncontended ones apart
    trials = [trial(0, 9.0, False)] + [trial(r, 0.1 * r + (r in (2, 4)), r in (2, 4)) for r in range(1, 6)]  # 2, 4 slow
    summary = stats.timing_summary(trials + [{**trial(6, 1.0, False), "status": "failed"}], "P1", True)
    assert (summary["measured_trials"], summary["warmups_excluded"]) == (5, 1)
    assert summary["failed_trials"] == ["P1-cache_on-6"]
    assert summary["contended_trials"] == ["P1-cache_on-2", "P1-cache_on-4"] and summary["loop_s"]["n"] == 5
    clean = summary["uncontended"]
    assert clean["n"] == 3 and clean["loop_s"]["values"] == pytest.approx([0.1, 0.3, 0.5])
    assert summary["loop_s"]["max"] == pytest.approx(1.4) and "uncontended" in clean["label"]


@pytest.mark.parametrize("a, b, expected", [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1),
                                            ([1, 2], [1, 2, 3], 2), ([], [], None)])
def test_first_divergence(a, b, expected):
    assert stats.first_divergence(a, b) == expected


def test_the_u_distribution_counts_rank_arrangements_and_the_level_picks_the_narrowest_interval_reaching_it():
    for m, n in ((1, 1), (2, 3), (3, 3), (5, 5), (4, 6)):
        counts = stats.u_counts(m, n)
        brute = [0] * (m * n + 1)  # U = pairs (i, j) where the second group's value is the larger
        for first in combinations(range(m + n), m):
            second = [r for r in range(m + n) if r not in first]
            brute[sum(1 for x in first for y in second if y > x)] += 1
        assert list(counts) == brute and sum(counts) == math.comb(m + n, m)
    # the declared level picks the narrowest interval that reaches it
    assert stats.rank_order(5, 5) == (3, pytest.approx(1 - 2 * 4 / 252))  # 96.8 %; k = 4 would be 94.4 %
    assert stats.rank_order(5, 5, 0.94) == (4, pytest.approx(1 - 2 * 7 / 252))
    assert stats.rank_order(3, 3) == (None, pytest.approx(0.9))
    short = stats.log_shift([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert short["low"] is None and "no distribution-free interval reaches 95%" in short["reason"]
    assert short["estimate"] == pytest.approx(math.log(2.1 / 1.1), rel=0.05)
    assert stats.verdict(short, 0.01)[0] == stats.CANNOT_TELL
    with pytest.raises(ValueError, match="positive and finite"):
        stats.log_shift([1.0, 0.0], [1.0, 2.0])


def _draw(rng: random.Random, family: str, spread: float) -> float:
    """One log time of a noise distribution centred near zero (the shape is what a shift model allows to vary)."""
    if family == "normal":
        return rng.gauss(0, spread)
    if family == "uniform":
        return rng.uniform(-spread, spread)
    if family == "right-skewed":  # a few slow outliers, as a busy machine gives
        return rng.expovariate(1 / spread)
    return rng.gauss(0, spread) * (3 if rng.random() < 0.2 else 1)  # "mixture": a heavier tail


def _samples(rng: random.Random, family: str, spread: float, shift: float) -> tuple[list[float], list[float]]:
    base = math.log(0.015)  # a 15 ms time
    a = [math.exp(base + _draw(rng, family, spread)) for _ in range(N)]
    b = [math.exp(base + shift + _draw(rng, family, spread)) for _ in range(N)]
    return a, b


def _most_misses(cases: int, rate: float, tail: float = 1e-4) -> int:
    """The largest count of misses Binomial(cases, rate) exceeds with probability below `tail`."""
    above = 1.0
    for count in range(cases + 1):
        above -= math.comb(cases, count) * rate ** count * (1 - rate) ** (cases - count)
        if above < tail:
            return count
    return cases


FAMILIES = st.sampled_from(["normal", "uniform", "right-skewed", "mixture"])
COVERAGE = 244 / 252  # 5 against 5 at k = 3


@settings(max_examples=25, deadline=None, derandomize=True)
@given(family=FAMILIES, spread=st.floats(0.005, 0.3), shift=st.floats(-0.5, 0.5), seed=st.integers(0, 2**32 - 1))
def test_the_interval_covers_a_known_shift_at_its_stated_rate(family, spread, shift, seed):
    rng = random.Random(seed)
    covered = 0
    for _ in range(CASES):
        found = stats.log_shift(*_samples(rng, family, spread, shift))
        assert found["coverage"] == pytest.approx(COVERAGE)
        covered += found["low"] <= shift <= found["high"]
    # misses beyond what Binomial(CASES, 1 - coverage) exceeds once in 10,000 fail the test
    assert CASES - covered <= _most_misses(CASES, 1 - COVERAGE), (
        f"{covered} of {CASES} intervals covered the true shift {shift} ({family}, {spread})")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(family=FAMILIES, spread=st.floats(0.005, 0.3), seed=st.integers(0, 2**32 - 1))
def test_with_no_shift_a_direction_is_claimed_no_more_often_than_the_interval_misses(family, spread, seed):
    # a claim needs the whole interval beyond the threshold, so at most the interval's miss rate (3.2 % at 5 against
    # 5); a verdict gated by anything looser than the interval would exceed it
    rng = random.Random(seed)
    claims = misses = 0
    for _ in range(CASES):
        effect = stats.log_shift(*_samples(rng, family, spread, 0.0))
        claims += stats.verdict(effect, THRESHOLD)[0] != stats.CANNOT_TELL
        misses += not effect["low"] <= 0 <= effect["high"]
    assert misses <= _most_misses(CASES, 1 - COVERAGE), f"{misses} of {CASES} missed a zero shift ({family}, {spread})"
    assert claims <= misses, f"{claims} claims against {misses} misses ({family}, {spread})"


def test_a_shift_beyond_the_threshold_is_claimed_in_its_direction_and_one_inside_it_never():
    rng = random.Random(7)
    for shift, expected in ((0.4, stats.FASTER), (-0.4, stats.SLOWER), (0.1, stats.FASTER), (-0.1, stats.SLOWER)):
        claims = sum(stats.verdict(stats.log_shift(*_samples(rng, "normal", 0.01, shift)), THRESHOLD)[0] == expected
                     for _ in range(CASES))
        assert claims == CASES, (shift, claims)
    # 2 % with a 0.2 % spread: the interval is narrow and clear of zero, but inside the declared 3 %
    inside = [stats.verdict(stats.log_shift(*_samples(rng, "normal", 0.002, 0.02)), THRESHOLD) for _ in range(CASES)]
    assert {v for v, _ in inside} == {stats.CANNOT_TELL}
    assert "does not lie wholly above +3.0% or wholly below -2.9%" in inside[0][1]
    same = stats.log_shift([0.00407, 0.00409, 0.00411, 0.00413, 0.00415], [0.00407, 0.00409, 0.00411, 0.00413, 0.00415])
    assert same["estimate"] == 0 and same["low"] < 0 < same["high"]
    assert stats.verdict(same, THRESHOLD)[0] == stats.CANNOT_TELL
