"""An estimate and a confidence interval for the shift between two groups of times, and the verdict it supports.

Method (stated in every result): the Hodges-Lehmann estimate of the shift of log times, with its distribution-free
Mann-Whitney (Wilcoxon rank-sum) interval. For samples a (m values) and b (n values), take every pairwise
difference d = log(b_j) - log(a_i) (m·n of them), sorted. The estimate is their median; the interval runs from the
k-th smallest to the k-th largest, where k is the largest whole number for which the exact null distribution of the
Mann-Whitney U gives coverage 1 - 2·P(U <= k - 1) of at least the declared level. The interval covers the true
shift at that rate whenever the two groups' log times differ by a shift alone (the same spread and shape, any
shape) and the samples are independent; no normality is assumed.

Coverage is discrete: with 5 against 5 samples (252 equally likely rank arrangements) the achievable levels near
95 % are 94.4 % (k = 4) and 96.8 % (k = 3). DECLARED_LEVEL asks for at least 95 %, so a 5-against-5 interval is the
3rd smallest to the 3rd largest of the 25 differences, at 96.8 %: the narrowest interval that does not claim more
than it holds. With 3 against 3 no interval reaches 95 % (the widest, min to max, covers 90 %), and the result says
so instead of giving a weaker interval under the declared name.

A shift s of log times is a ratio exp(s) of times; fraction() turns it into exp(s) - 1 ("+5 %": b is 5 % longer).
verdict() claims a direction only when the whole interval lies beyond a fixed threshold on one side, so where there
is no shift it claims one at most as often as the interval misses, 1 - coverage. Pure arithmetic: nothing here reads a clock or a record.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache
from typing import Optional, Sequence

DECLARED_LEVEL = 0.95
METHOD = ("Hodges-Lehmann shift of log times with its distribution-free Mann-Whitney interval (exact U "
          "distribution; assumes independent samples whose log times differ by a shift alone)")
FASTER, SLOWER, CANNOT_TELL = "faster", "slower", "cannot_tell"


@lru_cache(maxsize=None)
def u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) equally likely rank arrangements give each value 0..m·n of Mann-Whitney's U."""
    if m < 0 or n < 0:
        raise ValueError(f"u_counts: group sizes must be >= 0, got {m} and {n}")
    if m == 0 or n == 0:
        return (1,)
    # the largest of the m + n values belongs to the first group (it beats all n others) or to the second
    with_first, with_second = u_counts(m - 1, n), u_counts(m, n - 1)
    counts = [0] * (m * n + 1)
    for u, count in enumerate(with_first):
        counts[u + n] += count
    for u, count in enumerate(with_second):
        counts[u] += count
    return tuple(counts)


def rank_order(m: int, n: int, level: float = DECLARED_LEVEL) -> tuple[Optional[int], float]:
    """(k, coverage): the largest k whose interval [d_(k), d_(mn+1-k)] covers at least `level`, and that
    coverage; (None, the widest interval's coverage) when even k = 1 falls short."""
    counts = u_counts(m, n)
    total = sum(counts)
    best, below = None, 0
    for k in range(1, m * n // 2 + 1):
        below += counts[k - 1]  # arrangements with U <= k - 1
        coverage = 1 - 2 * below / total
        if coverage + 1e-12 < level:
            break
        best = (k, coverage)
    if best is None:
        return None, 1 - 2 * counts[0] / total if m and n else 0.0
    return best


def log_shift(a: Sequence[float], b: Sequence[float], level: float = DECLARED_LEVEL) -> dict:
    """The shift of log(b) against log(a): estimate, interval [low, high] at `coverage` (None without one), method.

    a and b are positive times (any unit, the same for both).
    """
    a, b = [float(x) for x in a], [float(x) for x in b]
    bad = [x for x in a + b if not (x > 0 and math.isfinite(x))]
    if bad:
        raise ValueError(f"log_shift: times must be positive and finite, got {bad[:3]}")
    result = {"method": METHOD, "declared_level": level, "n_a": len(a), "n_b": len(b), "estimate": None,
              "low": None, "high": None, "coverage": None, "rank": None, "reason": None}
    if not a or not b:
        return {**result, "reason": f"a group has no sample ({len(a)} against {len(b)})"}
    differences = sorted(math.log(y) - math.log(x) for x in a for y in b)
    result["estimate"] = statistics.median(differences)
    k, coverage = rank_order(len(a), len(b), level)
    if k is None:
        return {**result, "coverage": coverage,
                "reason": f"with {len(a)} against {len(b)} samples no distribution-free interval reaches "
                          f"{level:.0%} (the widest, min to max, covers {coverage:.1%})"}
    return {**result, "low": differences[k - 1], "high": differences[-k], "coverage": coverage, "rank": k}


def fraction(shift: Optional[float]) -> Optional[float]:
    """A shift of log times as a fraction of time: exp(shift) - 1."""
    return None if shift is None else math.expm1(shift)


def verdict(effect: dict, threshold: float) -> tuple[str, str]:
    """(verdict, reason) for an interval of log(without) - log(with): faster when the whole interval lies above
    log(1 + threshold), slower when it lies below -log(1 + threshold), otherwise cannot tell. Nothing else gates it."""
    if effect.get("low") is None:
        return CANNOT_TELL, effect.get("reason") or "no interval"
    margin = math.log1p(threshold)
    words = (f"{fraction(effect['estimate']):+.1%} [{fraction(effect['low']):+.1%}, {fraction(effect['high']):+.1%}] "
             f"({effect['coverage']:.1%} interval)")
    if effect["low"] > margin:
        return FASTER, words + f": the whole interval lies above {fraction(margin):+.1%}"
    if effect["high"] < -margin:
        return SLOWER, words + f": the whole interval lies below {fraction(-margin):+.1%} (a ratio of 1/{1 + threshold:g})"
    return CANNOT_TELL, (words + f": the interval does not lie wholly above {fraction(margin):+.1%} or wholly below "
                                 f"{fraction(-margin):+.1%}")
