"""report.md's evidence of Parts 5 and 6: every timing sample with its summaries and the cache's effect beside the
declared threshold, the memory accounting with what it leaves unmeasured, and the procedure's own limitations.
"""

from __future__ import annotations

import collections
from typing import Any, Optional

from inferlab import protocol
from inferlab.measure import stats, usage
from inferlab.read.runview import RunView
from inferlab.report.evidence import MISSING, cell, is_number, ms, nbytes, num, spread, table, yes_no

CONTENDED = "‡"  # after a sample of a contended trial (inferlab.measure.usage): marked, never left out
N = protocol.TIMING_NEW_TOKENS


def throughput(record: dict) -> Optional[float]:
    times = stats.token_times(record)
    return stats.throughput_including_prompt(times) if times else None


def per_second(value: Any) -> str:
    return f"{value:.1f}" if is_number(value) else MISSING


METRICS = (("prefill (ms)", "prefill_s", ms), ("local TTFT (ms)", "ttft_s", ms),
           (f"mean post-first interval (t{N} − t1)/{N - 1} (ms)", "mean_post_first_interval_s", ms),
           (f"loop, {N} selections (ms)", "loop_s", ms),
           (f"throughput {N}/(t{N} − t0), tokens/s", throughput, per_second))
METRIC_NAMES = {"mean_post_first_interval_s": "mean post-first interval", "loop_s": f"loop, {N} selections"}


def lengths(trials: list[dict], name: str) -> str:
    found = sorted({t.get(name) for t in trials if t.get(name) is not None}, key=str)
    return "/".join(num(v) for v in found) or MISSING


def effects(view: RunView) -> list[dict]:
    """inferlab.measure.stats' effect of the cache per timing prompt and metric, with its interval (its
    verdict in words is for the after page)."""
    trials = view.kind("timing_trial")
    return stats.cache_verdicts(trials)["verdicts"] if trials else []


def effect_text(entry: dict) -> str:
    """'+20.1% [-1.0%, +32.1%], 96.8%': the time without the cache over the time with it, minus one."""
    found = entry["interval"]
    if found.get("low") is None:
        return cell(entry["reason"])
    return (f"{found['estimate_fraction']:+.1%} [{found['low_fraction']:+.1%}, {found['high_fraction']:+.1%}], "
            f"{found['coverage']:.1%}")


def phase_rows(view: RunView) -> list[list[str]]:
    """The phases timed apart from the loop: one value, one per prompt, or median [min–max] of many."""
    phases: dict[str, list[dict]] = collections.defaultdict(list)
    for record in view.kind("phase"):
        phases[str(record.get("name")) + (f" ({record['source']})" if record.get("source") else "")].append(record)
    rows = []
    for name, found in phases.items():
        values = [r.get("elapsed_s") for r in found]
        shown = (", ".join(f"{r.get('prompt_id')} {ms(r.get('elapsed_s'))}" for r in found) if found[0].get(
            "prompt_id") else ms(values[0]) if len(values) == 1 else f"{spread(values)}, n={len(values)}")
        rows.append([cell(name), shown, cell(found[0].get("label"))])
    return rows


def section_timing(view: RunView, why) -> list[str]:
    """Every measured sample with median [min–max], the effect's interval beside the declared threshold, the
    contention rule's marks, the phases timed apart, and the loop's checks."""
    lines = ["## Timing", "", f"**Stopping rule:** {protocol.TIMING_STOPPING_RULE}: these ids are execution samples. "
             "Times from `time.perf_counter_ns` at loop start; prefill ends when the next-token logits exist, local "
             "TTFT at the first selection (no loading, tokenization, network or queue). Warmups are left out here; "
             "every timestamp is in the `timing_trial` records.", ""]
    rows = []
    for (prompt_id, use_cache), trials in stats.measured(view.kind("timing_trial")).items():
        marks = [CONTENDED if stats.trial_contended(t) else "" for t in trials]
        for name, metric, scale in METRICS:
            values = [t.get(metric) if isinstance(metric, str) else metric(t) for t in trials]
            rows.append([f"{prompt_id}, cache {'on' if use_cache else 'off'}", lengths(trials, "prompt_length"),
                         lengths(trials, "output_length"), name,
                         ", ".join(scale(v) + mark for v, mark in zip(values, marks)), spread(values, scale)])
    if not rows:
        return lines + why.absent("timing_trial")
    lines += table(["condition", "prompt len", "output len", "metric",
                    f"samples in schedule order ({CONTENDED}: contended)", "median [min–max]"], rows)
    threshold = protocol.SMALLEST_TIMING_EFFECT
    rows = [[e["prompt_id"], METRIC_NAMES.get(e["metric"], e["metric"]), e["samples"],
             f"{spread(e['cache_on']['values'])}, n={e['cache_on']['n']}",
             f"{spread(e['cache_off']['values'])}, n={e['cache_off']['n']}", effect_text(e),
             f"+{threshold:.1%} / {1 / (1 + threshold) - 1:+.1%}"] for e in effects(view)]
    lines += ["", "The cache's effect: time without it over time with it, minus one (positive: less time with the "
              "cache), a Hodges-Lehmann estimate with its distribution-free interval; from the uncontended samples "
              f"when each side has at least {protocol.VERDICT_MIN_UNCONTENDED}, else from all.", ""]
    lines += table(["prompt", "metric", "samples", "with the cache, ms", "without, ms",
                    "without ÷ with − 1: estimate [interval], coverage", "smallest effect declared"], rows)
    rule, counts = protocol.CONTENTION_RULE, usage.contention_counts(view.kind("timing_trial"))
    machine = {r.get("point"): r for r in view.kind("timing_machine")}
    share = (machine.get("after") or {}).get("cpu_pressure_share_during")
    named = f": {', '.join(counts['contended_ids'])}" if counts["contended"] else ""
    lines += ["", f"Contended ({CONTENDED}): {counts['contended']} of {counts['trials']} trials, warmups included "
              f"({counts['without_evidence']} without CPU readings){named}; the rule, declared at `timing_machine` seq "
              f"{(machine.get('before') or {}).get('seq')}: a span's CPU share below {rule.min_cpu_share:g}, more than "
              f"{rule.max_involuntary_switches} involuntary switches, the collector over {rule.max_collector_share:.1%}"
              f" of it, or a major page fault." + (f" Some task waited for a CPU during {share:.0%} of the timing "
                                                   "block (/proc/pressure/cpu)." if is_number(share) else ""), ""]
    phases = phase_rows(view)
    lines += table(["phase timed apart from the loop", "ms", "boundary"], phases) + [""] if phases else []
    for check in view.kind("loop_vs_generate"):
        lines.append(f"- The loop against `generate()`, {cell(check.get('prompt_id'))} (greedy, cache on): equal over "
                     f"{num(check.get('compared_length'))} ids: {yes_no(check.get('equal'))}.")
        lines += [f"- The loop's inputs for {cell(prompt)} ({cell(found.get('trial'))}) against those `generate()`'s "
                  f"own preparation builds for the same ids, {num(found.get('steps'))} steps (no `generate()` of this "
                  f"prompt is in the budget): equal: {yes_no(found.get('equal'))}."
                  for prompt, found in (check.get("inputs_vs_generate") or {}).items() if isinstance(found, dict)]
    for record in view.kind("cache_divergence"):
        diverged = record.get("first_divergence")
        lines.append(f"- Free-running ids, cache on against off, {cell(record.get('prompt_id'))}: "
                     + (f"first differ at token {diverged + 1}" if isinstance(diverged, int) else
                        f"identical in all {num(record.get('pairs_compared'))} measured pairs") + ".")
    return lines + [""]


# --- Part 6: memory ---------------------------------------------------------------------------------------


def section_memory(view: RunView, why) -> list[str]:
    """Tensor payloads with their formula checks, process RSS with its semantics, and what is not measured."""
    rows, rss, unmeasured = [], [], []
    for r in view.kind("memory"):
        expected, found = r.get("analytic_bytes_fp32", r.get("expected_bytes")), r.get("unique_bytes")
        check = (MISSING if not is_number(expected) else "= formula" if found == expected else
                 f"**differs** (formula {nbytes(expected)})")
        if r.get("measure") == "parameter_storage":
            dtypes = cell(", ".join(map(str, r.get("dtypes") or [])))
            rows.append(["parameters (unique storage)", nbytes(found), check,
                         f"{num(r.get('parameter_count'))} parameters, {dtypes}"])
        elif r.get("measure") == "cache_storage":
            rows.append([f"KV cache {cell(r.get('point'))}", nbytes(found), check,
                         f"{num(r.get('logical_length'))} positions"])
        for point in ("baseline", "now") if r.get("measure") == "process_rss" else ():
            value = r.get(point) if isinstance(r.get(point), dict) else {}
            current, peak = value.get("current_rss") or {}, value.get("peak_rss") or {}
            rss.append([point, nbytes(current.get("bytes")), nbytes(peak.get("bytes")),
                        cell(f"{current.get('tool')} {current.get('source_field')} / {peak.get('source_field')}")])
        categories = r.get("categories") if r.get("measure") == "unmeasured" else r.get("unmeasured_categories")
        unmeasured += ([f"{k}: {v}" for k, v in categories.items()] if isinstance(categories, dict)
                       else [str(c) for c in categories or []])
    checkpoint = (view.first("model_inspection") or {}).get("checkpoint_file_bytes")
    if is_number(checkpoint):
        rows.append(["checkpoint file on disk", nbytes(checkpoint), "-", "file bytes, not loaded memory"])
    if not rows + rss + unmeasured:
        return ["## Memory", ""] + why.absent("memory")
    lines = ["## Memory", "", "Tensor payloads, shared storage counted once; not process memory:", ""]
    lines += table(["what", "bytes", "check", "note"], rows)
    if rss:
        lines += ["", "Process RSS, process-wide: *baseline* was read before the model was loaded, with torch "
                  "already imported; the peak is the process's high-water mark since it started (nothing here resets "
                  "it, and freeing tensors does not lower it):", ""]
        lines += table(["point", "current", "peak", "source"], rss)
    if unmeasured:
        lines += ["", "Not measured:", ""] + [f"- {cell(c)}" for c in dict.fromkeys(unmeasured)]
    return lines + [""]


def section_limitations(view: RunView) -> list[str]:
    """What the procedure itself does to what it measures: facts of this run, never a reading of its results."""
    items = ["The specimen is synthetic: constructed weights, so nothing here describes Pythia or any trained "
             "model."] if view.synthetic else []
    clock = view.first("clock_overhead") or {}
    loops = [t["loop_s"] for group in stats.measured(view.kind("timing_trial")).values() for t in group
             if is_number(t.get("loop_s"))]
    cost, usage = clock.get("per_trial_overhead_ns"), clock.get("usage_per_read_ns")
    if is_number(cost) and loops:
        reads = (f", {num(clock.get('usage_reads_per_trial'))} thread-usage readings ≈ {usage / 1e3:.2f} µs each "
                 f"({num(clock.get('usage_reads_inside_loop'))} inside the loop)" if is_number(usage) else "")
        items.append(f"The instrumentation adds time, the same code on both cache paths, and none is subtracted: "
                     f"{num(clock.get('reads_per_trial'))} clock reads per trial ≈ {cost / 1e3:.2f} µs "
                     f"({cost / 1e7 / min(loops):.2g} % of the shortest measured loop){reads}, and a hook on every "
                     "forward that checks inference mode (`clock_overhead`).")
    benchmark = clock.get("benchmark") if isinstance(clock.get("benchmark"), dict) else {}
    if benchmark.get("found") and is_number(benchmark.get("instrumented_over_bare")):
        low, high = (list(benchmark.get("instrumented_interval") or []) + [None, None])[:2]
        items.append(f"Another run's benchmark of all of it (benchmarks/overhead.py, "
                     f"{cell(benchmark.get('recorded_utc'))}, {num(benchmark.get('rounds'))} rounds): the instrumented "
                     f"loop took {benchmark['instrumented_over_bare']:.4f} [{num(low, 5)}, {num(high, 5)}] times the "
                     "bare one's.")
    prompts = ", ".join(f"{r.get('prompt_id')} {r.get('length')}" for r in view.kind("input")) or MISSING
    items += [f"The workload: one model in float32 on CPU, batch size one, {protocol.INTRA_OP_THREADS} intra-op "
              f"thread, prompts of {prompts} tokens, {protocol.TIMING_MEASURED_PER_COMBINATION} measured trials of "
              f"{N} selections per condition.",
              "The timing loop keeps selecting after EOS; a generation trial's `elapsed_s` times a whole "
              "`generate()` call with its own per-step work, and is not Part 5's timing.",
              "The cache criterion was declared before any error was seen; it is a diagnostic for this backend and "
              "dtype."]
    if any(isinstance(r.get("first_divergence"), int) for r in view.kind("cache_divergence")):
        items.append("Free-running ids differed between cache on and off, so those timings do not compare identical "
                     "prefixes; a fixed-token replay would be needed for that.")
    return ["## Limitations of the procedure", ""] + [f"- {item}" for item in items] + [""]
