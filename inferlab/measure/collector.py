"""Python's cyclic garbage collector around the timed spans: the declared policy, and what collections ran inside.

A collection runs inside whichever allocation crosses the collector's threshold, so without a policy a timed
decode loop also times the collector (a 16-token loop saw 16 to 17 of them). Before the timing block as a whole
(not before each trial) collect_once() runs one full collection and gc.freeze(), so the objects alive then are out
of every later collection's way; it is timed and recorded once, and thaw() undoes the freeze after the block.
Nothing is collected between a trial's setup and its start stamp: a full collection there (as this module once
ran before every trial) walks every object, and the prefill and the first step after it ran cold. Two policies
for the trials, declared in the plan and the manifest and recorded by every timing trial:

- "off_in_spans" (the default, as timeit does): the collector is switched off for each trial's timed block and
  switched back on after it.
- "on_in_spans" (--gc-in-spans): the collector stays as it was, so what it costs is measured as a condition of
  its own.

Either way a CollectionWatch in gc.callbacks stamps each collection's start and stop on the loop's own clock
(time.perf_counter_ns) with its generation, so a span's collections and the collector's own time inside it are
found from the stamps alone (in_span), by the writer and by verify alike.

Collections are the interpreter's, not the thread's: with one interpreter and one Python thread doing the timing
they are the timed thread's.
"""

from __future__ import annotations

import gc
import time
from typing import Optional

OFF_IN_SPANS = "off_in_spans"
ON_IN_SPANS = "on_in_spans"
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
_CLOCK = time.perf_counter_ns


def policy_of(gc_in_spans: bool) -> str:
    """The policy a run declares for its --gc-in-spans setting."""
    return ON_IN_SPANS if gc_in_spans else OFF_IN_SPANS


def declaration(policy: str) -> dict:
    """The policy as the plan, the manifest and each trial state it."""
    if policy not in POLICIES:
        raise ValueError(f"collector policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    return {"policy": policy, "rule": POLICY_TEXT[policy], "event_fields": list(EVENT_FIELDS),
            "source": "gc.callbacks (start and stop of each collection, stamped with time.perf_counter_ns)"}


class CollectionWatch:
    """A gc.callbacks entry: [generation, start_ns, stop_ns] for each collection while it is installed.

    It allocates only inside a collection (where no other collection can start), never in the timed code.
    """

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
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def collect_once(where: str) -> dict:
    """One full collection, then gc.freeze(): what the run records of it (where, how long, what it found and froze).
    Called once, before the timing block as a whole."""
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


class TimedBlock:
    """The policy around one timed block: `with TimedBlock(policy) as block:` ... block.enabled_inside says whether
    the collector was on when the block began. Entering it collects nothing."""

    def __init__(self, policy: str):
        if policy not in POLICIES:
            raise ValueError(f"collector policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.was_enabled = gc.isenabled()
        self.enabled_inside: Optional[bool] = None

    def __enter__(self) -> "TimedBlock":
        if self.policy == OFF_IN_SPANS:
            gc.disable()
        self.enabled_inside = gc.isenabled()
        return self

    def __exit__(self, *exc) -> None:
        if self.was_enabled:
            gc.enable()


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def valid_events(events) -> Optional[list[tuple[int, int, int]]]:
    """The recorded events as (generation, start_ns, stop_ns), or None when they are not a list of such triples."""
    if not isinstance(events, list):
        return None
    found = []
    for event in events:
        if not (isinstance(event, list) and len(event) == 3 and all(_int(v) is not None for v in event)):
            return None
        found.append(tuple(event))
    return found


def in_span(events, first_ns: int, last_ns: int) -> Optional[dict]:
    """The collections that started inside [first_ns, last_ns]: their count per generation and the collector's
    own time inside the span (each collection clipped to it); None without valid events."""
    found = valid_events(events)
    if found is None:
        return None
    counts = {str(g): 0 for g in GENERATIONS}
    spent = 0
    for generation, start, stop in found:
        if first_ns <= start <= last_ns:
            counts[str(generation)] = counts.get(str(generation), 0) + 1
            spent += min(stop, last_ns) - start
    return {"collections": sum(counts.values()), "by_generation": counts, "collector_ns": spent}


def watch_cost(collections: int) -> dict:
    """What a CollectionWatch adds to one collection inside a span: its start and stop callbacks run `collections`
    times on a watch of its own (no collection is made), per_collection_ns = elapsed / collections."""
    watch = CollectionWatch()
    info = {"generation": 0, "collected": 0, "uncollectable": 0}
    began = _CLOCK()
    for _ in range(collections):
        watch("start", info)
        watch("stop", info)
    elapsed = _CLOCK() - began
    return {"watch_collections": collections, "watch_elapsed_ns": elapsed, "watch_per_collection_ns": elapsed / collections}
