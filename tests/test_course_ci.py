"""The course CI example cannot rot: docs/grading.md's GitHub Actions workflow and GitLab CI job call
.ci/course-grade, and this module runs that script end to end (analytic tests, a real stand-in experiment, the
explanation attached, pack, grade with JUnit output).

The script runs from a scratch copy of the project (its own .ci/, experiments/, analytic_tests/, specs), so the
stand-in it builds lands in that copy's artifacts/cache, never in the checkout; it is run once per session. That
script's stand-in run (with the learner's predictions, which make test's standin_run has not) is the real run the
tests below that need real tensors (a real vocabulary's first-step logits, the real cache comparison) share.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from inferlab.cli import COMMANDS
from inferlab.grading.grade import grade_source
from inferlab.grading.reference import compare_reference, make_reference
from inferlab.grading.rubric import load_rubric
from inferlab.runview import RunView

from fixtures_records import REPO_ROOT, copy_run, rewrite_records
from grading_helpers import answered_explanation, answered_predictions
from shared_runs import child_env, made_once, make_project

SCRIPT = REPO_ROOT / ".ci" / "course-grade"
DOC = REPO_ROOT / "docs" / "grading.md"
ATTACH_EXISTS = "attach" in COMMANDS  # issue 23 adds it; before that merge the script has nothing to attach with


@pytest.fixture(scope="module")
def ci(tmp_path_factory) -> dict:
    """One run of the course CI script, as a course's CI job runs it after the set-up step (once per session)."""
    def make(base):
        project = make_project(base / "project", analytic_tests=True)
        (project / ".ci").mkdir()
        shutil.copy(SCRIPT, project / ".ci" / SCRIPT.name)
        (base / "my_predictions.md").write_text(answered_predictions())
        (base / "my_explanation.md").write_text(answered_explanation())
        env = child_env({"PYTHON": sys.executable, "OUT": str(base / "out"),
                         "PREDICTIONS": str(base / "my_predictions.md"),
                         "EXPLANATION": str(base / ("my_explanation.md" if ATTACH_EXISTS else "not-attached.md"))})
        done = subprocess.run(["bash", str(project / ".ci" / SCRIPT.name)], cwd=project, env=env, capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "out": str(base / "out")}

    made = made_once(tmp_path_factory, "course-ci", make)
    done = subprocess.CompletedProcess(["bash", str(SCRIPT)], made["returncode"], made["stdout"], made["stderr"])
    out = Path(made["out"])
    return {"done": done, "out": out, "run": out / "run"}


@pytest.mark.slow
@pytest.mark.process
def test_the_course_ci_script_runs_every_step_and_grades_with_junit(ci):
    done, out = ci["done"], ci["out"]
    log = done.stdout + done.stderr
    for step in ("== 1. analytic tests", "== 2. the experiment", "== 3. the explanation", "== 4. pack", "== 5. grade"):
        assert step in done.stdout, log[-3000:]
    suite = ElementTree.parse(out / "grade.xml").getroot().find("testsuite")
    items = {case.get("name").split(":")[0]: case.find("failure") is None
             for case in suite.findall("testcase") if case.get("classname") == "inferlab.checklist"}
    assert list(items) == [f"item {n}" for n in range(1, 8)]
    assert (out / "submission.tar.gz").is_file() and len((out / "grade.csv").read_text().splitlines()) == 2
    if ATTACH_EXISTS:
        assert done.returncode == 0, log[-3000:]
        assert all(items.values())
    else:  # the script says it has no explanation to attach: exactly the two items that need one fail
        assert done.returncode == 1, log[-3000:]
        assert [name for name, ok in items.items() if not ok] == ["item 1", "item 7"]
        assert "nothing attached, so checklist items 1 and 7 fail" in done.stdout
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
def test_the_real_stand_in_run_passes_the_recorded_items(ci):
    grade = grade_source(ci["run"], load_rubric())
    assert {i.number: i.status for i in grade.items if i.number in range(2, 7)} == {n: "pass" for n in range(2, 7)}
    assert grade.measurements["decode_interval_ratio_on_off_P1x8"] > 0
    assert grade.facts["prompt_lengths"]["P1x8"] > grade.facts["prompt_lengths"]["P1"]


@pytest.mark.process
def test_a_reference_of_the_real_run_agrees_with_it_and_catches_an_edited_greedy_id(ci, tmp_path):
    view = RunView.read(ci["run"])
    reference = make_reference(view)
    assert len(reference["outputs"]["first_step"]["P1/G"]["top_ids"]) == 20
    agreed = compare_reference(view, json.loads(json.dumps(reference)))
    assert agreed.contradictions == [] and agreed.compared["generation"] == 26
    forged = copy_run(ci["run"], tmp_path / "forged")

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
def test_the_grading_benchmark_times_grade_over_copies_of_a_run(ci, capsys):
    from benchmarks import grading

    assert grading.main(["--runs", "3", "--source", str(ci["run"])]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"grading_seconds=[0-9.]+ runs=3 per_run=[0-9.]+", last)
