"""grade's JUnit and Gradescope outputs validate against their schemas (tests/schemas/: pytest's own xunit2
schema, and one written from Gradescope's documented specification), for one run and for a class; the item
tests agree with the score when an integrity problem forfeits it; a manual item is a skipped testcase with its
reason; and every output carries what the grade could not establish (not_checked)."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from inferlab.__main__ import main
from inferlab.grading import formats
from inferlab.grading.grade import grade_source
from inferlab.grading.rubric import load_rubric

from fixtures_records import copy_run
from grading_helpers import change_one_character, submit_ready
from fixture_runs import fixture_runs
from schema_check import GRADESCOPE_SCHEMA, JUNIT_XSD, Unsupported, json_schema_problems, xsd_problems

RESULTS_SCHEMA = json.loads(GRADESCOPE_SCHEMA.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def submitted(tmp_path_factory) -> Path:
    """An honest run with answered predictions and an attached explanation (items 1 and 7 manual)."""
    return submit_ready(fixture_runs(tmp_path_factory).copy("honest", tmp_path_factory.mktemp("formats") / "submitted"))


@pytest.fixture(scope="module")
def edited(submitted, tmp_path_factory) -> Path:
    """The same run with one generated id changed afterwards: an integrity problem."""
    run = copy_run(submitted, tmp_path_factory.mktemp("formats") / "edited")
    change_one_character(run)
    return run


@pytest.fixture(scope="module")
def a_class(submitted, edited, tmp_path_factory) -> Path:
    """A class of four: the honest run, the edited one, the honest run again under another parent with the same
    folder name as the first (so two suites would share a name), and a folder that holds no run."""
    folder = tmp_path_factory.mktemp("formats-class") / "submissions"
    copy_run(submitted, folder / "ada")
    copy_run(edited, folder / "mallory")
    (folder / "notes").mkdir()
    (folder / "notes" / "todo.txt").write_text("nothing here")
    return folder


def grade_of(run: Path):
    return grade_source(run, load_rubric())


# --- the checkers refuse what the schemas forbid (so a pass below means something) -------------------------------


OLD_JUNIT = """<testsuites name="inferlab grade" tests="1" failures="0" errors="0">
  <testsuite name="run" tests="1" failures="0" errors="0" skipped="0" time="0">
    <testcase classname="inferlab.checklist" name="item 1" time="0">
      <properties><property name="points" value="5" /></properties>
    </testcase>
  </testsuite>
</testsuites>"""


def test_the_xsd_checker_refuses_what_junit_10_forbids():
    # the form grade wrote before: properties inside a testcase
    assert any("do not fit the content model of <testcase>" in p for p in xsd_problems(OLD_JUNIT))
    for broken, expected in [
        (OLD_JUNIT.replace(' tests="1" failures="0" errors="0" skipped', ' skipped'), "required attribute 'tests'"),
        (OLD_JUNIT.replace('time="0">\n    <testcase', 'time="1.5s">\n    <testcase'), "does not match the pattern"),
        (OLD_JUNIT.replace('classname=', 'points="5" classname='), "attribute 'points' is not allowed"),
        (OLD_JUNIT.replace("<properties>", "<errors message='x'/><properties>"), "<errors> is not declared"),
    ]:
        assert any(expected in p for p in xsd_problems(broken)), (expected, xsd_problems(broken))
    valid = OLD_JUNIT.replace('<properties><property name="points" value="5" /></properties>',
                              '<skipped message="a person grades it" />')
    assert xsd_problems(valid) == []


def test_the_json_schema_checker_refuses_what_the_specification_does_not_allow():
    good = {"score": 1.0, "tests": [{"name": "a", "score": 1, "max_score": 1, "status": "passed"}]}
    assert json_schema_problems(good, RESULTS_SCHEMA) == []
    for broken, expected in [
        ({**good, "tests": [{"name": "a", "status": "skipped"}]}, "is not one of"),
        ({**good, "scor": 1}, "field 'scor' is not in the specification"),
        ({"tests": [{"name": "a"}]}, "fits none of anyOf"),  # no score anywhere
        ({**good, "visibility": "public"}, "is not one of"),
        ({**good, "score": "1"}, "expected number"),
        ({**good, "tests": [{"number": 1}]}, "expected string"),
    ]:
        assert any(expected in p for p in json_schema_problems(broken, RESULTS_SCHEMA)), expected
    with pytest.raises(Unsupported):
        json_schema_problems({}, {"type": "object", "patternProperties": {}})


# --- JUnit -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_one_runs_junit_validates_and_carries_points_on_the_suite(submitted, tmp_path):
    out = tmp_path / "grade.xml"
    assert main(["grade", str(submitted), "--format", "junit", "--out", str(out)]) == 0
    text = out.read_text()
    assert xsd_problems(text, JUNIT_XSD) == []
    suite = ElementTree.fromstring(text).find("testsuite")
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["score"] == "60" and properties["item_3_points"] == "10"
    assert properties["item_1_status"] == "manual" and properties["item_1_manual_points"] == "10"
    cases = suite.findall("testcase")
    assert all(case.find("properties") is None and case.get("time") is None for case in cases)
    assert suite.get("time") is None  # no fake 0: grade measures no time
    manual = [case for case in cases if case.find("skipped") is not None]
    assert [case.get("name").split(":")[0] for case in manual] == ["item 1", "item 7"]
    assert "for a person to grade (10 points)" in manual[0].find("skipped").get("message")
    assert suite.get("skipped") == "2" and suite.get("failures") == "0"
    assert "points 5 of 5 automatic" in manual[0].find("system-out").text


@pytest.mark.slow
def test_a_class_junit_validates_with_one_uniquely_named_suite_per_submission(a_class, submitted, tmp_path):
    # the class, and beside it the honest run once more in a folder named ada: two suites would share a name
    again = copy_run(submitted, tmp_path / "elsewhere" / "ada")
    text = formats.junit([grade_of(p) for p in sorted(a_class.iterdir())] + [grade_of(again)])
    assert xsd_problems(text, JUNIT_XSD) == []
    suites = ElementTree.fromstring(text).findall("testsuite")
    assert [s.get("name") for s in suites] == ["ada", "mallory", "notes", "ada (2)"]
    pairs = [(c.get("classname"), c.get("name")) for s in suites for c in s.findall("testcase")]
    assert len(pairs) == len(set(pairs)) == 8 + 8 + 1 + 8
    notes = suites[2].find("testcase")
    assert notes.find("error").get("type") == "not_a_run" and suites[2].get("errors") == "1"


def test_an_integrity_problem_fails_every_item_in_junit_with_its_reason(edited):
    grade = grade_of(edited)
    assert grade.integrity_problems and grade.score == 0
    text = formats.junit([grade])
    assert xsd_problems(text) == []
    suite = ElementTree.fromstring(text).find("testsuite")
    items = [c for c in suite.findall("testcase") if c.get("classname") == "inferlab.checklist"]
    assert all(c.find("failure") is not None and c.find("failure").get("type") == "integrity" for c in items)
    assert "no points: the run has" in items[2].find("failure").get("message")
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert all(properties[f"item_{n}_points"] == "0" for n in range(1, 8)) and properties["score"] == "0"


# --- Gradescope ---------------------------------------------------------------------------------------------------


def test_results_json_validates_and_its_items_add_up_to_the_score(submitted):
    data = json.loads(formats.gradescope(grade_of(submitted)))
    assert json_schema_problems(data, RESULTS_SCHEMA) == []
    items = [t for t in data["tests"] if "checklist" in t.get("tags", [])]
    assert data["score"] == sum(t["score"] for t in items) == 60


def test_results_json_items_agree_with_a_score_an_integrity_problem_forfeits(edited):
    data = json.loads(formats.gradescope(grade_of(edited)))
    assert json_schema_problems(data, RESULTS_SCHEMA) == []
    items = [t for t in data["tests"] if "checklist" in t.get("tags", [])]
    assert data["score"] == 0 and [t["score"] for t in items] == [0] * 7
    assert all(t["status"] == "failed" and t["output"].startswith("no points: the run has") for t in items)
    integrity = next(t for t in data["tests"] if t["name"] == "Integrity of the run")
    assert integrity["status"] == "failed" and "records.jsonl" in integrity["output"]


@pytest.mark.slow
def test_results_json_validates_for_every_submission_of_a_class(a_class):
    for source in sorted(a_class.iterdir()):
        data = json.loads(formats.gradescope(grade_of(source)))
        assert json_schema_problems(data, RESULTS_SCHEMA) == [], source.name


# --- what was not established ---------------------------------------------------------------------------------------


def test_every_output_carries_what_was_not_checked(submitted):
    grade = grade_of(submitted)
    grade.not_checked = ["sampled ids across torch versions: the run used another torch"]
    reason = grade.not_checked[0]
    run = json.loads(formats.json_text([grade]))["runs"][0]
    assert run["not_checked"] == [reason]
    suite = ElementTree.fromstring(formats.junit([grade])).find("testsuite")
    assert {p.get("name"): p.get("value") for p in suite.find("properties")}["not_checked_1"] == reason
    integrity = next(c for c in suite.findall("testcase") if c.get("classname") == "inferlab.integrity")
    assert f"not checked: {reason}" in integrity.find("system-out").text
    results = json.loads(formats.gradescope(grade))
    assert results["extra_data"]["not_checked"] == [reason]
    integrity_test = next(t for t in results["tests"] if t["name"] == "Integrity of the run")
    assert f"not checked: {reason}" in integrity_test["output"]
    page = formats.text_page(grade)
    assert page.count(reason) == 1 and page.split("Not checked (what this grade does not establish):")[1].strip() == \
        f"- {reason}"


@pytest.mark.slow
@pytest.mark.process
def test_the_course_ci_jobs_junit_file_validates(course_ci):
    """The file GitLab reads in the documented job (.ci/course-grade, run once per session)."""
    assert xsd_problems((course_ci["out"] / "grade.xml").read_text(encoding="utf-8")) == []
