"""Part 5 summary formulas on worked examples with exact fractions (inferlab.measure.stats).

Worked run: t0 = 0 s (loop start), prefill plus first selection end at t1 = 1/2 s, then one
selection every 1/10 s, so t16 = 1/2 + 15/10 = 2 s.
"""

from fractions import Fraction

import pytest

from inferlab import protocol
from inferlab.measure import stats

N = protocol.TIMING_NEW_TOKENS
T1 = Fraction(1, 2)
STEP = Fraction(1, 10)
TOKEN_TIMES = [T1 + k * STEP for k in range(N)]  # t1..t16


def test_worked_run_has_sixteen_times_ending_at_two_seconds():
    assert (len(TOKEN_TIMES), TOKEN_TIMES[-1]) == (16, 2)


def test_mean_post_first_interval_is_t16_minus_t1_over_15():
    assert stats.mean_post_first_interval(TOKEN_TIMES) == Fraction(1, 10)


def test_throughput_includes_prompt_processing():
    assert stats.throughput_including_prompt(TOKEN_TIMES, t0=0) == 8  # 16 tokens / 2 s


def test_reciprocal_throughput_is_not_the_inter_token_latency():
    # 1/8 s per token spreads the 1/2 s prefill over all 16 tokens; the interval after the first is 1/10 s.
    reciprocal = 1 / stats.throughput_including_prompt(TOKEN_TIMES, t0=0)
    assert reciprocal == Fraction(1, 8)
    assert reciprocal != stats.mean_post_first_interval(TOKEN_TIMES)


# Three runs of 16 tokens taking 1 s, 2 s and 4 s: per-run rates 16, 8, 4 tokens/s.
RUN_TOKENS = [16, 16, 16]
RUN_SECONDS = [Fraction(1), Fraction(2), Fraction(4)]  # Fractions keep the division exact


def test_median_of_per_run_rates():
    assert stats.median_of_rates(RUN_TOKENS, RUN_SECONDS) == 8


def test_aggregate_rate_differs_from_the_median_of_rates():
    aggregate = stats.aggregate_rate(RUN_TOKENS, RUN_SECONDS)
    assert aggregate == Fraction(48, 7)
    assert aggregate != stats.median_of_rates(RUN_TOKENS, RUN_SECONDS)


@pytest.mark.parametrize("values, expected", [
    ([Fraction(3), Fraction(1), Fraction(2), Fraction(9), Fraction(5)], (5, Fraction(3), Fraction(1), Fraction(9))),
    ([Fraction(4), Fraction(1), Fraction(2), Fraction(9)], (4, Fraction(3), Fraction(1), Fraction(9))),
], ids=["five", "four"])
def test_median_min_max_keeps_every_value(values, expected):
    summary = stats.median_min_max(values)
    assert (summary["n"], summary["median"], summary["min"], summary["max"]) == expected
    assert summary["values"] == values


@pytest.mark.parametrize("call", [
    lambda: stats.mean_post_first_interval([T1]),
    lambda: stats.mean_post_first_interval([T1, T1 - STEP]),
    lambda: stats.throughput_including_prompt([T1], t0=T1),
    lambda: stats.median_of_rates([16, 16], [1]),
    lambda: stats.aggregate_rate([16], [0]),
    lambda: stats.median_min_max([]),
], ids=["one-time", "clock-backwards", "no-elapsed-time", "unpaired-runs", "zero-duration", "no-values"])
def test_summaries_refuse_inputs_that_have_no_meaning(call):
    with pytest.raises(ValueError):
        call()
