"""The effect interval (Hodges-Lehmann shift of log times, Mann-Whitney interval): its exact coverage, and on samples
with a known shift, that it covers the shift at its stated rate, and that the verdict (the interval against the
declared threshold) claims a direction where there is none no more often than the interval misses."""

from __future__ import annotations

import math
import random
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab import protocol
from inferlab.measure import intervals

N = 5  # the protocol's measured trials per condition
CASES = 100


def test_the_u_distribution_is_the_count_of_rank_arrangements():
    for m, n in ((1, 1), (2, 3), (3, 3), (5, 5), (4, 6)):
        counts = intervals.u_counts(m, n)
        assert sum(counts) == math.comb(m + n, m) and counts == counts[::-1]
        brute = [0] * (m * n + 1)  # U = pairs (i, j) where the second group's value is the larger
        for first in combinations(range(m + n), m):
            second = [r for r in range(m + n) if r not in first]
            brute[sum(1 for x in first for y in second if y > x)] += 1
        assert list(counts) == brute


def test_the_declared_level_picks_the_narrowest_interval_that_reaches_it():
    assert intervals.rank_order(5, 5) == (3, pytest.approx(1 - 2 * 4 / 252))  # 96.8 %; k = 4 would be 94.4 %
    assert intervals.rank_order(5, 5, 0.94) == (4, pytest.approx(1 - 2 * 7 / 252))
    k, coverage = intervals.rank_order(3, 3)
    assert k is None and coverage == pytest.approx(0.9)
    short = intervals.log_shift([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert short["low"] is None and "no distribution-free interval reaches 95%" in short["reason"]
    assert short["estimate"] == pytest.approx(math.log(2.1 / 1.1), rel=0.05)
    assert intervals.verdict(short, 0.01)[0] == intervals.CANNOT_TELL
    with pytest.raises(ValueError, match="positive and finite"):
        intervals.log_shift([1.0, 0.0], [1.0, 2.0])


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


FAMILIES = st.sampled_from(["normal", "uniform", "right-skewed", "mixture"])


def _most_misses(cases: int, rate: float, tail: float = 1e-4) -> int:
    """The largest count of misses Binomial(cases, rate) exceeds with probability below `tail`."""
    above = 1.0
    for count in range(cases + 1):
        above -= math.comb(cases, count) * rate ** count * (1 - rate) ** (cases - count)
        if above < tail:
            return count
    return cases


THRESHOLD = protocol.SMALLEST_TIMING_EFFECT


@settings(max_examples=25, deadline=None, derandomize=True)
@given(family=FAMILIES, spread=st.floats(0.005, 0.3), shift=st.floats(-0.5, 0.5), seed=st.integers(0, 2**32 - 1))
def test_the_interval_covers_a_known_shift_at_its_stated_rate(family, spread, shift, seed):
    rng = random.Random(seed)
    covered = 0
    for _ in range(CASES):
        a, b = _samples(rng, family, spread, shift)
        found = intervals.log_shift(a, b)
        assert found["coverage"] == pytest.approx(244 / 252)
        covered += found["low"] <= shift <= found["high"]
    # the stated coverage: misses beyond what Binomial(CASES, 1 - coverage) exceeds once in 10,000 fail the test
    assert CASES - covered <= _most_misses(CASES, 1 - 244 / 252), (
        f"{covered} of {CASES} intervals covered the true shift {shift} ({family}, {spread})")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(family=FAMILIES, spread=st.floats(0.005, 0.3), seed=st.integers(0, 2**32 - 1))
def test_with_no_shift_a_direction_is_claimed_no_more_often_than_the_interval_misses(family, spread, seed):
    # under no shift a claim needs the whole interval beyond the threshold, so at most the interval's miss rate,
    # 1 - coverage (3.2 % at 5 against 5); a verdict gated by anything looser than the interval would exceed it
    rng = random.Random(seed)
    claims = misses = 0
    for _ in range(CASES):
        effect = intervals.log_shift(*_samples(rng, family, spread, 0.0))
        claims += intervals.verdict(effect, THRESHOLD)[0] != intervals.CANNOT_TELL
        misses += not effect["low"] <= 0 <= effect["high"]
    allowed = _most_misses(CASES, 1 - 244 / 252)
    assert misses <= allowed, f"{misses} of {CASES} intervals missed a zero shift ({family}, {spread})"
    assert claims <= misses, f"{claims} claims against {misses} misses ({family}, {spread})"


def test_a_shift_beyond_the_threshold_is_claimed_in_its_direction_and_one_inside_it_never():
    rng = random.Random(7)
    for shift, expected in ((0.4, intervals.FASTER), (-0.4, intervals.SLOWER), (0.1, intervals.FASTER),
                            (-0.1, intervals.SLOWER)):
        claims = sum(intervals.verdict(intervals.log_shift(*_samples(rng, "normal", 0.01, shift)), THRESHOLD)[0]
                     == expected for _ in range(CASES))
        assert claims == CASES, (shift, claims)
    # 2 % with a 0.2 % spread: the interval is narrow and clear of zero, but inside the declared 3 %
    inside = [intervals.verdict(intervals.log_shift(*_samples(rng, "normal", 0.002, 0.02)), THRESHOLD)
              for _ in range(CASES)]
    assert {v for v, _ in inside} == {intervals.CANNOT_TELL}
    assert "does not lie wholly above +3.0% or wholly below -2.9%" in inside[0][1]


def test_identical_samples_give_cannot_tell():
    times = [0.00407, 0.00409, 0.00411, 0.00413, 0.00415]
    effect = intervals.log_shift(times, list(times))
    assert effect["estimate"] == 0 and effect["low"] < 0 < effect["high"]
    assert intervals.verdict(effect, THRESHOLD)[0] == intervals.CANNOT_TELL
