"""The run as it is written, without pytest: the one writer (records.py), the Run (session.py), the plan and the
ledger (plan.py), and how a session ends (endings.py), from plain data in memory."""

from __future__ import annotations

import errno
import json
import signal
import types
from pathlib import Path

import pytest

from fixtures_records import REPO_ROOT, FixedHost, ticking_clock, ticking_stamp
from inferlab import writing
from inferlab.host import environment
from inferlab.read.verify import verify_run
from inferlab.run import endings, plan, records, session
from inferlab.run.plan import TestFacts, selection_of

FIRST = TestFacts("experiments/test_a.py::test_first", provides=("ready",), records=("value",))
SECOND = TestFacts("experiments/test_a.py::test_second", requires=("ready",))


def small_run(directory: Path, end: bool = True) -> session.Run:
    """Two tests, the first providing the check the second requires, written as a session writes them."""
    invocation = session.Invocation(("pytest", "experiments"), "pytest experiments", "given", str(REPO_ROOT),
                                    REPO_ROOT, "run", {"name": "standin", "synthetic": True})
    run = session.claim_run(invocation, record_dir=directory, pid=1, hostname="here", clock=ticking_clock(),
                            host=FixedHost(), stamp=ticking_stamp())
    run.start(None)
    run.write_plan([FIRST, SECOND], selection=selection_of(types.SimpleNamespace()))
    run.emit("value", FIRST.nodeid, {"x": 1}, declared=FIRST.records)
    for facts in (FIRST, SECOND):
        assert run.refusal(facts) is None
        run.record_outcome(facts, outcome="passed", phase="call", duration=0.5)
    if end:
        run.end_session(exit_status=0, interrupted_status=2, exit_code_name="OK")
        run.finish()
    return run


def lines_of(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / records.RECORDS_FILE).read_text().splitlines()]


def test_the_envelope_refuses_its_own_fields_and_keeps_what_is_not_json_as_its_repr():
    with pytest.raises(ValueError, match=r"record 'x': fields \['seq'\] are reserved"):
        records.make_record("x", None, 0, "t", {"seq": 3})
    record = records.make_record("x", "a::test_b", 7, "t", {"value": float("inf"), "thing": object()})
    assert (record["kind"], record["test"], record["seq"], record["wall_time"]) == ("x", "a::test_b", 7, "t")
    assert record["value"] == "inf" and record["thing"].startswith("<object object")
    assert record["serialisation_warnings"] == ["object is not JSON data; recorded as its repr"]


def test_a_line_the_disk_takes_only_in_part_is_taken_back_and_the_run_writes_no_more(tmp_path, monkeypatch):
    """A full disk: records.jsonl keeps whole lines only, so the run reads as unfinished, never torn; the failure is
    noted for the plugin, which stops the session on it, and not raised into the test that recorded."""
    run = small_run(tmp_path / "run", end=False)
    before = (tmp_path / "run" / records.RECORDS_FILE).read_bytes()
    real_write = records.os.write

    def half_then_full(fd, data):
        monkeypatch.setattr(records.os, "write", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
        return real_write(fd, bytes(data[:len(data) // 2]))

    monkeypatch.setattr(records.os, "write", half_then_full)
    run.emit("big", None, {"text": "x" * 1000})
    monkeypatch.setattr(records.os, "write", real_write)
    assert (tmp_path / "run" / records.RECORDS_FILE).read_bytes() == before
    assert run.cannot_write == f"writing into {run.record_dir} failed ({records.RECORDS_FILE}: No space (ENOSPC))"
    run.emit("after", None, {})
    assert (tmp_path / "run" / records.RECORDS_FILE).read_bytes() == before and len(run.records) == len(
        lines_of(tmp_path / "run"))


def test_a_final_manifest_the_disk_refuses_fails_the_session_and_is_said_last(tmp_path, monkeypatch):
    """session_end already says how the session ended; a final manifest that cannot be written makes exit status 1
    and a red last line, never 'reached its end' with status 0 over a folder that does not hold that end."""
    run = small_run(tmp_path / "run", end=False)
    monkeypatch.setattr(session, "write_json_atomic", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space")))
    ended = types.SimpleNamespace(shouldstop=False, shouldfail=False, testsfailed=0,
                                  config=types.SimpleNamespace(option=types.SimpleNamespace(collectonly=False)))
    assert run.end_pytest(ended, 0, pytest.ExitCode) == 1 and run.session_end["status"].startswith("the session")
    lines = []
    endings.last_line(lambda text, **style: lines.append(text), run)
    assert lines[-1].startswith(f"inferlab: its final records were not all written: writing into {run.record_dir} "
                                "failed (manifest.json: No space (ENOSPC))")
    checked = verify_run(run.record_dir)  # unfinished, said so, and no integrity problem from the start manifest
    assert checked["problems"] == checked["completeness"] and "not its final manifest" in checked["problems"][0]


def test_a_record_whose_line_was_written_is_kept_when_a_signal_stops_its_keeping(tmp_path, monkeypatch):
    """A time limit or a Ctrl-C between the write and its keeping: the next record knows it, and takes the next seq."""
    run = small_run(tmp_path / "run", end=False)
    real_fsync = records.os.fsync

    def interrupted(fd):
        monkeypatch.setattr(records.os, "fsync", real_fsync)
        raise KeyboardInterrupt("SIGINT received")

    monkeypatch.setattr(records.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run.emit("written", None, {})
    after = run.emit("after", None, {})
    assert [r["seq"] for r in lines_of(tmp_path / "run")] == list(range(after["seq"] + 1))
    assert [r["kind"] for r in run.records][-2:] == ["written", "after"] and len(run.records) == after["seq"] + 1


def test_renaming_never_takes_over_a_name_another_run_holds(tmp_path):
    run = tmp_path / "20250101T000000Z-standin"
    run.mkdir()
    (run / "records.jsonl").write_text("")
    (tmp_path / "20250101T000000Z-standin-failed").mkdir()  # empty: a plain rename would replace it
    renamed = records.rename_with_suffix(run, "-failed")
    assert renamed.name == "20250101T000000Z-standin-failed-2" and (renamed / "records.jsonl").is_file()
    assert not any((tmp_path / "20250101T000000Z-standin-failed").iterdir()) and not run.exists()


def test_a_read_only_record_dir_is_refused_naming_the_reason(tmp_path, monkeypatch):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(records.RecordDirError, match=r"cannot be created: Read-only file system \(EROFS\)"):
        records.claim_record_dir(tmp_path / "mnt" / "run", {"pid": 1})


@pytest.mark.parametrize("option", ["--record-dir", "--runs-dir"])
def test_no_run_is_written_into_a_folder_that_holds_a_specimen_or_into_the_cache(tmp_path, option):
    copy = tmp_path / "lab05-copy"
    copy.mkdir()
    (copy / "config.json").write_text("{}")
    (copy / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(ValueError, match=f"{option}: .* is inside {copy}, which holds a specimen's files"):
        records.check_paths({option: str(copy / "deeper" / "run")})
    with pytest.raises(ValueError, match="inside the project's specimen cache"):
        records.check_paths({option: str(tmp_path / "cache" / "x")}, cache_root=tmp_path / "cache")
    records.check_paths({option: str(tmp_path / "runs" / "first")}, cache_root=tmp_path / "cache")


def test_a_run_written_twice_is_the_same_run_and_a_record_holds_what_is_particular_to_it(tmp_path):
    runs = [small_run(tmp_path / name) for name in ("one", "two")]  # with an injected clock and host
    assert (runs[0].record_dir / "records.jsonl").read_bytes() == (runs[1].record_dir / "records.jsonl").read_bytes()
    manifests = [json.loads((run.record_dir / "manifest.json").read_text()) for run in runs]
    assert [m.pop("record_dir") for m in manifests] and manifests[0] == manifests[1]
    assert manifests[0]["started_utc"] == "2025-01-01T00:00:01+00:00" and manifests[0]["checks"]["ready"]["status"] \
        == "passed" and manifests[0]["platform"] == FixedHost().environment_record(REPO_ROOT)["platform"]
    # what every record of a kind would repeat is in plan.json or the manifest: a passed outcome has no empty
    # longrepr or skip reason and no check_kind (the plan's entry has it); the plan record points at plan.json
    run = runs[0]
    plan_record, passed = run.records_of("plan")[0], run.records_of("test_outcome")[0]
    assert set(passed) == set(records.make_record("k", "t", 0, "w", {}, 1)) | {"outcome", "phase", "duration"}
    assert set(plan_record) - {"kind", "test", "seq", "wall_time", records.STAMP_FIELD} == {"file", "sha256", "mode",
                                                                                            "tests"}
    assert plan_record["sha256"] == records.sha256_file(run.record_dir / "plan.json")
    assert [e["check_kind"] for e in run.plan["schedule"]] == ["integrity", "integrity"]
    assert "how" not in run.session_end["forward_reconciliation"]


def test_predictions_are_judged_as_they_are_copied():
    template = (REPO_ROOT / "predictions.md").read_text()
    assert writing.predictions_status(template + "\n\n", template)["template_unanswered"] is True
    answered = writing.predictions_status(template.replace("Prediction:\n", "Prediction:\nyes, identical ids\n", 1),
                                          template)
    assert answered["template_unanswered"] is False and answered["answered"] == [1]
    assert writing.predictions_status("I expect identical greedy ids.\n", template)["template_unanswered"] is False


def test_a_python_without_pytest_timeout_is_named_as_the_cause_not_a_p_option(monkeypatch):
    config = types.SimpleNamespace(option=types.SimpleNamespace(), getoption=lambda name, default=None: default,
                                   pluginmanager=types.SimpleNamespace(has_plugin=lambda name: False,
                                                                       get_plugin=lambda name: None))
    monkeypatch.setattr(plan, "importlib", types.SimpleNamespace(util=types.SimpleNamespace(find_spec=lambda n: None)))
    message = plan.refusal(config, "standin")
    assert "is not the project's environment" in message and "-p no:" not in message
    assert ".venv/bin/python -m pytest experiments" in message


@pytest.mark.parametrize("orig_argv, argv, args, typed", [
    (["/r/.venv/bin/python", "/r/.venv/bin/pytest", "experiments", "-k", "a or b"],
     ["/r/.venv/bin/pytest", "experiments", "-k", "a or b"], ("experiments", "-k", "a or b"),
     ".venv/bin/pytest experiments -k 'a or b'"),
    ([".venv/bin/python", "-m", "pytest", "experiments"], ["/x/pytest/__main__.py", "experiments"], ("experiments",),
     ".venv/bin/python -m pytest experiments"),
    (["python", "-m", "pytest", "tests"], ["/x/pytest/__main__.py", "tests"], ("experiments",),
     "python -m pytest experiments"),  # in process: the launcher is not known, and the record says so
], ids=["console-script", "python-m", "in-process"])
def test_the_manifest_records_the_command_as_the_learner_typed_it(orig_argv, argv, args, typed):
    command, how = environment.typed_command(orig_argv, argv, args, Path("/r"))
    assert command == typed and (("in-process" in how) is (args != tuple(argv[1:])))


def ended(**overrides) -> dict:
    fields = dict(exit_status=0, exit_code_name="OK", signals=[], collect_only=False, plan_only=False, stop_reason=None,
                  planned=["a", "b"], with_outcome={"a", "b"}, partial_reasons=[], outcome_counts={"passed": 2})
    return endings.session_end(**{**fields, **overrides})


def test_the_status_line_says_unfinished_before_partial_and_names_the_optional_extension_left_out():
    unfinished = ended(exit_status=2, exit_code_name="INTERRUPTED", signals=["SIGINT"], with_outcome={"a"},
                       stop_reason="interrupted by SIGINT", partial_reasons=["-k 'x' deselected 3 protocol test(s)"],
                       outcome_counts={"passed": 1})
    assert unfinished["complete"] is False and unfinished["tests_without_outcome"] == ["b"]
    assert unfinished["status"] == ("the run did NOT finish (interrupted by SIGINT): 1 of 2 planned tests have no "
                                    "outcome (1 passed); PARTIAL, not the complete protocol: -k 'x' deselected 3 "
                                    "protocol test(s)")
    left_out = "experiments/test_70_batching.py (Part 7: batching): 0 of its 4 tests planned (4 deselected)"
    complete = ended(optional_notes=[left_out])
    assert complete["complete"] is True and complete["status"] == (
        "the session reached its end: all 2 planned tests have an outcome (2 passed); the plan is the complete "
        f"protocol; the optional extension was left out: {left_out}")
    assert ended(collect_only=True, with_outcome=set())["complete"] is False  # --co is never complete


def test_an_acquisition_failure_is_its_own_ending_and_another_failure_beside_it_is_still_the_harness():
    counts = {"failed": 2, "skipped": 1}
    failed = {"exit_status": 1, "exit_code_name": "TESTS_FAILED", "failures_by_check_kind": {"integrity": 2},
              "outcome_counts": counts}
    refused = ended(**failed, acquisition_failure={"cause": "your --artifacts copy was refused", "failed_tests": 2})
    assert endings.failure_kind(refused, counts) == "acquisition"
    line = endings.status_line(refused, counts)
    assert line.startswith("NOTHING was measured: the specimen could not be acquired (your --artifacts copy was "
                           "refused); ") and "HARNESS" not in line
    broken = ended(**failed, acquisition_failure={"cause": "no connection to the hub", "failed_tests": 1})
    assert endings.failure_kind(broken, counts) == "harness"
    assert "the HARNESS FAILED" in endings.status_line(broken, counts)


@pytest.mark.parametrize("overrides, counts, suffix", [
    ({}, {"passed": 2}, None),
    ({"exit_code_name": "TESTS_FAILED"}, {"failed": 1}, "-failed"),  # no check kinds: every failure the harness's
    ({"exit_code_name": "TESTS_FAILED", "failures_by_check_kind": {"diagnostic": 2}}, {"failed": 2}, "-findings"),
    ({"exit_code_name": "TESTS_FAILED", "failures_by_check_kind": {"integrity": 1, "diagnostic": 1}},
     {"failed": 2}, "-failed"),
    ({"partial_reasons": ["-k"]}, {"passed": 2}, "-partial"),
    ({"partial_reasons": ["-k"], "exit_code_name": "TESTS_FAILED"}, {"failed": 1}, "-partial-failed"),
    ({"partial_reasons": ["-k"], "exit_code_name": "TESTS_FAILED", "failures_by_check_kind": {"diagnostic": 1}},
     {"failed": 1}, "-partial-findings"),
    ({"signals": ["SIGINT"], "exit_code_name": "INTERRUPTED"}, {"failed": 1}, "-incomplete"),
    ({"plan_only": True}, {}, None),
])
def test_the_name_a_run_gets_says_how_it_ended(overrides, counts, suffix):
    assert endings.outcome_suffix(ended(**overrides, outcome_counts=counts), counts) == suffix


def test_abandoning_says_where_the_run_stands_and_exits_with_128_plus_the_signal(capsys):
    exits = []
    watch = endings.SignalWatch(exit_process=exits.append)
    watch.on_abandon = lambda: "where it stands"
    watch.finishing = True
    watch._handle(signal.SIGTERM, None)  # noted: the final records go on
    assert exits == [] and "Send it once more" in capsys.readouterr().err
    watch._handle(signal.SIGTERM, None)
    assert exits == [128 + signal.SIGTERM] and watch.during_finish == ["SIGTERM", "SIGTERM"]
    assert capsys.readouterr().err.strip().splitlines() == [
        f"inferlab: SIGTERM received again: the final records are abandoned, exiting with status "
        f"{128 + signal.SIGTERM}. where it stands"]
