"""The few measurements a class table and CSV show per run: the cache comparison's largest error, the median
local TTFT per timing prompt and cache setting, and the ratio of the median post-first-token intervals with
and without the cache per timing prompt (below 1: the cache made decode steps faster on that machine); beside
them the evidence those timings rest on: how many timing trials the declared rule marked contended, and the run's
own cache verdict per timing prompt (inferlab.measure.contention: 'cannot_tell' unless the interval lies beyond the
declared threshold).

They are read from the run's records through the report's own functions (inferlab.report.measures), so the
class page and the report cannot disagree on a number.
"""

from __future__ import annotations

from typing import Optional

from inferlab import protocol
from inferlab.measure import contention
from inferlab.reading.runview import RunView
from inferlab.report import measures as report_measures
from inferlab.report.fmt import is_number


def _median(values: list) -> Optional[float]:
    return report_measures.median(values)


def measurement_columns() -> list[str]:
    """The names of the measurements, in CSV order."""
    columns = ["cache_max_abs_diff"]
    for prompt_id in protocol.TIMING_PROMPTS:
        columns += [f"ttft_median_ms_{prompt_id}_cache_on", f"ttft_median_ms_{prompt_id}_cache_off"]
    columns += [f"decode_interval_ratio_on_off_{prompt_id}" for prompt_id in protocol.TIMING_PROMPTS]
    columns += ["timing_trials_contended", "timing_trials_without_cpu_evidence"]
    columns += [f"cache_verdict_interval_{prompt_id}" for prompt_id in protocol.TIMING_PROMPTS]
    return columns


def key_measurements(view: RunView) -> dict:
    """{column: value or None} for one run (milliseconds for TTFT; a ratio without unit)."""
    diffs = [r.get("max_abs_diff") for r in view.kind("cache_comparison") if is_number(r.get("max_abs_diff"))]
    found: dict = {"cache_max_abs_diff": max(diffs) if diffs else None}
    groups = report_measures.measured_trials(view)
    for prompt_id in protocol.TIMING_PROMPTS:
        for use_cache in (True, False):
            ttft = _median([t.get("ttft_s") for t in groups.get((prompt_id, use_cache), [])])
            found[f"ttft_median_ms_{prompt_id}_cache_{'on' if use_cache else 'off'}"] = \
                None if ttft is None else ttft * 1e3
    for prompt_id in protocol.TIMING_PROMPTS:
        found[f"decode_interval_ratio_on_off_{prompt_id}"] = decode_interval_ratio(view, prompt_id, groups)
    trials = view.kind("timing_trial")
    counts = contention.contention_counts(trials)
    evidence = bool(trials) and counts["without_evidence"] < counts["trials"]
    found["timing_trials_contended"] = counts["contended"] if evidence else None
    found["timing_trials_without_cpu_evidence"] = counts["without_evidence"] if trials else None
    verdicts = contention.cache_verdicts(trials) if trials else None
    for prompt_id in protocol.TIMING_PROMPTS:
        entry = next((v for v in (verdicts or {}).get("verdicts", []) if v["prompt_id"] == prompt_id
                      and v["metric"] == "mean_post_first_interval_s"), None)
        found[f"cache_verdict_interval_{prompt_id}"] = entry["verdict"] if entry and evidence else None
    return found


def decode_interval_ratio(view: RunView, prompt_id: str, groups: Optional[dict] = None) -> Optional[float]:
    """Median post-first-token interval with the cache over the one without, for one timing prompt."""
    groups = report_measures.measured_trials(view) if groups is None else groups
    on = _median([report_measures.post_first_interval(t) for t in groups.get((prompt_id, True), [])])
    off = _median([report_measures.post_first_interval(t) for t in groups.get((prompt_id, False), [])])
    return on / off if on is not None and off else None


def prompt_lengths(view: RunView) -> dict[str, Optional[int]]:
    """{timing prompt: its token length} as the run tokenized it."""
    lengths = {r.get("prompt_id"): r.get("length") for r in view.kind("input")}
    for record in view.kind("timing_trial"):
        lengths.setdefault(record.get("prompt_id"), record.get("prompt_length"))
    return {p: lengths.get(p) if isinstance(lengths.get(p), int) else None for p in protocol.TIMING_PROMPTS}
