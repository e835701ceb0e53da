"""Declared timing summaries (Part 5): median/min/max, post-first-token interval, throughput conventions.

Pure arithmetic on numbers already measured; nothing here reads a clock or a model. Every function
accepts ints, floats or fractions.Fraction, so the analytic tests can check the formulas exactly.
"""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from inferlab import protocol


def median_min_max(values: Sequence) -> dict:
    """All values with their count, median, minimum and maximum (no value is dropped)."""
    values = list(values)
    if not values:
        raise ValueError("median_min_max: expected at least one value, got none")
    return {
        "n": len(values),
        "values": values,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def mean_post_first_interval(token_times: Sequence) -> float:
    """(t_n - t_1) / (n - 1) for selection times t_1..t_n; for 16 outputs, (t16 - t1) / 15.

    The prefill and the first selection lie before t_1, so they are not part of this interval.
    """
    times = list(token_times)
    if len(times) < 2:
        raise ValueError(f"mean_post_first_interval: expected at least 2 selection times, got {len(times)}")
    _check_non_decreasing("mean_post_first_interval", times)
    return (times[-1] - times[0]) / (len(times) - 1)


def post_first_interval_s(token_times_ns: Sequence[int]) -> Optional[float]:
    """(t_n - t_1) / (n - 1) in seconds from the loop's perf_counter_ns stamps t_1..t_n; None when n < 2.

    The one place the mean post-first-token interval of a trial is computed: from the integer stamps, so
    no rounding of the per-token seconds enters it.
    """
    times = list(token_times_ns)
    if len(times) < 2:
        return None
    return mean_post_first_interval(times) / 1e9


def throughput_including_prompt(token_times: Sequence, t0=0.0) -> float:
    """n / (t_n - t0): generated tokens per second counted from loop start t0, so prefill is included.

    Its reciprocal is (t_n - t0) / n, an average that spreads prefill over every token; it is not
    the inter-token latency, which mean_post_first_interval gives.
    """
    times = list(token_times)
    if not times:
        raise ValueError("throughput_including_prompt: expected at least 1 selection time, got none")
    _check_non_decreasing("throughput_including_prompt", [t0, *times])
    elapsed = times[-1] - t0
    if elapsed <= 0:
        raise ValueError(f"throughput_including_prompt: expected t_n > t0, got t_n={times[-1]!r}, t0={t0!r}")
    return len(times) / elapsed


def token_times(record: dict) -> Optional[list]:
    """A timing trial record's selection times in seconds from t_start (`token_times_s`), or None without them."""
    times = record.get("token_times_s")
    if isinstance(times, list) and times and all(_is_number(t) for t in times):
        return times
    return None


def trial_contended(record: dict) -> Optional[bool]:
    """A trial's recorded contention flag; None when the trial carries no evidence (an older run)."""
    flag = record.get("contended")
    return flag if isinstance(flag, bool) else None


def post_first_interval(record: dict) -> Optional[float]:
    """(t_n - t_1)/(n - 1) of one timing trial record: as recorded, else from its nanosecond stamps, else from
    its times in seconds; None when it has none of them."""
    if _is_number(record.get("mean_post_first_interval_s")):
        return record["mean_post_first_interval_s"]
    try:
        stamps = record.get("token_times_ns")
        if isinstance(stamps, list) and stamps and all(isinstance(t, int) and not isinstance(t, bool) for t in stamps):
            return post_first_interval_s(stamps)
        times = token_times(record)
        return mean_post_first_interval(times) if times else None
    except ValueError:
        return None


def _trial_interval(trial: dict) -> float:
    """A completed trial's post-first-token interval; a trial without one is an error, never left out."""
    interval = post_first_interval(trial)
    if interval is None:
        raise ValueError(f"timing_summary: trial {trial.get('schedule_id')}: expected at least 2 non-decreasing "
                         f"selection times, got {trial.get('token_times_s')!r}")
    return interval


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def median_of_rates(tokens: Sequence, seconds: Sequence) -> float:
    """Median over runs of tokens_i / seconds_i (convention: 'median per-run throughput')."""
    _check_runs("median_of_rates", tokens, seconds)
    return statistics.median([n / s for n, s in zip(tokens, seconds)])


def aggregate_rate(tokens: Sequence, seconds: Sequence) -> float:
    """sum(tokens) / sum(seconds) (convention: 'aggregate tokens over aggregate time').

    Longer runs weigh more here than in median_of_rates, so the two generally differ.
    """
    _check_runs("aggregate_rate", tokens, seconds)
    return sum(tokens) / sum(seconds)


def _check_runs(name: str, tokens: Sequence, seconds: Sequence) -> None:
    if len(tokens) != len(seconds):
        raise ValueError(f"{name}: expected one duration per run, got {len(tokens)} token counts and {len(seconds)} durations")
    if not tokens:
        raise ValueError(f"{name}: expected at least one run, got none")
    bad = [s for s in seconds if not s > 0]
    if bad:
        raise ValueError(f"{name}: expected every duration > 0 s, got {bad!r}")


def _check_non_decreasing(name: str, times: list) -> None:
    for earlier, later in zip(times, times[1:]):
        if later < earlier:
            raise ValueError(f"{name}: expected non-decreasing times from one monotonic clock, got {earlier!r} then {later!r}")


# --- summaries of a run's records (plain dicts in, plain dicts out) -----------------------------

THREE_SEEDS_CAVEAT = (
    "three seeds per condition neither estimate the output distribution nor identify a best temperature; "
    "different seeds may select the same tokens"
)
THROUGHPUT_CONVENTION = (
    "median of per-run values 16/(t16 - t0); includes prompt processing; its reciprocal is not inter-token latency"
)


def first_divergence(a: Sequence, b: Sequence):
    """Index of the first position where two id lists differ (a length difference counts); None if equal."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def stopped_early_on_eos(generation: dict, max_new_tokens: int = protocol.MAX_NEW_TOKENS) -> bool:
    """Whether a trial ended on EOS before its token budget: an EOS as the last allowed token is not early."""
    ids = generation.get("generated_ids")
    length = generation.get("generated_length", len(ids) if isinstance(ids, list) else None)
    counted = isinstance(length, int) and not isinstance(length, bool)
    return generation.get("stop_reason") == "eos" and counted and length < max_new_tokens


def sampling_summary(generations: list[dict], prompt_id: str) -> dict:
    """Repeatability and distinctness of one prompt's generation records (failed trials are counted, not hidden)."""
    rows = [g for g in generations if g["prompt_id"] == prompt_id]
    ok = completed(rows)
    greedy = [tuple(g["generated_ids"]) for g in ok if g["condition"] == "G"]
    first = next((g for g in ok if g["condition"] == "S1" and g["seed"] == 17 and not g["is_rerun"]), None)
    rerun = next((g for g in ok if g["is_rerun"]), None)
    per_condition = {}
    for condition in sorted({g["condition"] for g in ok}):
        ids = [tuple(g["generated_ids"]) for g in ok if g["condition"] == condition and not g["is_rerun"]]
        per_condition[condition] = {
            "trials": len(ids),
            "distinct_continuations": len(set(ids)),
            "early_eos": sum(1 for g in ok if g["condition"] == condition and not g["is_rerun"]
                             and stopped_early_on_eos(g)),
        }
    return {
        "prompt_id": prompt_id,
        "trials_recorded": len(rows),
        "trials_failed": [g["trial_id"] for g in rows if g.get("status") != "ok"],
        "greedy_repeatability": {
            "repetitions": len(greedy),
            "identical": len(greedy) > 1 and len(set(greedy)) == 1,
            "distinct_sequences": [list(s) for s in sorted(set(greedy))],
        },
        "seed_rerun": {
            "condition": "S1",
            "seed": 17,
            "first": first and first["generated_ids"],
            "rerun": rerun and rerun["generated_ids"],
            "identical": bool(first and rerun and first["generated_ids"] == rerun["generated_ids"]),
        },
        "per_condition": per_condition,
        "early_eos_total": sum(1 for g in ok if stopped_early_on_eos(g)),
        "early_eos_rule": f"stop_reason eos with fewer than {protocol.MAX_NEW_TOKENS} generated tokens",
        "caveat": THREE_SEEDS_CAVEAT,
    }


def completed(records: list[dict]) -> list[dict]:
    """The records whose trial completed (status ok); a failed trial's record holds only its error."""
    return [r for r in records if r.get("status") == "ok"]


def timing_summary(trials: list[dict], prompt_id: str, use_cache: bool) -> dict:
    """All measured values of one (prompt, cache) combination with their median, min and max; warmups excluded."""
    failed = [t["schedule_id"] for t in trials if t.get("status") != "ok"
              and t["prompt_id"] == prompt_id and t["use_cache"] == use_cache]
    trials = completed(trials)
    measured = [t for t in trials if t["prompt_id"] == prompt_id and t["use_cache"] == use_cache and not t["warmup"]]
    warmups = [t for t in trials if t["prompt_id"] == prompt_id and t["use_cache"] == use_cache and t["warmup"]]
    summary = {
        "prompt_id": prompt_id,
        "use_cache": use_cache,
        "measured_trials": len(measured),
        "failed_trials": failed,
        "warmups_excluded": len(warmups),
        "schedule_indices": [t["schedule_index"] for t in measured],
        "prompt_length": sorted({t["prompt_length"] for t in measured}),
        "output_length": sorted({t["output_length"] for t in measured}),
        "stopping_rule": measured[0]["stopping_rule"] if measured else None,
        "throughput_convention": THROUGHPUT_CONVENTION,
        "units": "seconds; throughput in tokens per second",
    }
    flags = [trial_contended(t) for t in measured]
    summary["contended_trials"] = [t["schedule_id"] for t, flag in zip(measured, flags) if flag is True]
    summary["trials_without_evidence"] = [t["schedule_id"] for t, flag in zip(measured, flags) if flag is None]
    summary["contention_rule"] = protocol.CONTENTION_RULE.describe()
    if not measured:
        return summary
    summary.update(_metric_summaries(measured))
    clean = [t for t, flag in zip(measured, flags) if flag is False]
    summary["uncontended"] = {
        "label": "median [min, max] of the uncontended samples only; the figures above hold every sample",
        "n": len(clean), "schedule_indices": [t["schedule_index"] for t in clean],
        **(_metric_summaries(clean) if clean else {}),
    }
    return summary


def _metric_summaries(measured: list[dict]) -> dict:
    """median_min_max of every timing metric over these trials (none is dropped)."""
    return {
        "prefill_s": median_min_max([t["prefill_s"] for t in measured]),
        "ttft_s": median_min_max([t["ttft_s"] for t in measured]),
        "mean_post_first_interval_s": median_min_max([_trial_interval(t) for t in measured]),
        "loop_s": median_min_max([t["loop_s"] for t in measured]),
        "throughput_tok_s": median_min_max([throughput_including_prompt(t["token_times_s"]) for t in measured]),
    }


def loop_vs_generate(trials: list[dict], generations: list[dict], prompt_id: str = "P1") -> dict:
    """The loop's cache-on ids against generate()'s greedy ids for the same prompt, through generate's EOS stop.

    No extra generate() call is made: the reference is the matrix's first greedy trial of this prompt.
    """
    loop = next((t for t in completed(trials) if t["prompt_id"] == prompt_id and t["use_cache"] and not t["warmup"]), None)
    reference = next((g for g in completed(generations) if g["prompt_id"] == prompt_id and g["condition"] == "G"),
                     None)
    if loop is None or reference is None:
        return {"prompt_id": prompt_id, "available": False, "equal": False, "loop_ids": None, "generate_ids": None,
                "first_difference": None, "reason": "missing a measured cache-on trial or an ok greedy trial"}
    generate_ids = reference["generated_ids"]
    loop_ids = loop["generated_ids"][: len(generate_ids)]  # generate stops at EOS; the loop does not
    return {
        "prompt_id": prompt_id,
        "available": True,
        "loop_trial": loop["schedule_id"],
        "generate_trial": reference["trial_id"],
        "generate_stop_reason": reference["stop_reason"],
        "compared_length": len(generate_ids),
        "loop_ids": loop_ids,
        "generate_ids": generate_ids,
        "first_difference": first_divergence(loop_ids, generate_ids),
        "equal": loop_ids == generate_ids,
        "not_compared": [p for p in {t["prompt_id"] for t in trials} if p != prompt_id],
        "note": "only prompts of the generation matrix have a generate() reference; no extra generate() call is made",
    }


def cache_divergence(trials: list[dict], prompt_id: str) -> dict:
    """First index where measured cache-on and cache-off ids differ, repetition by repetition."""
    measured = [t for t in completed(trials) if t["prompt_id"] == prompt_id and not t["warmup"]]
    by_repetition = {}
    for trial in measured:
        by_repetition.setdefault(trial["repetition"], {})[trial["use_cache"]] = trial["generated_ids"]
    pairs = []
    for repetition, paths in sorted(by_repetition.items()):
        if True in paths and False in paths:
            index = first_divergence(paths[True], paths[False])
            pairs.append({"repetition": repetition, "first_divergence": index, "identical": index is None})
    diverged = [p for p in pairs if not p["identical"]]
    return {
        "prompt_id": prompt_id,
        "pairs_compared": len(pairs),
        "pairs": pairs,
        "any_divergence": bool(diverged),
        "first_divergence": min((p["first_divergence"] for p in diverged), default=None),
        "meaning": ("ids diverged: later timings no longer compare identical prefixes; use the matched-prefix "
                    "test for correctness" if diverged else
                    "cache-on and cache-off selected identical ids in every measured pair"),
    }

