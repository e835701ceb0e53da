"""Grading that rests on nothing a learner can write (issue 31, items 1, 2, 4 and 6): every decision recomputed
from the files with the grader's own code, every summary flag checked against what it summarises, the run's
harness compared with the grader's copy, the rubric's requirements, and what a grade could not establish.

The forgeries are made as a learner would (tests/forging.py): edit the JSON, re-hash the inventory. Fixture runs
(tests/fixture_runs.py) serve most; the session's real stand-in run (standin_run) those that need a run made under
this checkout's requirements.lock, and one real run from a scratch clone with one line added to
inferlab/measure/decode_loop.py shows that a changed harness is named by file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.base.records import MANIFEST_FILE
from inferlab.grading import formats
from inferlab.grading.grade import grade_source
from inferlab.grading.harness import compare_harness, grader_hashes
from inferlab.grading.rubric import DEFAULT_RUBRIC, RubricError, load_rubric
from inferlab.reading.runview import RunView
from inferlab.run import predictions

from fixtures_records import REPO_ROOT, copy_run
from forging import rehash
from shared_runs import inferlab_command
from grading_helpers import (
    PREDICTIONS_TEMPLATE,
    TEMPLATE,
    answered_explanation,
    answered_predictions,
    attach_file,
    give_predictions,
)
from fixture_runs import runs, shared  # noqa: F401 (runs is a fixture)

honest = shared("honest", "honest", "A complete, honest stand-in run with this checkout's source hashes; no "
                "predictions, nothing attached. Shared: never change it (run_copy is a copy).")


@pytest.fixture
def run_copy(honest, tmp_path) -> Path:
    return copy_run(honest, tmp_path / "copy")


def grade_of(run: Path, rubric=None, **kwargs):
    return grade_source(run, load_rubric(rubric), **kwargs)


def check(grade, number: int, name: str):
    return next(c for c in grade.item(number).checks if c.name == name)


def rubric_with(tmp_path: Path, **settings) -> Path:
    """The default rubric with some top-level settings replaced (TOML values given as text)."""
    text = DEFAULT_RUBRIC.read_text()
    for key, value in settings.items():
        lines = [line for line in text.splitlines() if line.startswith(f"{key} = ")]
        assert len(lines) == 1, key
        text = text.replace(lines[0], f"{key} = {value}")
    path = tmp_path / "course.toml"
    path.write_text(text)
    return path


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


# --- item 1: the predictions, from predictions.md itself --------------------------------------------------

FREE_FORM = """My predictions, written before the run.

1. Yes: greedy decoding takes the argmax each step, so the same environment gives the same ids.
2. No. Two seeds can draw the same short continuation when the distribution is peaked.
3) Lower temperature sharpens the whole distribution; lower top-p cuts off its tail, keeping the order.
Q4: They should agree within a small tolerance, not bitwise: the cached path sums in another order.
5. Not necessarily; for 14M parameters and short prompts the cache's bookkeeping can cost more than it saves.
6. Activations, the KV cache, the allocator's slack, the tokenizer, Python and the libraries themselves:
   1. activations
   2. the cache
"""


def template_with(answers: dict[int, str]) -> str:
    """The template with its Prediction/Uncertainty/Why fields filled for the questions in `answers`."""
    out, question = [], 0
    for line in PREDICTIONS_TEMPLATE.splitlines():
        heading = predictions.NUMBERED_HEADING.match(line)
        if heading:
            question = int(heading.group(1))
        field = predictions.FIELD.match(line)
        out.append(f"{field.group(1)}: {answers[question]}" if field and question in answers else line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("text, why", [
    ("", "the file is empty"),
    ("   \n\n\t \n", "the file holds only whitespace"),
    ("lol\n", "no section numbered for it"),
    (template_with({n: "TODO" for n in range(1, 7)}), "1, 2, 3, 4, 5, 6 (its Prediction field holds only a "
                                                        "placeholder (TODO))"),
    ("1. ?\n2. ...\n3. -\n4. xxx\n5. n/a\n6. tbd\n", "1 (only placeholders (?)); 2 (only placeholders (...))"),
    (template_with({1: "yes, identical ids, because greedy takes the argmax"}), "1 of 6 questions answered "
                                                                                "(template); not answered: 2, 3, 4, "
                                                                                "5, 6 (its Prediction field is blank)"),
], ids=["empty", "whitespace", "lol", "TODO-fields", "placeholders", "single-answer"])
def test_predictions_that_answer_fewer_than_six_questions_fail_item_1_saying_which(run_copy, text, why):
    give_predictions(run_copy, text)
    grade = grade_of(run_copy)
    answered = check(grade, 1, "predictions_answered")
    assert answered.status == "fail" and why in answered.detail, answered.detail
    assert "this rubric requires all six" in answered.detail and "each of the six questions" in answered.fix
    assert grade.exit_status == 1 and grade.integrity_problems == []  # the manifest's flag agrees with the file
    assert "[FAIL] 1. Predictions" in formats.text([grade]) and why in formats.text([grade])


@pytest.mark.parametrize("text", [answered_predictions(), FREE_FORM], ids=["template", "free-form"])
def test_predictions_answering_all_six_pass_item_1(run_copy, text):
    give_predictions(run_copy, text)
    grade = grade_of(run_copy)
    answered = check(grade, 1, "predictions_answered")
    assert answered.status == "pass" and "6 of 6 questions answered" in answered.detail, answered.detail
    assert grade.integrity_problems == []


def test_the_question_copied_without_an_answer_does_not_count():
    found = predictions.question_answers("1. Will repeated greedy runs return identical token IDs in the same "
                                         "environment?\n2. yes\n", PREDICTIONS_TEMPLATE)
    assert found.answered == [] and found.missing[1] == "no answer" and "1 word(s)" in found.missing[2]


def test_a_rubric_can_ask_for_fewer_answered_questions(run_copy, tmp_path):
    four = template_with({n: "an answer in my own words" for n in (1, 2, 3, 4)})
    give_predictions(run_copy, four)
    assert check(grade_of(run_copy), 1, "predictions_answered").status == "fail"
    lenient = grade_of(run_copy, rubric_with(tmp_path, require_answered_predictions=4))
    assert check(lenient, 1, "predictions_answered").status == "pass"


# --- summary flags edited alone, re-hashed: integrity ------------------------------------------------------


def test_the_predictions_verdict_edited_alone_is_an_integrity_problem(run_copy, capsys):
    give_predictions(run_copy, PREDICTIONS_TEMPLATE)
    edit_json(run_copy / MANIFEST_FILE, lambda m: m["predictions"].update(
        template_unanswered=False, template_check="6 of 6 questions answered (template)"))
    rehash(run_copy)
    grade = grade_of(run_copy)
    assert grade.exit_status == 3
    line = next(p for p in grade.integrity_problems if "predictions.template_unanswered" in p)
    assert "the manifest says false, predictions.md says true" in line
    assert check(grade, 1, "predictions_answered").status == "fail"  # decided from the file, not the flag
    assert main(["grade", str(run_copy)]) == 3
    assert "predictions.template_unanswered" in capsys.readouterr().out


def test_the_explanation_structure_edited_alone_is_an_integrity_problem(run_copy):
    give_predictions(run_copy, answered_predictions())
    attach_file(run_copy, TEMPLATE)  # the blank explanation template
    ledger = run_copy / "addenda.jsonl"
    entry = json.loads(ledger.read_text())
    entry["structure"].update(ok=True, headings_missing=[], empty_sections=[])
    ledger.write_text(json.dumps(entry) + "\n")
    grade = grade_of(run_copy)
    assert grade.exit_status == 3
    line = next(p for p in grade.integrity_problems if "structure.ok" in p)
    assert line.startswith("addenda.jsonl seq 0 structure.ok: the ledger says True")
    assert "addenda/my_explanation.md says False" in line
    assert any("structure.empty_sections" in p for p in grade.integrity_problems)
    # items 1 and 7 are judged from the file: the template's text alone is no written work
    assert check(grade, 7, "conclusions_and_limitations").status == "fail"


def test_outcome_counts_edited_alone_are_an_integrity_problem(run_copy):
    edit_json(run_copy / MANIFEST_FILE, lambda m: m["outcome_counts"].update(
        passed=m["outcome_counts"]["passed"] + m["outcome_counts"].pop("failed", 0) + 1))
    rehash(run_copy)
    grade = grade_of(run_copy)
    assert grade.exit_status == 3
    line = next(p for p in grade.integrity_problems if "outcome_counts" in p)
    assert line.startswith("manifest.json: outcome_counts ") and "records.jsonl holds" in line


def test_the_session_ending_edited_in_the_manifest_alone_is_an_integrity_problem(run_copy):
    def change(manifest):
        manifest["session_end"]["status"] = manifest["status"] = "all planned tests passed"

    edit_json(run_copy / MANIFEST_FILE, change)
    rehash(run_copy)
    lines = grade_of(run_copy).integrity_problems
    assert any(line.startswith("manifest.json session_end.status: the manifest says 'all planned tests passed', "
                               "the session_end record (seq ") for line in lines), lines
    assert any(line.startswith("manifest.json status: the manifest says 'all planned tests passed'") for line in lines)


@pytest.mark.slow
def test_a_prerequisite_status_edited_alone_is_an_integrity_problem(runs, tmp_path):
    run = runs.copy("failed_ended", tmp_path / "failed")
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    name = next(n for n, c in manifest["checks"].items() if c.get("status") == "failed")
    edit_json(run / MANIFEST_FILE, lambda m: m["checks"][name].update(status="passed", reason=None, root_cause=None))
    rehash(run)
    line = next(p for p in grade_of(run).integrity_problems if p.startswith(f"manifest.json checks.{name}.status"))
    assert "the manifest says 'passed'" in line and "is 'failed'" in line


def forged_real(standin_run: Path, target: Path, change) -> Path:
    """A copy of the real stand-in run (made under this checkout's lock) whose manifest `change` edited, re-hashed."""
    from inferlab import report

    run = copy_run(standin_run, target)
    edit_json(run / MANIFEST_FILE, change)
    for name, text in report.render_pages(run).items():  # a thorough forger renders the pages again (grade checks)
        (run / name).write_text(text, encoding="utf-8")
    rehash(run)
    return run


def as_made_on_the_lock(manifest: dict) -> None:
    """The manifest's environment replaced by fixed data, as a run made in an environment that holds exactly
    requirements.lock would record it: its pins (torch as the CPU build), the lock's Python, and the lock_check
    inferlab.host.environment computes for them. The machine's own packages (a CUDA torch's extra ones, say) and
    Python never enter a scenario."""
    from inferlab.host import environment, installation

    lock = REPO_ROOT / "requirements.lock"
    locked = installation.read_lock(lock.read_text(encoding="utf-8"))
    distributions = {name: version for name, version in locked["pins"].values()}
    distributions["torch"] += "+cpu"
    distributions[installation.PROJECT_DISTRIBUTION] = manifest["distributions"][installation.PROJECT_DISTRIBUTION]
    manifest["distributions"] = distributions
    manifest["platform"]["python_version"] = locked["python"]
    manifest["torch_build"]["version"] = distributions["torch"]
    manifest["lock_check"] = environment.lock_check(lock, distributions, locked["python"])
    assert manifest["lock_check"]["differences"] == []


@pytest.mark.slow
def test_a_run_made_on_the_lock_has_nothing_to_say_about_it(standin_run, tmp_path):
    grade = grade_of(forged_real(standin_run, tmp_path / "locked", as_made_on_the_lock))
    assert not any("lock_check" in p or "distributions" in p for p in grade.integrity_problems), \
        grade.integrity_problems


@pytest.mark.slow
def test_an_honest_real_run_has_its_lock_check_recomputed_and_agrees(standin_run):
    grade = grade_of(standin_run)
    assert grade.integrity_problems == [], grade.integrity_problems
    assert not any("lock_check" in line for line in grade.not_checked), grade.not_checked


@pytest.mark.slow
def test_a_torch_version_edited_in_distributions_is_an_integrity_problem(standin_run, tmp_path, capsys):
    def change(manifest):
        as_made_on_the_lock(manifest)
        manifest["distributions"]["torch"] = "2.14.0"

    run = forged_real(standin_run, tmp_path / "torch", change)
    grade = grade_of(run)
    assert grade.exit_status == 3
    line = next(p for p in grade.integrity_problems if p.startswith("manifest.json lock_check.differences"))
    assert "the manifest says none" in line and "torch locked 2.13.0, installed 2.14.0" in line
    assert any(p.startswith("manifest.json distributions.torch: the manifest says 2.14.0") for p in
               grade.integrity_problems)
    assert main(["grade", str(run)]) == 3
    assert "lock_check.differences" in capsys.readouterr().out


@pytest.mark.slow
def test_a_torch_version_edited_with_its_build_record_is_still_caught_by_the_lock(standin_run, tmp_path):
    def change(manifest):
        as_made_on_the_lock(manifest)
        manifest["distributions"]["torch"] = "2.14.0"
        manifest["torch_build"]["version"] = "2.14.0+cpu"

    grade = grade_of(forged_real(standin_run, tmp_path / "torch", change))
    assert [p for p in grade.integrity_problems if not p.startswith("manifest.json lock_check.")] == []
    assert any("torch locked 2.13.0, installed 2.14.0" in p for p in grade.integrity_problems)


@pytest.mark.slow
def test_lock_check_edited_alone_is_an_integrity_problem(standin_run, tmp_path):
    def change(manifest):
        as_made_on_the_lock(manifest)
        manifest["lock_check"]["differences"] = [{"name": "torch", "locked": "2.13.0", "installed": "2.14.0"}]

    grade = grade_of(forged_real(standin_run, tmp_path / "lock", change))
    assert grade.exit_status == 3
    line = next(p for p in grade.integrity_problems if "lock_check.differences" in p)
    assert "the manifest says [('torch', '2.13.0', '2.14.0')]" in line and "none" in line


# --- the grader's harness --------------------------------------------------------------------------------


def test_a_run_whose_manifest_hashes_a_changed_decode_loop_is_an_integrity_problem(run_copy, capsys):
    """As a forger would leave it: the run's source hash of inferlab/measure/decode_loop.py is that of the file with one
    line added, everything re-hashed."""
    changed = (REPO_ROOT / "inferlab" / "measure" / "decode_loop.py").read_bytes() + b"SPEEDUP = 2.0\n"
    edit_json(run_copy / MANIFEST_FILE, lambda m: m["source_sha256"].update(
        {"inferlab/measure/decode_loop.py": hashlib.sha256(changed).hexdigest()}))
    rehash(run_copy)
    grade = grade_of(run_copy)
    assert grade.exit_status == 3
    source = [p for p in grade.integrity_problems if p.startswith("source: ")]
    assert len(source) == 1 and source[0].startswith("source: inferlab/measure/decode_loop.py: sha256 "), source
    assert check(grade, 2, "grader_source").status == "fail"
    assert main(["grade", str(run_copy)]) == 3
    assert "inferlab/measure/decode_loop.py" in capsys.readouterr().out


def test_files_on_one_side_only_and_another_version_are_named(run_copy):
    def change(manifest):
        hashes = manifest["source_sha256"]
        del hashes["pytest.ini"]
        hashes["experiments/test_99_mine.py"] = "1" * 64
        manifest["distributions"] = {**manifest["distributions"], "inferlab": "0.0.9"}

    edit_json(run_copy / MANIFEST_FILE, change)
    rehash(run_copy)
    lines = grade_of(run_copy).integrity_problems
    assert "source: pytest.ini: in the grader's copy, not in the run's source hashes" in lines
    assert "source: experiments/test_99_mine.py: in the run's source hashes, not in the grader's copy" in lines
    assert any(line.startswith("source: the run was made with inferlab 0.0.9; the grader's copy is inferlab ")
               for line in lines)


def test_a_rubric_can_make_a_harness_difference_a_finding_or_an_item_failure(run_copy, tmp_path):
    edit_json(run_copy / MANIFEST_FILE, lambda m: m["source_sha256"].update({"inferlab/measure/decode_loop.py": "0" * 64}))
    rehash(run_copy)
    finding = grade_of(run_copy, rubric_with(tmp_path, grader_source='"finding"'))
    assert not any(p.startswith("source: ") for p in finding.integrity_problems)
    assert any(f["kind"] == "source_differs" and "inferlab/measure/decode_loop.py" in f["what"] for f in finding.findings)
    item = grade_of(run_copy, rubric_with(tmp_path, grader_source='"item"'))
    assert not item.integrity_problems and item.item(2).status == "fail" and item.exit_status == 1
    assert "inferlab/measure/decode_loop.py" in check(item, 2, "grader_source").detail


def test_the_grader_hashes_the_package_it_imported():
    import inferlab

    ours = grader_hashes()
    assert "inferlab/measure/decode_loop.py" in ours and "experiments/test_30_sampling.py" in ours
    assert ours["inferlab/measure/decode_loop.py"] == hashlib.sha256(
        (Path(inferlab.__file__).parent / "measure" / "decode_loop.py").read_bytes()).hexdigest()
    assert not any(path.startswith(("tests/", "benchmarks/")) for path in ours)  # no part of a run's records


CLONE_SELECTION = "test_10_specimen or test_20_inputs or P1-cache_on-warmup"


@pytest.mark.slow
@pytest.mark.process
def test_a_real_run_from_a_clone_with_one_line_added_to_decode_loop_is_named(tmp_path):
    """The real thing: a scratch clone whose inferlab/ is a copy with one line added to decode_loop.py makes an
    honest run (its own code hashes itself); the unchanged checkout grades it. The run is a selection that loads
    the model and runs one timing trial through the changed decode loop: what is read here is the manifest the
    clone's own code wrote, and a complete run of that code is standin_run's (tests/conftest.py)."""
    from shared_runs import experiment

    def clone_with_one_line(project: Path) -> None:
        (project / "inferlab").unlink()
        shutil.copytree(REPO_ROOT / "inferlab", project / "inferlab", ignore=shutil.ignore_patterns("__pycache__"))
        with open(project / "inferlab" / "measure" / "decode_loop.py", "a", encoding="utf-8") as handle:
            handle.write("LEARNER_NOTE = 'one line added'\n")

    made = experiment(tmp_path, "--specimen", "standin", "-k", CLONE_SELECTION, prepare=clone_with_one_line)
    assert made.returncode == 0, made.tail()
    comparison = compare_harness(RunView.read(made.run))
    assert [line for line in comparison.differs] == [
        line for line in comparison.differs if line.startswith("inferlab/measure/decode_loop.py: sha256 ")] and \
        len(comparison.differs) == 1, comparison.differs
    grade = grade_of(made.run)
    assert grade.exit_status == 3
    assert [p for p in grade.integrity_problems if p.startswith("source: ")] == [
        f"source: {comparison.differs[0]}"]


# --- the rubric's requirements ---------------------------------------------------------------------------


def test_a_rubric_requiring_pythia_fails_a_stand_in_runs_item_3(run_copy, tmp_path, capsys):
    rubric = rubric_with(tmp_path, require_specimen='["pythia-14m"]')
    grade = grade_of(run_copy, rubric)
    required = check(grade, 3, "required_specimen")
    assert grade.item(3).status == "fail"
    assert required.detail == "the run's specimen is standin (synthetic); this rubric requires pythia-14m"
    assert "--specimen pythia-14m" in required.fix
    assert main(["grade", str(run_copy), "--rubric", str(rubric)]) == 1
    assert "this rubric requires pythia-14m" in capsys.readouterr().out


def test_a_stand_in_relabelled_as_pythia_fails_the_required_specimen_by_its_hashes(run_copy, tmp_path):
    edit_json(run_copy / MANIFEST_FILE, lambda m: m.update(specimen={**m["specimen"], "name": "pythia-14m"}))
    rehash(run_copy)
    required = check(grade_of(run_copy, rubric_with(tmp_path, require_specimen='["pythia-14m"]')), 3,
                     "required_specimen")
    assert required.status == "fail" and required.detail.startswith("the run is labelled pythia-14m, but its ")


def test_a_rubric_without_synthetic_specimens_fails_the_stand_in(run_copy, tmp_path):
    grade = grade_of(run_copy, rubric_with(tmp_path, allow_synthetic_specimen="false"))
    assert "synthetic" in check(grade, 3, "required_specimen").detail and grade.item(3).status == "fail"
    assert grade_of(run_copy).item(3).status == "pass"  # the default rubric accepts it


def test_a_rubric_requiring_lock_conformance_fails_item_2_with_the_differences(run_copy, tmp_path):
    grade = grade_of(run_copy, rubric_with(tmp_path, require_lock_conformance="true"))
    conformance = check(grade, 2, "lock_conformance")
    assert conformance.status == "fail"
    assert "numpy locked" in conformance.detail and "installed 2.0.0" in conformance.detail
    assert "another requirements.lock" in conformance.detail and "make" in conformance.fix
    assert any(f["kind"] == "lock_differs" for f in grade_of(run_copy).findings)  # shown, not held, by default


def test_a_rubric_requiring_replay_fails_item_4_until_a_replay_is_given(run_copy, tmp_path):
    rubric = rubric_with(tmp_path, require_replay="true")
    replay = check(grade_of(run_copy, rubric), 4, "replay")
    assert replay.status == "fail" and "grade RUN --replay" in replay.fix
    assert load_rubric(rubric).require_replay is True and load_rubric().require_replay is False
    assert check(grade_of(run_copy, rubric, replay={"ok": True}), 4, "replay").status == "pass"


def test_the_course_own_run_meets_a_replay_requirement_saying_so_and_against_is_not_refused(run_copy, tmp_path,
                                                                                            capsys):
    """The bundle grades the course's own run with this rubric: nothing of it is replayed, and item 4 says why it
    passes instead of claiming a replay; `grade --against` meets the requirement by the comparison, not a refusal."""
    from inferlab.grading.replayed import MadeHere

    rubric = rubric_with(tmp_path, require_replay="true")
    replay = check(grade_of(run_copy, rubric, replay=MadeHere()), 4, "replay")
    assert replay.status == "pass" and "course's own run, made here" in replay.detail
    assert "replayed on the grader's copy" not in replay.detail
    status, _ = inferlab_command("grade", run_copy, "--against", run_copy, "--rubric", rubric)
    assert status != 2 and "give one" not in capsys.readouterr().err
    assert inferlab_command("grade", run_copy, "--against", run_copy, "--replay")[0] == 2


@pytest.mark.parametrize("setting, message", [
    ("grader_source = \"maybe\"", "grader_source must be one of integrity, item, finding"),
    ("require_answered_predictions = 7", "require_answered_predictions must be a whole number from 0 to 6"),
    ("require_specimen = \"pythia-14m\"", "require_specimen must be a list of specimen names"),
    ("require_replay = 1", "require_replay must be true or false"),
])
def test_a_rubric_with_a_bad_requirement_is_refused(tmp_path, setting, message):
    key = setting.split(" = ")[0]
    rubric = tmp_path / "bad.toml"
    rubric.write_text("\n".join(setting if line.startswith(f"{key} = ") else line
                                for line in DEFAULT_RUBRIC.read_text().splitlines()))
    with pytest.raises(RubricError, match="bad.toml: ") as caught:
        load_rubric(rubric)
    assert message in str(caught.value)


# --- what was not established ---------------------------------------------------------------------------


def test_a_grade_says_what_it_did_not_establish(run_copy, capsys):
    give_predictions(run_copy, answered_predictions())
    attach_file(run_copy, answered_explanation())
    grade = grade_of(run_copy)
    assert any(line.startswith("verify: decoded texts") and "tokenizer files not at hand" in line
               for line in grade.not_checked), grade.not_checked
    assert any(line.startswith("reference: none given") for line in grade.not_checked)
    assert any(line.startswith("replay: ") and "grade RUN --replay" in line for line in grade.not_checked)
    assert any("another requirements.lock" in line for line in grade.not_checked)  # the fixture's made-up lock
    page = formats.text([grade])
    assert "Not checked (what this grade does not establish):" in page
    assert all(f"  - {line}" in page for line in grade.not_checked)


def test_the_schema_1_runs_missing_stamps_are_said(tmp_path):
    schema1 = Path(__file__).resolve().parent / "fixtures" / "schema1-run"
    lines = grade_of(schema1).not_checked
    assert any("carry no perf_counter_ns" in line for line in lines)
    assert any(line.startswith("the inferlab version that made the run") for line in lines)


@pytest.mark.slow
def test_sampled_ids_not_compared_across_torch_versions_are_said(runs, tmp_path):
    from inferlab.grading.reference import load_reference

    reference = tmp_path / "REF.json"
    assert main(["reference", str(runs.get("honest")), "-o", str(reference)]) == 0
    learner = runs.copy("honest_elsewhere", tmp_path / "learner")
    edit_json(learner / MANIFEST_FILE, lambda m: m["distributions"].update(torch="2.14.0"))
    rehash(learner)
    grade = grade_of(learner, reference=load_reference(reference), reference_file=str(reference))
    line = next(line for line in grade.not_checked if "seeded sampling trials not compared" in line)
    assert line.startswith("reference: ") and "torch 2.14.0" in line
    assert not any(line.startswith("reference: none given") for line in grade.not_checked)


@pytest.mark.slow
def test_the_versions_that_decide_sampled_comparability_come_from_the_lock_check(standin_run, tmp_path):
    from inferlab.grading.recompute import established_versions

    honest_versions = established_versions(RunView.read(standin_run))
    assert honest_versions["established"] is True and honest_versions["torch"].startswith("2.13.0")

    def change(manifest):
        manifest["distributions"]["torch"] = "2.14.0"

    forged = established_versions(RunView.read(forged_real(standin_run, tmp_path / "torch", change)))
    assert forged["established"] is False and "lock_check does not agree" in forged["how"]


def test_every_moved_file_is_at_its_present_path_and_gone_from_its_former_one():
    from inferlab.grading.harness import MOVED_FROM

    ours = grader_hashes()
    assert len(MOVED_FROM) == 46  # 42 on 2026-12-02, four out of grading/ on 2026-12-04
    assert all(path in ours for path in MOVED_FROM)
    left = sorted(former for former in MOVED_FROM.values() if former in ours)
    assert left == ["inferlab/replica.py", "inferlab/standin.py"]  # the `python -m` shims, nothing else


def test_a_file_that_moved_unchanged_is_the_same_file_and_one_that_changed_is_named_on_both_sides(run_copy):
    """A run made before the layout by stage hashes inferlab/run/predictions.py as inferlab/predictions.py: the same
    bytes are the same file (and the predictions check runs), other bytes a difference at both paths."""
    new, former = "inferlab/run/predictions.py", "inferlab/predictions.py"

    def moved(digest):
        def change(manifest):
            hashes = manifest["source_sha256"]
            hashes[former] = digest if digest is not None else hashes[new]
            del hashes[new]
        return change

    edit_json(run_copy / MANIFEST_FILE, moved(None))
    same = compare_harness(RunView.read(run_copy))
    assert same.same and same.same_files(new), same.differs
    edit_json(run_copy / MANIFEST_FILE, lambda m: m["source_sha256"].update({new: m["source_sha256"].pop(former)}))
    edit_json(run_copy / MANIFEST_FILE, moved("0" * 64))
    changed = compare_harness(RunView.read(run_copy))
    assert sorted(changed.differs) == [f"{former}: in the run's source hashes, not in the grader's copy",
                                       f"{new}: in the grader's copy, not in the run's source hashes"]
    assert not changed.same_files(new)
