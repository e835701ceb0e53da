"""The arithmetic of a run's records: the declared timing summaries, an effect's interval and the cache verdict.

Pure Python on numbers already measured: nothing here reads a clock, a model or a file, so the experiment, the
report and the analytic tests share it (the formulas accept Fractions, so the worked examples check them exactly).
The interval and the verdict in words: docs/timing.md, "Intervals and the threshold".
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache
from typing import Optional, Sequence

from inferlab import protocol

# --- Part 5's formulas ---------------------------------------------------------------------------------------------


def median_min_max(values: Sequence) -> dict:
    """All values with their count, median, minimum and maximum (no value is dropped)."""
    values = list(values)
    if not values:
        raise ValueError("median_min_max: expected at least one value, got none")
    return {"n": len(values), "values": values, "median": statistics.median(values), "min": min(values),
            "max": max(values)}


def _non_decreasing(name: str, times: list) -> None:
    if any(later < earlier for earlier, later in zip(times, times[1:])):
        raise ValueError(f"{name}: expected non-decreasing times from one monotonic clock, got {times!r}")


def mean_post_first_interval(token_times: Sequence):
    """(t_n - t_1) / (n - 1) for selection times t_1..t_n (for 16 outputs, (t16 - t1) / 15): the prefill and the
    first selection lie before t_1, so they are not in it."""
    times = list(token_times)
    if len(times) < 2:
        raise ValueError(f"mean_post_first_interval: expected at least 2 selection times, got {len(times)}")
    _non_decreasing("mean_post_first_interval", times)
    return (times[-1] - times[0]) / (len(times) - 1)


def post_first_interval_s(token_times_ns: Sequence[int]) -> Optional[float]:
    """The mean post-first interval in seconds from the loop's integer perf_counter_ns stamps (no rounding of
    per-token seconds enters it); None when n < 2."""
    return mean_post_first_interval(token_times_ns) / 1e9 if len(token_times_ns) >= 2 else None


def throughput_including_prompt(token_times: Sequence, t0=0.0):
    """n / (t_n - t0): tokens per second from the loop's start t0, prompt processing included. Its reciprocal
    spreads the prefill over every token: it is not the inter-token latency (mean_post_first_interval)."""
    times = list(token_times)
    if not times:
        raise ValueError("throughput_including_prompt: expected at least 1 selection time, got none")
    _non_decreasing("throughput_including_prompt", [t0, *times])
    if times[-1] <= t0:
        raise ValueError(f"throughput_including_prompt: expected t_n > t0, got t_n={times[-1]!r}, t0={t0!r}")
    return len(times) / (times[-1] - t0)


def _runs(name: str, tokens: Sequence, seconds: Sequence) -> list:
    if len(tokens) != len(seconds) or not tokens:
        raise ValueError(f"{name}: expected one duration per run and at least one run, got {len(tokens)} token "
                         f"counts and {len(seconds)} durations")
    if not all(s > 0 for s in seconds):
        raise ValueError(f"{name}: expected every duration > 0 s, got {list(seconds)!r}")
    return list(zip(tokens, seconds))


def median_of_rates(tokens: Sequence, seconds: Sequence):
    """Median over runs of tokens_i / seconds_i (the convention 'median per-run throughput')."""
    return statistics.median(n / s for n, s in _runs("median_of_rates", tokens, seconds))


def aggregate_rate(tokens: Sequence, seconds: Sequence):
    """sum(tokens) / sum(seconds) ('aggregate tokens over aggregate time'): longer runs weigh more than in the
    median of rates, so the two generally differ."""
    _runs("aggregate_rate", tokens, seconds)
    return sum(tokens) / sum(seconds)


# --- reading one record ---------------------------------------------------------------------------------------------


def is_number(value) -> bool:
    """An int or float that is not a bool (a JSON number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def completed(records: list[dict]) -> list[dict]:
    """The records whose trial completed (status ok); a failed trial's record holds only its error."""
    return [r for r in records if r.get("status") == "ok"]


def token_times(record: dict) -> Optional[list]:
    """A timing trial's selection times in seconds from t_start (`token_times_s`), or None without them."""
    times = record.get("token_times_s")
    return times if isinstance(times, list) and times and all(map(is_number, times)) else None


def measured(trials: list[dict]) -> dict[tuple, list[dict]]:
    """Completed measured timing trials by (prompt_id, use_cache), the groups and each group in schedule order."""
    groups: dict[tuple, list[dict]] = {(t.prompt_id, t.use_cache): [] for t in protocol.timing_schedule()}
    for record in trials:
        if record.get("warmup") is False and record.get("status", "ok") == "ok":
            groups.setdefault((record.get("prompt_id"), record.get("use_cache")), []).append(record)
    return {k: sorted(v, key=lambda r: r.get("schedule_index", 0)) for k, v in groups.items() if v}


def trial_contended(record: dict) -> Optional[bool]:
    """A trial's recorded contention flag; None when it carries no evidence."""
    return record["contended"] if isinstance(record.get("contended"), bool) else None


def loop_cpu_share(record: dict) -> Optional[float]:
    """The loop span's recorded CPU share, or None."""
    evidence = record.get("cpu_evidence")
    loop = evidence.get("loop") if isinstance(evidence, dict) else None
    share = loop.get("cpu_share") if isinstance(loop, dict) else None
    return share if is_number(share) else None


def first_divergence(a: Sequence, b: Sequence) -> Optional[int]:
    """Index of the first position where two id lists differ (a length difference counts); None if equal."""
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return index if index is not None or len(a) == len(b) else min(len(a), len(b))


# --- summaries of a run's records -----------------------------------------------------------------------------------

TIMING_METRICS = ("prefill_s", "ttft_s", "mean_post_first_interval_s", "loop_s")
THROUGHPUT_CONVENTION = ("median of per-run values 16/(t16 - t0); includes prompt processing; its reciprocal is not "
                         "inter-token latency")


def stopped_early_on_eos(generation: dict, max_new_tokens: int = protocol.MAX_NEW_TOKENS) -> bool:
    """Whether a trial ended on EOS before its token budget: an EOS as the last allowed token is not early."""
    return generation.get("stop_reason") == "eos" and len(generation["generated_ids"]) < max_new_tokens


def sampling_summary(generations: list[dict], prompt_id: str) -> dict:
    """Repeatability and distinct continuations of one prompt's generation records (failed trials are named)."""
    rows = [g for g in generations if g["prompt_id"] == prompt_id]
    ok = completed(rows)
    greedy = [tuple(g["generated_ids"]) for g in ok if g["condition"] == "G"]
    first = next((g for g in ok if g["condition"] == protocol.RERUN_CONDITION and g["seed"] == protocol.RERUN_SEED
                  and not g["is_rerun"]), None)
    rerun = next((g for g in ok if g["is_rerun"]), None)
    per_condition = {}
    for condition in sorted({g["condition"] for g in ok}):
        trials = [g for g in ok if g["condition"] == condition and not g["is_rerun"]]
        per_condition[condition] = {"trials": len(trials),
                                    "distinct_continuations": len({tuple(g["generated_ids"]) for g in trials}),
                                    "early_eos": sum(map(stopped_early_on_eos, trials))}
    return {
        "prompt_id": prompt_id, "trials_recorded": len(rows),
        "trials_failed": [g["trial_id"] for g in rows if g.get("status") != "ok"],
        "greedy_repeatability": {"repetitions": len(greedy), "identical": len(greedy) > 1 and len(set(greedy)) == 1,
                                 "distinct_sequences": [list(s) for s in sorted(set(greedy))]},
        "seed_rerun": {"condition": protocol.RERUN_CONDITION, "seed": protocol.RERUN_SEED,
                       "first": first and first["generated_ids"], "rerun": rerun and rerun["generated_ids"],
                       "identical": bool(first and rerun and first["generated_ids"] == rerun["generated_ids"])},
        "per_condition": per_condition,
        "early_eos_total": sum(map(stopped_early_on_eos, ok)),
    }


def _metric_summaries(trials: list[dict]) -> dict:
    """median_min_max of every timing metric over these trials."""
    return {**{metric: median_min_max([t[metric] for t in trials]) for metric in TIMING_METRICS},
            "throughput_tok_s": median_min_max([throughput_including_prompt(t["token_times_s"]) for t in trials])}


def timing_summary(trials: list[dict], prompt_id: str, use_cache: bool) -> dict:
    """Every measured value of one (prompt, cache) combination with its median, min and max, warmups excluded; and
    the same over the uncontended trials only, labelled."""
    mine = [t for t in trials if t["prompt_id"] == prompt_id and t["use_cache"] == use_cache]
    measured = [t for t in completed(mine) if not t["warmup"]]
    flags = [trial_contended(t) for t in measured]
    summary = {
        "prompt_id": prompt_id, "use_cache": use_cache, "measured_trials": len(measured),
        "failed_trials": [t["schedule_id"] for t in mine if t.get("status") != "ok"],
        "warmups_excluded": sum(1 for t in completed(mine) if t["warmup"]),
        "schedule_indices": [t["schedule_index"] for t in measured],
        "prompt_length": sorted({t["prompt_length"] for t in measured}),
        "output_length": sorted({t["output_length"] for t in measured}),
        "throughput_convention": THROUGHPUT_CONVENTION,
        "contended_trials": [t["schedule_id"] for t, flag in zip(measured, flags) if flag is True],
        "trials_without_evidence": [t["schedule_id"] for t, flag in zip(measured, flags) if flag is None],
    }
    if measured:
        clean = [t for t, flag in zip(measured, flags) if flag is False]
        summary.update(_metric_summaries(measured))
        summary["uncontended"] = {
            "label": "median [min, max] of the uncontended samples only; the figures above hold every sample",
            "n": len(clean), "schedule_indices": [t["schedule_index"] for t in clean],
            **(_metric_summaries(clean) if clean else {})}
    return summary


def cache_divergence(trials: list[dict], prompt_id: str) -> dict:
    """First index where measured cache-on and cache-off ids differ, repetition by repetition."""
    by_repetition: dict = {}
    for trial in completed(trials):
        if trial["prompt_id"] == prompt_id and not trial["warmup"]:
            by_repetition.setdefault(trial["repetition"], {})[trial["use_cache"]] = trial["generated_ids"]
    pairs = [{"repetition": repetition, "first_divergence": first_divergence(paths[True], paths[False]),
              "identical": paths[True] == paths[False]}
             for repetition, paths in sorted(by_repetition.items()) if True in paths and False in paths]
    diverged = [p["first_divergence"] for p in pairs if not p["identical"]]
    return {"prompt_id": prompt_id, "pairs_compared": len(pairs), "pairs": pairs, "any_divergence": bool(diverged),
            "first_divergence": min(diverged, default=None)}


# --- an effect's interval and the verdict it supports ----------------------------------------------------------------

DECLARED_LEVEL = 0.95
METHOD = ("Hodges-Lehmann shift of log times with its distribution-free Mann-Whitney interval (exact U "
          "distribution; assumes independent samples whose log times differ by a shift alone)")
FASTER, SLOWER, CANNOT_TELL = "faster", "slower", "cannot_tell"


@lru_cache(maxsize=None)
def u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) equally likely rank arrangements give each value 0..m·n of Mann-Whitney's U."""
    if m == 0 or n == 0:
        return (1,)
    # the largest of the m + n values is the first group's (it beats all n others) or the second's
    counts = [0] * (m * n + 1)
    for u, count in enumerate(u_counts(m - 1, n)):
        counts[u + n] += count
    for u, count in enumerate(u_counts(m, n - 1)):
        counts[u] += count
    return tuple(counts)


def rank_order(m: int, n: int, level: float = DECLARED_LEVEL) -> tuple[Optional[int], float]:
    """(k, coverage): the largest k whose interval [d_(k), d_(mn+1-k)] covers at least `level`, and that coverage;
    (None, the widest interval's coverage) when even k = 1 falls short."""
    counts = u_counts(m, n)
    total, best, below = sum(counts), None, 0
    for k in range(1, m * n // 2 + 1):
        below += counts[k - 1]  # arrangements with U <= k - 1
        if 1 - 2 * below / total + 1e-12 < level:
            break
        best = (k, 1 - 2 * below / total)
    return best or (None, 1 - 2 * counts[0] / total if m and n else 0.0)


def log_shift(a: Sequence[float], b: Sequence[float], level: float = DECLARED_LEVEL) -> dict:
    """The shift of log(b) against log(a) for positive times: estimate, interval [low, high] at `coverage` (None
    without one, with the reason), method."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if not all(x > 0 and math.isfinite(x) for x in a + b):
        raise ValueError(f"log_shift: times must be positive and finite, got {a} and {b}")
    result = {"method": METHOD, "estimate": None, "low": None, "high": None, "coverage": None, "reason": None}
    if not a or not b:
        return {**result, "reason": f"a group has no sample ({len(a)} against {len(b)})"}
    differences = sorted(math.log(y) - math.log(x) for x in a for y in b)
    result["estimate"] = statistics.median(differences)
    k, coverage = rank_order(len(a), len(b), level)
    if k is None:
        return {**result, "coverage": coverage,
                "reason": f"with {len(a)} against {len(b)} samples no distribution-free interval reaches "
                          f"{level:.0%} (the widest, min to max, covers {coverage:.1%})"}
    return {**result, "low": differences[k - 1], "high": differences[-k], "coverage": coverage}


def fraction(shift: Optional[float]) -> Optional[float]:
    """A shift of log times as a fraction of time: exp(shift) - 1 ("+5 %": 5 % longer)."""
    return None if shift is None else math.expm1(shift)


def verdict(effect: dict, threshold: float) -> tuple[str, str]:
    """(verdict, reason) for an interval of log(without) - log(with): faster when it lies wholly above
    log(1 + threshold), slower when wholly below -log(1 + threshold), else cannot tell. Nothing else gates it."""
    if effect.get("low") is None:
        return CANNOT_TELL, effect.get("reason") or "no interval"
    margin = math.log1p(threshold)
    words = (f"{fraction(effect['estimate']):+.1%} [{fraction(effect['low']):+.1%}, {fraction(effect['high']):+.1%}] "
             f"({effect['coverage']:.1%} interval)")
    if effect["low"] > margin:
        return FASTER, words + f": the whole interval lies above {fraction(margin):+.1%}"
    if effect["high"] < -margin:
        return SLOWER, (words + f": the whole interval lies below {fraction(-margin):+.1%} (a ratio of "
                                f"1/{1 + threshold:g})")
    return CANNOT_TELL, (words + f": the interval does not lie wholly above {fraction(margin):+.1%} or wholly below "
                                 f"{fraction(-margin):+.1%}")


# --- the cache verdict on each metric's own samples ------------------------------------------------------------------


def cache_verdict(trials: list[dict], prompt_id: str, metric: str,
                  threshold: float = protocol.SMALLEST_TIMING_EFFECT) -> dict:
    """'faster', 'slower' or 'cannot_tell' for the cache on this metric and prompt, from this metric's own samples
    (uncontended ones when each side has enough: `samples` says which): the shift of log times without against with
    the cache (positive: the cache is faster), its interval, and `effect`, its estimate as a fraction of time."""
    groups = measured(trials)
    on, off = groups.get((prompt_id, True), []), groups.get((prompt_id, False), [])
    clean = [[t for t in group if trial_contended(t) is False] for group in (on, off)]
    enough = all(len(group) >= protocol.VERDICT_MIN_UNCONTENDED for group in clean)
    samples, (used_on, used_off) = ("uncontended", clean) if enough else ("all", (on, off))
    groups = []
    for used in (used_on, used_off):
        kept = [(t.get("schedule_id"), t.get(metric)) for t in used if is_number(t.get(metric)) and t[metric] > 0]
        values = [v for _, v in kept]
        spread = median_min_max(values) if values else {"n": 0, "values": [], "median": None, "min": None, "max": None}
        groups.append({**spread, "schedule_ids": [name for name, _ in kept]})
    shift = log_shift(groups[0]["values"], groups[1]["values"])
    interval = {**shift, **{f"{name}_fraction": fraction(shift[name]) for name in ("estimate", "low", "high")}}
    found, reason = verdict(interval, threshold)
    if samples == "all":
        reason += (f"; from all samples: fewer than {protocol.VERDICT_MIN_UNCONTENDED} of them uncontended on a side "
                   f"(cache on {len(clean[0])}, off {len(clean[1])}; the others contended or without CPU evidence)")
    used = {id(t) for t in used_on + used_off}
    return {"prompt_id": prompt_id, "metric": metric, "verdict": found, "reason": reason, "samples": samples,
            "threshold": threshold, "effect": interval["estimate_fraction"], "interval": interval,
            "cache_on": groups[0], "cache_off": groups[1],
            "not_used": [t.get("schedule_id") for t in on + off if id(t) not in used]}


def cache_verdicts(trials: list[dict]) -> dict:
    """The declared threshold and one verdict per timing prompt and metric."""
    return {"threshold": protocol.SMALLEST_TIMING_EFFECT,
            "verdicts": [cache_verdict(trials, p, m) for p in protocol.TIMING_PROMPTS
                         for m in ("mean_post_first_interval_s", "loop_s")]}
