"""Whether a timing sample had the CPU: the thread's own usage over each timed span, the declared rule's verdict
on it, the machine around the timing block, and what this run's timings can and cannot tell.

- usage_reader(): the function the loop calls at the ends of its spans (never between tokens): the thread's CPU
  time (time.thread_time_ns) and its voluntary and involuntary context switches (getrusage(RUSAGE_THREAD)), each
  None where the platform lacks it.
- trial_evidence(): a trial's derived contention fields from its raw readings and its clock stamps; the writer
  and verify call the same function, so a forged flag differs from its recomputation.
- machine_state(): load average, running processes, CPU pressure and frequency, each said unavailable when the
  platform does not give it (never a made-up value).
- cache_verdict(): per timing prompt and metric, the interval of the cache's effect from that metric's own samples
  (uncontended ones when each side has enough), claimed only beyond the declared threshold.

Nothing here reads the model; everything but the readers is arithmetic on records.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

from inferlab import protocol
from inferlab.measure import collector, intervals
from inferlab.measure.summaries import post_first_interval, trial_contended

try:  # not on every platform (Windows has no resource module; macOS has no RUSAGE_THREAD)
    import resource

    _RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)
except ImportError:  # pragma: no cover - platform dependent
    resource = None
    _RUSAGE_THREAD = None

_THREAD_TIME_NS = getattr(time, "thread_time_ns", None)
_CLOCK = time.perf_counter_ns  # bound once: the cost measurement keeps its own clock

SPANS = ("prefill", "loop")
READING_POINTS = ("start", "prefill_done", "end")
READING_FIELDS = ("thread_cpu_ns", "voluntary_switches", "involuntary_switches", "thread_minor_faults",
                  "thread_major_faults", "process_minor_faults", "process_major_faults")
# which readings are the timed thread's own and which the whole process's (RUSAGE_THREAD against RUSAGE_SELF)
READING_SCOPE = {"thread_cpu_ns": "thread", "voluntary_switches": "thread", "involuntary_switches": "thread",
                 "thread_minor_faults": "thread", "thread_major_faults": "thread",
                 "process_minor_faults": "process", "process_major_faults": "process"}


def usage_sources() -> dict:
    """Where this platform's readings come from, or None for a reading it cannot take."""
    cpu = ("time.thread_time_ns (the thread's CPU clock)" if _THREAD_TIME_NS is not None
           else "resource.getrusage(RUSAGE_THREAD) ru_utime + ru_stime" if _RUSAGE_THREAD is not None else None)
    switches = ("resource.getrusage(RUSAGE_THREAD) ru_nvcsw, ru_nivcsw" if _RUSAGE_THREAD is not None else None)
    thread_faults = ("resource.getrusage(RUSAGE_THREAD) ru_minflt, ru_majflt (this thread's own)"
                     if _RUSAGE_THREAD is not None else None)
    process_faults = ("resource.getrusage(RUSAGE_SELF) ru_minflt, ru_majflt (every thread of the process)"
                      if resource is not None else None)
    return {"thread_cpu": cpu, "context_switches": switches, "thread_page_faults": thread_faults,
            "process_page_faults": process_faults}


def _check_point() -> None:
    """Nothing: calling it is an interpreter check point (entering a Python function), where CPython 3.12+ runs a
    collection that an earlier allocation made due. It allocates nothing itself."""


def usage_reader() -> tuple[Callable[[], list], Callable[[], list]]:
    """(read_at_start, read_at_end): each returns the READING_FIELDS values (None where unavailable).

    The CPU reading is the last thing a start reader does and the first thing an end reader does, so it sits next
    to the wall clock read on both sides: a start reader builds its list before it reads the CPU clock and only
    stores an int after it. On CPython 3.11 a cyclic garbage collection runs inside whichever allocation crosses
    the threshold; one that ran after the CPU reading and before the wall stamp counted tens of milliseconds of CPU
    time the wall span did not contain (a CI run recorded 34 ms of CPU in 18.8 ms of wall time). CPython 3.12 and
    later run it instead at the interpreter's next check point (a call's return, a function's entry, a loop's jump)
    after the allocation that made it due, so a start reader passes one check point after its last allocation and
    before its CPU reading: a collection its own list or readings made due runs there, outside the span. The
    page-fault readings (two getrusage calls: the thread's, then the process's) are taken before the CPU reading at
    the start and after it at the end, so they too stay outside the pair of CPU and wall stamps.
    """
    thread_time, who = _THREAD_TIME_NS, _RUSAGE_THREAD
    if who is not None:
        getrusage, whole = resource.getrusage, resource.RUSAGE_SELF
        if thread_time is not None:
            def start() -> list:
                reading = [None, None, None, None, None, None, None]
                # called after the list exists: 3.12+ runs a collection that an allocation made due at the check
                # after the next call, so it runs here, before the CPU reading, not after it
                usage = getrusage(who)
                process = getrusage(whole)
                reading[1], reading[2] = usage.ru_nvcsw, usage.ru_nivcsw
                reading[3], reading[4] = usage.ru_minflt, usage.ru_majflt
                reading[5], reading[6] = process.ru_minflt, process.ru_majflt
                _check_point()  # 3.12+: a collection the last result made due runs here, not inside the span
                reading[0] = thread_time()
                return reading

            def end() -> list:
                cpu = thread_time()
                usage = getrusage(who)
                process = getrusage(whole)
                return [cpu, usage.ru_nvcsw, usage.ru_nivcsw, usage.ru_minflt, usage.ru_majflt, process.ru_minflt,
                        process.ru_majflt]

            return start, end

        def start_from_rusage() -> list:
            process = getrusage(whole)  # before the list: the list, not the CPU call, meets a collection now due
            reading = [None, None, None, None, None, None, None]
            _check_point()  # 3.12+: a collection the list made due runs here, not after getrusage's reading
            usage = getrusage(who)  # (its own result is built after the system call: a one-allocation window)
            # int(x + 0.5), not round(): round() looks up __round__ and allocates a bound method, a tracked object
            reading[0] = int((usage.ru_utime + usage.ru_stime) * 1e9 + 0.5)
            reading[1], reading[2] = usage.ru_nvcsw, usage.ru_nivcsw
            reading[3], reading[4] = usage.ru_minflt, usage.ru_majflt
            reading[5], reading[6] = process.ru_minflt, process.ru_majflt
            return reading

        def end_from_rusage() -> list:
            usage = getrusage(who)
            process = getrusage(whole)
            return [int((usage.ru_utime + usage.ru_stime) * 1e9 + 0.5), usage.ru_nvcsw, usage.ru_nivcsw,
                    usage.ru_minflt, usage.ru_majflt, process.ru_minflt, process.ru_majflt]

        return start_from_rusage, end_from_rusage
    if thread_time is not None:
        def start_cpu_only() -> list:
            reading = [None, None, None, None, None, None, None]
            _check_point()  # 3.12+: a collection the list made due runs here, not after the CPU reading
            reading[0] = thread_time()
            return reading

        def end_cpu_only() -> list:
            return [thread_time(), None, None, None, None, None, None]

        return start_cpu_only, end_cpu_only

    def nothing() -> list:
        return [None, None, None, None, None, None, None]

    return nothing, nothing


def usage_read_cost(reads: int) -> dict:
    """What one span reading (read_at_start, then read_at_end) costs, from `reads` consecutive pairs."""
    start, end = usage_reader()
    clock = _CLOCK
    began = clock()
    for _ in range(reads):
        start()
        end()
    elapsed = clock() - began
    return {"usage_reads": 2 * reads, "usage_elapsed_ns": elapsed, "usage_per_read_ns": elapsed / (2 * reads)}


# --- one trial's evidence ------------------------------------------------------------------------


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _delta(readings: dict, first: str, last: str, index: int) -> Optional[int]:
    a, b = readings.get(first), readings.get(last)
    if not (isinstance(a, list) and isinstance(b, list) and len(a) > index and len(b) > index):
        return None
    x, y = _int(a[index]), _int(b[index])
    return None if x is None or y is None else y - x


FAULT_FIELDS = READING_FIELDS[3:]
# What else can run inside a span, as its label says. Minor faults are counted per span but are no disturbance: on
# CPython 3.11 nearly all of them are the interpreter mapping a frame-stack chunk each time a forward's calls cross
# one (their count follows where the calls fall, not the cache; docs/timing.md), in every span of every trial.
DISTURBANCES = ("collection", "major_fault")


def disturbances(span: dict) -> list[str]:
    """What else ran inside a span (span_evidence's fields): a collection, a major fault (thread or process); empty
    when nothing did or nothing could be read."""
    found = []
    if (span.get("collections") or 0) > 0:
        found.append("collection")
    if any((span.get(name) or 0) > 0 for name in ("thread_major_faults", "process_major_faults")):
        found.append("major_fault")
    return found


def span_evidence(readings: dict, first: str, last: str, wall_ns: Optional[int],
                  rule: protocol.ContentionRule = protocol.CONTENTION_RULE, collections: Optional[dict] = None) -> dict:
    """One span's CPU time, share of its wall time, switches, page faults, collections and contention under the rule.

    collections: collector.in_span's count for this span (None when the trial recorded no collection events).
    """
    cpu = _delta(readings, first, last, 0)
    share = cpu / wall_ns if cpu is not None and isinstance(wall_ns, int) and wall_ns > 0 else None
    involuntary = _delta(readings, first, last, 2)
    span = {"wall_ns": wall_ns, "cpu_ns": cpu, "cpu_share": share,
            "voluntary_switches": _delta(readings, first, last, 1), "involuntary_switches": involuntary,
            **{name: _delta(readings, first, last, READING_FIELDS.index(name)) for name in FAULT_FIELDS},
            "collections": collections["collections"] if collections else None,
            "collections_by_generation": collections["by_generation"] if collections else None,
            "collector_ns": collections["collector_ns"] if collections else None}
    reasons = span_reasons(span, rule)
    span["contended"] = None if reasons is None else bool(reasons)
    span["disturbed_by"] = disturbances(span)
    return span


def span_reasons(span: dict, rule: protocol.ContentionRule = protocol.CONTENTION_RULE) -> Optional[list[str]]:
    """The rule's reasons for calling a span (span_evidence's fields) contended; None when nothing was read. The
    collector's share is its time over the span's wall time; the major faults are the thread's own where read,
    else the process's."""
    wall, collector_ns = span.get("wall_ns"), span.get("collector_ns")
    collector_share = (collector_ns / wall if _int(collector_ns) is not None and _int(wall) is not None and wall > 0
                       else None)
    major = span.get("thread_major_faults")
    major = major if major is not None else span.get("process_major_faults")
    return rule.span_reasons(span.get("cpu_share"), span.get("involuntary_switches"), collector_share, major)


def trial_evidence(readings: dict, t_start_ns: int, t_prefill_done_ns: int, t_end_ns: int,
                   rule: protocol.ContentionRule = protocol.CONTENTION_RULE, gc_events=None) -> dict:
    """A trial's derived fields: `cpu_evidence` per span, `contended` (None when nothing could be read) and
    `disturbed_by` (what else ran in any span: DISTURBANCES).

    readings: {"start": [...], "prefill_done": [...], "end": [...]} as usage_reader() returned them; the prefill
    span is start..prefill_done against t_prefill_done_ns - t_start_ns, the loop span start..end against
    t_end_ns - t_start_ns (exactly loop_s). gc_events: the trial's collector.CollectionWatch events (None when it
    recorded none); a collection belongs to a span when it started between the span's wall stamps.
    """
    spans = {"prefill": span_evidence(readings, "start", "prefill_done", t_prefill_done_ns - t_start_ns, rule,
                                      collector.in_span(gc_events, t_start_ns, t_prefill_done_ns)),
             "loop": span_evidence(readings, "start", "end", t_end_ns - t_start_ns, rule,
                                   collector.in_span(gc_events, t_start_ns, t_end_ns))}
    flags = [spans[name]["contended"] for name in SPANS]
    contended = None if all(f is None for f in flags) else any(bool(f) for f in flags)
    reasons = [f"{name} {reason}" for name in SPANS for reason in span_reasons(spans[name], rule) or []]
    disturbed = [kind for kind in DISTURBANCES if any(kind in spans[name]["disturbed_by"] for name in SPANS)]
    return {"cpu_evidence": spans, "contended": contended, "contention_reasons": reasons, "disturbed_by": disturbed}


def recorded_evidence(record: dict) -> Optional[dict]:
    """trial_evidence() recomputed from a timing_trial record's raw fields, or None when it has none."""
    readings = record.get("cpu_readings")
    start, prefill, tokens = record.get("t_start_ns"), record.get("t_prefill_done_ns"), record.get("token_times_ns")
    if not isinstance(readings, dict) or _int(start) is None or _int(prefill) is None \
            or not isinstance(tokens, list) or not tokens or _int(tokens[-1]) is None:
        return None
    return trial_evidence(readings, start, prefill, tokens[-1], gc_events=record.get("gc_events"))


def loop_cpu_share(record: dict) -> Optional[float]:
    """The loop span's recorded CPU share, or None."""
    evidence = record.get("cpu_evidence")
    loop = evidence.get("loop") if isinstance(evidence, dict) else None
    share = loop.get("cpu_share") if isinstance(loop, dict) else None
    return share if isinstance(share, (int, float)) and not isinstance(share, bool) else None


# --- the machine around the timing block -----------------------------------------------------------

PROC = Path("/proc")
CPU_SYS = Path("/sys/devices/system/cpu")


def _read(path: Path) -> tuple[Optional[str], Optional[str]]:
    try:
        return path.read_text(encoding="utf-8", errors="replace"), None
    except OSError as error:
        return None, f"{path}: {type(error).__name__}: {error.strerror or error}"


def _load_average() -> dict:
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError) as error:
        return {"available": False, "reason": f"os.getloadavg: {type(error).__name__}: {error}"}
    return {"available": True, "1m": one, "5m": five, "15m": fifteen, "source": "os.getloadavg"}


def _running_processes() -> dict:
    text, problem = _read(PROC / "loadavg")
    if text is not None:
        fields = text.split()
        if len(fields) >= 4 and "/" in fields[3]:
            running, total = fields[3].split("/", 1)
            if running.isdigit() and total.isdigit():
                return {"available": True, "running": int(running), "total": int(total),
                        "source": "/proc/loadavg (running/total scheduling entities, this process included)"}
    stat, stat_problem = _read(PROC / "stat")
    for line in (stat or "").splitlines():
        name, _, value = line.partition(" ")
        if name == "procs_running" and value.strip().isdigit():
            return {"available": True, "running": int(value), "source": "/proc/stat procs_running"}
    return {"available": False, "reason": "; ".join(p for p in (problem, stat_problem) if p)
            or "/proc/loadavg and /proc/stat hold no running count"}


def _cpu_pressure() -> dict:
    text, problem = _read(PROC / "pressure" / "cpu")
    if text is None:
        return {"available": False, "reason": f"no CPU pressure information ({problem})"}
    parsed = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        values = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            try:
                values[key] = int(value) if key == "total" else float(value)
            except ValueError:
                continue
        parsed[kind] = values
    if "some" not in parsed:
        return {"available": False, "reason": f"{PROC / 'pressure' / 'cpu'}: no 'some' line in {text!r}"}
    return {"available": True, **parsed,
            "source": "/proc/pressure/cpu (share of time some runnable task waited for a CPU; total in µs)"}


def _cpu_frequency() -> dict:
    found = {}
    for folder in sorted(CPU_SYS.glob("cpu[0-9]*/cpufreq")):
        text, _ = _read(folder / "scaling_cur_freq")
        if text is not None and text.strip().isdigit():
            found[folder.parent.name] = int(text.strip()) / 1000
    if found:
        return {"available": True, "mhz": found, "source": f"{CPU_SYS}/cpu*/cpufreq/scaling_cur_freq"}
    text, problem = _read(PROC / "cpuinfo")
    mhz = []
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                mhz.append(float(value))
            except ValueError:
                continue
    if mhz:
        return {"available": True, "mhz": {f"cpu{i}": v for i, v in enumerate(mhz)},
                "source": "/proc/cpuinfo 'cpu MHz' (may be the nominal rate on a virtual machine)"}
    return {"available": False, "reason": f"no cpufreq folder and no 'cpu MHz' in /proc/cpuinfo ({problem})"
            if problem else "no cpufreq folder and no 'cpu MHz' in /proc/cpuinfo"}


def _affinity() -> dict:
    try:
        return {"available": True, "cpus": sorted(os.sched_getaffinity(0)), "source": "os.sched_getaffinity"}
    except (AttributeError, OSError) as error:
        return {"available": False, "reason": f"os.sched_getaffinity: {type(error).__name__}: {error}"}


def machine_state() -> dict:
    """The machine now: each reading with `available` and its source, or the reason it is unavailable."""
    return {"read_at_ns": time.perf_counter_ns(), "load_average": _load_average(),
            "running_processes": _running_processes(), "cpu_pressure": _cpu_pressure(),
            "cpu_frequency": _cpu_frequency(), "affinity": _affinity(), "cpu_count": os.cpu_count()}


MACHINE_READINGS = ("load_average", "running_processes", "cpu_pressure", "cpu_frequency", "affinity")


def unexplained_readings(state: dict) -> list[str]:
    """The machine readings that are neither available nor said unavailable with a reason."""
    return [name for name in MACHINE_READINGS if not isinstance(state.get(name), dict)
            or not (state[name].get("available") is True or state[name].get("reason"))]


def pressure_between(before: dict, after: dict) -> Optional[float]:
    """The share of the time between two machine_state readings in which some task waited for a CPU (from
    /proc/pressure/cpu 'some total'), or None when either lacks it."""
    try:
        stalled_us = after["cpu_pressure"]["some"]["total"] - before["cpu_pressure"]["some"]["total"]
        wall_us = (after["read_at_ns"] - before["read_at_ns"]) / 1e3
    except (KeyError, TypeError):
        return None
    return stalled_us / wall_us if wall_us > 0 else None


# --- the cache verdict ----------------------------------------------------------------------------

VERDICT_METRICS = ("mean_post_first_interval_s", "loop_s")


def _value(record: dict, metric: str) -> Optional[float]:
    value = post_first_interval(record) if metric == "mean_post_first_interval_s" else record.get(metric)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _measured(trials: list[dict], prompt_id: str, use_cache: bool) -> list[dict]:
    return sorted((t for t in trials if t.get("status", "ok") == "ok" and t.get("warmup") is False
                   and t.get("prompt_id") == prompt_id and t.get("use_cache") == use_cache),
                  key=lambda t: t.get("schedule_index", 0))


def _group(trials: list[dict], metric: str) -> dict:
    values = [(t, _value(t, metric)) for t in trials]
    numbers = [v for _, v in values if v is not None]
    return {"n": len(numbers), "schedule_ids": [t.get("schedule_id") for t, v in values if v is not None],
            "values": numbers, "median": statistics.median(numbers) if numbers else None,
            "min": min(numbers) if numbers else None, "max": max(numbers) if numbers else None}


def chosen_samples(*groups: list[dict]) -> tuple[str, list[list[dict]]]:
    """('uncontended', those trials of each group) when every group has protocol.VERDICT_MIN_UNCONTENDED of them,
    else ('all', the groups as they are)."""
    clean = [[t for t in group if trial_contended(t) is False] for group in groups]
    if all(len(group) >= protocol.VERDICT_MIN_UNCONTENDED for group in clean):
        return "uncontended", clean
    return "all", [list(group) for group in groups]


def interval_fields(shift: dict) -> dict:
    """An intervals.log_shift result with its shift also as fractions of time (exp(shift) - 1)."""
    return {**shift, "estimate_fraction": intervals.fraction(shift["estimate"]),
            "low_fraction": intervals.fraction(shift["low"]), "high_fraction": intervals.fraction(shift["high"])}


def cache_verdict(trials: list[dict], prompt_id: str, metric: str,
                  threshold: float = protocol.SMALLEST_TIMING_EFFECT) -> dict:
    """Whether the cache made this metric faster for this prompt in this run: 'faster', 'slower' or 'cannot_tell',
    from this metric's own samples alone (intervals.verdict against the declared threshold).

    The effect is the shift of log times without against with the cache (positive: the cache is faster), with its
    interval (intervals.log_shift); `effect` is its estimate as a fraction of time. The samples are the uncontended
    ones when each side has enough (chosen_samples), else all of them, and `samples` says which.
    """
    on, off = _measured(trials, prompt_id, True), _measured(trials, prompt_id, False)
    samples, (used_on, used_off) = chosen_samples(on, off)
    a, b = _group(used_on, metric), _group(used_off, metric)
    interval = interval_fields(intervals.log_shift(a["values"], b["values"]))
    verdict, reason = intervals.verdict(interval, threshold)
    if samples == "all":
        clean = [sum(1 for t in group if trial_contended(t) is False) for group in (on, off)]
        reason += (f"; from all samples: fewer than {protocol.VERDICT_MIN_UNCONTENDED} of them uncontended on a side "
                   f"(cache on {clean[0]}, off {clean[1]}; the others contended or without CPU evidence)")
    used = {id(t) for t in used_on + used_off}
    return {"prompt_id": prompt_id, "metric": metric, "verdict": verdict, "reason": reason, "samples": samples,
            "threshold": threshold, "effect": interval["estimate_fraction"], "interval": interval,
            "cache_on": a, "cache_off": b, "not_used": [t.get("schedule_id") for t in on + off if id(t) not in used]}


def prefill_vs_decode(trials: list[dict], prompt_id: str, use_cache: bool) -> dict:
    """How many decode steps one prefill is worth in this condition: per trial, its prefill_s over its own mean
    post-first interval (the two come from one trial, so they are paired, never two independent samples); the
    median [min, max] of those ratios, from the uncontended trials when there are enough."""
    measured = _measured(trials, prompt_id, use_cache)
    samples, (chosen,) = chosen_samples(measured)
    pairs = [(t, _value(t, "prefill_s"), _value(t, "mean_post_first_interval_s")) for t in chosen]
    ratios = [prefill / step for _, prefill, step in pairs if prefill is not None and step is not None]
    return {"prompt_id": prompt_id, "use_cache": use_cache, "samples": samples, "n": len(ratios), "ratios": ratios,
            "median": statistics.median(ratios) if ratios else None, "min": min(ratios, default=None),
            "max": max(ratios, default=None), "output_length": sorted({t.get("output_length") for t in chosen}, key=str)}


def cache_verdicts(trials: list[dict]) -> dict:
    """The declared threshold, one verdict per timing prompt and metric (VERDICT_METRICS), and prefill against
    one decode step per prompt and cache setting."""
    return {"threshold": protocol.SMALLEST_TIMING_EFFECT,
            "verdicts": [cache_verdict(trials, p, m) for p in protocol.TIMING_PROMPTS for m in VERDICT_METRICS],
            "prefill_vs_decode": [prefill_vs_decode(trials, p, c) for p in protocol.TIMING_PROMPTS
                                  for c in (True, False)]}


def contention_counts(trials: list[dict]) -> dict:
    """How many completed trials (warmups included) were contended, uncontended, or carry no evidence."""
    done = [t for t in trials if t.get("status", "ok") == "ok"]
    flags = [trial_contended(t) for t in done]
    return {"trials": len(done), "contended": flags.count(True), "uncontended": flags.count(False),
            "without_evidence": flags.count(None),
            "contended_ids": [t.get("schedule_id") for t, f in zip(done, flags) if f is True]}
