"""The course CI example cannot rot: docs/grading.md's GitHub Actions workflow and GitLab CI job call
.ci/course-grade, and this module runs that script end to end (analytic tests, a real stand-in experiment, the
explanation attached, pack, grade with JUnit output).

The script runs from a scratch copy of the project (its own .ci/, experiments/, analytic_tests/, specs), so the
stand-in it builds lands in that copy's artifacts/cache, never in the checkout; it is run once per session (the
course_ci fixture, tests/conftest.py). That script's --offline stand-in run (with the learner's predictions, which
make test's standin_run has not) is the real run the tests below that need real tensors (a real vocabulary's
first-step logits, the real cache comparison) share, and test_experiment_runs compares it with standin_run.
"""

from __future__ import annotations

import json
import re
import subprocess
from xml.etree import ElementTree

import pytest

from inferlab.grading.grade import grade_source
from inferlab.grading.reference import compare_reference, make_reference
from inferlab.grading.rubric import load_rubric
from inferlab.reading.runview import RunView

from fixtures_records import REPO_ROOT, copy_run, rewrite_records
from shared_runs import COURSE_CI_SCRIPT as SCRIPT
DOC = REPO_ROOT / "docs" / "grading.md"


@pytest.mark.slow
@pytest.mark.process
def test_the_course_ci_script_runs_every_step_and_grades_with_junit(course_ci):
    done, out = course_ci["done"], course_ci["out"]
    log = done.stdout + done.stderr
    for step in ("== 1. analytic tests", "== 2. the experiment", "== 3. the explanation", "== 4. pack", "== 5. grade"):
        assert step in done.stdout, log[-3000:]
    suite = ElementTree.parse(out / "grade.xml").getroot().find("testsuite")
    items = {case.get("name").split(":")[0]: case.find("failure") is None
             for case in suite.findall("testcase") if case.get("classname") == "inferlab.checklist"}
    assert list(items) == [f"item {n}" for n in range(1, 8)]
    assert (out / "submission.tar.gz").is_file() and len((out / "grade.csv").read_text().splitlines()) == 2
    assert done.returncode == 0, log[-3000:]
    assert all(items.values())
    integrity = next(c for c in suite.findall("testcase") if c.get("classname") == "inferlab.integrity")
    assert integrity.find("failure") is None, ElementTree.tostring(integrity, encoding="unicode")


def ci_blocks() -> dict[str, str]:
    """The CI examples in docs/grading.md: {'github': yaml, 'gitlab': yaml}."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    return {("github" if "runs-on:" in block else "gitlab"): block for block in blocks if "course-grade" in block}


def test_the_documented_workflows_call_the_tested_script_and_keep_its_output():
    blocks = ci_blocks()
    assert set(blocks) == {"github", "gitlab"}
    script = SCRIPT.read_text()
    assert "OUT=${OUT:-ci-output}" in script and '--out "$OUT/grade.xml"' in script
    for name, block in blocks.items():
        assert ".ci/course-grade" in block, name
        assert "ci-output" in block, f"{name}: keeps the script's output folder as the job's artifact"
        for target in re.findall(r"\bmake\s+([^\s#]+)", block):
            # a dry run (-n) only prints what make would do; it fails when the Makefile has no such target
            dry = subprocess.run(["make", "-n", "-C", str(REPO_ROOT), target], capture_output=True, text=True,
                                 timeout=60)
            assert "No rule to make target" not in dry.stderr, f"{name}: no make target {target}: {dry.stderr}"
    assert "ci-output/grade.xml" in blocks["gitlab"]  # GitLab's JUnit report is the script's file


# --- the real run's tensors --------------------------------------------------------------------------


@pytest.mark.process
def test_the_real_stand_in_run_passes_the_recorded_items(course_ci):
    grade = grade_source(course_ci["run"], load_rubric())
    assert {i.number: i.status for i in grade.items if i.number in range(2, 7)} == {n: "pass" for n in range(2, 7)}
    assert grade.measurements["decode_interval_ratio_on_off_P1x8"] > 0
    assert grade.facts["prompt_lengths"]["P1x8"] > grade.facts["prompt_lengths"]["P1"]


@pytest.mark.process
def test_a_reference_of_the_real_run_agrees_with_it_and_catches_an_edited_greedy_id(course_ci, tmp_path):
    view = RunView.read(course_ci["run"])
    reference = make_reference(view)
    assert len(reference["outputs"]["first_step"]["P1/G"]["top_ids"]) == 20
    agreed = compare_reference(view, json.loads(json.dumps(reference)))
    assert agreed.contradictions == [] and agreed.compared["generation"] == 26
    forged = copy_run(course_ci["run"], tmp_path / "forged")

    def edit(records):
        for record in records:
            if record["kind"] == "generation" and record.get("trial_id", "").startswith("P1-G-"):
                ids = record["generated_ids"]
                record["generated_ids"] = ids[:2] + [(ids[2] + 1) % 50000] + ids[3:]
        return records

    rewrite_records(forged, edit)
    found = compare_reference(RunView.read(forged), reference).contradictions
    assert any(c.startswith("generation P1-G-rep1: ids first differ at step 2") for c in found), found


@pytest.mark.process
def test_the_grading_benchmark_times_grade_over_copies_of_a_run(course_ci, capsys):
    from benchmarks import grading

    assert grading.main(["--runs", "3", "--source", str(course_ci["run"])]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"grading_seconds=[0-9.]+ runs=3 per_run=[0-9.]+", last)
