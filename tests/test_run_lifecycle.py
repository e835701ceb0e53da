"""The run's lifecycle and its writers without pytest's plugin: plain data in, the record dir out."""

from __future__ import annotations

import json
import types

import pytest

from fixtures_records import REPO_ROOT, FixedSurroundings, TickingClock, TickingStamp
from inferlab.run import session_status
from inferlab.read import runview as earlier_runs
from inferlab.run import lifecycle, writers
from inferlab.run.plan import EXPERIMENTS_DIR, TestFacts, selection_of


def test_the_envelope_refuses_its_own_fields_and_keeps_what_is_not_json_as_its_repr():
    with pytest.raises(ValueError, match=r"record 'x': fields \['seq'\] are reserved"):
        writers.make_record("x", None, 0, "t", {"seq": 3})
    record = writers.make_record("x", "a::test_b", 7, "t", {"value": float("inf"), "thing": object()})
    assert (record["kind"], record["test"], record["seq"], record["wall_time"]) == ("x", "a::test_b", 7, "t")
    assert record["value"] == "inf" and record["thing"].startswith("<object object")
    assert record["serialisation_warnings"] == ["object is not JSON data; recorded as its repr"]


def small_run(directory, outcome: str = "passed") -> lifecycle.Run:
    """Two tests, the first providing a check the second requires, written as a session writes them."""
    invocation = lifecycle.Invocation(argv=("pytest", "experiments"), command="pytest experiments",
                                      command_how="given", invocation_dir=str(REPO_ROOT), root=REPO_ROOT,
                                      mode="run", specimen={"name": "standin", "synthetic": True})
    run = lifecycle.claim_run(invocation, record_dir=directory, pid=1, hostname="here", clock=TickingClock(),
                              surroundings=FixedSurroundings(REPO_ROOT), stamp=TickingStamp(),
                              reader=earlier_runs)
    run.start(None)
    first = TestFacts("experiments/test_a.py::test_first", provides=("ready",), records=("value",))
    second = TestFacts("experiments/test_a.py::test_second", requires=("ready",))
    run.write_plan([first, second], parts=session_status.experiment_parts(REPO_ROOT, EXPERIMENTS_DIR),
                   selection=selection_of(types.SimpleNamespace()))
    run.emit_declared(first, "value", {"x": 1})
    run.record_outcome(first, outcome=outcome, phase="call", duration=0.5, longrepr=None if outcome == "passed"
                       else "E   AssertionError: measured 1, expected 2", skip_reason=None)
    refusal = run.ledger.refusal(second.nodeid, second.requires)
    run.record_outcome(second, outcome="skipped" if refusal else "passed", phase="setup" if refusal else "call",
                       duration=0.0, longrepr=None, skip_reason=refusal)
    run.end_session(lifecycle.SessionFacts(exit_status=1 if outcome == "failed" else 0,
                                           exit_code_name="TESTS_FAILED" if outcome == "failed" else "OK",
                                           interrupted_status=2))
    run.finish()
    return run


def test_a_run_written_twice_with_an_injected_clock_and_surroundings_is_the_same_run(tmp_path):
    runs = [small_run(tmp_path / name) for name in ("one", "two")]
    texts = [(run.record_dir / "records.jsonl").read_text() for run in runs]
    assert texts[0] == texts[1]
    manifests = [json.loads((run.record_dir / "manifest.json").read_text()) for run in runs]
    for manifest in manifests:
        manifest.pop("record_dir")
    assert manifests[0] == manifests[1] and manifests[0]["started_utc"] == "2025-01-01T00:00:01+00:00"
    assert manifests[0]["checks"]["ready"]["status"] == "passed" and "command_line" not in manifests[0]


def test_a_test_may_write_only_the_kinds_it_declares(tmp_path):
    run = small_run(tmp_path / "run")
    with pytest.raises(ValueError, match=r"record kind 'other' is not declared on the test; expected one of"):
        run.emit_declared(TestFacts("t::test_x", records=("value",)), "other", {})
    with pytest.raises(ValueError, match=r"which declares no record kinds"):
        run.emit_declared(TestFacts("t::test_x"), "value", {})


def test_a_failed_provider_stops_its_dependent_with_the_failure_as_the_reason(tmp_path):
    run = small_run(tmp_path / "run", outcome="failed")
    outcomes = {r["test"].split("::")[-1]: r for r in run.records_of("test_outcome")}
    assert outcomes["test_second"]["outcome"] == "skipped"
    assert outcomes["test_second"]["skip_reason"] == (
        "not run: prerequisite 'ready' failed in experiments/test_a.py::test_first: AssertionError: measured 1, "
        "expected 2")
    end = run.ending.session_end
    assert end["exit_code_name"] == "TESTS_FAILED" and end["tests_without_outcome"] == []
    assert run.outcomes.failure_lines == ["FAILED experiments/test_a.py::test_first (full text: records.jsonl seq 2)"]
