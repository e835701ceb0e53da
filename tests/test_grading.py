"""`grade`: one verdict per checklist item with evidence, integrity apart, findings apart, the exit status, the
output formats, bad input. Runs are built with the harness's writers (no model); one honest run per process
(tests/fixture_runs.py), copied by each test that changes it."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.base.records import RECORDS_FILE, write_json_atomic
from inferlab.grading import formats
from inferlab.grading.grade import grade_source
from inferlab.grading.rubric import DEFAULT_RUBRIC, RubricError, load_rubric
from inferlab.run.plan import plan_totals

from fixtures_records import (
    REPO_ROOT,
    copy_run,
    edit_manifest,
    kill_after,
    refresh_manifest,
    rerender,
    rewrite_records,
    session_end_record,
)
from grading_helpers import (
    PREDICTIONS_TEMPLATE,
    TEMPLATE,
    answered_explanation,
    answered_predictions,
    attach_file,
    change_one_character,
    give_predictions,
    submit_ready,
    verify_reads_addenda,
)
from fixture_runs import runs, shared, fixture_runs  # noqa: F401 (runs is a fixture)

SCHEMA1 = Path(__file__).resolve().parent / "fixtures" / "schema1-run"
GRADESCOPE_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


honest = shared("honest", "honest", "A complete, honest stand-in run with this checkout's source hashes; no "
                "predictions, nothing attached. Shared: never change it (run_copy is a copy).")


@pytest.fixture(scope="module")
def submitted(tmp_path_factory) -> Path:
    """The honest run with answered predictions and an attached, answered explanation."""
    return submit_ready(fixture_runs(tmp_path_factory).copy("honest", tmp_path_factory.mktemp("grading") / "submitted"))


@pytest.fixture
def run_copy(honest, tmp_path) -> Path:
    return copy_run(honest, tmp_path / "copy")


def grade_of(run: Path, **kwargs):
    return grade_source(run, load_rubric(kwargs.pop("rubric", None)), **kwargs)


def statuses(grade) -> dict:
    return {item.number: item.status for item in grade.items}


def failing_checks(grade, number: int) -> list[str]:
    return [c.name for c in grade.item(number).checks if c.status == "fail"]


def require_addenda_aware_verify(run: Path) -> None:
    if not verify_reads_addenda(run):
        pytest.skip("verify on this branch lists addenda.jsonl as a file the manifest does not list; issue 23's "
                    "verify/addenda.py teaches it the addenda layout, and this test runs once that is merged")


# --- the honest run ------------------------------------------------------------------------------


def test_an_honest_run_passes_items_2_to_6_and_leaves_the_written_work_to_a_person(submitted):
    grade = grade_of(submitted)
    assert statuses(grade) == {1: "manual", 2: "pass", 3: "pass", 4: "pass", 5: "pass", 6: "pass", 7: "manual"}
    manual = [c for c in grade.item(1).checks + grade.item(7).checks if c.status == "manual"]
    assert [c.name for c in manual] == ["revised_explanation", "conclusions_and_limitations"]
    assert all(e.file == "addenda.jsonl" and e.seq == 0 for c in manual for e in c.evidence[:1])
    # every check names its evidence: a file, and for records the kind and seq
    trials = next(c for c in grade.item(4).checks if c.name == "trials")
    assert trials.evidence[0].file == RECORDS_FILE and trials.evidence[0].kind == "generation"
    assert isinstance(trials.evidence[0].seq, int) and trials.count == 26
    assert grade.score == grade.max_score == 60 or grade.integrity_problems


def test_an_honest_complete_run_with_predictions_and_an_attached_explanation_exits_0(submitted, capsys):
    require_addenda_aware_verify(submitted)
    assert main(["grade", str(submitted)]) == 0
    out = capsys.readouterr().out
    assert "PASSED (exit 0)" in out and "integrity: OK" in out and "What to fix" not in out


def test_json_has_a_schema_and_seven_items_each_with_checks_and_evidence(submitted, capsys):
    main(["grade", str(submitted), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert (data["format"], data["schema"]) == ("inferlab-grade", 1)
    (run,) = data["runs"]
    assert [item["number"] for item in run["items"]] == [1, 2, 3, 4, 5, 6, 7]
    assert all(item["checks"] and item["status"] in ("pass", "fail", "manual") for item in run["items"])
    evidence = run["items"][3]["checks"][0]["evidence"][0]
    assert evidence["file"] == RECORDS_FILE and evidence["kind"] == "input" and isinstance(evidence["seq"], int)
    assert set(run["integrity"]) == {"ok", "verify_problems", "completeness", "reference"}
    assert data["rubric"]["default"] is True and data["rubric"]["max_score"] == 60


def test_junit_has_one_testcase_per_item_with_points_as_suite_properties(submitted, tmp_path, capsys):
    out = tmp_path / "grade.xml"
    main(["grade", str(submitted), "--format", "junit", "--out", str(out)])
    root = ElementTree.parse(out).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    items = [case for case in suite.findall("testcase") if case.get("classname") == "inferlab.checklist"]
    assert [case.get("name").split(":")[0] for case in items] == [f"item {n}" for n in range(1, 8)]
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    for n in range(1, 8):  # the xunit2 schema allows properties on the testsuite only (tests/test_grading_formats.py)
        assert {f"item_{n}_{k}" for k in ("points", "max_points", "manual_points", "status", "required")} <= \
            set(properties)
    assert suite.get("tests") == str(len(suite.findall("testcase")))
    assert "What passed:" in capsys.readouterr().out  # the learner's page is still printed


def test_junit_failure_says_what_to_fix(run_copy, tmp_path):
    out = tmp_path / "grade.xml"
    assert main(["grade", str(run_copy), "--format", "junit", "--out", str(out)]) == 1
    suite = ElementTree.parse(out).getroot().find("testsuite")
    first = next(case for case in suite.findall("testcase") if case.get("name").startswith("item 1:"))
    failure = first.find("failure")
    assert failure is not None and "To fix: answer predictions.md BEFORE running" in failure.get("message")
    assert int(suite.get("failures")) == 2  # items 1 and 7: nothing was written


def test_gradescope_writes_a_valid_results_json(submitted, tmp_path):
    out = tmp_path / "results.json"
    main(["grade", str(submitted), "--format", "gradescope", "--out", str(out)])
    data = json.loads(out.read_text())
    assert isinstance(data["score"], float) and isinstance(data["output"], str)
    items = [t for t in data["tests"] if "checklist" in t.get("tags", [])]
    assert len(items) == 7
    for test in data["tests"]:
        assert set(test) <= {"score", "max_score", "status", "name", "number", "output", "tags", "visibility",
                             "extra_data", "name_format", "output_format"}
        assert test["status"] in ("passed", "failed") and test["visibility"] in GRADESCOPE_VISIBILITY
        assert isinstance(test["name"], str) and isinstance(test["output"], str)
    if not any(t["status"] == "failed" and "checklist" not in t.get("tags", []) for t in data["tests"]):
        assert data["score"] == sum(t["score"] for t in items)
    assert "graded by a person" in items[0]["output"]


def test_gradescope_holds_one_submission(honest, run_copy, capsys):
    assert main(["grade", str(honest), str(run_copy), "--format", "gradescope"]) == 2
    assert "one submission's results.json" in capsys.readouterr().err


# --- failing items ---------------------------------------------------------------------------------


def test_a_run_without_predictions_exits_1_naming_item_1(run_copy, capsys):
    assert main(["grade", str(run_copy)]) == 1
    grade = grade_of(run_copy)
    assert "predictions_supplied" in failing_checks(grade, 1) and statuses(grade)[2] == "pass"
    out = capsys.readouterr().out
    fix = out[out.index("What to fix:"):]
    assert "[FAIL] 1. Predictions" in fix and "predictions_supplied" in fix
    assert out.index("What passed:") < out.index("What to fix:")  # what passed first, then what to fix


def test_the_blank_predictions_template_fails_item_1(run_copy):
    give_predictions(run_copy, PREDICTIONS_TEMPLATE)
    grade = grade_of(run_copy)
    assert failing_checks(grade, 1)[:1] == ["predictions_answered"] and grade.exit_status == 1


def test_an_answered_template_passes_the_predictions_checks(run_copy):
    give_predictions(run_copy, answered_predictions())
    grade = grade_of(run_copy)
    assert "predictions_supplied" not in failing_checks(grade, 1)
    assert "predictions_answered" not in failing_checks(grade, 1)


def partial_sampling_run(directory: Path) -> Path:
    """What `-k sampling` leaves: only the sampling part's tests planned and recorded; the plan and session_end
    say why (as tests/test_verify.py's partial_run builds one)."""
    keep = "test_30_sampling"
    plan = json.loads((directory / "plan.json").read_text())
    dropped = sum(1 for e in plan["schedule"] if keep not in e["test"])
    plan["schedule"] = [e for e in plan["schedule"] if keep in e["test"]]
    reasons = [f"-k 'sampling' deselected {dropped} protocol test(s)"]
    plan["totals"] = plan_totals(plan["schedule"])  # as the plan of such a selection counts them
    plan.update(partial_reasons=reasons + protocol.shortfalls(plan["totals"]), protocol_complete=False)
    write_json_atomic(directory / "plan.json", plan)

    def drop(records):
        kept = [r for r in records if r["kind"] in ("plan",) or keep in (r.get("test") or "")]
        return kept + [session_end_record(kept, plan["schedule"], protocol_complete=False, partial_reasons=reasons,
                                          complete=False, tests_without_outcome=[])]

    rewrite_records(directory, drop)
    return rerender(as_the_session_ends(directory))  # and its report as that session rendered it


def test_a_k_subset_exits_1_and_fails_the_items_it_lacks_not_integrity(run_copy, capsys):
    partial_sampling_run(run_copy)
    grade = grade_of(run_copy)
    assert grade.integrity_problems == [] and grade.completeness[0].startswith("partial: -k 'sampling'")
    assert grade.facts["complete"] is False
    for number in (3, 5, 6):
        assert statuses(grade)[number] == "fail"
    detail = next(c for c in grade.item(5).checks if c.status == "fail").detail
    assert "left out the tests that write it" in detail and "partial run" in detail
    assert main(["grade", str(run_copy)]) == 1
    assert "NOT the complete protocol" in capsys.readouterr().out


def test_a_killed_run_fails_its_items_and_says_its_files_are_not_protected(run_copy):
    kill_after(run_copy, tests_done=40)
    grade = grade_of(run_copy)
    assert grade.exit_status == 1 and grade.completeness and grade.completeness[0].startswith("unfinished: ")
    assert "no file hash can be checked" in grade.completeness[0]
    assert statuses(grade)[6] == "fail"


def drop_one_outcome(run: Path) -> Path:
    """A run whose manifest and session_end still say complete, but one planned test has no outcome record."""
    dropped = []

    def drop(records):
        kept = []
        for record in records:
            if record["kind"] == "test_outcome" and not dropped and "test_30_sampling" in record["test"]:
                dropped.append(record["test"])
                continue
            kept.append(record)
        return kept

    rewrite_records(run, drop)
    assert dropped
    return run


@pytest.mark.parametrize("make", ["partial", "killed", "outcome_missing"])
def test_verify_and_grade_say_the_same_of_a_run_that_is_not_complete(run_copy, make, capsys):
    from inferlab.verify import verify_run

    {"partial": partial_sampling_run, "killed": lambda run: kill_after(run, tests_done=40),
     "outcome_missing": drop_one_outcome}[make](run_copy)
    verified = verify_run(run_copy)
    grade = grade_of(run_copy)
    # one definition of complete, stated by verify and read by grade
    assert verified["complete"] is False and grade.facts["complete"] is False
    assert grade.completeness == verified["completeness"]
    assert set(grade.completeness) <= set(verified["problems"])
    assert main(["verify", str(run_copy)]) == 1
    said = capsys.readouterr().out
    assert "; NOT the complete protocol" in said.splitlines()[-1]
    main(["grade", str(run_copy)])
    page = capsys.readouterr().out
    assert "NOT the complete protocol" in page
    assert "integrity: OK (verify found no problem)" not in page  # verify did find one: the run is incomplete


def test_verify_and_grade_both_call_an_honest_complete_run_complete(honest, capsys):
    from inferlab.verify import verify_run

    verified = verify_run(honest)
    assert verified["complete"] is True and verified["completeness"] == []
    assert grade_of(honest).facts["complete"] is True
    main(["verify", str(honest)])
    assert "NOT the complete protocol" not in capsys.readouterr().out


def test_a_failed_acquisition_fails_the_dependent_items_with_its_evidence(runs, tmp_path):
    # The fixture's manifest hashes a made-up source; as this checkout's harness would have hashed it:
    run = with_this_harness(runs.copy("failed_ended", tmp_path / "failed"))
    grade = grade_of(run)
    assert grade.exit_status == 1 and grade.integrity_problems == []
    behind = next(c for c in grade.item(3).checks if c.name == "integrity_tests")
    assert behind.status == "fail" and "test_acquisition failed" in behind.detail
    assert behind.evidence[0].kind == "test_outcome"
    trials = next(c for c in grade.item(4).checks if c.name == "trials")
    assert "skipped" in trials.detail and "records.jsonl seq" in trials.fix


def with_this_harness(run: Path) -> Path:
    """A run's manifest given this checkout's source hashes (what grade compares with its own copy)."""
    from inferlab.host import environment

    edit_manifest(run, source_sha256=environment.source_hashes(REPO_ROOT))
    return rerender(run)  # and its report as a session with these hashes renders it (grade compares the two)


def as_the_session_ends(run: Path) -> Path:
    """After an edit of the records, the manifest says what a session ending so writes: its session_end and the
    copies of it, and each prerequisite's status by the outcome of the test it names (grade checks both)."""
    records = [json.loads(line) for line in (run / RECORDS_FILE).read_text().splitlines()]
    end = {k: v for k, v in next(r for r in records if r["kind"] == "session_end").items()
           if k not in ("kind", "test", "seq", "wall_time", "perf_counter_ns")}
    outcomes = {}  # test -> its decisive outcome: the first that did not pass, else passed
    for record in records:
        if record["kind"] == "test_outcome" and outcomes.get(record["test"], "passed") == "passed":
            outcomes[record["test"]] = record["outcome"]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.update(session_end=end, **{k: end[k] for k in ("complete", "status", "exit_status", "exit_code_name")})
    for entry in (manifest.get("checks") or {}).values():
        if entry.get("by") in outcomes:
            entry["status"] = {"skipped": "did not run"}.get(outcomes[entry["by"]], outcomes[entry["by"]])
    write_json_atomic(run / "manifest.json", manifest)
    refresh_manifest(run)
    return run


def set_outcome(test_suffix: str, **fields):
    """A records transform: the outcome of the test whose node id ends with `test_suffix` gets `fields`, and
    session_end is written again to agree with the outcomes."""
    def change(records: list[dict]) -> list[dict]:
        for record in records:
            if record["kind"] == "test_outcome" and record["test"].endswith(test_suffix):
                record.update(fields)
        kept = [r for r in records if r["kind"] != "session_end"]
        return kept + [session_end_record(kept)]

    return change


def test_a_failed_protocol_diagnostic_is_a_finding_never_a_failed_item(run_copy, honest):
    rewrite_records(run_copy, set_outcome("::test_greedy_repetitions_identical", outcome="failed",
                                          longrepr="E   AssertionError: P2 greedy repetitions differ at 3"))
    rerender(as_the_session_ends(run_copy))  # and the report a session with that failure renders
    grade, before = grade_of(run_copy), grade_of(honest)
    assert statuses(grade) == statuses(before) and grade.exit_status == before.exit_status
    (finding,) = [f for f in grade.findings if f["kind"] == "diagnostic_failed"]
    assert "test_greedy_repetitions_identical failed: AssertionError: P2 greedy repetitions differ" in finding["what"]
    assert finding["evidence"][0]["kind"] == "test_outcome" and isinstance(finding["evidence"][0]["seq"], int)


def test_a_failed_harness_integrity_test_fails_the_item_its_records_belong_to(run_copy):
    rewrite_records(run_copy, set_outcome("::test_matched_prefix", outcome="failed",
                                          longrepr="E   Failed: the cached path was fed a stale cache"))
    as_the_session_ends(run_copy)
    grade = grade_of(run_copy)
    assert failing_checks(grade, 5) == ["integrity_tests"] and statuses(grade)[4] == "pass"
    assert "the cached path was fed a stale cache" in grade.item(5).checks[-1].detail


def test_a_skipped_check_that_left_nothing_missing_does_not_fail_its_item(run_copy):
    """As a cache prefix beyond an early EOS is 'not applicable': the skip is recorded, no record is missing."""
    rewrite_records(run_copy, set_outcome("::test_thread_controls", outcome="skipped",
                                          skip_reason="not applicable: a test of this test suite"))
    as_the_session_ends(run_copy)
    check = grade_of(run_copy).item(2).checks[-1]
    assert check.name == "integrity_tests" and check.status == "pass" and "1 skipped" in check.detail


def test_an_explanation_without_its_conclusions_fails_item_7_and_names_the_gaps(run_copy):
    text = answered_explanation(skip=("A conclusion about selection", "A conclusion about computation",
                                      "Limitation 1", "Limitation 2"))
    attach_file(run_copy, text)
    grade = grade_of(run_copy)
    (check,) = [c for c in grade.item(7).checks if c.name == "conclusions_and_limitations"]
    assert check.status == "fail" and "absent" in check.detail and "Limitation 2" in check.detail
    partly = answered_explanation(skip=("Limitation 2",))
    attach_file(run_copy, partly)  # a later attach revises the explanation
    check = [c for c in grade_of(run_copy).item(7).checks if c.name == "conclusions_and_limitations"][0]
    assert check.status == "manual" and "3 of 4 sections" in check.detail and "Limitation 2" in check.fix


def test_an_attachment_that_is_not_an_explanation_is_a_finding(run_copy):
    attach_file(run_copy, "atol 1e-4\n", kind="revised_criterion", name="criterion.txt", structure=None)
    grade = grade_of(run_copy)
    assert any(f["kind"] == "addendum_revised_criterion" for f in grade.findings)
    assert "explanation_attached" in failing_checks(grade, 7)


# --- integrity and exit statuses -------------------------------------------------------------------


def test_one_changed_character_of_records_exits_3(run_copy, capsys):
    change_one_character(run_copy)
    assert main(["grade", str(run_copy)]) == 3
    out = capsys.readouterr().out
    assert "INTEGRITY (exit 3)" in out and "records.jsonl: sha256" in out
    assert grade_of(run_copy).score == 0  # the default rubric: untrusted evidence earns no points


def test_a_damaged_run_is_an_integrity_problem_naming_the_line(run_copy):
    with open(run_copy / RECORDS_FILE, "a") as handle:
        handle.write('{"kind": "generation", "te\n')
    grade = grade_of(run_copy)
    assert grade.exit_status == 3
    assert any("records.jsonl:" in p and "not a JSON object" in p for p in grade.integrity_problems)


@pytest.mark.parametrize("make", ["empty", "other files", "missing"])
def test_a_folder_that_is_not_a_run_exits_2(tmp_path, capsys, make):
    target = tmp_path / "not-a-run"
    if make != "missing":
        target.mkdir()
    if make == "other files":
        (target / "notes.txt").write_text("hello")
    assert main(["grade", str(target)]) == 2
    assert "NOT A RUN (exit 2)" in capsys.readouterr().out


def test_a_plan_folder_is_not_a_run_to_grade(runs, capsys):
    plan = runs.get("plan")
    assert main(["grade", str(plan)]) == 2
    assert "a plan folder (--plan): no test ran" in capsys.readouterr().out


def test_the_csv_over_two_runs_has_two_rows_and_the_exit_status_is_the_worse(honest, run_copy, tmp_path):
    change_one_character(run_copy)
    out = tmp_path / "class.csv"
    assert main(["grade", str(honest), str(run_copy), "--csv", str(out)]) == 3
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("source,run_id,specimen,synthetic,complete,integrity,exit_status,")
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    assert [r["exit_status"] for r in rows] == ["1", "3"] and rows[1]["integrity"].endswith("problem(s)")
    assert rows[0]["synthetic"] == "yes" and rows[0]["item_2"] == "pass" and rows[0]["item_1"] == "fail"
    for column in ("cache_max_abs_diff", "ttft_median_ms_P1_cache_on", "ttft_median_ms_P1x8_cache_on",
                   "decode_interval_ratio_on_off_P1", "decode_interval_ratio_on_off_P1x8"):
        assert float(rows[0][column]) > 0


def test_the_older_schema_run_is_graded_through_the_upgrade(capsys, tmp_path):
    # An older harness made it: under the default rubric that alone is an integrity problem (exit 3); a rubric
    # that shows a harness difference as a finding grades what the run recorded.
    assert grade_of(SCHEMA1).exit_status == 3
    rubric = tmp_path / "older-harness.toml"
    rubric.write_text(DEFAULT_RUBRIC.read_text().replace('grader_source = "integrity"', 'grader_source = "finding"'))
    assert main(["grade", str(SCHEMA1), "--rubric", str(rubric)]) == 1
    grade = grade_of(SCHEMA1, rubric=rubric)
    assert any(f["kind"] == "source_differs" for f in grade.findings)
    assert grade.facts["schema"] == 1 and grade.integrity_problems == []
    assert {n: s for n, s in statuses(grade).items() if n in (4, 5, 6)} == {4: "pass", 5: "pass", 6: "pass"}
    # that run hashed only the experiment folder's files, not the harness's own source
    assert "inferlab/" in next(c for c in grade.item(2).checks if c.name == "source_hashes").detail
    assert "schema 1" in capsys.readouterr().out


def test_grade_never_writes_into_a_run_folder(honest, tmp_path):
    def snapshot():
        return {p.relative_to(honest): (p.stat().st_mtime_ns, p.read_bytes()) for p in honest.rglob("*")
                if p.is_file()}

    before = snapshot()
    for kind in formats.FORMATS:
        main(["grade", str(honest), "--format", kind, "--out", str(tmp_path / f"out.{kind}"),
              "--csv", str(tmp_path / f"out.{kind}.csv")])
    assert main(["grade", str(honest), "--out", str(honest / "grade.txt")]) == 2
    assert main(["grade", str(honest), "--csv", str(honest / "tensors" / "x.csv")]) == 2
    assert snapshot() == before


# --- the rubric ------------------------------------------------------------------------------------


def test_a_rubric_that_does_not_parse_exits_2_naming_the_file_and_line(honest, tmp_path, capsys):
    rubric = tmp_path / "rubric.toml"
    rubric.write_text("schema = 1\n[[items]\nnumber = 1\n")
    assert main(["grade", str(honest), "--rubric", str(rubric)]) == 2
    err = capsys.readouterr().err
    assert str(rubric) in err and "not valid TOML" in err and "line 2" in err


@pytest.mark.parametrize("change, message", [
    (lambda text: text.replace("\npoints = 10\n", "\npoints = -1\n", 1), "item 2: points must be a number >= 0"),
    (lambda text: text.replace("number = 7", "number = 6"), "item 6 appears twice"),
    (lambda text: text.replace("schema = 1", "schema = 1\nbonus = 3"), "unknown field(s) bonus"),
    (lambda text: text.replace('visibility = "visible"', 'visibility = "soon"', 1), "item 1: visibility must be one of"),
])
def test_a_rubric_with_a_bad_value_is_refused_with_what_was_expected(tmp_path, change, message):
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(change(DEFAULT_RUBRIC.read_text()))
    with pytest.raises(RubricError, match="rubric.toml: ") as caught:
        load_rubric(rubric)
    assert message in str(caught.value)


def test_a_course_rubric_changes_points_and_what_is_required(run_copy, tmp_path):
    text = DEFAULT_RUBRIC.read_text().replace("points = 5\nmanual_points = 10\nrequired = true", "points = 0\n"
                                              "manual_points = 20\nrequired = false")
    rubric = tmp_path / "course.toml"
    rubric.write_text(text)
    grade = grade_of(run_copy, rubric=rubric)
    assert grade.max_score == 50 and grade.exit_status == 0  # items 1 and 7 fail, but are optional here
    assert statuses(grade)[1] == "fail" and grade.score == 50


def test_the_default_rubric_names_the_templates_answer_headings():
    from inferlab.reading import addenda

    rubric = load_rubric()
    headings = [heading for level, heading, _ in addenda.sections(TEMPLATE)[1:]]
    grouping = {"Predictions revisited", "Limitations"}
    assert list(rubric.items[1].sections) + list(rubric.items[7].sections) == [h for h in headings
                                                                                if h not in grouping]


def test_grade_help_lists_every_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["grade", "--help"])
    out = capsys.readouterr().out
    for line in ("0  every required checklist item passes", "1  a checklist item fails", "2  a usage error",
                 "3  an integrity problem"):
        assert line in out


@pytest.mark.process
def test_grading_loads_no_model_and_no_torch(honest, tmp_path):
    import subprocess
    import sys

    code = ("import sys; from inferlab.__main__ import main; main(['grade', sys.argv[1], '--format', 'json', "
            "'--out', sys.argv[2]]); assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('torch', 'transformers')))")
    out = tmp_path / "grade.json"  # a file of the test's own: never a device of the machine's (issue 42)
    done = subprocess.run([sys.executable, "-c", code, str(honest), str(out)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["runs"], out.read_text()[:500]
