"""The report's three plots, drawn from records alone with matplotlib's Agg canvas (no display, no pyplot state).

Each plot is available only when its records exist; plot_specs() says which and why, so the
report can name a skipped plot without drawing anything. PNGs are written atomically with no
software or time metadata, so the same records give the same bytes with the same matplotlib.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.records import write_bytes_atomic

TOKEN_TIMES_PNG = "plot_token_times.png"
TTFT_INTERVAL_PNG = "plot_ttft_interval.png"
CACHE_DIFF_PNG = "plot_cache_max_abs_diff.png"
CACHE_COLOURS = {True: "tab:blue", False: "tab:orange"}
DPI = 100


def _token_times(record: dict) -> Optional[list]:
    for name in ("token_times", "token_times_s"):
        times = record.get(name)
        if isinstance(times, list) and times and all(isinstance(t, (int, float)) for t in times):
            return times
    return None


def measured_timing_trials(records: list[dict]) -> list[dict]:
    """Timing-trial records that are not warmups and carry selection times, in record order."""
    return [r for r in records if r.get("kind") == "timing_trial" and r.get("warmup") is False
            and _token_times(r) is not None]


def _post_first_interval(record: dict) -> Optional[float]:
    value = record.get("mean_post_first_interval_s")
    if isinstance(value, (int, float)):
        return value
    times = _token_times(record)
    return (times[-1] - times[0]) / (len(times) - 1) if times and len(times) > 1 else None


def _conditions(trials: list[dict]) -> list[tuple]:
    """(prompt_id, use_cache) pairs in schedule order, keeping only those with trials."""
    order = list(dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()))
    present = {(r.get("prompt_id"), r.get("use_cache")) for r in trials}
    return [c for c in order if c in present] + sorted((c for c in present if c not in order), key=str)


def _prompt_length(trials: list[dict], prompt_id: str) -> str:
    lengths = sorted({r.get("prompt_length") for r in trials if r.get("prompt_id") == prompt_id}, key=str)
    return "/".join(str(n) for n in lengths)


def plot_specs(records: list[dict]) -> list[dict]:
    """Each plot's file, title and whether its data exist (with the reason when not); draws nothing."""
    measured = measured_timing_trials(records)
    with_ttft = [r for r in measured if isinstance(r.get("ttft_s"), (int, float))]
    comparisons = [r for r in records if r.get("kind") == "cache_comparison"
                   and isinstance(r.get("prefix_length"), int) and isinstance(r.get("max_abs_diff"), (int, float))]
    return [
        {"name": "token_times", "file": TOKEN_TIMES_PNG, "section": "timing",
         "title": "Per-token time against token index, cache on and off, every measured trial",
         "available": bool(measured),
         "reason": None if measured else "no measured timing_trial record with token times"},
        {"name": "ttft_interval", "file": TTFT_INTERVAL_PNG, "section": "timing",
         "title": "Local TTFT and mean post-first-token interval per condition (individual values)",
         "available": bool(with_ttft),
         "reason": None if with_ttft else "no measured timing_trial record with ttft_s"},
        {"name": "cache_max_abs_diff", "file": CACHE_DIFF_PNG, "section": "cache",
         "title": "Matched-prefix cache comparison: max abs diff per prefix against the tolerance",
         "available": bool(comparisons),
         "reason": None if comparisons else "no cache_comparison record with a finite max_abs_diff"},
    ]


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: Path) -> None:
    buffer = io.BytesIO()
    # Software: None drops the version string; Agg PNGs carry no timestamp otherwise.
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    write_bytes_atomic(path, buffer.getvalue())


def draw_token_times(records: list[dict], path: Path) -> None:
    """Time since the previous selection for each token index, one line per measured trial, per prompt."""
    trials = measured_timing_trials(records)
    prompts = list(dict.fromkeys(p for p, _ in _conditions(trials)))
    figure = _figure(5.5 * len(prompts), 4.2)
    axes = figure.subplots(1, len(prompts), squeeze=False)[0]
    for axis, prompt_id in zip(axes, prompts):
        labelled = set()
        for record in (r for r in trials if r.get("prompt_id") == prompt_id):
            times = _token_times(record)
            # token 1 is measured from t_start, so it includes the prefill
            steps = [(t - p) * 1e3 for t, p in zip(times, [0.0, *times[:-1]])]
            use_cache = record.get("use_cache")
            label = None if use_cache in labelled else f"cache {'on' if use_cache else 'off'}"
            labelled.add(use_cache)
            axis.plot(range(1, len(steps) + 1), steps, marker=".", linewidth=0.8, alpha=0.75,
                      color=CACHE_COLOURS.get(use_cache, "grey"), label=label)
        axis.set_ylim(bottom=0)
        axis.set_xlabel("token index (1 = first selection)")
        axis.set_ylabel("ms since previous selection")
        axis.set_title(f"{prompt_id} (prompt length {_prompt_length(trials, prompt_id)} tokens)")
        axis.legend(loc="lower right")
        axis.grid(True, which="both", alpha=0.3)
    figure.suptitle("Per-token time, every measured trial (warmups not drawn); token 1 is timed from loop start, "
                    "so it includes the prefill")
    figure.tight_layout()
    _save(figure, path)


def draw_ttft_interval(records: list[dict], path: Path) -> None:
    """Strips of individual TTFT and mean post-first-token interval values per (prompt, cache) condition."""
    trials = measured_timing_trials(records)
    conditions = _conditions(trials)
    figure = _figure(11, 4.2)
    axes = figure.subplots(1, 2)
    metrics = (("local TTFT (ms)", lambda r: r.get("ttft_s")),
               ("mean post-first-token interval (ms)", _post_first_interval))
    for axis, (title, value_of) in zip(axes, metrics):
        for x, (prompt_id, use_cache) in enumerate(conditions):
            values = [value_of(r) for r in trials if (r.get("prompt_id"), r.get("use_cache")) == (prompt_id, use_cache)]
            values = [v * 1e3 for v in values if isinstance(v, (int, float))]
            # a fixed spread instead of random jitter keeps the picture deterministic
            offsets = [(i - (len(values) - 1) / 2) * 0.06 for i in range(len(values))]
            axis.scatter([x + o for o in offsets], values, s=22, color=CACHE_COLOURS.get(use_cache, "grey"), zorder=3)
            if values:
                ordered = sorted(values)
                middle = len(ordered) // 2
                median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
                axis.hlines(median, x - 0.25, x + 0.25, color="black", linewidth=1.2, zorder=2)
        axis.set_xticks(range(len(conditions)))
        axis.set_xticklabels([f"{p}\ncache {'on' if c else 'off'}\nlen {_prompt_length(trials, p)}"
                              for p, c in conditions])
        axis.set_title(title + "; bar = median")
        axis.set_ylabel("ms")
        axis.grid(True, axis="y", alpha=0.3)
    figure.suptitle(f"Measured trials only; output length {protocol.TIMING_NEW_TOKENS} tokens each")
    figure.tight_layout()
    _save(figure, path)


def cache_floor(diffs: list[float], atol: float) -> float:
    """Where exact zeros are drawn on the log axis: a decade below the smallest non-zero value or atol."""
    positive = [d for d in diffs if d > 0]
    return min(positive + [atol]) / 10


def draw_cache_diff(records: list[dict], path: Path) -> None:
    """Max abs diff per prefix on a log axis, zeros drawn at a labelled floor, against the declared atol."""
    rows = [r for r in records if r.get("kind") == "cache_comparison"
            and isinstance(r.get("prefix_length"), int) and isinstance(r.get("max_abs_diff"), (int, float))]
    atol = protocol.CACHE_TOLERANCE.atol
    floor = cache_floor([r["max_abs_diff"] for r in rows], atol)
    figure = _figure(7, 4.2)
    axis = figure.subplots()
    nonzero = [r for r in rows if r["max_abs_diff"] > 0]
    zeros = [r for r in rows if r["max_abs_diff"] == 0]
    colours = ["tab:green" if r.get("passed") else "tab:red" for r in nonzero]
    axis.scatter([r["prefix_length"] for r in nonzero], [r["max_abs_diff"] for r in nonzero], color=colours,
                 zorder=3, label="max |cached - uncached| (green: passed, red: failed)")
    if zeros:
        axis.scatter([r["prefix_length"] for r in zeros], [floor] * len(zeros), facecolors="none",
                     edgecolors="black", zorder=3, label=f"exactly 0 (bitwise equal), drawn at {floor:.0e}")
    axis.axhline(atol, color="tab:red", linestyle="--",
                 label=f"atol = {atol:g}; per element the bound is atol + {protocol.CACHE_TOLERANCE.rtol:g}*|b|")
    axis.set_yscale("log")
    axis.set_xlabel("prefix length (tokens, prompt included)")
    axis.set_ylabel("max abs diff of logits")
    axis.set_xticks(sorted({r["prefix_length"] for r in rows}))
    axis.set_title("Matched-prefix cache comparison")
    axis.legend(loc="best", fontsize="small")
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    _save(figure, path)


DRAWERS = {"token_times": draw_token_times, "ttft_interval": draw_ttft_interval, "cache_max_abs_diff": draw_cache_diff}


def write_plots(record_dir: Path, records: list[dict]) -> list[dict]:
    """Draw every available plot into the record dir; returns plot_specs() with 'written' and any 'error'."""
    results = []
    for spec in plot_specs(records):
        spec = {**spec, "written": False, "error": None}
        if spec["available"]:
            try:
                DRAWERS[spec["name"]](records, Path(record_dir) / spec["file"])
                spec["written"] = True
            except Exception as error:  # a broken plot is reported in the report, not raised over it
                spec["error"] = f"{type(error).__name__}: {error}"
        results.append(spec)
    return results
