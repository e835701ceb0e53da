"""What the report says about whether the timing samples had the CPU: the declared rule and which trials it marked,
the machine before and after the timing block, this run's A/A noise, and whether the cache made this run faster.

Every sentence is a pure function of one run's view; the arithmetic is inferlab.measure.contention's.
"""

from __future__ import annotations

import math
from typing import Optional

from inferlab import protocol
from inferlab.measure import contention, intervals
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
    """contention.contention_counts over every timing trial of the run (warmups included)."""
    return contention.contention_counts(view.kind("timing_trial"))


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
                f"{CONTENDED_MARK} in the Timing section, and the cache verdict rests on the others only; "
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
    return [f"**Did each sample have the CPU?** Each trial reads its thread's CPU time, context switches and page "
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
    words = {"collection": "a garbage collection", "major_fault": "a major page fault",
             "minor_fault": "minor page faults"}
    parts = [f"{words[kind]} in {sum(1 for t in trials if kind in (t.get('disturbed_by') or []))}"
             for kind in contention.DISTURBANCES]
    policies = sorted({str((t.get("collector") or {}).get("policy")) for t in trials})
    return (f" What else ran inside the spans, of {len(trials)} trials (collector policy {', '.join(policies)}): "
            + ", ".join(parts) + "; such trials are ringed on the plot, not left out.")


def _group_text(group: dict) -> str:
    if not group.get("n"):
        return "no sample"
    return f"{ms(group['median'])} [{ms(group['min'])}–{ms(group['max'])}] ms, n={group['n']}"


def _interval_text(interval: dict) -> str:
    """'+4.1 % [+1.0 %, +7.3 %] (96.8 % interval)', or why there is no interval."""
    if interval.get("estimate") is None:
        return f"no estimate ({interval.get('reason')})"
    estimate = f"{interval['estimate_fraction']:+.1%}"
    if interval.get("low") is None:
        return f"{estimate}, no interval ({interval.get('reason')})"
    return (f"{estimate} [{interval['low_fraction']:+.1%}, {interval['high_fraction']:+.1%}] "
            f"({interval['coverage']:.1%} interval)")


def method_text() -> str:
    """The interval method and its coverage, in one sentence."""
    k, coverage = intervals.rank_order(protocol.TIMING_MEASURED_PER_COMBINATION,
                                       protocol.TIMING_MEASURED_PER_COMBINATION)
    n = protocol.TIMING_MEASURED_PER_COMBINATION
    return (f"Every interval here is the {intervals.METHOD}; coverage is discrete, so each is the narrowest "
            f"whose coverage is at least {intervals.DECLARED_LEVEL:.0%}: for {n} against {n} samples the "
            f"{k}rd smallest to the {k}rd largest of the {n * n} pairwise differences, {coverage:.1%}. "
            if k == 3 else
            f"Every interval here is the {intervals.METHOD}, the narrowest whose coverage is at least "
            f"{intervals.DECLARED_LEVEL:.0%} (coverage is discrete; each states its own). ")


def noise_lines(view: RunView) -> list[str]:
    """The A/A interval of each timing prompt and the run's noise figure."""
    trials = view.kind("timing_trial")
    if not trials:
        return []
    noise = contention.run_noise(trials)
    parts = []
    for entry in noise["per_prompt"]:
        parts.append(f"{entry['prompt_id']}: {_group_text(entry['cache_on'])} with the cache, "
                     f"{_group_text(entry['cache_off'])} without ({entry['samples']} samples), without against with "
                     + _interval_text(entry["interval"]))
    figure = noise["noise_fraction"]
    return [f"**This run's noise (A/A).** Prefill with and without the cache is the same forward over the same ids "
            f"(the cache-on path also keeps its keys and values), so any shift between them is noise. "
            + method_text() + "; ".join(parts)
            + ". This run's noise, the farthest either A/A interval reaches from zero: "
            + (f"**{intervals.band_text(noise['noise_log'])}**" if is_number(figure) else MISSING)
            + " (the same shift either way in log time); an effect whose interval does not clear it is not a finding."]


def verdict_items(view: RunView) -> list[str]:
    """One sentence per timing prompt and metric: faster, slower, or this run cannot tell, and why."""
    trials = view.kind("timing_trial")
    if not trials:
        return []
    verdicts = contention.cache_verdicts(trials)["verdicts"]
    if verdicts and not any(entry["cache_on"]["n"] + entry["cache_off"]["n"] for entry in verdicts):
        return [_no_uncontended_sample(verdicts)]
    items = []
    for entry in verdicts:
        other = entry["all_samples"]["verdict"]
        everything = entry["all_samples"]["cache_on"]["n"] + entry["all_samples"]["cache_off"]["n"]
        used = entry["cache_on"]["n"] + entry["cache_off"]["n"]
        note = ""
        if entry["not_used"]:
            left_out = ("every sample" if not used else ", ".join(map(str, entry["not_used"])))
            note = f"; left out as contended or without evidence: {left_out}"
            if other != entry["verdict"]:
                note += (f"; all {everything} samples, contended ones included, would say {other.replace('_', ' ')}, "
                         "which this report does not claim")
        groups = (f"; uncontended: with the cache {_group_text(entry['cache_on'])}, without "
                  f"{_group_text(entry['cache_off'])}" if used else "")
        items.append(f"{entry['prompt_id']}, {METRIC_WORDS[entry['metric']]}: {VERDICT_WORDS[entry['verdict']]}"
                     f"{_by_how_much(entry)} ({entry['reason']}{groups}{note})")
    return items


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


def _no_uncontended_sample(verdicts: list[dict]) -> str:
    """One sentence for every prompt and metric when no sample on either side is uncontended (the same reason)."""
    claimed_elsewhere = [f"{entry['prompt_id']} {METRIC_WORDS[entry['metric']]} "
                         f"{entry['all_samples']['verdict'].replace('_', ' ')}"
                         for entry in verdicts if entry["all_samples"]["verdict"] != entry["verdict"]]
    return (f"every prompt and metric: {VERDICT_WORDS['cannot_tell']} (no uncontended sample on either side: every "
            "sample is contended or carries no CPU evidence"
            + (f"; all samples, contended ones included, would say {', '.join(claimed_elsewhere)}, which this report "
               "does not claim" if claimed_elsewhere else "") + ")")


def verdict_lines(view: RunView) -> list[str]:
    """The verdict paragraph of the Timing section (it follows noise_lines' paragraph, on the same line)."""
    items = verdict_items(view)
    if not items:
        return []
    return [" **Did the cache make this run faster?** Each effect is the shift of log times without against with the "
            f"cache (positive: faster with it), from the uncontended samples (at least "
            f"{protocol.VERDICT_MIN_UNCONTENDED} a side), with its interval by the same method; a verdict is claimed "
            "only when the whole interval lies beyond this run's noise, on one side:", ""] \
        + [f"- {item}." for item in items] + [""]


def prefill_vs_decode_text(view: RunView) -> Optional[str]:
    """One prefill against one decode step, per timing prompt and cache setting, with its interval (one sentence)."""
    trials = view.kind("timing_trial")
    parts = []
    for entry in contention.cache_verdicts(trials)["prefill_vs_decode"] if trials else []:
        ratio = entry["ratio"]
        if ratio["estimate"] is None:
            continue
        interval = (f" [{ratio['low']:.2f}, {ratio['high']:.2f}] ({entry['interval']['coverage']:.1%} interval)"
                    if ratio["low"] is not None else f", no interval ({entry['interval']['reason']})")
        parts.append(f"{entry['prompt_id']} cache {'on' if entry['use_cache'] else 'off'}: "
                     f"{ratio['estimate']:.2f}×{interval}, {entry['samples']} samples")
    if not parts:
        return None
    return ("**Prefill against one decode step:** the prefill's time over the mean post-first interval (one step), "
            "the Hodges-Lehmann ratio with its interval by the method of the noise below: " + "; ".join(parts) + ".")


def short_verdicts(view: RunView) -> str:
    """The verdicts in one clause each, for the conclusions scaffold."""
    trials = view.kind("timing_trial")
    if not trials:
        return MISSING
    found = contention.cache_verdicts(trials)
    words = {"faster": "faster with the cache", "slower": "slower with the cache", "cannot_tell": "this run cannot tell"}
    return "; ".join(f"{v['prompt_id']} {METRIC_WORDS[v['metric']]}: {words[v['verdict']]}" for v in found["verdicts"])
