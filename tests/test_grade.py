"""grade on the course's run: a handed-in run earns items 2 to 6 by agreeing with the course's own run, and never
scores above an honest complete run; the writing earns items 1 and 7; outputs never replace a user's file; nothing
outside a submission is read. The session's stand-in run (answered predictions) is the course's run throughout."""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.grade import bundle, formats, rubric
from inferlab.grade.grade import FAIL, MANUAL, PASS, Writing, grade_source, grade_writing
from inferlab.read.runview import RunView

from forging import forge, rebind
from grading_helpers import answered_explanation, answered_predictions

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def honest(standin_run, tmp_path_factory) -> Path:
    """A copy of the course's run with an explanation attached by `attach`, as a learner hands it in."""
    run = shutil.copytree(standin_run, tmp_path_factory.mktemp("honest") / "run")
    explanation = run.parent / "my_explanation.md"
    explanation.write_text(answered_explanation())
    assert main(["attach", str(run), str(explanation)]) == 0
    return run


@pytest.fixture(scope="module")
def course(standin_run) -> RunView:
    return RunView.read(standin_run)


def packed(run: Path, target: Path, learner: str = "ada") -> Path:
    assert main(["pack", str(run), "-o", str(target), "--learner", learner]) in (0, 1)
    return target


def statuses(grade) -> dict:
    return {item.item.number: item.status for item in grade.items}


def test_an_honest_complete_archive_scores_full_and_is_compared_exactly(honest, course, tmp_path):
    grade = grade_source(packed(honest, tmp_path / "a.tar.gz"), rubric.load(), course)
    assert grade.exit_status == 0 and grade.score == grade.max_score, formats.text_page(grade)
    assert statuses(grade) == {1: MANUAL, 2: PASS, 3: PASS, 4: PASS, 5: PASS, 6: PASS, 7: MANUAL}
    assert grade.comparison.exact and grade.learner == "ada"
    assert "None" not in formats.text_page(grade)  # no field read under a name its record does not use (item 5 once)
    assert all(grade.comparison.compared.get(n) for n in (3, 4, 5, 6)), grade.comparison.compared


def cached_replaced_by_uncached(source: Path, target: Path) -> Path:
    """Every cached logit vector replaced by its uncached twin, every hash redone (a forger on the same machine)."""
    import hashlib

    import numpy
    from safetensors.numpy import load_file, save_file

    def edit(records):
        for record in [r for r in records if r["kind"] == "cache_comparison"]:
            cached, uncached = record["tensors"]["cached"], record["tensors"]["uncached"]
            tensors = load_file(str(target / cached["file"]))
            tensors[cached["key"]] = tensors[uncached["key"]].copy()
            save_file(tensors, str(target / cached["file"]))
            cached["sha256"] = hashlib.sha256(numpy.ascontiguousarray(tensors[cached["key"]]).tobytes()).hexdigest()
            record["max_abs_diff"], record["bitwise_equal"] = 0.0, True

    return forge(source, target, edit)


def test_cached_logits_replaced_by_their_uncached_twins_fail_the_cache_item_naming_the_element(
        honest, course, tmp_path):
    forged = cached_replaced_by_uncached(honest, tmp_path / "forged")
    assert main(["verify", str(forged)]) == 0  # its files are consistent: only the course's run can tell
    grade = grade_source(forged, rubric.load(), course)
    assert statuses(grade)[5] == FAIL and grade.exit_status == 3
    detail = next(c.detail for c in grade.items[4].checks if c.name == "course_run")
    assert "contradicts the course's run: cache_comparison prefix" in detail and "element [" in detail, detail


def test_a_claimed_other_cpu_makes_the_comparison_inexact_said_and_never_scores_more(honest, course, tmp_path):
    forged = cached_replaced_by_uncached(honest, tmp_path / "forged")
    manifest = json.loads((forged / "manifest.json").read_text())
    manifest["platform"]["cpu_model"] = "Some Other CPU"
    (forged / "manifest.json").write_text(json.dumps(manifest))
    rebind(forged)  # the explanation bound to the edited manifest, as a forger would keep it
    grade = grade_source(forged, rubric.load(), course)
    honest_grade = grade_source(honest, rubric.load(), course)
    assert not grade.comparison.exact and "cpu_model" in grade.comparison.why_not_exact[0]
    text = formats.text_page(grade)
    assert "not exact" in text and "Some Other CPU" in text and "no contradiction" not in text
    assert grade.score <= honest_grade.score


def test_a_partial_run_scores_less_than_a_complete_one(tmp_path_factory, honest, course):
    from shared_runs import experiment_once

    partial = experiment_once(tmp_path_factory, "standin-partial", "--specimen", "standin", "-k",
                              "specimen or inputs or sampling", here=True)
    grade = grade_source(partial.run, rubric.load(), course)
    full = grade_source(honest, rubric.load(), course)
    assert statuses(grade)[4] == PASS and statuses(grade)[5] == FAIL and statuses(grade)[6] == FAIL
    assert grade.score < full.score


def test_writing_alone_earns_the_writing_items_only_and_says_no_run_came(tmp_path):
    texts = Writing(predictions=answered_predictions(), explanation=answered_explanation())
    grade = grade_writing(texts, rubric.load(), "writing")
    assert statuses(grade) == {1: MANUAL, 2: FAIL, 3: FAIL, 4: FAIL, 5: FAIL, 6: FAIL, 7: MANUAL}
    assert grade.score == 10 and any("no run was handed in" in note for note in grade.notes)


def test_placeholder_text_under_every_heading_is_not_written(tmp_path):
    texts = Writing(predictions=answered_predictions(), explanation=answered_explanation(under="TODO"))
    grade = grade_writing(texts, rubric.load(), "writing")
    assert statuses(grade)[7] == FAIL and "placeholders aside" in grade.items[6].message()


def test_a_run_of_another_specimen_is_not_comparable_and_says_why(honest, tmp_path):
    other = shutil.copytree(honest, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["specimen"]["name"] = "replica"
    (other / "manifest.json").write_text(json.dumps(manifest))
    grade = grade_source(honest, rubric.load(), RunView.read(other))
    assert all(statuses(grade)[n] == FAIL for n in (3, 4, 5, 6))
    assert "not comparable: the run used standin" in grade.items[2].message()
    assert "reference" not in formats.text_page(grade)


# --- the command and its formats ------------------------------------------------------------------------------


def test_without_a_course_run_nothing_measured_is_checked_and_exact_copies_are_flagged(honest, tmp_path, capsys):
    copy = shutil.copytree(honest, tmp_path / "copy")
    assert main(["grade", str(honest), str(copy)]) == 0
    pages = capsys.readouterr().out.split(f"grade: {copy}")
    for page, other in zip(pages, (copy, honest)):
        assert "note: not checked against the course's run (--against COURSE_RUN): nothing this run measured" in page
        assert f"note: exact copy: its records is byte for byte that of {other}" in page


def test_every_format_names_the_learner_and_holds_each_item_as_its_readers_expect(honest, course, tmp_path):
    """JUnit (what a course CI reads): one testsuite per submission, one testcase per item, a failure element for
    each failed item and the counts agreeing; Gradescope's results.json: its documented fields only; CSV: a header
    and one row per submission; JSON: every grade."""
    import csv
    from xml.etree import ElementTree

    texts = Writing(predictions=answered_predictions(), explanation=answered_explanation())
    grades = [grade_source(packed(honest, tmp_path / "a.tar.gz"), rubric.load(), course),
              grade_writing(texts, rubric.load(), "writing-only", learner="bo")]
    suites = ElementTree.fromstring(formats.junit(grades))
    assert suites.tag == "testsuites" and [s.get("name") for s in suites] == ["ada", "bo"]
    for suite, grade in zip(suites, grades):
        cases = suite.findall("testcase")
        failed = [c.get("name") for c in cases if c.find("failure") is not None]
        assert len(cases) == int(suite.get("tests")) == 7 and len(failed) == int(suite.get("failures"))
        assert failed == [f"item {i.item.number}: {i.item.title}" for i in grade.items if i.status == FAIL]
        assert {p.get("name"): p.get("value") for p in suite.iter("property")}["learner"] == grade.learner
    results = json.loads(formats.gradescope(grades[0], execution_time=1.5))
    assert set(results) == {"score", "execution_time", "output", "tests", "extra_data"} and results["score"] == 60
    assert all(set(t) == {"name", "number", "score", "max_score", "status", "output", "visibility"} and
               t["status"] in ("passed", "failed") for t in results["tests"]) and len(results["tests"]) == 7
    rows = list(csv.DictReader(io.StringIO(formats.csv_text(grades))))
    assert [(r["learner"], r["score"], r["item_2"]) for r in rows] == [("ada", "60", "pass"), ("bo", "10", "fail")]
    assert [g["learner"] for g in json.loads(formats.as_json(grades))["grades"]] == ["ada", "bo"]


@pytest.mark.parametrize("old, new, said", [
    ("points = 5", "points = -1", r"items\[0\] \(item 1\): points must be a number >= 0, found -1"),
    ("title = ", "titl = ", r"items\[0\]: unknown field\(s\) titl; an item has manual_points"),
    ("number = 2", "number = 1", r"items must be items 1 to 7, each once, found \[1, 1, 3"),
])
def test_a_rubric_with_a_bad_value_an_unknown_field_or_a_repeated_item_is_refused_naming_it(tmp_path, old, new, said):
    path = tmp_path / "rubric.toml"
    path.write_text(rubric.DEFAULT.read_text().replace(old, new, 1))
    with pytest.raises(rubric.RubricError, match=f"^{path}: {said}"):
        rubric.load(path)


def test_pack_refuses_a_zip_name_for_its_gzipped_tar(honest, tmp_path, capsys):
    assert main(["pack", str(honest), "-o", str(tmp_path / "x.zip")]) == 2
    assert "name the file FILE.tar.gz" in capsys.readouterr().err and not (tmp_path / "x.zip").exists()


def test_grade_refuses_two_course_runs(honest, standin_run, capsys):
    assert main(["grade", str(honest), "--against", str(standin_run), "--against", str(standin_run)]) == 2
    assert "--against was given 2 times" in capsys.readouterr().err


# --- confinement: nothing outside a submission is read because a file inside names it ---------------------------


@pytest.fixture
def guarded(monkeypatch):
    """A file outside every submission; opening it in any way fails the test."""
    def install(path: Path):
        path = os.path.realpath(path)

        def guard(opener):
            def opened(file, *args, **kwargs):
                if isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(file)) == path:
                    raise AssertionError(f"{path} was opened")
                return opener(file, *args, **kwargs)
            return opened

        for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
            monkeypatch.setattr(module, name, guard(getattr(module, name)))
    return install


@pytest.mark.parametrize("field", ["absolute", "dotdot"])
def test_an_archive_naming_a_file_outside_it_opens_nothing_outside(honest, tmp_path, guarded, field):
    secret = tmp_path / "course" / "reference.md"
    secret.parent.mkdir()
    secret.write_text(answered_predictions())
    run = shutil.copytree(honest, tmp_path / "claim" / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    named = str(secret) if field == "absolute" else "../../course/reference.md"
    manifest["predictions"]["copied_to"] = named
    manifest["files"][named] = manifest["files"]["predictions.md"]  # an inventory entry verify would hash
    (run / "manifest.json").write_text(json.dumps(manifest))
    ledger = run / "addenda.jsonl"
    entry = json.loads(ledger.read_text().splitlines()[0])
    entry["file"] = str(secret) if field == "absolute" else "addenda/../../../course/reference.md"
    ledger.write_text(json.dumps(entry) + "\n")
    archive = packed(run, tmp_path / "claim.tar.gz")
    guarded(secret)
    grade = grade_source(archive, rubric.load())
    assert grade.texts.explanation is None and grade.texts.predictions == answered_predictions()
    for field_named in ("addenda.jsonl", "manifest.json files: " + repr(named), "predictions.copied_to: " + repr(named)):
        assert any(field_named in line for line in grade.integrity), (field_named, grade.integrity)


def test_an_archive_with_a_link_or_an_absolute_entry_is_refused_before_anything_is_written(tmp_path):
    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("run/records.jsonl")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    grade = grade_source(archive, rubric.load())
    assert grade.exit_status == 2 and "not a plain file or folder" in grade.error


# --- the Gradescope bundle, end to end ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundled(honest, tmp_path_factory) -> Path:
    """The Gradescope bundle, end to end, once for this module: the zip written and unpacked as Gradescope does, the
    honest archive handed in, and `run_autograder`'s step, which makes the course's run (--offline, in a Python of
    its own: root/work/course-run) and grades the archive against it. The root."""
    import zipfile

    zipped = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    bundle.write_zip(zipped, "standin", None, None)
    root = zipped.parent / "autograder"
    with zipfile.ZipFile(zipped) as archive:
        archive.extractall(root / "source")
    packed(honest, root / "submission" / "run.tar.gz")
    (root / "submission_metadata.json").write_text(json.dumps({"users": [{"email": "ada@example.edu"}]}))
    os.environ[bundle.ROOT_VARIABLE] = str(root)
    try:
        assert bundle.run(root) == 0
    finally:
        del os.environ[bundle.ROOT_VARIABLE]
    return root


def test_the_bundle_makes_the_course_run_and_grades_an_archive_against_it(bundled):
    results = json.loads((bundled / "results" / "results.json").read_text())
    assert results["score"] == 60 and results["execution_time"] > 0, results["output"]
    assert results["extra_data"]["learner"] == "ada@example.edu"
    item1 = next(t for t in results["tests"] if t["number"] == "1")
    assert "--- your predictions ---" in item1["output"] and "the course's run, the evidence" in item1["output"]


def test_the_bundle_writes_results_json_saying_why_nothing_was_graded(tmp_path):
    assert bundle.run(tmp_path) == 0  # no autograder settings: a set-up fault, said in the results
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["score"] == 0 and results["output"].startswith("not graded: ") and "autograder.json" in \
        results["tests"][0]["output"]


# The bundle's course run is the session's second complete stand-in run, made --offline in a Python of its own
# (tests/test_experiment_runs.py made one of its own for these two tests before).


def test_the_bundles_course_run_needs_no_network_and_proves_the_block(bundled):
    """An --offline stand-in run builds the stand-in in its project (the bundle's source) with the network blocked."""
    run = bundled / "work" / "course-run"
    found = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    guard = next(r for r in found if r["kind"] == "offline_guard")
    assert guard["offline"] is True and "network access blocked" in guard["outcome"]
    assert next(r for r in found if r["kind"] == "generation")["status"] == "ok"
    acquisition = next(r for r in found if r["kind"] == "artifact_acquisition")
    assert acquisition["acquisition"] == "built_offline" and acquisition["ok"] is True
    assert Path(acquisition["directory"]).is_relative_to(bundled / "source" / "artifacts" / "cache")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["options"]["network_blocked_for_session"] is True and manifest["options"]["offline"] is True
    assert manifest["exit_status"] == 0 and manifest["complete"] is True


def test_two_stand_in_runs_compare_with_every_generated_id_equal(standin_run, bundled):
    """The session's complete run (an inner session of a worker) and the bundle's course run (another Python)."""
    from inferlab import protocol
    from inferlab.report.compare import compare

    comparison = compare(standin_run, bundled / "work" / "course-run")
    rows = comparison["generation"]
    assert len(rows) == len(protocol.generation_trials())
    assert all(row["equal"] for row in rows), [row for row in rows if not row["equal"]]


def test_a_replica_bundle_carries_the_files_the_replica_is_built_from(tmp_path, monkeypatch):
    import zipfile

    from conftest import require_reference_dir

    reference = require_reference_dir()
    monkeypatch.setenv(bundle.REFERENCE_VARIABLE, str(reference))
    bundle.write_zip(tmp_path / "a.zip", "replica", None, None)
    names = zipfile.ZipFile(tmp_path / "a.zip").namelist()
    assert {f"{bundle.REFERENCE_DIR}/{p.name}" for p in reference.iterdir() if p.is_file()} <= set(names)
