"""Whether a timing sample's thread was kept waiting (preempted; not whether caches or memory were shared): the
thread's usage read at the ends of each timed span (usage_reader), the collector kept out of the spans (collect_once,
TimedBlock, CollectionWatch), and the declared contention rule applied to a trial (trial_evidence, which the writer
and any later reader call alike). What each reading is and why:
docs/timing.md, "What each span records" and "The collector"; the machine's load: inferlab.host.machine.
"""

from __future__ import annotations

import gc
import time
from typing import Callable, Optional

from inferlab import protocol
from inferlab.measure.stats import completed, trial_contended

try:  # Windows has no resource module; macOS has no RUSAGE_THREAD
    import resource

    _RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)
except ImportError:  # pragma: no cover - platform dependent
    resource, _RUSAGE_THREAD = None, None
_THREAD_TIME_NS = time.thread_time_ns  # Linux and macOS (Windows is refused by the experiment)
_CLOCK = time.perf_counter_ns  # the loop's clock, bound once

SPANS = ("prefill", "loop")
READING_POINTS = ("start", "prefill_done", "end")
READING_FIELDS = ("thread_cpu_ns", "voluntary_switches", "involuntary_switches", "thread_minor_faults",
                  "thread_major_faults", "process_minor_faults", "process_major_faults")
READING_SCOPE = {name: "process" if name.startswith("process") else "thread" for name in READING_FIELDS}
FAULT_FIELDS = READING_FIELDS[3:]


def usage_sources() -> dict:
    """Where this platform's readings come from, or None for a reading it cannot take."""
    thread = _RUSAGE_THREAD is not None  # as usage_reader reads them
    return {"thread_cpu": "time.thread_time_ns (the thread's CPU clock)",
            "context_switches": "resource.getrusage(RUSAGE_THREAD) ru_nvcsw, ru_nivcsw" if thread else None,
            "thread_page_faults": "resource.getrusage(RUSAGE_THREAD) ru_minflt, ru_majflt (this thread's own)"
            if thread else None,
            "process_page_faults": "resource.getrusage(RUSAGE_SELF) ru_minflt, ru_majflt (every thread of the process)"
            if thread else None}


def _check_point() -> None:
    """Nothing: entering it is an interpreter check point, where CPython 3.12+ runs a collection an earlier
    allocation made due. It allocates nothing itself."""


def usage_reader() -> tuple[Callable[[], list], Callable[[], list]]:
    """(read_at_start, read_at_end): each returns the READING_FIELDS values (None where unavailable).

    The CPU reading is the last thing a start reader does and the first an end reader does, so it sits next to the
    wall stamp on both sides. A collection may run inside any allocation that finds one due (CPython 3.11) or at the
    next check point after it (3.12+); one that ran between a CPU reading and its wall stamp once put 34 ms of CPU
    time in an 18.8 ms span. So a start reader allocates its list and reads the rusage first, passes a check point,
    and only then reads the CPU clock and stores an int; an end reader reads the CPU clock before anything else.
    """
    thread_time, who = _THREAD_TIME_NS, _RUSAGE_THREAD
    if who is None:  # macOS: the CPU clock alone
        def start_cpu_only() -> list:
            reading = [None] * len(READING_FIELDS)
            _check_point()  # 3.12+: a collection the list made due runs here, not after the CPU reading
            reading[0] = thread_time()
            return reading

        def end_cpu_only() -> list:
            return [thread_time(), None, None, None, None, None, None]

        return start_cpu_only, end_cpu_only
    getrusage, whole = resource.getrusage, resource.RUSAGE_SELF

    def start() -> list:
        reading = [None] * len(READING_FIELDS)
        process, usage = getrusage(whole), getrusage(who)  # the process's window holds the thread's on both sides
        reading[1], reading[2], reading[3] = usage.ru_nvcsw, usage.ru_nivcsw, usage.ru_minflt
        reading[4], reading[5], reading[6] = usage.ru_majflt, process.ru_minflt, process.ru_majflt
        _check_point()  # 3.12+: a collection the last result made due runs here, not inside the span
        reading[0] = thread_time()
        return reading

    def end() -> list:
        cpu = thread_time()
        usage, process = getrusage(who), getrusage(whole)
        return [cpu, usage.ru_nvcsw, usage.ru_nivcsw, usage.ru_minflt, usage.ru_majflt, process.ru_minflt,
                process.ru_majflt]

    return start, end


def usage_read_cost(reads: int) -> dict:
    """What one span reading costs, from `reads` consecutive (read_at_start, read_at_end) pairs."""
    start, end = usage_reader()
    began = _CLOCK()
    for _ in range(reads):
        start()
        end()
    elapsed = _CLOCK() - began
    return {"usage_reads": 2 * reads, "usage_elapsed_ns": elapsed, "usage_per_read_ns": elapsed / (2 * reads)}


# --- the collector around the timed spans --------------------------------------------------------------------------

OFF_IN_SPANS, ON_IN_SPANS = "off_in_spans", "on_in_spans"
POLICIES = (OFF_IN_SPANS, ON_IN_SPANS)
DEFAULT_POLICY = OFF_IN_SPANS
ONCE = ("one full gc.collect() and gc.freeze() before the first timing trial (timed, in the timing_machine 'before' "
        "record), none before a single trial")
POLICY_TEXT = {
    OFF_IN_SPANS: ONCE + "; the cyclic collector off inside each trial's timed block (gc.disable), and back on after "
                         "it, as timeit does",
    ON_IN_SPANS: ONCE + "; the cyclic collector left on inside the timed blocks (--gc-in-spans): its collections are "
                        "timed with the work, and each one is recorded",
}
GENERATIONS = (0, 1, 2)
EVENT_FIELDS = ("generation", "start_ns", "stop_ns")


def policy_of(gc_in_spans: bool) -> str:
    """The policy a run declares for its --gc-in-spans setting."""
    return ON_IN_SPANS if gc_in_spans else OFF_IN_SPANS


def declaration(policy: str) -> dict:
    """The policy as the plan, the manifest and each trial state it."""
    return {"policy": policy, "rule": POLICY_TEXT[policy], "event_fields": list(EVENT_FIELDS),
            "source": "gc.callbacks (start and stop of each collection, stamped with time.perf_counter_ns)"}


class CollectionWatch:
    """A gc.callbacks entry: [generation, start_ns, stop_ns] for each collection while installed. It allocates only
    inside a collection (where no other can start), never in the timed code."""

    def __init__(self):
        self.events: list[list[int]] = []
        self._started: Optional[int] = None
        self._generation: Optional[int] = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started, self._generation = _CLOCK(), info.get("generation")
        elif self._started is not None:
            self.events.append([self._generation, self._started, _CLOCK()])
            self._started = None

    def __enter__(self) -> "CollectionWatch":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


class TimedBlock:
    """The policy around one timed block; `enabled_inside` says whether the collector was on as it began. Entering
    it collects nothing, and leaving it restores the collector as it was found."""

    def __init__(self, policy: str):
        if policy not in POLICIES:
            raise ValueError(f"collector policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy, self.was_enabled, self.enabled_inside = policy, gc.isenabled(), None

    def __enter__(self) -> "TimedBlock":
        if self.policy == OFF_IN_SPANS:
            gc.disable()
        self.enabled_inside = gc.isenabled()
        return self

    def __exit__(self, *exc) -> None:
        if self.was_enabled:
            gc.enable()


def collect_once(where: str) -> dict:
    """One full collection, then gc.freeze(), before the timing block as a whole: where, how long, what it found
    and froze."""
    began = _CLOCK()
    found = gc.collect()
    gc.freeze()
    return {"where": where, "elapsed_ns": _CLOCK() - began, "collected": found, "frozen": gc.get_freeze_count(),
            "how": "gc.collect(), then gc.freeze(), timed together with time.perf_counter_ns"}


def thaw() -> int:
    """Undo collect_once's freeze after the timing block; how many objects were still frozen."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    return frozen


def watch_cost(collections: int) -> dict:
    """What a CollectionWatch adds to one collection: its two callbacks run `collections` times on a watch of its
    own (no collection is made)."""
    watch, info = CollectionWatch(), {"generation": 0, "collected": 0, "uncollectable": 0}
    began = _CLOCK()
    for _ in range(collections):
        watch("start", info)
        watch("stop", info)
    elapsed = _CLOCK() - began
    return {"watch_collections": collections, "watch_elapsed_ns": elapsed,
            "watch_per_collection_ns": elapsed / collections}


def in_span(events: Optional[list], first_ns: int, last_ns: int) -> Optional[dict]:
    """The collections that started inside [first_ns, last_ns]: their count per generation and the collector's own
    time inside the span (each clipped to it); None without a watch's events."""
    if events is None:
        return None
    counts, spent = {str(g): 0 for g in GENERATIONS}, 0
    for generation, start, stop in events:
        if first_ns <= start <= last_ns:
            counts[str(generation)] += 1
            spent += min(stop, last_ns) - start
    return {"collections": sum(counts.values()), "collections_by_generation": counts, "collector_ns": spent}


# --- one trial's evidence under the declared rule --------------------------------------------------------------------

# What else ran inside a span. Minor faults are counted but are no disturbance: on CPython 3.11 nearly all are the
# interpreter mapping a frame-stack chunk as a forward's calls cross one, in every span of every trial (docs/timing.md).
DISTURBANCES = ("collection", "major_fault")


def _delta(readings: dict, first: str, last: str, index: int) -> Optional[int]:
    a, b = readings[first][index], readings[last][index]
    return None if a is None or b is None else b - a


def span_reasons(span: dict, rule: protocol.ContentionRule = protocol.CONTENTION_RULE) -> Optional[list[str]]:
    """The rule's reasons for calling a span contended (None when nothing was read): the collector's share is its
    time over the span's wall time; the major faults are the thread's own where read, else the process's."""
    wall, collector_ns = span.get("wall_ns"), span.get("collector_ns")
    share = collector_ns / wall if collector_ns is not None and wall else None
    major = span.get("thread_major_faults")
    major = major if major is not None else span.get("process_major_faults")
    return rule.span_reasons(span.get("cpu_share"), span.get("involuntary_switches"), share, major)


def span_evidence(readings: dict, first: str, last: str, wall_ns: int,
                  rule: protocol.ContentionRule = protocol.CONTENTION_RULE, collections: Optional[dict] = None) -> dict:
    """One span's CPU time and share of its wall time, switches, page faults, collections, and contention."""
    cpu = _delta(readings, first, last, 0)
    span = {"wall_ns": wall_ns, "cpu_ns": cpu,
            "cpu_share": cpu / wall_ns if cpu is not None and wall_ns else None,
            "voluntary_switches": _delta(readings, first, last, 1),
            "involuntary_switches": _delta(readings, first, last, 2),
            **{name: _delta(readings, first, last, READING_FIELDS.index(name)) for name in FAULT_FIELDS},
            **(collections or dict.fromkeys(("collections", "collections_by_generation", "collector_ns")))}
    reasons = span_reasons(span, rule)
    span["contended"] = None if reasons is None else bool(reasons)
    span["disturbed_by"] = (["collection"] if (span["collections"] or 0) > 0 else []) + (
        ["major_fault"] if any((span[n] or 0) > 0 for n in ("thread_major_faults", "process_major_faults")) else [])
    return span


def trial_evidence(readings: dict, t_start_ns: int, t_prefill_done_ns: int, t_end_ns: int,
                   rule: protocol.ContentionRule = protocol.CONTENTION_RULE, gc_events=None) -> dict:
    """A trial's `cpu_evidence` per span (prefill: start..prefill_done; loop: start..end, exactly loop_s),
    `contended` (None when nothing could be read), `contention_reasons` and `disturbed_by` over both spans.

    readings: {"start", "prefill_done", "end"} as usage_reader() returned them; gc_events: the trial's
    CollectionWatch events (a collection belongs to a span when it started between the span's wall stamps).
    """
    spans = {"prefill": span_evidence(readings, "start", "prefill_done", t_prefill_done_ns - t_start_ns, rule,
                                      in_span(gc_events, t_start_ns, t_prefill_done_ns)),
             "loop": span_evidence(readings, "start", "end", t_end_ns - t_start_ns, rule,
                                   in_span(gc_events, t_start_ns, t_end_ns))}
    flags = [spans[name]["contended"] for name in SPANS]
    return {"cpu_evidence": spans,
            "contended": None if all(f is None for f in flags) else any(bool(f) for f in flags),
            "contention_reasons": [f"{name} {reason}" for name in SPANS for reason in span_reasons(spans[name], rule)
                                   or []],
            "disturbed_by": [kind for kind in DISTURBANCES if any(kind in spans[n]["disturbed_by"] for n in SPANS)]}


def recorded_evidence(record: dict) -> dict:
    """trial_evidence() recomputed from a timing_trial record's raw fields, as a reader of the run would."""
    return trial_evidence(record["cpu_readings"], record["t_start_ns"], record["t_prefill_done_ns"],
                          record["token_times_ns"][-1], gc_events=record["gc_events"])


def contention_counts(trials: list[dict]) -> dict:
    """How many completed trials (warmups included) were contended, uncontended, or carry no evidence."""
    done = completed(trials)
    flags = [trial_contended(t) for t in done]
    return {"trials": len(done), "contended": flags.count(True), "uncontended": flags.count(False),
            "without_evidence": flags.count(None),
            "contended_ids": [t.get("schedule_id") for t, f in zip(done, flags) if f is True]}
