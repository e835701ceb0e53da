"""The garbage-collector policy around the timed spans, and the collections each span records."""

from __future__ import annotations

import gc

import pytest
import torch

from inferlab.measure import collector, contention
from inferlab.measure.decode_loop import run_greedy_loop
from inferlab.specimen.build import tiny_gpt_neox

PROMPT = [5, 17, 33, 2, 9, 40, 11]


@pytest.fixture(scope="module")
def model():
    return tiny_gpt_neox(seed=0)


@pytest.fixture
def prompt():
    ids = torch.tensor([PROMPT], dtype=torch.long)
    return ids, torch.ones_like(ids)


@pytest.fixture
def eager_collector():
    """A collection due at almost every tracked allocation, so a loop left with the collector on meets many."""
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(5, 1, 1)
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_off_in_spans_switches_off_inside_collects_nothing_and_restores_the_state_it_found(monkeypatch):
    assert gc.isenabled()
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or 0)
    with collector.TimedBlock(collector.OFF_IN_SPANS) as block:
        assert not gc.isenabled() and block.enabled_inside is False
    assert gc.isenabled() and collections == []  # entering a trial's block starts nothing cold
    monkeypatch.undo()
    gc.disable()
    try:
        with collector.TimedBlock(collector.OFF_IN_SPANS):
            pass
        assert not gc.isenabled(), "a collector the caller had off was switched on"
    finally:
        gc.enable()
    with collector.TimedBlock(collector.ON_IN_SPANS) as block:
        assert gc.isenabled() and block.enabled_inside is True
    with pytest.raises(ValueError, match="expected one of off_in_spans, on_in_spans, got 'sometimes'"):
        collector.TimedBlock("sometimes")


def test_the_watch_stamps_each_collection_and_in_span_counts_only_those_that_started_inside():
    with collector.CollectionWatch() as watch:
        gc.collect(0)
        gc.collect(2)
    assert watch not in gc.callbacks
    assert [event[0] for event in watch.events] == [0, 2]
    assert all(start <= stop for _, start, stop in watch.events)
    (_, a_start, a_stop), (_, b_start, b_stop) = watch.events
    both = collector.in_span(watch.events, a_start, b_stop)
    assert both == {"collections": 2, "by_generation": {"0": 1, "1": 0, "2": 1},
                    "collector_ns": (a_stop - a_start) + (b_stop - b_start)}
    only_first = collector.in_span(watch.events, a_start, a_stop)  # the second started after the span ended
    assert only_first["collections"] == 1 and only_first["by_generation"]["2"] == 0
    clipped = collector.in_span(watch.events, b_start, b_start + 1)  # a collection running past the span's end
    assert clipped["collector_ns"] == 1
    assert collector.in_span("garbage", 0, 1) is None and collector.in_span([[0, 1]], 0, 1) is None


def test_the_one_collection_before_the_block_is_timed_and_freezes_what_is_alive_until_thawed():
    kept = [[] for _ in range(1000)]  # tracked objects alive now
    try:
        found = collector.collect_once("here")
        assert found["where"] == "here" and found["elapsed_ns"] > 0 and found["frozen"] >= len(kept)
        still = gc.get_freeze_count()  # a frozen object that dies leaves the count
        assert len(kept) <= still <= found["frozen"]
    finally:
        thawed = collector.thaw()
    assert len(kept) <= thawed <= found["frozen"] and gc.get_freeze_count() == 0


def test_a_loop_under_the_default_policy_collects_nothing_and_sees_no_collection_in_its_spans(
        model, prompt, eager_collector, monkeypatch):
    full = []
    monkeypatch.setattr(gc, "collect", lambda *args: full.append(args) or 0)
    record = run_greedy_loop(model, *prompt, use_cache=True, new_tokens=6).to_record()
    monkeypatch.undo()
    assert full == [], "a full collection ran inside the trial, between its setup and its start stamp"
    assert record["collector"]["policy"] == collector.OFF_IN_SPANS and record["collector"]["enabled_in_spans"] is False
    assert gc.isenabled(), "the collector was not switched back on after the timed block"
    for span in ("prefill", "loop"):
        assert record["cpu_evidence"][span]["collections"] == 0
        assert record["cpu_evidence"][span]["collector_ns"] == 0
        assert "collection" not in record["cpu_evidence"][span]["disturbed_by"]


def test_a_loop_with_the_collector_left_on_records_and_labels_its_collections(model, prompt, eager_collector):
    record = run_greedy_loop(model, *prompt, use_cache=True, new_tokens=6,
                             collector_policy=collector.ON_IN_SPANS).to_record()
    loop = record["cpu_evidence"]["loop"]
    assert record["collector"] == {"policy": collector.ON_IN_SPANS, "enabled_in_spans": True}
    assert loop["collections"] > 0 and loop["collections"] == sum(loop["collections_by_generation"].values())
    assert 0 < loop["collector_ns"] <= loop["wall_ns"]
    assert "collection" in loop["disturbed_by"] and "collection" in record["disturbed_by"]
    assert record["cpu_evidence"] == contention.recorded_evidence(record)["cpu_evidence"]  # verify's recomputation
    # the collector's time is CPU time of this thread inside the span, never more than the span's wall time
    if loop["cpu_ns"] is not None:
        assert loop["cpu_ns"] <= loop["wall_ns"] + 200_000


def test_page_faults_are_read_per_thread_and_per_process_and_minor_ones_label_nothing():
    import mmap

    start, end = contention.usage_reader()
    # Fresh pages straight from the kernel, one minor fault per 4 KiB page at its first touch. Not a bytearray: in a
    # worker that already freed large blocks the allocator can hand back pages still mapped (seen on CPython 3.13:
    # 0 faults for 64 MiB), and transparent huge pages could make one fault serve 512 pages.
    touched = mmap.mmap(-1, 64 * 1024 * 1024)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        touched.madvise(mmap.MADV_NOHUGEPAGE)
    first = start()
    for offset in range(0, len(touched), 4096):
        touched[offset] = 1
    last = end()
    touched.close()
    scope = contention.READING_SCOPE
    assert set(scope) == set(contention.READING_FIELDS)
    if contention.usage_sources()["thread_page_faults"] is None:
        pytest.skip("this platform has no per-thread page-fault reading")
    minor = contention.READING_FIELDS.index("thread_minor_faults")
    assert last[minor] - first[minor] >= 16384  # every page of the mapping, touched once
    readings = {"start": first, "prefill_done": last, "end": last}
    span = contention.trial_evidence(readings, 0, 10, 20)["cpu_evidence"]["loop"]
    assert span["thread_minor_faults"] == last[minor] - first[minor]
    assert span["process_minor_faults"] >= span["thread_minor_faults"]  # the process counts this thread's too
    assert span["disturbed_by"] == []  # counted, never a disturbance: nearly all are frame-stack chunks (3.11)


def test_a_stand_in_run_declares_its_policy_collects_once_and_every_trial_records_collections_and_faults(standin_run):
    import json

    records = [json.loads(line) for line in (standin_run / "records.jsonl").read_text().splitlines()]
    plan = json.loads((standin_run / "plan.json").read_text())
    manifest = json.loads((standin_run / "manifest.json").read_text())
    assert plan["collector"]["policy"] == manifest["collector"]["policy"] == collector.DEFAULT_POLICY
    assert manifest["options"]["collector_policy"] == collector.DEFAULT_POLICY
    before = next(r for r in records if r["kind"] == "timing_machine" and r["point"] == "before")
    assert before["collection"]["elapsed_ns"] > 0 and before["collection"]["frozen"] > 0
    assert before["seq"] < min(r["seq"] for r in records if r["kind"] == "timing_trial")
    trials = [r for r in records if r["kind"] == "timing_trial" and r["status"] == "ok"]
    assert len([t for t in trials if not t["warmup"]]) == 20
    for trial in trials:
        assert trial["collector"]["policy"] == collector.DEFAULT_POLICY and not trial["collector"]["enabled_in_spans"]
        assert "full_collection_ns" not in trial["collector"]  # no collection before a single trial
        for name in ("prefill", "loop"):
            span = trial["cpu_evidence"][name]
            assert set(span["collections_by_generation"]) == {"0", "1", "2"}
            assert span["collections"] == 0 and span["collector_ns"] == 0  # the collector was off in the span
            for reading in contention.FAULT_FIELDS:
                assert isinstance(span[reading], int) and span[reading] >= 0, (trial["schedule_id"], name, reading)
