"""The report's four plots, drawn from records alone with matplotlib's Agg canvas (no display, no pyplot state).

Each plot is available only when its records exist; plot_specs() says which and why, so the
report can name a skipped plot without drawing anything. The plots are meant to survive a noisy
machine: axes used for comparison start at zero (or say they do not), one outlier is drawn at a
clipped edge with its value written beside it instead of flattening the rest, legends sit outside
the axes, and the plots of a partial run say so in their title. PNGs are written atomically with
no software or time metadata, so the same records give the same bytes with the same matplotlib.
"""

from __future__ import annotations

import io
import statistics
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.files import write_bytes_atomic
from inferlab.measure.stats import post_first_interval, token_times

TOKEN_TIMES_PNG = "plot_token_times.png"
TTFT_INTERVAL_PNG = "plot_ttft_interval.png"
CACHE_DIFF_PNG = "plot_cache_max_abs_diff.png"
CPU_SHARE_PNG = "plot_cpu_share.png"
CACHE_COLOURS = {True: "tab:blue", False: "tab:orange"}
PARTIAL_PREFIX = "PARTIAL RUN"
DPI = 100


def measured_timing_trials(records: list[dict]) -> list[dict]:
    """Timing-trial records that are not warmups and carry selection times, in record order."""
    return [r for r in records if r.get("kind") == "timing_trial" and r.get("warmup") is False
            and token_times(r) is not None]


def _conditions(trials: list[dict]) -> list[tuple]:
    """(prompt_id, use_cache) pairs in schedule order, keeping only those with trials."""
    order = list(dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()))
    present = {(r.get("prompt_id"), r.get("use_cache")) for r in trials}
    return [c for c in order if c in present] + sorted((c for c in present if c not in order), key=str)


def _prompt_length(trials: list[dict], prompt_id: str) -> str:
    lengths = sorted({r.get("prompt_length") for r in trials if r.get("prompt_id") == prompt_id}, key=str)
    return "/".join(str(n) for n in lengths)


def trials_with_evidence(records: list[dict]) -> list[dict]:
    """Completed timing trials (warmups included) whose loop span has a CPU share, in schedule order."""
    from inferlab.measure.stats import loop_cpu_share

    found = [r for r in records if r.get("kind") == "timing_trial" and r.get("status", "ok") == "ok"
             and loop_cpu_share(r) is not None and isinstance(r.get("loop_s"), (int, float))]
    return sorted(found, key=lambda r: r.get("schedule_index", 0))


def _cache_rows(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "cache_comparison"
            and isinstance(r.get("prefix_length"), int) and isinstance(r.get("max_abs_diff"), (int, float))]


def plot_specs(records: list[dict]) -> list[dict]:
    """Each plot's file, title and whether its data exist (with the reason when not); draws nothing."""
    measured = measured_timing_trials(records)
    with_ttft = [r for r in measured if isinstance(r.get("ttft_s"), (int, float))]
    comparisons = _cache_rows(records)
    evidence = trials_with_evidence(records)
    return [
        {"name": "token_times", "file": TOKEN_TIMES_PNG, "section": "timing",
         "title": "Per-token time against token index, cache on and off, every measured trial",
         "available": bool(measured),
         "reason": None if measured else "no measured timing_trial record with token times"},
        {"name": "ttft_interval", "file": TTFT_INTERVAL_PNG, "section": "timing",
         "title": "Local TTFT and mean post-first-token interval per condition (individual values)",
         "available": bool(with_ttft),
         "reason": None if with_ttft else "no measured timing_trial record with ttft_s"},
        {"name": "cpu_share", "file": CPU_SHARE_PNG, "section": "timing",
         "title": "Each timing trial in schedule order: its loop time, and the CPU share of its loop and prefill",
         "available": bool(evidence),
         "reason": None if evidence else "no timing_trial record with its thread's CPU readings"},
        {"name": "cache_max_abs_diff", "file": CACHE_DIFF_PNG, "section": "cache",
         "title": "Matched-prefix cache comparison: max abs diff, and max error as a fraction of each element's bound",
         "available": bool(comparisons),
         "reason": None if comparisons else "no cache_comparison record with a finite max_abs_diff"},
    ]


# --- drawing helpers -------------------------------------------------------------------------------


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # constrained layout makes room for a legend placed outside the axes ("outside ..." locations)
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: Path) -> None:
    buffer = io.BytesIO()
    # Software: None drops the version string; Agg PNGs carry no timestamp otherwise.
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    write_bytes_atomic(path, buffer.getvalue())


def _title(figure, text: str, partial: Optional[str]) -> None:
    """The figure's title; a partial run's plot says so first, in red."""
    if partial:
        figure.suptitle(f"{PARTIAL_PREFIX}: {partial}\n{text}", color="tab:red")
    else:
        figure.suptitle(text)


def clip_limit(values: list[float]) -> Optional[float]:
    """An upper axis limit that keeps the bulk of `values` readable, or None when nothing needs clipping.

    The bulk ends at Q3 + 3*IQR + a quarter of the median (the last term keeps a nearly constant
    series from calling small jitter an outlier). Only values more than twice the bulk's largest
    value are clipped: below that, drawing them costs the bulk at most half of the axis.
    """
    finite = sorted(v for v in values if isinstance(v, (int, float)))
    if len(finite) < 4:
        return None
    q1, _, q3 = statistics.quantiles(finite, n=4)
    fence = q3 + 3 * (q3 - q1) + 0.25 * abs(statistics.median(finite))
    bulk = [v for v in finite if v <= fence]
    if not bulk or finite[-1] <= 2 * bulk[-1]:
        return None
    return max(v for v in finite if v <= 2 * bulk[-1]) * 1.15


def _mark_clipped(axis, points: list[tuple[float, float]], top: Optional[float], colour: str) -> list[tuple]:
    """Draw points above `top` at the edge as open triangles with their value; return the points kept."""
    if top is None:
        return points
    kept = [(x, y) for x, y in points if y <= top]
    for number, (x, y) in enumerate((x, y) for x, y in points if y > top):
        edge = top * 0.97
        axis.scatter([x], [edge], marker="^", s=50, facecolors="none", edgecolors=colour, zorder=4)
        # successive labels step down so that neighbouring outliers do not print over each other
        axis.annotate(f"{y:.3g}", (x, edge), textcoords="offset points", xytext=(4, -10 - 9 * (number % 3)),
                      fontsize="small", color=colour)
    return kept


def _legend_below(figure, axes) -> None:
    handles, labels = [], []
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize="small")


# --- the three plots ---------------------------------------------------------------------------------


def draw_token_times(records: list[dict], path: Optional[Path], partial: Optional[str] = None):
    """Time since the previous selection for each token index, one line per measured trial, per prompt."""
    trials = measured_timing_trials(records)
    prompts = list(dict.fromkeys(p for p, _ in _conditions(trials)))
    figure = _figure(5.5 * len(prompts), 4.6)
    axes = figure.subplots(1, len(prompts), squeeze=False)[0]
    clipped_any = False
    for axis, prompt_id in zip(axes, prompts):
        series = []
        for record in (r for r in trials if r.get("prompt_id") == prompt_id):
            times = token_times(record)
            # token 1 is measured from t_start, so it includes the prefill
            steps = [(t - p) * 1e3 for t, p in zip(times, [0.0, *times[:-1]])]
            series.append((record.get("use_cache"), steps))
        top = clip_limit([v for _, steps in series for v in steps])
        clipped_any = clipped_any or top is not None
        for use_cache, steps in series:
            colour = CACHE_COLOURS.get(use_cache, "grey")
            points = _mark_clipped(axis, list(zip(range(1, len(steps) + 1), steps)), top, colour)
            # a clipped point leaves a gap in its line rather than a line drawn to the wrong height
            xs = [x if (x, y) in points else None for x, y in zip(range(1, len(steps) + 1), steps)]
            ys = [y if x is not None else float("nan") for x, y in zip(xs, steps)]
            axis.plot(range(1, len(steps) + 1), ys, marker=".", linewidth=0.8, alpha=0.75, color=colour,
                      label=f"cache {'on' if use_cache else 'off'}")
        axis.set_ylim(bottom=0, top=top)
        axis.set_xlabel("token index (1 = first selection, includes the prefill)")
        axis.set_ylabel("ms since previous selection (axis from 0)")
        count = sum(1 for r in trials if r.get("prompt_id") == prompt_id)
        axis.set_title(f"{prompt_id}: prompt {_prompt_length(trials, prompt_id)} tokens, {count} measured trials")
        axis.grid(True, which="both", alpha=0.3)
    _legend_below(figure, axes)
    note = "; triangles: values above the clipped axis, with their value" if clipped_any else ""
    _title(figure, f"Per-token time, every measured trial (warmups not drawn){note}", partial)
    if path is not None:
        _save(figure, path)
    return figure


def draw_ttft_interval(records: list[dict], path: Optional[Path], partial: Optional[str] = None):
    """Strips of individual TTFT and mean post-first-token interval values per (prompt, cache) condition."""
    trials = measured_timing_trials(records)
    conditions = _conditions(trials)
    figure = _figure(11, 4.8)
    axes = figure.subplots(1, 2)
    metrics = (("local TTFT", lambda r: r.get("ttft_s")), ("mean post-first-token interval", post_first_interval))
    for axis, (title, value_of) in zip(axes, metrics):
        per_condition = []
        for prompt_id, use_cache in conditions:
            values = [value_of(r) for r in trials if (r.get("prompt_id"), r.get("use_cache")) == (prompt_id, use_cache)]
            per_condition.append([v * 1e3 for v in values if isinstance(v, (int, float))])
        top = clip_limit([v for values in per_condition for v in values])
        for x, ((prompt_id, use_cache), values) in enumerate(zip(conditions, per_condition)):
            colour = CACHE_COLOURS.get(use_cache, "grey")
            # a fixed spread instead of random jitter keeps the picture deterministic
            offsets = [(i - (len(values) - 1) / 2) * 0.06 for i in range(len(values))]
            points = _mark_clipped(axis, [(x + o, v) for o, v in zip(offsets, values)], top, colour)
            axis.scatter([p[0] for p in points], [p[1] for p in points], s=22, color=colour, zorder=3,
                         label=f"cache {'on' if use_cache else 'off'}: one measured trial")
            if values:
                axis.hlines(statistics.median(values), x - 0.25, x + 0.25, color="black", linewidth=1.2, zorder=2,
                            label="median of the condition")
        axis.set_ylim(bottom=0, top=top)
        axis.set_xticks(range(len(conditions)))
        axis.set_xticklabels([f"{p}\ncache {'on' if c else 'off'}\nlen {_prompt_length(trials, p)}"
                              for p, c in conditions])
        axis.set_title(title)
        axis.set_ylabel("ms (axis from 0)")
        axis.grid(True, axis="y", alpha=0.3)
    _legend_below(figure, axes)
    _title(figure, f"{len(trials)} measured trials, {protocol.TIMING_NEW_TOKENS} output tokens each", partial)
    if path is not None:
        _save(figure, path)
    return figure


# what else ran inside a trial's spans (contention.DISTURBANCES): marker, colour, legend words
DISTURBANCE_MARKERS = {"collection": ("o", "tab:purple", "garbage collection"),
                       "major_fault": ("s", "tab:brown", "major page fault")}
DISTURBANCE_SIZES = {"collection": 170, "major_fault": 120}


def draw_cpu_share(records: list[dict], path: Optional[Path], partial: Optional[str] = None):
    """Two panels sharing the schedule index: each trial's loop time above, its spans' CPU share below, against the
    declared rule's threshold; contended trials are drawn red, warmups hollow; a trial inside whose spans a
    collection or a page fault happened is ringed, one ring per kind, each in the legend."""
    from inferlab.measure.stats import loop_cpu_share

    trials = trials_with_evidence(records)
    rule = protocol.CONTENTION_RULE
    figure = _figure(11, 6.4)
    top, bottom = figure.subplots(2, 1, sharex=True)
    for use_cache in (True, False):
        chosen = [r for r in trials if r.get("use_cache") is use_cache]
        colour = CACHE_COLOURS[use_cache]
        for warmup in (False, True):
            group = [r for r in chosen if bool(r.get("warmup")) is warmup]
            if not group:
                continue
            xs = [r.get("schedule_index", 0) for r in group]
            label = f"cache {'on' if use_cache else 'off'}" + (" (warmup)" if warmup else "")
            face = "none" if warmup else colour
            top.scatter(xs, [r["loop_s"] * 1e3 for r in group], s=26, facecolors=face, edgecolors=colour, zorder=3,
                        label=label)
            bottom.scatter(xs, [loop_cpu_share(r) for r in group], s=26, facecolors=face, edgecolors=colour,
                           zorder=3)
    contended = [r for r in trials if r.get("contended") is True]
    if contended:
        xs = [r.get("schedule_index", 0) for r in contended]
        top.scatter(xs, [r["loop_s"] * 1e3 for r in contended], marker="x", s=60, color="tab:red", zorder=4,
                    label="contended (declared rule)")
        bottom.scatter(xs, [loop_cpu_share(r) for r in contended], marker="x", s=60, color="tab:red", zorder=4)
    for kind, (marker, colour, words) in DISTURBANCE_MARKERS.items():
        hit = [r for r in trials if kind in (r.get("disturbed_by") or [])]
        if hit:  # rings around the trial's own loop-time dot, larger the rarer the kind
            top.scatter([r.get("schedule_index", 0) for r in hit], [r["loop_s"] * 1e3 for r in hit], marker=marker,
                        s=DISTURBANCE_SIZES[kind], facecolors="none", edgecolors=colour, linewidths=1.1, zorder=5,
                        label=f"{words} inside a span ({len(hit)})")
    prefill = [(r.get("schedule_index", 0), ((r.get("cpu_evidence") or {}).get("prefill") or {}).get("cpu_share"))
               for r in trials]
    prefill = [(x, y) for x, y in prefill if isinstance(y, (int, float))]
    if prefill:
        bottom.scatter([x for x, _ in prefill], [y for _, y in prefill], marker="_", s=80, color="black", zorder=2,
                       label="prefill span's share")
    bottom.axhline(rule.min_cpu_share, color="tab:red", linestyle="--",
                   label=f"rule: contended below {rule.min_cpu_share:g}")
    top.set_ylim(bottom=0)
    top.set_ylabel("loop ms (axis from 0)")
    top.set_title("Loop time per trial (16 selections, prefill included)")
    shares = [loop_cpu_share(r) for r in trials] + [y for _, y in prefill]
    bottom.set_ylim(0, max(1.05, max(shares, default=1) * 1.02))
    bottom.set_ylabel("thread CPU time / wall time")
    bottom.set_xlabel("schedule index (order the trials ran)")
    bottom.set_title("CPU share of each trial's loop span (dots) and prefill span (bars)")
    for axis in (top, bottom):
        axis.grid(True, alpha=0.3)
    _legend_below(figure, [top, bottom])
    _title(figure, f"{len(trials)} timing trials, {len(contended)} contended", partial)
    if path is not None:
        _save(figure, path)
    return figure


def cache_floor(values: list[float], reference: float) -> float:
    """Where exact zeros are drawn on a log axis: a decade below the smallest non-zero value or the reference."""
    positive = [d for d in values if d > 0]
    return min(positive + [reference]) / 10


def _log_panel(axis, rows: list[dict], field: str, reference: float, reference_label: str, ylabel: str) -> None:
    usable = [r for r in rows if isinstance(r.get(field), (int, float))]
    floor = cache_floor([r[field] for r in usable], reference)
    nonzero = [r for r in usable if r[field] > 0]
    zeros = [r for r in usable if r[field] == 0]
    for passed, colour, label in ((True, "tab:green", "prefix passed"), (False, "tab:red", "prefix failed")):
        chosen = [r for r in nonzero if bool(r.get("passed")) is passed]
        if chosen:
            axis.scatter([r["prefix_length"] for r in chosen], [r[field] for r in chosen], color=colour, zorder=3,
                         label=label)
    if zeros:
        axis.scatter([r["prefix_length"] for r in zeros], [floor] * len(zeros), facecolors="none",
                     edgecolors="black", zorder=3, label="exactly 0 (bitwise equal), drawn at the bottom")
    axis.axhline(reference, color="tab:red", linestyle="--", label=reference_label)
    axis.set_yscale("log")
    axis.set_xlabel("prefix length (tokens, prompt included)")
    axis.set_ylabel(ylabel)
    axis.set_xticks(sorted({r["prefix_length"] for r in rows}))
    axis.grid(True, which="both", alpha=0.3)


def draw_cache_diff(records: list[dict], path: Optional[Path], partial: Optional[str] = None,
                    bound_ratios: Optional[list[dict]] = None):
    """Per prefix: max abs diff against atol, and max |a-b| / (atol + rtol*|b|) against 1 (log axes).

    bound_ratios holds {prefix_length, bound_ratio, passed} computed from the recorded logit tensors;
    without them the second panel says the tensors were not available.
    """
    rows = _cache_rows(records)
    tolerance = protocol.CACHE_TOLERANCE
    figure = _figure(11, 4.6)
    left, right = figure.subplots(1, 2)
    _log_panel(left, rows, "max_abs_diff", tolerance.atol, f"atol = {tolerance.atol:g}",
               "max |cached - uncached| (log axis)")
    left.set_title("Largest absolute difference per prefix")
    ratios = [r for r in bound_ratios or [] if isinstance(r.get("bound_ratio"), (int, float))]
    if ratios:
        _log_panel(right, ratios, "bound_ratio", 1.0, "1 = the criterion's edge (above fails)",
                   "max |a-b| / bound (log axis)")
        right.set_title(f"Error / its bound {tolerance.atol:g} + {tolerance.rtol:g}*|b|, worst element")
    else:
        right.set_axis_off()
        right.text(0.5, 0.5, "the logit tensors were not available,\nso the per-element bound cannot be drawn",
                   ha="center", va="center", transform=right.transAxes)
    _legend_below(figure, [left, right])
    _title(figure, f"Matched-prefix cache comparison, {len(rows)} prefixes (b = uncached)", partial)
    if path is not None:
        _save(figure, path)
    return figure


DRAWERS = {"token_times": draw_token_times, "ttft_interval": draw_ttft_interval, "cpu_share": draw_cpu_share,
           "cache_max_abs_diff": draw_cache_diff}


def write_plots(record_dir: Path, records: list[dict], partial: Optional[str] = None,
                bound_ratios: Optional[list[dict]] = None) -> list[dict]:
    """Draw every available plot into the record dir; returns plot_specs() with 'written' and any 'error'.

    partial: a short reason, given when the run is partial; every plot then says so in its title.
    """
    results = []
    for spec in plot_specs(records):
        spec = {**spec, "written": False, "error": None}
        if spec["available"]:
            try:
                extra = {"bound_ratios": bound_ratios} if spec["name"] == "cache_max_abs_diff" else {}
                DRAWERS[spec["name"]](records, Path(record_dir) / spec["file"], partial=partial, **extra)
                spec["written"] = True
            except Exception as error:  # a broken plot is reported in the report, not raised over it
                spec["error"] = f"{type(error).__name__}: {error}"
        results.append(spec)
    return results
