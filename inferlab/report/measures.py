"""The report's tables of what was measured: the cache comparison, timing and the weight read, phases, memory, batching
and captured warnings, each a pure function of one run's view (inferlab.read.runview.RunView).

Every function returns plain data or Markdown cells; the pages arrange them with their prose. A missing
record gives a placeholder cell, never an error.
"""

from __future__ import annotations

import collections
import statistics
from typing import Any, Optional

from inferlab import protocol
from inferlab.measure import stats as summaries
from inferlab.report import logits as logit_math
from inferlab.report.fmt import (
    DASH,
    MISSING,
    flag,
    is_number,
    ms,
    nbytes,
    num,
    spread,
    text_cell,
    us,
    yes_no,
)
from inferlab.read.runview import RunView

# --- cache --------------------------------------------------------------------------------------


def cache_rows(view: RunView) -> tuple[list[str], list[list[str]], bool]:
    """One row per compared prefix; the revised criterion's columns only when a revised evaluation exists."""
    criterion = view.first("cache_criterion") or {}
    atol = criterion.get("atol", protocol.CACHE_TOLERANCE.atol)
    rtol = criterion.get("rtol", protocol.CACHE_TOLERANCE.rtol)
    comparisons = view.kind("cache_comparison")
    revised = any(isinstance(r.get("revised"), dict) for r in comparisons)
    header = ["#", "prefix length (fed)", "max abs diff", "max error / bound", "fail fraction", "bitwise equal",
              "argmax cached / uncached", "top-2 margin", "tie allowance", "near tie", "passed (declared)"]
    if revised:
        header += ["passed (revised)", "fail fraction (revised)"]
    rows = []
    for number, record in enumerate(comparisons, start=1):
        tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
        cached, uncached = view.tensor(tensors.get("cached")), view.tensor(tensors.get("uncached"))
        ratio = None if cached is None or uncached is None else logit_math.bound_ratio(cached, uncached, atol, rtol)
        argmax = f"{num(record.get('argmax_cached'))} / {num(record.get('argmax_uncached'))}"
        if record.get("argmax_cached") != record.get("argmax_uncached"):
            argmax = f"**{argmax} differ**"
        fed = record.get("fed_continuation_tokens")
        row = [str(number), num(record.get("prefix_length")) + (f" ({fed})" if is_number(fed) else ""),
               num(record.get("max_abs_diff"), 3), num(ratio, 3), num(record.get("fail_fraction"), 3),
               flag(record.get("bitwise_equal")), argmax,
               num(record.get("top2_margin_uncached"), 4), num(record.get("near_tie_allowance"), 3),
               flag(record.get("near_tie"), alarm=True), yes_no(record.get("passed"))]
        if revised:
            second = record.get("revised") if isinstance(record.get("revised"), dict) else {}
            row += [yes_no(second.get("passed")), num(second.get("fail_fraction"), 3)]
        rows.append(row)
    return header, rows, revised


def bound_ratios(view: RunView) -> list[dict]:
    """Per prefix: length, max abs diff, max error as a fraction of its per-element bound (for the plot)."""
    criterion = view.first("cache_criterion") or {}
    atol = criterion.get("atol", protocol.CACHE_TOLERANCE.atol)
    rtol = criterion.get("rtol", protocol.CACHE_TOLERANCE.rtol)
    found = []
    for record in view.kind("cache_comparison"):
        if not isinstance(record.get("prefix_length"), int):
            continue
        tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
        cached, uncached = view.tensor(tensors.get("cached")), view.tensor(tensors.get("uncached"))
        found.append({"prefix_length": record["prefix_length"], "max_abs_diff": record.get("max_abs_diff"),
                      "passed": record.get("passed"),
                      "bound_ratio": None if cached is None or uncached is None
                      else logit_math.bound_ratio(cached, uncached, atol, rtol)})
    return found


# --- timing -------------------------------------------------------------------------------------


def measured_trials(view: RunView) -> dict[tuple, list[dict]]:
    """Completed measured timing trials grouped by (prompt_id, use_cache), in schedule order."""
    order = list(dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()))
    groups: dict[tuple, list[dict]] = {key: [] for key in order}
    for record in view.kind("timing_trial"):
        if record.get("warmup") is False and record.get("status", "ok") == "ok":
            groups.setdefault((record.get("prompt_id"), record.get("use_cache")), []).append(record)
    return {key: sorted(trials, key=lambda r: r.get("schedule_index", 0)) for key, trials in groups.items() if trials}


token_times = summaries.token_times
post_first_interval = summaries.post_first_interval


def throughput(record: dict) -> Optional[float]:
    """n/(t_n - t0): includes prompt processing."""
    times = token_times(record)
    try:
        return summaries.throughput_including_prompt(times) if times else None
    except ValueError:
        return None


def timing_metrics() -> tuple:
    """(label, value of a trial, scale) per timing metric; the loop's label counts the protocol's selections."""
    return (
        ("prefill", lambda r: r.get("prefill_s"), ms),
        ("local TTFT", lambda r: r.get("ttft_s"), ms),
        ("mean post-first interval", post_first_interval, ms),
        (f"loop ({protocol.TIMING_NEW_TOKENS} selections)", lambda r: r.get("loop_s"), ms),
    )


def condition_label(prompt_id: Any, use_cache: Any) -> str:
    """'P1, cache on'."""
    return f"{prompt_id}, cache {'on' if use_cache else 'off'}"


def lengths_of(trials: list[dict], field_name: str) -> str:
    """The distinct values of a length field over trials ('8', or '8/9' if they differ)."""
    values = sorted({t.get(field_name) for t in trials if t.get(field_name) is not None}, key=str)
    return "/".join(num(v) for v in values) or MISSING


CONTENDED_MARK = "‡"  # a sample of a contended trial (inferlab.measure.contention)


def timing_rows(view: RunView) -> list[list[str]]:
    """Per condition and metric: every measured sample in schedule order (a contended trial's marked, never left
    out), the median and [min–max] of all, and of the uncontended samples only with their count."""
    rows = []
    for (prompt_id, use_cache), trials in measured_trials(view).items():
        flags = [summaries.trial_contended(t) for t in trials]
        for metric, value_of, scale in timing_metrics():
            values = [value_of(t) for t in trials]
            samples = ", ".join((scale(v) if is_number(v) else MISSING) + (CONTENDED_MARK if flag else "")
                                for v, flag in zip(values, flags))
            clean = [v for v, flag in zip(values, flags) if flag is False]
            rows.append([condition_label(prompt_id, use_cache), lengths_of(trials, "prompt_length"),
                         lengths_of(trials, "output_length"), metric, samples, spread(values, scale),
                         f"{spread(clean, scale)}, n={len(clean)}" if clean else
                         ("none uncontended" if all(f is True for f in flags) else "no CPU evidence")])
    return rows


def uncontended_spread(trials: list[dict], value_of, scale=ms) -> str:
    """spread() of the uncontended trials' values; where none is uncontended, of all of them, marked ‡ when they
    are contended (a run without CPU evidence has no mark: nothing says either way)."""
    flags = [summaries.trial_contended(t) for t in trials]
    clean = [value_of(t) for t, flag in zip(trials, flags) if flag is False]
    if clean:
        return spread(clean, scale)
    return spread([value_of(t) for t in trials], scale) + (CONTENDED_MARK if True in flags else "")


def lengths_text(trials: list[dict]) -> str:
    """'8 prompt tokens, 16 output tokens' of these trials."""
    return f"{lengths_of(trials, 'prompt_length')} prompt tokens, {lengths_of(trials, 'output_length')} output tokens"


def throughput_line(view: RunView) -> Optional[str]:
    """Per condition the throughput n/(t_n - t0) of its measured trials, median of the per-trial values [min–max],
    with that convention named (the protocol allows another, total tokens over total time, which differs)."""
    parts = [f"{condition_label(prompt_id, use_cache)} ({lengths_text(trials)}) "
             f"{spread([throughput(t) for t in trials], tokens_per_s)}"
             for (prompt_id, use_cache), trials in measured_trials(view).items()]
    if not parts:
        return None
    n = protocol.TIMING_NEW_TOKENS
    return (f"Throughput {n}/(t{n} − t0) in tokens per second, the median of the per-trial values [min{DASH}max] "
            "(not total tokens over total time, a convention that gives another number); it includes the prompt: "
            + "; ".join(parts) + ".")


def tokens_per_s(value: Any) -> str:
    """A rate in tokens per second, one decimal."""
    return f"{value:.1f}" if is_number(value) else MISSING


def loop_inputs_lines(check: dict) -> list[str]:
    """One bullet per timing prompt whose loop inputs were checked against generate()'s own preparation."""
    found = check.get("inputs_vs_generate") if isinstance(check.get("inputs_vs_generate"), dict) else {}
    lines = []
    for prompt_id, result in found.items():
        result = result if isinstance(result, dict) else {}
        difference = result.get("first_difference") if isinstance(result.get("first_difference"), dict) else None
        lines.append(f"- Loop against `generate()` for {text_cell(prompt_id)} ({text_cell(result.get('trial'))}): no "
                     "`generate()` call of this prompt is in the budget, so the inputs of each of its "
                     f"{num(result.get('steps'))} forwards are compared with those `generate()`'s own preparation "
                     f"builds for the same ids, with no forward run: equal: {yes_no(result.get('equal'))}"
                     + (f", first difference at step {num(difference.get('step'))} in "
                        f"`{text_cell(difference.get('field'))}`" if difference else "") + ".")
    return lines


def median(values: list) -> Optional[float]:
    """The median of the numbers among values, or None."""
    numbers = [v for v in values if is_number(v)]
    return statistics.median(numbers) if numbers else None


def weight_read_rows(view: RunView) -> tuple[Optional[dict], list[list[str]]]:
    """(the weight_read record or None, rows): per condition the measured post-first interval beside the time one
    pass reading the decode step's weights took in this run. No row relates the two: their ratio would read like a
    bound on the step, and a cache-off step feeds the whole sequence, so it reads more than one pass's worth."""
    record = view.first("weight_read")
    if record is None:
        return None, []
    seconds = [s for s in record.get("seconds") or [] if is_number(s)]
    rows = [[condition_label(prompt_id, use_cache), spread([post_first_interval(t) for t in trials]), spread(seconds)]
            for (prompt_id, use_cache), trials in measured_trials(view).items()]
    return record, rows


def cache_levels(caches: Any) -> str:
    """'L1 Data 32K, L1 Instruction 32K, L2 Unified 512K, L3 Unified 32768K' from machine.cache_sizes(), or why
    they are unknown."""
    caches = caches if isinstance(caches, dict) else {}
    levels = [entry for entry in caches.get("levels") or [] if isinstance(entry, dict)]
    if not levels:
        return f"unknown ({text_cell(caches.get('note') or 'not recorded')})"
    return ", ".join(text_cell(f"L{entry.get('level')} {entry.get('type')} {entry.get('size')}") for entry in levels)


def clock_overhead_line(view: RunView) -> Optional[str]:
    """'N clock reads ≈ X µs of a ≈ M ms loop (S % of the shortest measured loop)', N being the record's
    reads_per_trial; the share is taken of the shortest single measured loop, so it bounds every trial's."""
    record = view.first("clock_overhead")
    if record is None:
        return None
    reads = record.get("reads_per_trial")
    overhead = record.get("per_trial_overhead_ns")
    if not is_number(overhead) and is_number(record.get("per_read_ns")) and is_number(reads):
        overhead = record["per_read_ns"] * reads
    groups = measured_trials(view).values()
    loops = [v for v in (median([t.get("loop_s") for t in trials]) for trials in groups) if v is not None]
    shortest = min((t["loop_s"] for trials in groups for t in trials if is_number(t.get("loop_s"))
                    and t["loop_s"] > 0), default=None)
    loop = (f"{ms(min(loops), 1)} ms" if len(loops) == 1 or min(loops) == max(loops)
            else f"{ms(min(loops), 1)}{DASH}{ms(max(loops), 1)} ms") if loops else "(no measured loop)"
    share = (f" ({overhead / 1e9 / shortest * 100:.2g} % of the shortest measured loop, {ms(shortest, 1)} ms)"
             if shortest and is_number(overhead) else "")
    usage = record.get("usage_per_read_ns")
    usage_text = (f" The thread-usage readings that say whether a sample's thread kept running: "
                  f"{num(record.get('usage_reads_per_trial'))} per trial, ≈ {us(usage)} µs each, "
                  f"{num(record.get('usage_reads_inside_loop'))} of them inside the loop span"
                  + (f" ({record['usage_inside_loop_ns'] / 1e9 / shortest * 100:.2g} % of the shortest measured loop)"
                     if shortest and is_number(record.get("usage_inside_loop_ns")) else "") + "."
                  if is_number(usage) else "")
    watch = record.get("watch_per_collection_ns")
    watch_text = (f" The collection watch adds ≈ {us(watch)} µs to each collection that runs inside a span, and "
                  "nothing to a span without one." if is_number(watch) else "")
    return (f"{num(reads)} clock reads ≈ {(us(overhead) if is_number(overhead) else MISSING)} µs of a ≈ {loop} "
            f"loop{share}: {text_cell(record.get('clock'))}, {num(record.get('per_read_ns'), 3)} ns per read "
            f"({text_cell(record.get('method'))}).{usage_text}{watch_text}{collector_line(view)}")


def _ratio(value: Any, interval: Any = None) -> str:
    """'1.0064 [1.0044, 1.0089]' or '1.0064', or MISSING."""
    if not is_number(value):
        return MISSING
    bounds = interval if isinstance(interval, list) and len(interval) == 2 and all(map(is_number, interval)) else None
    return f"{value:.4f}" + (f" [{bounds[0]:.4f}, {bounds[1]:.4f}]" if bounds else "")


def benchmark_line(view: RunView) -> str:
    """What benchmarks/overhead.py measured of the whole instrumentation, as the clock_overhead record quoted it:
    another run's figures, labelled so (its date, commit, machine, rounds), with the frame-placement spread."""
    record = view.first("clock_overhead") or {}
    found = record.get("benchmark") if isinstance(record.get("benchmark"), dict) else {}
    if not found.get("found"):
        return (" This run quoted no overhead benchmark" + (f" ({text_cell(found.get('reason'))})" if found else "")
                + ", so the per-forward hook's cost and the frame-placement effect are not stated here.")
    hook = found.get("hook") if isinstance(found.get("hook"), dict) else {}
    rest = found.get("readings_without_hook") if isinstance(found.get("readings_without_hook"), dict) else {}
    placement = found.get("placement") if isinstance(found.get("placement"), dict) else {}
    machine = found.get("machine") if isinstance(found.get("machine"), dict) else {}
    where = ", ".join(str(machine[k]) for k in ("cpu_model", "logical_cpus") if k in machine) or MISSING
    text = (f" Another run's figures, not this run's ({text_cell(found.get('file'))}: benchmarks/overhead.py on "
            f"{text_cell(found.get('recorded_utc'))}, at {text_cell(str(found.get('commit'))[:7])}, on {where} CPUs, "
            f"Python {text_cell(found.get('python'))}, {num(found.get('rounds'))} rounds, each call's time over the "
            f"bare loop's in the same round): the loop with everything a trial adds (the clock, the usage reads, "
            f"the collection watch and the per-forward hook) "
            f"{_ratio(found.get('instrumented_over_bare'), found.get('instrumented_interval'))}, the per-forward "
            f"hook alone {_ratio(hook.get('median'), hook.get('interval'))}, the rest without the hook "
            f"{_ratio(rest.get('median'), rest.get('interval'))}; the bare loop against itself (A/A) "
            f"{_ratio(found.get('aa'))}" + (f"; its verdict: {text_cell(found['verdict'])}" if found.get("verdict")
                                             else "") + ".")
    ratio, bounds = placement.get("most_over_fewest"), placement.get("interval")
    if is_number(ratio) and isinstance(bounds, list) and len(bounds) == 2 and all(map(is_number, bounds)):
        text += (f" **Frame placement** (benchmarks/page_faults.py, another run's too: "
                 f"{text_cell(placement.get('recorded_utc'))}, at {text_cell(str(placement.get('commit'))[:7])}, "
                 f"Python {text_cell(placement.get('python'))}, {num(placement.get('rounds'))} rounds): the same bare "
                 f"loop took {_ratio(ratio, bounds)} times as long started where its calls crossed the most "
                 "frame-stack chunk ends as where they crossed the fewest "
                 f"(A/A {_ratio(placement.get('aa'))}); every trial of this run started at the test's own place, "
                 "good or bad, unmeasured.")
    return text


def collector_line(view: RunView) -> str:
    """' The collector policy: ...; the run's one full collection ...' from the trials' collector fields and the
    timing_machine 'before' record; empty for a run whose trials record no policy."""
    trials = [t for t in view.kind("timing_trial") if isinstance(t.get("collector"), dict)]
    if not trials:
        return ""
    policies = sorted({str(t["collector"].get("policy")) for t in trials})
    text = f" The collector policy: {', '.join(policies)}"
    full = [t["collector"]["full_collection_ns"] for t in trials if is_number(t["collector"].get("full_collection_ns"))]
    before = next((r for r in view.kind("timing_machine") if r.get("point") == "before"), {})
    once = before.get("collection") if isinstance(before.get("collection"), dict) else {}
    if full:  # runs before issue 55 collected before every trial
        text += (f"; a full collection before each trial took {ms(statistics.median(full) / 1e9, 1)} ms (median of "
                 f"{len(full)}), outside every span, and left the trial to start cold")
    elif is_number(once.get("elapsed_ns")):
        text += (f"; the run's one full collection and freeze, before the first trial (timing_machine seq "
                 f"{before.get('seq')}), took {ms(once['elapsed_ns'] / 1e9, 1)} ms and froze {num(once.get('frozen'))} "
                 "objects; none ran between a trial's setup and its start stamp")
    return text + "."


def phase_rows(view: RunView) -> list[list[str]]:
    """The separately timed phases: acquisition, load, tokenization, output decoding per source."""
    rows = []
    grouped: dict[tuple, list[dict]] = collections.defaultdict(list)
    for record in view.kind("phase"):
        name = record.get("name")
        grouped[(name, record.get("source") if name == "output_decoding" else None)].append(record)
    for (name, source), records in grouped.items():
        values = [r.get("elapsed_s") for r in records]
        if name == "tokenization":
            value = ", ".join(f"{r.get('prompt_id')} {ms(r.get('elapsed_s'))}" for r in records)
        elif len(values) == 1:
            value = ms(values[0])
        else:
            value = f"{spread(values)}, n={len(values)}"
        rows.append([text_cell(f"{name} ({source})" if source else name), value, text_cell(records[0].get("label"))])
    if not any(name == "output_decoding" for name, _ in grouped):
        for kind, source in (("generation", "generation"), ("timing_trial", "timing")):
            values = [r.get("decode_s") for r in view.kind(kind) if is_number(r.get("decode_s"))]
            if values:
                rows.append([f"output_decoding ({source})", f"{spread(values)}, n={len(values)}",
                             "no output_decoding phase record in this run; from the records' `decode_s` fields"])
    return rows


# --- memory -------------------------------------------------------------------------------------


def memory_rows(view: RunView) -> list[list[str]]:
    """Tensor payloads with their formula check: parameters, the checkpoint file, the cache at each point."""
    parameters, caches = [], []
    for record in view.kind("memory"):
        measure = record.get("measure")
        if measure == "parameter_storage":
            expected = record.get("analytic_bytes_fp32", record.get("expected_bytes"))
            dtypes = ", ".join(map(str, record.get("dtypes") or []))
            parameters.append(["parameters (unique storage)", nbytes(record.get("unique_bytes")),
                               _matches(record.get("unique_bytes"), expected),
                               f"{num(record.get('parameter_count'))} parameters {text_cell(dtypes)}".rstrip()])
        elif measure == "cache_storage":
            length = record.get("logical_length")
            per = (record["unique_bytes"] / length) if is_number(record.get("unique_bytes")) and is_number(length) \
                and length else None
            caches.append([f"KV cache {text_cell(record.get('point'))}", nbytes(record.get("unique_bytes")),
                           _matches(record.get("unique_bytes"), record.get("expected_bytes")),
                           f"{num(length)} positions, {num(per)} B each"])
    inspection = view.first("model_inspection") or {}
    checkpoint = []
    if is_number(inspection.get("checkpoint_file_bytes")):
        checkpoint.append(["checkpoint file on disk", nbytes(inspection["checkpoint_file_bytes"]), "-",
                           "file bytes, not loaded memory (its dtype may differ from float32)"])
    return parameters + checkpoint + caches


def _matches(measured: Any, expected: Any) -> str:
    if not is_number(expected):
        return MISSING
    return "= formula" if measured == expected else f"**differs** (formula {nbytes(expected)})"


def per_prefix_cache_bytes(view: RunView) -> str:
    """'8: 49,152 · 9: 55,296 …' from the cache test's comparisons (bytes held after each cached forward)."""
    pairs = [f"{num(r.get('cache_seq_length_after_forward', r.get('prefix_length')))}: "
             f"{nbytes(r.get('cache_unique_bytes_after_forward'))}"
             for r in view.kind("cache_comparison") if is_number(r.get("cache_unique_bytes_after_forward"))]
    return " · ".join(pairs)


def rss_rows(view: RunView) -> list[list[str]]:
    """Process RSS per point: current and lifetime peak with their source; the baseline has the libraries in it."""
    rows = []
    for record in view.kind("memory"):
        if record.get("measure") != "process_rss":
            continue
        for point, label in (("baseline", "baseline: " + str(record.get("baseline_point") or "before the model")),
                             ("now", "after the experiment's tensors were counted"), (None, "at this record")):
            value = record if point is None else record.get(point)
            value = value if isinstance(value, dict) else {}
            entries = [value.get(name) if isinstance(value.get(name), dict) else None
                       for name in ("current_rss", "peak_rss")]
            if not any(entries):
                continue
            source = next(e for e in entries if e)
            rows.append([text_cell(label)] + [nbytes(e.get("bytes")) if e else MISSING for e in entries] +
                        [text_cell(f"{source.get('tool', MISSING)} "
                                   + " / ".join(str(e.get("source_field", "")) for e in entries if e))])
    return rows


def unmeasured(view: RunView) -> list[str]:
    """The memory categories the counts leave out, with why."""
    found = []
    for record in view.kind("memory"):
        categories = record.get("categories") if record.get("measure") == "unmeasured" else record.get(
            "unmeasured_categories")
        if isinstance(categories, dict):
            found += [f"{k}: {v}" for k, v in categories.items()]
        elif isinstance(categories, list):
            found += [str(c) for c in categories]
    return list(dict.fromkeys(found))


# --- batching -----------------------------------------------------------------------------------


def batching_rows(view: RunView) -> list[list[str]]:
    """Singleton against batch, per request and batch order: padding, first-step agreement, generated ids."""
    calls = {r.get("call_index"): r for r in view.kind("batching") if r.get("record_type") == "call"}
    rows = []
    for record in view.kind("batching"):
        if record.get("record_type") != "summary" or not isinstance(record.get("comparisons"), list):
            continue
        for comparison in record["comparisons"]:
            if not isinstance(comparison, dict):
                continue
            batch = calls.get(comparison.get("batch_call_index")) or {}
            requests = batch.get("request_ids")
            if not isinstance(requests, list) and isinstance(batch.get("row_to_request"), dict):
                requests = [batch["row_to_request"][row] for row in sorted(batch["row_to_request"], key=str)]
            order = "[" + ", ".join(map(str, requests or [])) + "]"
            divergence = comparison.get("first_divergence")
            ids = yes_no(comparison.get("generated_ids_identical"))
            if divergence is not None:
                ids += f" (first differ at token {divergence + 1})" if isinstance(divergence, int) else ""
            rows.append([text_cell(comparison.get("request_id")), f"{order}, row {num(comparison.get('row'))}",
                         num(comparison.get("padding_columns")), num(comparison.get("first_step_max_abs_diff"), 3),
                         yes_no(comparison.get("first_step_argmax_agree")),
                         yes_no(comparison.get("unpadded_prompt_matches_singleton")), ids])
    return rows


# --- warnings -----------------------------------------------------------------------------------


def warnings_by_record(view: RunView) -> list[tuple[dict, list[str]]]:
    """Every record that captured warnings or log messages, with them."""
    found = []
    for record in view.records:
        messages = []
        for name in ("warnings", "log_messages", "config_warnings"):
            value = record.get(name)
            if isinstance(value, list):
                messages += [str(m) for m in value if m]
        if messages:
            found.append((record, messages))
    return found
