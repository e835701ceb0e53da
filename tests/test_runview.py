"""inferlab.read.runview: one reader of a run, built from data in memory or read from disk once: every problem met
and nothing raised, the plan asked which test produces a kind and why a record is missing, tensors read when asked
and checked against their record."""

from __future__ import annotations

import json

import numpy
import pytest

from inferlab.files import tensor_sha256
from inferlab.read.parse import parse_records
from inferlab.read.runview import RunView, TensorFileError
from inferlab.read.verify import verify_run
from inferlab.run.records import MANIFEST_FILE, RECORDS_FILE


def record(kind: str, test, seq: int = 0, **fields) -> dict:
    return {"kind": kind, "test": test, "seq": seq, "wall_time": "2025-01-01T00:00:00+00:00", **fields}


def outcome(test: str, state: str = "passed", **fields) -> dict:
    return record("test_outcome", test, outcome=state, **fields)


def plan_of(*entries: tuple, **fields) -> dict:
    """A schema-2 plan of the complete protocol (unless fields say otherwise): entries are (node id, [kinds])."""
    return {"schema": 2, "schedule": [{"index": i, "test": t, "records": list(kinds)} for i, (t, kinds) in
                                      enumerate(entries)], "partial_reasons": [], **fields}


def test_each_line_that_is_not_a_record_is_a_problem_with_its_line_number_and_non_ascii_is_named():
    raw = (json.dumps(record("a", None)) + "\n{not json\n[1, 2]\n" + json.dumps({"kind": "b"}) + "\n").encode()
    records, problems = parse_records(raw)
    assert [r["kind"] for r in records] == ["a", "b"]  # a record without its envelope is still read
    assert [(p.line, p.code, p.lost) for p in problems] == [(2, "not_json", True), (3, "not_object", True),
                                                              (4, "missing_fields", False)]
    assert str(problems[1]) == "records.jsonl:3: a list, expected a JSON object"
    assert str(problems[2]) == "records.jsonl:4: missing field(s) test, seq, wall_time"
    records, problems = parse_records(json.dumps(record("a", None)).encode() + b"\xc3\xa9\n")  # read, and named
    assert problems[0].code == "not_ascii" and problems[0].lost is False
    assert str(problems[0]).startswith("records.jsonl: not ASCII as written ('ascii' codec can't decode")


def test_a_folder_with_nothing_or_a_manifest_that_is_not_an_object_is_read_with_a_problem_per_file(tmp_path):
    view = RunView.read(tmp_path)
    assert [p.file for p in view.problems] == [RECORDS_FILE, MANIFEST_FILE, "plan.json"]
    assert view.records == [] and view.manifest == {} and view.plan is None and view.ending == "killed"
    (tmp_path / RECORDS_FILE).write_text("")
    (tmp_path / MANIFEST_FILE).write_text("[1]\n")
    view = RunView.read(tmp_path)
    assert "manifest.json: a list, expected a JSON object" in [str(p) for p in view.problems]
    assert not view.manifest_found
    assert any("a list, expected a JSON object" in p for p in verify_run(tmp_path)["problems"])


def test_why_a_record_is_missing_follows_the_plans_producers():
    plan = plan_of(("a.py::test_x", ["x"]), ("a.py::test_y", ["y"]), ("a.py::test_z", ["z"]))
    records = [outcome("a.py::test_x", "skipped", skip_reason="no"), outcome("a.py::test_y")]
    view = RunView.from_data(records, {}, plan)
    assert view.why_missing("x").reason == "evidence" and view.why_missing("x").evidence["outcome"] == "skipped"
    assert view.why_missing("y").reason == "ran"  # it passed and wrote nothing: nothing explains the gap
    assert view.why_missing("z").reason == "not_reached"  # no session_end: the run was killed before test_z
    assert view.why_missing("w").reason == "not_planned"
    partial = RunView.from_data(records, {}, {**plan, "partial_reasons": ["-k deselected 3"]})
    assert partial.why_missing("w").reason == "deselected"
    ended = RunView.from_data(records + [record("session_end", None)], {}, plan)
    assert ended.why_missing("z").reason == "planned_not_run"


@pytest.mark.parametrize("end, ending", [
    (None, "killed"), ({}, "finished"), ({"interrupted": True, "stop_reason": "SIGINT"}, "interrupted"),
    ({"stopped_early": True}, "stopped_early"), ({"collect_only": True}, "collect_only"),
    ({"plan_only": True}, "plan"),
])
def test_how_the_session_ended(end, ending):
    records = [] if end is None else [record("session_end", None, **end)]
    view = RunView.from_data(records, {}, plan_of())
    assert view.ending == ending
    assert (view.unfinished is None) == (ending in ("finished", "plan"))


def test_a_plan_folder_is_known_by_its_manifest_or_its_records():
    assert RunView.from_data([], {"mode": "plan"}, plan_of()).is_plan_folder
    assert RunView.from_data([record("plan", None, mode="plan")], {}, plan_of()).is_plan_folder
    assert not RunView.from_data([], {"mode": "run"}, plan_of()).is_plan_folder


def test_a_part_is_labelled_by_its_plan_entry_up_to_the_colon_else_by_its_file():
    plan = plan_of(parts=[{"file": "experiments/test_80_new.py", "title": "Part 8: a new part."},
                          {"file": "experiments/test_90_x.py", "title": "Optional extension"}])
    view = RunView.from_data([], {}, plan)
    assert view.part_label("experiments/test_80_new.py::test_a") == "Part 8"
    assert view.part_label("experiments/test_90_x.py::test_b[1]") == "Optional extension"
    assert view.part_label("elsewhere/check.py::test_d") == "check.py" and view.part_label(None) == "(session)"


def test_a_tensor_is_checked_against_its_records_shape_and_sha256():
    array = numpy.arange(4, dtype=numpy.float32)
    good = {"file": "tensors/t.safetensors", "key": "k", "shape": [4], "sha256": tensor_sha256(array)}
    view = RunView.from_data([record("x", None, logits=good)], {}, plan_of(), {"tensors/t.safetensors": {"k": array}})
    assert view.tensors.check(good) is None and view.tensors.verified(good) is array
    edited = {**good, "sha256": "00" * 32}
    assert view.tensors.check(edited) == f"tensors/t.safetensors[k] sha256 {good['sha256']}, record says {'00' * 32}"
    assert view.tensors.verified(edited) is None
    assert view.tensors.get(edited) is array  # what the file holds, for a page that shows it
    assert view.tensors.check({**good, "shape": [2, 2]}) == "tensors/t.safetensors[k] has shape [4], record says [2, 2]"
    assert view.tensors.check({**good, "key": "other"}) == "key 'other' not in tensors/t.safetensors"
    with pytest.raises(TensorFileError, match="missing"):
        view.tensors.check({**good, "file": "tensors/gone.safetensors"})


def test_a_tensor_file_outside_the_runs_tensors_folder_is_never_read(tmp_path):
    (tmp_path / "secret.safetensors").write_bytes(b"not for a record to point at")
    reference = {"file": "../secret.safetensors", "key": "k", "sha256": "00"}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RECORDS_FILE).write_text(json.dumps(record("x", None, logits=reference)) + "\n")
    view = RunView.read(tmp_path / "run")
    with pytest.raises(TensorFileError) as raised:
        view.tensors.check(reference)
    assert raised.value.code == "outside" and view.tensors.get(reference) is None
    assert any("tensor file ../secret.safetensors: not in tensors/" in p for p in verify_run(view)["problems"])


def test_a_run_file_that_is_a_link_leading_out_of_the_run_is_never_read(tmp_path):
    (tmp_path / "secret.jsonl").write_text(json.dumps(record("x", None)) + "\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RECORDS_FILE).symlink_to(tmp_path / "secret.jsonl")
    view = RunView.read(tmp_path / "run")
    assert view.records == [] and any(f"{RECORDS_FILE}: not readable ('{RECORDS_FILE}' is a link that leads out of "
                                      "the run folder; not opened)" == p for p in view.read_problems), \
        view.read_problems
