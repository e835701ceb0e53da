"""The report's four plots, drawn from records alone with matplotlib's Agg canvas (no display, no pyplot state); how
they read: docs/report.md. plot_specs() says which plots a run's records allow and why not, without drawing. PNGs are
written atomically without software or time metadata: the same records give the same bytes.
"""

from __future__ import annotations

import io
import statistics
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.files import write_bytes_atomic
from inferlab.measure.stats import loop_cpu_share, measured, token_times

TOKEN_TIMES_PNG, TTFT_INTERVAL_PNG = "plot_token_times.png", "plot_ttft_interval.png"
CACHE_DIFF_PNG, CPU_SHARE_PNG = "plot_cache_max_abs_diff.png", "plot_cpu_share.png"
COLOURS = {True: "tab:blue", False: "tab:orange"}
PARTIAL_PREFIX = "PARTIAL RUN"
DPI = 100


def measured_timing_trials(records: list[dict]) -> dict[tuple, list[dict]]:
    """stats.measured of the timing trials that carry selection times: by (prompt_id, use_cache)."""
    return measured([r for r in records if r.get("kind") == "timing_trial" and token_times(r) is not None])


def trials_with_evidence(records: list[dict]) -> list[dict]:
    """Completed timing trials (warmups included) whose loop span has a CPU share, in schedule order."""
    return sorted((r for r in records if r.get("kind") == "timing_trial" and r.get("status", "ok") == "ok"
                   and loop_cpu_share(r) is not None and isinstance(r.get("loop_s"), (int, float))),
                  key=lambda r: r.get("schedule_index", 0))


def cache_rows(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "cache_comparison" and isinstance(r.get("prefix_length"), int)
            and isinstance(r.get("max_abs_diff"), (int, float))]


def plot_specs(records: list[dict]) -> list[dict]:
    """Each plot's name, file, report section, title, and whether its data exist (the reason when not)."""
    trials = [r for group in measured_timing_trials(records).values() for r in group]
    found = [("token_times", TOKEN_TIMES_PNG, "timing", "Per-token time against token index, cache on and off, "
              "every measured trial", trials, "no measured timing_trial record with token times"),
             ("ttft_interval", TTFT_INTERVAL_PNG, "timing", "Local TTFT and mean post-first-token interval per "
              "condition (individual values)", [r for r in trials if isinstance(r.get("ttft_s"), (int, float))],
              "no measured timing_trial record with ttft_s"),
             ("cpu_share", CPU_SHARE_PNG, "timing", "Each timing trial in schedule order: its loop time, and the CPU "
              "share of its loop and prefill", trials_with_evidence(records),
              "no timing_trial record with its thread's CPU readings"),
             ("cache_max_abs_diff", CACHE_DIFF_PNG, "cache", "Matched-prefix cache comparison: max abs diff, and max "
              "error as a fraction of each element's bound", cache_rows(records),
              "no cache_comparison record with a finite max_abs_diff")]
    return [{"name": name, "file": file, "section": section, "title": title, "available": bool(data),
             "reason": None if data else reason} for name, file, section, title, data, reason in found]


def links(view, section: str, plot_errors: dict) -> list[str]:
    """report.md's lines for one section's plots: the image, or why it is not there."""
    lines = []
    for spec in (s for s in plot_specs(view.records) if s["section"] == section):
        error = plot_errors.get(spec["name"])
        lines += [f"![{spec['title']}]({spec['file']})" if spec["available"] and not error else
                  f"Plot not drawn ({spec['title']}): {spec['reason'] or ' '.join(str(error).split())}.", ""]
    return lines


# --- drawing helpers -----------------------------------------------------------------------------------------


def figure_of(width: float, height: float, title: str, partial: Optional[str]):
    """A figure on the Agg canvas (constrained layout makes room for a legend outside the axes), with its title; a
    partial run's says so first, in red."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(f"{PARTIAL_PREFIX}: {partial}\n{title}" if partial else title,
                    color="tab:red" if partial else "black")
    return figure


def finish(figure, axes, path: Optional[Path]):
    """The legend below the axes (each label once), then the PNG (no version string, no timestamp)."""
    shown = {}  # label -> its first handle
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            shown.setdefault(label, handle)
    if shown:
        figure.legend(list(shown.values()), list(shown), loc="outside lower center", ncols=min(len(shown), 3),
                      fontsize="small")
    if path is not None:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
        write_bytes_atomic(path, buffer.getvalue())
    return figure


def clip_limit(values: list[float]) -> Optional[float]:
    """An upper axis limit that keeps the bulk of values readable, or None when nothing needs clipping: the bulk
    ends at Q3 + 3*IQR + a quarter of the median (so jitter around a constant is no outlier), and only values more
    than twice the bulk's largest are clipped."""
    finite = sorted(v for v in values if isinstance(v, (int, float)))
    if len(finite) < 4:
        return None
    q1, _, q3 = statistics.quantiles(finite, n=4)
    bulk = [v for v in finite if v <= q3 + 3 * (q3 - q1) + 0.25 * abs(statistics.median(finite))]
    if not bulk or finite[-1] <= 2 * bulk[-1]:
        return None
    return max(v for v in finite if v <= 2 * bulk[-1]) * 1.15


def mark_clipped(axis, points: list[tuple], top: Optional[float], colour: str) -> list[tuple]:
    """Draw the points above top at the edge, as open triangles with their value; return the points kept."""
    if top is None:
        return points
    for number, (x, y) in enumerate(p for p in points if p[1] > top):
        axis.scatter([x], [top * 0.97], marker="^", s=50, facecolors="none", edgecolors=colour, zorder=4)
        # successive labels step down so that neighbouring outliers do not print over each other
        axis.annotate(f"{y:.3g}", (x, top * 0.97), textcoords="offset points", xytext=(4, -10 - 9 * (number % 3)),
                      fontsize="small", color=colour)
    return [(x, y) for x, y in points if y <= top]


def prompt_length(trials: list[dict], prompt_id: str) -> str:
    return "/".join(map(str, sorted({r.get("prompt_length") for r in trials if r.get("prompt_id") == prompt_id},
                                    key=str)))


# --- the four plots ------------------------------------------------------------------------------------------


def draw_token_times(records: list[dict], path: Optional[Path], partial: Optional[str] = None):
    """Time since the previous selection for each token index, one line per measured trial, one panel per prompt."""
    groups = measured_timing_trials(records)
    trials, prompts = [r for group in groups.values() for r in group], list(dict.fromkeys(p for p, _ in groups))
    series = {p: [(r.get("use_cache"), [(t - s) * 1e3 for t, s in zip(token_times(r), [0.0, *token_times(r)[:-1]])])
                  for r in trials if r.get("prompt_id") == p] for p in prompts}
    tops = {p: clip_limit([v for _, steps in found for v in steps]) for p, found in series.items()}
    note = "; triangles: values above the clipped axis, with their value" if any(tops.values()) else ""
    figure = figure_of(5.5 * len(prompts), 4.6, f"Per-token time, every measured trial (warmups not drawn){note}",
                       partial)
    axes = figure.subplots(1, len(prompts), squeeze=False)[0]
    for axis, prompt_id in zip(axes, prompts):
        for use_cache, steps in series[prompt_id]:
            index = range(1, len(steps) + 1)
            kept = set(mark_clipped(axis, list(zip(index, steps)), tops[prompt_id], COLOURS.get(use_cache, "grey")))
            # a clipped point leaves a gap in its line rather than a line drawn to the wrong height
            axis.plot(index, [y if (x, y) in kept else float("nan") for x, y in zip(index, steps)], marker=".",
                      linewidth=0.8, alpha=0.75, color=COLOURS.get(use_cache, "grey"),
                      label=f"cache {'on' if use_cache else 'off'}")
        axis.set_ylim(bottom=0, top=tops[prompt_id])
        axis.set(xlabel="token index (1 = first selection, includes the prefill)",
                 ylabel="ms since previous selection (axis from 0)",
                 title=f"{prompt_id}: prompt {prompt_length(trials, prompt_id)} tokens, "
                       f"{len(series[prompt_id])} measured trials")
        axis.grid(True, which="both", alpha=0.3)
    return finish(figure, axes, path)


def draw_ttft_interval(records: list[dict], path: Optional[Path], partial: Optional[str] = None):
    """Strips of each condition's individual TTFT and mean post-first-token interval values, with their median."""
    groups = measured_timing_trials(records)
    trials, found = [r for group in groups.values() for r in group], list(groups)
    figure = figure_of(11, 4.8, f"{len(trials)} measured trials, {protocol.TIMING_NEW_TOKENS} output tokens each",
                       partial)
    axes = figure.subplots(1, 2)
    for axis, (title, metric) in zip(axes, (("local TTFT", "ttft_s"),
                                            ("mean post-first-token interval", "mean_post_first_interval_s"))):
        values = [[r[metric] * 1e3 for r in groups[key] if isinstance(r.get(metric), (int, float))] for key in found]
        top = clip_limit([v for group in values for v in group])
        for x, ((prompt_id, use_cache), group) in enumerate(zip(found, values)):
            # a fixed spread instead of random jitter keeps the picture deterministic
            points = mark_clipped(axis, [(x + (i - (len(group) - 1) / 2) * 0.06, v) for i, v in enumerate(group)],
                                  top, COLOURS[use_cache])
            axis.scatter([p[0] for p in points], [p[1] for p in points], s=22, color=COLOURS[use_cache], zorder=3,
                         label=f"cache {'on' if use_cache else 'off'}: one measured trial")
            if group:
                axis.hlines(statistics.median(group), x - 0.25, x + 0.25, color="black", linewidth=1.2, zorder=2,
                            label="median of the condition")
        axis.set_ylim(bottom=0, top=top)
        axis.set_xticks(range(len(found)), [f"{p}\ncache {'on' if c else 'off'}\nlen {prompt_length(trials, p)}"
                                            for p, c in found])
        axis.set(title=title, ylabel="ms (axis from 0)")
        axis.grid(True, axis="y", alpha=0.3)
    return finish(figure, axes, path)


# what else ran inside a trial's spans (usage.DISTURBANCES): marker, colour, size, legend words
DISTURBANCES = {"collection": ("o", "tab:purple", 170, "garbage collection"),
                "major_fault": ("s", "tab:brown", 120, "major page fault")}


def draw_cpu_share(records: list[dict], path: Optional[Path], partial: Optional[str] = None):
    """Above, each trial's loop time; below, its spans' CPU share against the declared rule's threshold. Contended
    trials are crossed in red, warmups hollow; a trial with a collection or a major fault inside a span is ringed."""
    trials, rule = trials_with_evidence(records), protocol.CONTENTION_RULE
    contended = [r for r in trials if r.get("contended") is True]
    figure = figure_of(11, 6.4, f"{len(trials)} timing trials, {len(contended)} contended", partial)
    top, bottom = figure.subplots(2, 1, sharex=True)
    for use_cache in (True, False):
        for warmup in (False, True):
            group = [r for r in trials if r.get("use_cache") is use_cache and bool(r.get("warmup")) is warmup]
            xs, style = [r.get("schedule_index", 0) for r in group], {
                "s": 26, "facecolors": "none" if warmup else COLOURS[use_cache], "edgecolors": COLOURS[use_cache]}
            if group:
                top.scatter(xs, [r["loop_s"] * 1e3 for r in group], zorder=3, **style,
                            label=f"cache {'on' if use_cache else 'off'}" + (" (warmup)" if warmup else ""))
                bottom.scatter(xs, [loop_cpu_share(r) for r in group], zorder=3, **style)
    if contended:
        xs = [r.get("schedule_index", 0) for r in contended]
        top.scatter(xs, [r["loop_s"] * 1e3 for r in contended], marker="x", s=60, color="tab:red", zorder=4,
                    label="contended (declared rule)")
        bottom.scatter(xs, [loop_cpu_share(r) for r in contended], marker="x", s=60, color="tab:red", zorder=4)
    for kind, (marker, colour, size, words) in DISTURBANCES.items():
        hit = [r for r in trials if kind in (r.get("disturbed_by") or [])]
        if hit:
            top.scatter([r.get("schedule_index", 0) for r in hit], [r["loop_s"] * 1e3 for r in hit], marker=marker,
                        s=size, facecolors="none", edgecolors=colour, linewidths=1.1, zorder=5,
                        label=f"{words} inside a span ({len(hit)})")
    prefill = [(r.get("schedule_index", 0), ((r.get("cpu_evidence") or {}).get("prefill") or {}).get("cpu_share"))
               for r in trials]
    prefill = [(x, y) for x, y in prefill if isinstance(y, (int, float))]
    if prefill:
        bottom.scatter(*zip(*prefill), marker="_", s=80, color="black", zorder=2, label="prefill span's share")
    bottom.axhline(rule.min_cpu_share, color="tab:red", linestyle="--",
                   label=f"rule: contended below {rule.min_cpu_share:g}")
    top.set_ylim(bottom=0)
    top.set(ylabel="loop ms (axis from 0)", title="Loop time per trial (16 selections, prefill included)")
    bottom.set_ylim(0, max(1.05, max([loop_cpu_share(r) for r in trials] + [y for _, y in prefill], default=1) * 1.02))
    bottom.set(ylabel="thread CPU time / wall time", xlabel="schedule index (order the trials ran)",
               title="CPU share of each trial's loop span (dots) and prefill span (bars)")
    for axis in (top, bottom):
        axis.grid(True, alpha=0.3)
    return finish(figure, [top, bottom], path)


def log_panel(axis, rows: list[dict], name: str, reference: float, reference_label: str, ylabel: str) -> None:
    """Per prefix a dot per value of `name` on a log axis (green passed, red failed), exact zeros drawn hollow a
    decade below the smallest value, and the reference line."""
    usable = [r for r in rows if isinstance(r.get(name), (int, float))]
    floor = min([r[name] for r in usable if r[name] > 0] + [reference]) / 10
    for passed, colour, label in ((True, "tab:green", "prefix passed"), (False, "tab:red", "prefix failed")):
        chosen = [r for r in usable if r[name] > 0 and bool(r.get("passed")) is passed]
        if chosen:
            axis.scatter([r["prefix_length"] for r in chosen], [r[name] for r in chosen], color=colour, zorder=3,
                         label=label)
    zeros = [r["prefix_length"] for r in usable if r[name] == 0]
    if zeros:
        axis.scatter(zeros, [floor] * len(zeros), facecolors="none", edgecolors="black", zorder=3,
                     label="exactly 0 (bitwise equal), drawn at the bottom")
    axis.axhline(reference, color="tab:red", linestyle="--", label=reference_label)
    axis.set_yscale("log")
    axis.set(xlabel="prefix length (tokens, prompt included)", ylabel=ylabel)
    axis.set_xticks(sorted({r["prefix_length"] for r in rows}))
    axis.grid(True, which="both", alpha=0.3)


def draw_cache_diff(records: list[dict], path: Optional[Path], partial: Optional[str] = None,
                    bound_ratios: Optional[list[dict]] = None):
    """Per prefix: max abs diff against atol, and max |a-b| / (atol + rtol*|b|) against 1 (log axes); bound_ratios
    (inferlab.report.evidence.bound_ratios) come from the saved tensors, and without them the second panel says so."""
    rows, tolerance = cache_rows(records), protocol.CACHE_TOLERANCE
    figure = figure_of(11, 4.6, f"Matched-prefix cache comparison, {len(rows)} prefixes (b = uncached)", partial)
    left, right = figure.subplots(1, 2)
    log_panel(left, rows, "max_abs_diff", tolerance.atol, f"atol = {tolerance.atol:g}",
              "max |cached - uncached| (log axis)")
    left.set_title("Largest absolute difference per prefix")
    ratios = [r for r in bound_ratios or [] if isinstance(r.get("bound_ratio"), (int, float))]
    if ratios:
        log_panel(right, ratios, "bound_ratio", 1.0, "1 = the criterion's edge (above fails)",
                  "max |a-b| / bound (log axis)")
        right.set_title(f"Error / its bound {tolerance.atol:g} + {tolerance.rtol:g}*|b|, worst element")
    else:
        right.set_axis_off()
        right.text(0.5, 0.5, "the logit tensors were not available,\nso the per-element bound cannot be drawn",
                   ha="center", va="center", transform=right.transAxes)
    return finish(figure, [left, right], path)


DRAWERS = {"token_times": draw_token_times, "ttft_interval": draw_ttft_interval, "cpu_share": draw_cpu_share,
           "cache_max_abs_diff": draw_cache_diff}


def write_plots(record_dir: Path, records: list[dict], partial: Optional[str] = None,
                bound_ratios: Optional[list[dict]] = None) -> list[dict]:
    """Draw every available plot into the record folder; plot_specs() with 'written' and any 'error' (a broken plot
    is said in the report, never raised over it)."""
    results = []
    for spec in plot_specs(records):
        spec = {**spec, "written": False, "error": None}
        if spec["available"]:
            try:
                extra = {"bound_ratios": bound_ratios} if spec["name"] == "cache_max_abs_diff" else {}
                DRAWERS[spec["name"]](records, Path(record_dir) / spec["file"], partial=partial, **extra)
                spec["written"] = True
            except Exception as error:
                spec["error"] = f"{type(error).__name__}: {error}"
        results.append(spec)
    return results
