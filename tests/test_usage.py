"""inferlab.measure.usage: the contention rule, a trial's evidence, the readers at the span ends, the collector off in
the timed spans (one collection before the timing block, none before a single trial)."""

from __future__ import annotations

import copy
import gc
import json
import mmap
import sys
import time

import pytest

from inferlab import protocol
from inferlab.measure import usage
from inferlab.measure.decode_loop import run_greedy_loop

from test_decode_loop import prompt  # noqa: F401 (a fixture: a seven-token prompt; the tiny model is conftest.py's)

RULE = protocol.CONTENTION_RULE
MS = 1_000_000  # ns


@pytest.mark.parametrize("share, switches, collector, major, expected", [
    (0.995, 0, None, None, False), (RULE.min_cpu_share, 0, None, None, False),
    (RULE.min_cpu_share - 0.001, 0, None, None, True),
    (0.999, RULE.max_involuntary_switches, None, None, False),
    (0.999, RULE.max_involuntary_switches + 1, None, None, True),
    (0.999, 0, RULE.max_collector_share, 0, False), (0.999, 0, RULE.max_collector_share + 0.001, 0, True),
    (0.999, 0, 0.0, RULE.max_major_faults + 1, True), (None, None, None, None, None),
    (0.5, None, None, None, True),  # a platform without switch counts still has the share
])
def test_the_rule_marks_a_span_that_lost_its_cpu_and_says_unknown_without_readings(share, switches, collector, major,
                                                                                    expected):
    reasons = RULE.span_reasons(share, switches, collector_share=collector, major_faults=major)
    assert (None if reasons is None else bool(reasons)) is expected


def test_the_rules_thresholds_follow_from_half_the_smallest_effect_and_each_reason_is_named():
    budget = protocol.SMALLEST_TIMING_EFFECT / 2  # off the CPU and inside the collector, each at most half of it
    assert 1 - RULE.min_cpu_share == pytest.approx(budget) and RULE.max_collector_share == budget
    declared = RULE.declaration()
    assert declared["rule"] == RULE.describe() and {k: v for k, v in declared.items() if k != "rule"} == {
        "min_cpu_share": 0.985, "max_involuntary_switches": 10, "max_collector_share": 0.015, "max_major_faults": 0}
    assert RULE.span_reasons(0.5, 11, 0.02, 1) == [
        "CPU share 0.500 < 0.985", "involuntary switches 11 > 10", "collector time 0.020 of the span > 0.015",
        "major page faults 1 > 0"]


def readings(prefill_cpu_ns: int, loop_cpu_ns: int, involuntary: int = 0, start_cpu: int = 5 * MS) -> dict:
    """Raw readings (CPU ns, voluntary, involuntary switches, four fault counts) at the three points."""
    return {"start": [start_cpu, 3, 1, 0, 0, 0, 0], "prefill_done": [start_cpu + prefill_cpu_ns, 3, 1, 0, 0, 0, 0],
            "end": [start_cpu + loop_cpu_ns, 4, 1 + involuntary, 0, 0, 0, 0]}


def test_a_trials_evidence_is_its_spans_cpu_time_over_their_wall_time_and_what_disturbed_them():
    # prefill 2 ms wall, 1.99 ms CPU; loop 10 ms wall, 4 ms CPU: the loop lost the CPU, the prefill did not
    evidence = usage.trial_evidence(readings(1_990_000, 4 * MS), 100 * MS, 102 * MS, 110 * MS)
    prefill, loop = evidence["cpu_evidence"]["prefill"], evidence["cpu_evidence"]["loop"]
    assert (prefill["wall_ns"], prefill["cpu_ns"], prefill["cpu_share"], prefill["contended"]) == (
        2 * MS, 1_990_000, 0.995, False)
    assert (loop["wall_ns"], loop["cpu_share"], loop["voluntary_switches"], loop["involuntary_switches"]) == (
        10 * MS, 0.4, 1, 0)
    assert evidence["contended"] is True and evidence["contention_reasons"] == ["loop CPU share 0.400 < 0.985"]
    preempted = usage.trial_evidence(readings(1_990_000, 9_950_000, involuntary=11), 0, 2 * MS, 10 * MS)
    assert preempted["contention_reasons"] == ["loop involuntary switches 11 > 10"]
    nothing = {point: [None] * 7 for point in usage.READING_POINTS}
    unknown = usage.trial_evidence(nothing, 0, 2 * MS, 10 * MS)
    assert unknown["contended"] is None and unknown["cpu_evidence"]["loop"]["cpu_share"] is None  # never made up
    # a collection or a major fault inside a span is labelled, and judged by its share
    quiet = readings(1_995_000, 9_990_000)  # a 10 ms loop with its CPU; a collection at 105 ms, in the loop only
    collected = usage.trial_evidence(quiet, 100 * MS, 102 * MS, 110 * MS, gc_events=[[0, 105 * MS, 105 * MS + 200_000]])
    assert collected["cpu_evidence"]["prefill"]["contended"] is False
    assert collected["cpu_evidence"]["loop"]["collector_ns"] == 200_000  # 2 % of the loop
    assert collected["contention_reasons"] == ["loop collector time 0.020 of the span > 0.015"]
    small = usage.trial_evidence(quiet, 100 * MS, 102 * MS, 110 * MS, gc_events=[[0, 105 * MS, 105 * MS + 100_000]])
    assert small["contended"] is False and small["disturbed_by"] == ["collection"]  # labelled, within the rule
    faulted = copy.deepcopy(quiet)
    faulted["end"][4] = 1  # one major fault of the thread
    assert usage.trial_evidence(faulted, 100 * MS, 102 * MS, 110 * MS)["contention_reasons"] == [
        "loop major page faults 1 > 0"]
    for point in faulted.values():
        point[3] = point[4] = None  # a platform with no thread counts: the process's are judged
    faulted["end"][6] = 2
    evidence = usage.trial_evidence(faulted, 100 * MS, 102 * MS, 110 * MS)
    assert evidence["contention_reasons"] == ["loop major page faults 2 > 0"] and evidence["disturbed_by"] == [
        "major_fault"]


def test_the_readers_return_the_threads_cpu_time_switches_and_faults_and_say_what_they_cost():
    start, end = usage.usage_reader()
    # fresh pages straight from the kernel, one minor fault per 4 KiB page at its first touch (not a bytearray: the
    # allocator may hand back pages still mapped), without huge pages
    touched = mmap.mmap(-1, 64 * 1024 * 1024)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        touched.madvise(mmap.MADV_NOHUGEPAGE)
    first = start()
    for offset in range(0, len(touched), 4096):
        touched[offset] = 1
    last = end()
    touched.close()
    assert len(first) == len(last) == len(usage.READING_FIELDS) == len(usage.READING_SCOPE)
    sources = usage.usage_sources()
    if sources["thread_cpu"] is not None:
        assert last[0] > first[0]
    if sources["thread_page_faults"] is not None:
        assert last[1] >= first[1] and last[2] >= first[2]
        span = usage.trial_evidence({"start": first, "prefill_done": last, "end": last}, 0, 10, 20)["cpu_evidence"]
        assert span["loop"]["thread_minor_faults"] >= 16384  # every page of the mapping, touched once
        assert span["loop"]["process_minor_faults"] >= span["loop"]["thread_minor_faults"]
        assert span["loop"]["disturbed_by"] == []  # counted, never a disturbance
    cost = usage.usage_read_cost(100)
    assert cost["usage_reads"] == 200 and cost["usage_per_read_ns"] == cost["usage_elapsed_ns"] / 200


class _Tracked:
    """An object the cyclic collector counts when it is made (no free list serves it)."""


def _arm(burned: list, keep: list, burn_ns: int):
    """A gc callback noting where a collection ran and burning burn_ns of this thread's CPU in it; and allocations
    past the youngest generation's threshold, so the next counted allocation makes a collection due."""

    def burn(phase, info):
        if phase == "start":
            burned.append((sys._getframe(1).f_code.co_name, sys._getframe(2).f_code.co_name))
            began = time.thread_time_ns()
            while time.thread_time_ns() - began < burn_ns:
                pass

    gc.callbacks.append(burn)
    gc.disable()
    try:
        for _ in range(gc.get_threshold()[0] + 100):
            keep.append([])
    finally:
        gc.enable()
    return burn


@pytest.mark.parametrize("due", ["at the reader's own allocation", "after the CPU reading"])
@pytest.mark.parametrize("platform", ["thread clock and rusage", "thread clock only"])
def test_a_collection_after_a_cpu_reading_never_lands_inside_the_span_it_starts(monkeypatch, platform, due):
    # A CI run once recorded 34.3 ms of thread CPU time in an 18.8 ms prefill: a collection ran between the start
    # reader's CPU reading and the wall stamp. A collection made due here runs where CPython runs one (3.11: inside
    # the counted allocation; 3.12+: at the next check point), and must run outside the readings' span.
    if platform == "thread clock only":
        monkeypatch.setattr(usage, "_RUSAGE_THREAD", None)
    if usage.usage_sources()["thread_cpu"] is None:
        pytest.skip("this platform has no thread CPU reading")
    burned, keep, burns = [], [], []
    if due == "after the CPU reading":
        read = usage._THREAD_TIME_NS

        def armed():
            if not burns:  # the first reading arms the collector, with it off, and turns it on after
                burns.append(_arm(burned, keep, 5 * MS))
                gc.disable()
                try:
                    return read()
                finally:
                    gc.enable()
            return read()

        monkeypatch.setattr(usage, "_THREAD_TIME_NS", armed)
    start, end = usage.usage_reader()
    try:
        if due == "at the reader's own allocation":
            burns.append(_arm(burned, keep, 5 * MS))  # the next counted allocation is the start reader's list
        first = start()
        t_start = time.perf_counter_ns()
        t_end = time.perf_counter_ns()
        last = end()
        _Tracked()  # a collection still due runs here, after the span
    finally:
        for burn in burns:
            gc.callbacks.remove(burn)
    assert burned, "no collection ran: the test did not exercise what it is for"
    if due == "at the reader's own allocation":
        assert start.__name__ in burned[0], f"the collection ran in {burned[0]}, not in the start reader"
    assert last[0] - first[0] <= t_end - t_start + 200_000, f"the collection ran in {burned[0]}, inside the span"


@pytest.fixture
def eager_collector():
    """A collection due at almost every tracked allocation, so a loop left with the collector on meets many."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(5, 1, 1)
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_a_timed_block_switches_the_collector_off_collects_nothing_and_restores_what_it_found(monkeypatch):
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or 0)
    with usage.TimedBlock(usage.OFF_IN_SPANS) as block:
        assert not gc.isenabled() and block.enabled_inside is False
    assert gc.isenabled() and collections == []  # entering a trial's block starts nothing cold
    gc.disable()
    try:
        with usage.TimedBlock(usage.OFF_IN_SPANS):
            pass
        assert not gc.isenabled(), "a collector the caller had off was switched on"
    finally:
        gc.enable()
    with usage.TimedBlock(usage.ON_IN_SPANS) as block:
        assert gc.isenabled() and block.enabled_inside is True
    with pytest.raises(ValueError, match="expected one of off_in_spans, on_in_spans, got 'sometimes'"):
        usage.TimedBlock("sometimes")


def test_the_watch_stamps_each_collection_a_span_counts_those_started_inside_it_and_collect_once_freezes_the_rest():
    with usage.CollectionWatch() as watch:
        gc.collect(0)
        gc.collect(2)
    assert watch not in gc.callbacks and [event[0] for event in watch.events] == [0, 2]
    (_, a_start, a_stop), (_, b_start, b_stop) = watch.events
    assert usage.in_span(watch.events, a_start, b_stop) == {"collections": 2, "collector_ns": (a_stop - a_start)
                                                            + (b_stop - b_start),
                                                            "collections_by_generation": {"0": 1, "1": 0, "2": 1}}
    assert usage.in_span(watch.events, a_start, a_stop)["collections"] == 1  # the second started after the span
    assert usage.in_span(watch.events, b_start, b_start + 1)["collector_ns"] == 1  # clipped at the span's end
    # the one collection before the timing block is timed, and freezes what is alive until thawed
    kept = [[] for _ in range(1000)]  # tracked objects alive now
    try:
        found = usage.collect_once("here")
        assert found["where"] == "here" and found["elapsed_ns"] > 0 and found["frozen"] >= len(kept)
    finally:
        thawed = usage.thaw()
    assert len(kept) <= thawed <= found["frozen"] and gc.get_freeze_count() == 0


def test_a_loop_sees_no_collection_by_default_and_labels_those_it_meets_left_on(model, prompt, eager_collector,
                                                                                monkeypatch):
    full = []
    monkeypatch.setattr(gc, "collect", lambda *args: full.append(args) or 0)
    record = run_greedy_loop(model, *prompt, use_cache=True, new_tokens=6).to_record()
    monkeypatch.undo()
    assert full == [], "a full collection ran inside the trial, between its setup and its start stamp"
    assert record["collector_enabled_in_spans"] is False and gc.isenabled()
    for span in record["cpu_evidence"].values():
        assert span["collections"] == span["collector_ns"] == 0 and "collection" not in span["disturbed_by"]
    record = run_greedy_loop(model, *prompt, use_cache=True, new_tokens=6,
                             collector_policy=usage.ON_IN_SPANS).to_record()
    loop = record["cpu_evidence"]["loop"]
    assert record["collector_enabled_in_spans"] is True
    assert loop["collections"] > 0 and loop["collections"] == sum(loop["collections_by_generation"].values())
    assert 0 < loop["collector_ns"] <= loop["wall_ns"] and "collection" in record["disturbed_by"]
    assert record["cpu_evidence"] == usage.recorded_evidence(record)["cpu_evidence"]  # a reader's recomputation
    if loop["cpu_ns"] is not None:  # the collector's time is this thread's CPU time inside the span
        assert loop["cpu_ns"] <= loop["wall_ns"] + 200_000


def test_a_stand_in_run_declares_its_policy_collects_once_and_every_trial_records_collections_and_faults(standin_run):
    records = [json.loads(line) for line in (standin_run / "records.jsonl").read_text().splitlines()]
    plan = json.loads((standin_run / "plan.json").read_text())
    manifest = json.loads((standin_run / "manifest.json").read_text())
    before = next(r for r in records if r["kind"] == "timing_machine" and r["point"] == "before")
    policy = before["trials"]["collector"]["policy"]  # declared once, before any trial: the trials hold only their own
    assert plan["collector"]["policy"] == manifest["collector"]["policy"] == policy == usage.DEFAULT_POLICY
    assert before["collection"]["elapsed_ns"] > 0 and before["collection"]["frozen"] > 0
    assert before["seq"] < min(r["seq"] for r in records if r["kind"] == "timing_trial")
    trials = [r for r in records if r["kind"] == "timing_trial" and r["status"] == "ok"]
    assert len([t for t in trials if not t["warmup"]]) == 20
    for trial in trials:
        assert trial["collector_enabled_in_spans"] is False and "clock" not in trial and "stopping_rule" not in trial
        for name, span in trial["cpu_evidence"].items():
            assert set(span["collections_by_generation"]) == {"0", "1", "2"}
            assert span["collections"] == 0 and span["collector_ns"] == 0  # the collector was off in the span
            for reading in usage.FAULT_FIELDS:
                assert isinstance(span[reading], int) and span[reading] >= 0, (trial["schedule_id"], name, reading)
