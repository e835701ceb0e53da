"""What the report says about whether the timing samples had the CPU: the declared rule and which trials it marked,
the machine before and after the timing block, and whether the cache made this run faster.

Every sentence is a pure function of one run's view; the arithmetic is inferlab.measure.stats' and usage's.
"""

from __future__ import annotations

import math
from typing import Optional

from inferlab import protocol
from inferlab.measure import stats, usage
from inferlab.read.runview import RunView
from inferlab.report import measures
from inferlab.report.fmt import MISSING, is_number, ms, num, text_cell

CONTENDED_MARK = measures.CONTENDED_MARK  # after a sample of a contended trial, in the timing table
VERDICT_WORDS = {"faster": "**the cache made it faster**", "slower": "**the cache made it slower**",
                 "cannot_tell": "**this run cannot tell**"}
METRIC_WORDS = {"mean_post_first_interval_s": "mean post-first interval", "loop_s": "loop", "prefill_s": "prefill"}
RERUN_ADVICE = ("rerun on a quieter machine (close browsers and builds, keep other jobs off this computer) "
                "before citing these timings")


def declared_rule(view: RunView) -> tuple[Optional[dict], str]:
    """(the timing_machine record that declared the rule, or None; the rule's text)."""
    before = next((r for r in view.kind("timing_machine") if r.get("point") == "before"), None)
    rule = (before or {}).get("contention_rule")
    text = rule.get("rule") if isinstance(rule, dict) and rule.get("rule") else protocol.CONTENTION_RULE.describe()
    return before, text


def counts(view: RunView) -> dict:
    """usage.contention_counts over every timing trial of the run (warmups included)."""
    return usage.contention_counts(view.kind("timing_trial"))


def status_fact(view: RunView) -> Optional[str]:
    """The run status's sentence on the timing part: contended (with the advice to rerun), quiet, or unknown."""
    found = counts(view)
    if not found["trials"]:
        return None
    if found["without_evidence"] == found["trials"]:
        return ("Timing: these trials carry no record of their thread's CPU time (an older inferlab wrote them), so "
                "whether they had the CPU is unknown.")
    if found["contended"]:
        shown = ", ".join(found["contended_ids"][:8]) + (" …" if found["contended"] > 8 else "")
        reasons = [reason for trial in view.kind("timing_trial") if trial.get("contended") is True
                   for reason in trial.get("contention_reasons") or [] if isinstance(reason, str)]
        collector = any("collector time" in reason for reason in reasons)
        advice = (RERUN_ADVICE + (", and without --gc-in-spans: the collector, left on inside the spans, took more "
                                  "of them than the rule allows" if collector else ""))
        return (f"**The timing part was contended**: {found['contended']} of {found['trials']} timing trials did not "
                f"have their spans to themselves under the declared rule ({shown}). They are kept and marked "
                f"{CONTENDED_MARK} in the Timing section, and a cache verdict rests on the others where each side keeps "
                f"at least {protocol.VERDICT_MIN_UNCONTENDED} (else on all samples, and says so); "
                f"{advice}.")
    return (f"Timing: none of the {found['trials']} timing trials was contended under the declared rule "
            "(every span passed each of its thresholds).")


def _machine_cell(record: Optional[dict]) -> str:
    if not record:
        return MISSING
    parts = []
    load = record.get("load_average") or {}
    parts.append(f"load {num(load.get('1m'), 3)}/{num(load.get('5m'), 3)}/{num(load.get('15m'), 3)}"
                 if load.get("available") else f"load average unavailable ({text_cell(load.get('reason'))})")
    running = record.get("running_processes") or {}
    parts.append(f"{num(running.get('running'))} running" + (f" of {num(running.get('total'))}"
                                                             if is_number(running.get("total")) else "")
                 if running.get("available") else f"running processes unavailable ({text_cell(running.get('reason'))})")
    pressure = record.get("cpu_pressure") or {}
    some = pressure.get("some") if isinstance(pressure.get("some"), dict) else {}
    parts.append(f"CPU pressure some avg10 {num(some.get('avg10'), 3)} %" if pressure.get("available")
                 else f"CPU pressure unavailable ({text_cell(pressure.get('reason'))})")
    frequency = record.get("cpu_frequency") or {}
    mhz = frequency.get("mhz") if isinstance(frequency.get("mhz"), dict) else {}
    values = sorted({v for v in mhz.values() if is_number(v)})
    parts.append((f"CPU {num(values[0], 5)} MHz" if len(values) == 1 else
                  f"CPU {num(values[0], 5)}–{num(values[-1], 5)} MHz") + f" ({text_cell(frequency.get('source'))})"
                 if frequency.get("available") and values else
                 f"CPU frequency unavailable ({text_cell(frequency.get('reason'))})")
    affinity = record.get("affinity") or {}
    if affinity.get("available"):
        parts.append(f"pinned to CPUs {affinity.get('cpus')} of {num(record.get('cpu_count'))}")
    return text_cell(f"seq {record.get('seq')}: " + ", ".join(parts))


def usage_cost(view: RunView) -> str:
    """What the usage readings cost, from the clock_overhead record."""
    record = view.first("clock_overhead") or {}
    if not is_number(record.get("usage_per_read_ns")):
        return "their cost was not measured in this run"
    return (f"one reading costs ≈ {record['usage_per_read_ns'] / 1e3:.2f} µs (clock_overhead seq {record.get('seq')}); "
            f"{num(record.get('usage_reads_per_trial'))} per trial, {num(record.get('usage_reads_inside_loop'))} of "
            "them inside loop_s (after the prefill, before the first selection)")


def contention_lines(view: RunView) -> list[str]:
    """The rule, which trials it marked, the machine around the block and what the readings cost."""
    found = counts(view)
    if not found["trials"]:
        return []
    declaration, rule = declared_rule(view)
    where = (f"declared at seq {declaration.get('seq')}, before the first trial" if declaration
             else "the protocol's; this run recorded no declaration")
    if found["without_evidence"] == found["trials"]:
        marked = "These trials carry no CPU readings, so no sample is marked."
    else:
        marked = (f"Contended: {found['contended']} of {found['trials']} trials (warmups included)"
                  + (f": {', '.join(found['contended_ids'])}; their samples are marked {CONTENDED_MARK} and kept"
                     if found["contended"] else "") + ".")
    after = next((r for r in view.kind("timing_machine") if r.get("point") == "after"), None)
    share = (after or {}).get("cpu_pressure_share_during")
    machine = ""
    if declaration or after:
        machine = (f" The machine before the timing trials: {_machine_cell(declaration)}; after: {_machine_cell(after)}."
                   + (f" Some task waited for a CPU during {share:.0%} of the time between the two readings "
                      "(/proc/pressure/cpu)." if is_number(share) else ""))
    return [f"**Was each sample's thread running for all of its span?** (Only that: nothing here says what else "
            f"used the core's caches, memory bandwidth or clock.) Each trial reads its thread's CPU time, context "
            f"switches and page "
            f"faults (the thread's and the process's) at the ends of its spans only, never between tokens, and "
            f"records every garbage collection that ran; {usage_cost(view)}. Rule ({where}): {text_cell(rule)}. "
            + marked + disturbance_text(view)
            + (" Each trial's CPU share in schedule order is plotted below." if found["uncontended"]
               or found["contended"] else "") + machine, ""]


def disturbance_text(view: RunView) -> str:
    """' What else ran inside the spans: ...' counted over the trials that record it; empty when none does."""
    trials = [t for t in view.kind("timing_trial") if t.get("status", "ok") == "ok" and "disturbed_by" in t]
    if not trials:
        return ""
    words = {"collection": "a garbage collection", "major_fault": "a major page fault"}
    parts = [f"{words[kind]} in {sum(1 for t in trials if kind in (t.get('disturbed_by') or []))}"
             for kind in usage.DISTURBANCES]
    policies = sorted({str((t.get("collector") or {}).get("policy")) for t in trials})
    minor = [((t.get("cpu_evidence") or {}).get("loop") or {}).get("thread_minor_faults") for t in trials]
    minor = [m for m in minor if is_number(m)]
    return (f" What else ran inside the spans, of {len(trials)} trials (collector policy {', '.join(policies)}): "
            + ", ".join(parts) + "; such trials are ringed on the plot, not left out."
            + (f" Minor page faults ({min(minor)} to {max(minor)} in a loop) are counted and judge nothing: on "
               "CPython 3.11 nearly all are the interpreter mapping frame-stack chunks, as many as where a forward's "
               "calls fall makes them (docs/timing.md)." if minor else ""))


def _group_text(group: dict) -> str:
    if not group.get("n"):
        return "no sample"
    return f"{ms(group['median'])} [{ms(group['min'])}–{ms(group['max'])}] ms, n={group['n']}"


def method_text() -> str:
    """The interval method and its coverage, in one sentence."""
    n = protocol.TIMING_MEASURED_PER_COMBINATION
    k, coverage = stats.rank_order(n, n)
    return (f"each interval is the {stats.METHOD}, the narrowest whose coverage is at least "
            f"{stats.DECLARED_LEVEL:.0%} (coverage is discrete: for {n} against {n} samples the {k}rd smallest "
            f"to the {k}rd largest of the {n * n} pairwise differences, {coverage:.1%}; each states its own)"
            if k == 3 else
            f"each interval is the {stats.METHOD}, the narrowest whose coverage is at least "
            f"{stats.DECLARED_LEVEL:.0%} (coverage is discrete; each states its own)")


def verdict_items(view: RunView) -> list[str]:
    """One sentence per timing prompt, a clause per metric: faster, slower, or this run cannot tell, and why."""
    trials = view.kind("timing_trial")
    if not trials:
        return []
    clauses: dict[str, list[str]] = {}
    for entry in stats.cache_verdicts(trials)["verdicts"]:
        left_out = (f"; left out as contended or without evidence: {', '.join(map(str, entry['not_used']))}"
                    if entry["not_used"] else "")
        clauses.setdefault(entry["prompt_id"], []).append(
            f"{METRIC_WORDS[entry['metric']]}: {VERDICT_WORDS[entry['verdict']]}{_by_how_much(entry)} "
            f"({entry['reason']}; {entry['samples']} samples: with the cache {_group_text(entry['cache_on'])}, "
            f"without {_group_text(entry['cache_off'])}{left_out})")
    return [f"{prompt_id}: " + "; ".join(found) for prompt_id, found in clauses.items()]


def _by_how_much(entry: dict) -> str:
    """', by 4.1 % [1.0 %, 7.3 %] of the time without it' for a claimed verdict; empty otherwise."""
    interval = entry["interval"]
    if entry["verdict"] not in ("faster", "slower") or interval.get("low") is None:
        return ""
    # the effect is log(without) - log(with); the time saved is 1 - with/without = 1 - exp(-shift)
    saved = [-math.expm1(-interval[name]) for name in ("estimate", "high", "low")]
    if entry["verdict"] == "faster":
        return (f", by {saved[0]:.1%} [{saved[2]:.1%}, {saved[1]:.1%}] of the time without it")
    return f", by {-saved[0]:.1%} [{-saved[1]:.1%}, {-saved[2]:.1%}] more than the time without it"


def verdict_lines(view: RunView) -> list[str]:
    """The verdict paragraph of the Timing section and one item per timing prompt and metric."""
    items = verdict_items(view)
    if not items:
        return []
    threshold = protocol.SMALLEST_TIMING_EFFECT
    return [f"**Did the cache make this run faster?** Each effect is the shift of log times without against with "
            f"the cache (positive: faster with it), from that metric's own samples: the uncontended ones when each "
            f"side has at least {protocol.VERDICT_MIN_UNCONTENDED}, else all of them (said so); "
            + method_text() + f". A verdict is claimed only when the whole interval lies beyond {threshold:.0%} on "
            f"one side (a ratio of times beyond {1 + threshold:g} either way), the threshold the run declared before "
            "its first trial (why that value: docs/timing.md); nothing else decides it:"] \
        + [f"- {item}" for item in items] + [""]


def prefill_vs_decode_text(view: RunView) -> Optional[str]:
    """One prefill against one decode step, per timing prompt and cache setting: the median [min–max] of each
    trial's own ratio (one sentence)."""
    trials = view.kind("timing_trial")
    parts = []
    for entry in stats.cache_verdicts(trials)["prefill_vs_decode"] if trials else []:
        if entry["median"] is None:
            continue
        lengths = measures.lengths_of(_measured(view, entry["prompt_id"], entry["use_cache"]), "prompt_length")
        parts.append(f"{measures.condition_label(entry['prompt_id'], entry['use_cache'])} ({lengths} prompt tokens, "
                     f"{'/'.join(map(str, entry['output_length']))} output tokens): {entry['median']:.2f}× "
                     f"[{entry['min']:.2f}–{entry['max']:.2f}], n={entry['n']}, {entry['samples']} samples")
    if not parts:
        return None
    return ("**Prefill against one decode step:** each trial's prefill over its own mean post-first interval (one "
            "step), a ratio of two times from the same trial, so paired; median [min–max] of those ratios: "
            + "; ".join(parts) + ".")


def _measured(view: RunView, prompt_id: str, use_cache: bool) -> list[dict]:
    return measures.measured_trials(view).get((prompt_id, use_cache), [])


def short_verdicts(view: RunView) -> str:
    """The verdicts in one clause each, for the conclusions scaffold."""
    trials = view.kind("timing_trial")
    if not trials:
        return MISSING
    found = stats.cache_verdicts(trials)
    words = {"faster": "faster with the cache", "slower": "slower with the cache", "cannot_tell": "this run cannot tell"}
    return "; ".join(f"{v['prompt_id']} {METRIC_WORDS[v['metric']]}: {words[v['verdict']]}"
                     + (" (all samples)" if v["samples"] == "all" else "") for v in found["verdicts"])
