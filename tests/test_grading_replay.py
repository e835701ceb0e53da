"""`grade --replay`: a run's deterministic parts re-executed on the grader's own copy of the specimen and folded
into the grade (issue 31 item 3). A forgery that every file check accepts (greedy ids edited with every field
derived from them redone) is an integrity problem only the replay finds.

The course CI script's run (tests/shared_runs.course_ci_once: the session's complete stand-in run with answered
predictions and explanation, which grades exit 0) is the honest run; the grader's copy is the session's built
stand-in (standin_dir), loaded once per module."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from inferlab import protocol, report
from inferlab.grading import timing_sides
from inferlab.grading.grade import EXIT_INTEGRITY, EXIT_PASSED, grade_source
from inferlab.grading.replayed import CourseRun, GraderCopy
from inferlab.grading.rubric import load_rubric
from inferlab.measure import summaries
from inferlab.verify import verify_run

import shared_runs
from fixture_runs import runs  # noqa: F401 (a fixture)
from forging import nudge_first_step_logits, rebind, rehash
from shared_runs import inferlab_command

NOT_REPLAYED = "replay: none made, so the run's deterministic outputs were not re-executed"
FORGED_STEP = 5  # a later step than the first: the saved first-step logits cannot contradict it


@pytest.fixture(scope="module")
def grader_copy(standin_dir):
    """The grader's copy of the stand-in, loaded at its first replay and kept for the process (shared_runs.grader_copy:
    the one `grade --replay` in this process also uses where a test shares it)."""
    return shared_runs.grader_copy("standin", standin_dir)


def forge_greedy(run, target, standin_dir):
    """P2's three greedy trials given another id at FORGED_STEP, with everything derived from the ids redone as a
    careful forger would (sequence, decoded texts and pieces, P2's sampling summary, the report's pages), the
    inventory re-hashed and the attached explanation bound to the new manifest."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(standin_dir / "tokenizer.json"))

    def edit(records):
        for record in records:
            if record["kind"] == "generation" and record.get("prompt_id") == "P2" and record.get("condition") == "G":
                ids = record["generated_ids"]
                ids[FORGED_STEP] = (ids[FORGED_STEP] + 7) % 1000 + 1000  # an ordinary token, not the EOS
                record["sequence_ids"] = record["prompt_ids"] + ids
                if isinstance(record.get("step_top2_ids"), list):  # each step's selected id is a derived field too
                    record["step_top2_ids"][FORGED_STEP][0] = ids[FORGED_STEP]
                record["text"] = tokenizer.decode(ids, skip_special_tokens=True)
                record["text_with_special"] = tokenizer.decode(ids, skip_special_tokens=False)
                if isinstance(record.get("generated_pieces"), dict):
                    found = [tokenizer.id_to_token(i) for i in ids]
                    record["generated_pieces"] = {
                        "pieces": found, "decoded": [tokenizer.decode([i], skip_special_tokens=False) for i in ids],
                        "ids_without_token": [i for i, piece in zip(ids, found) if piece is None]}
        generations = [r for r in records if r["kind"] == "generation"]
        for record in records:
            if record["kind"] == "sampling_summary" and record.get("prompt_id") == "P2":
                record.update(summaries.sampling_summary(generations, "P2"))

    shutil.copytree(run, target)
    records = [json.loads(line) for line in (target / "records.jsonl").read_text().splitlines()]
    edit(records)
    (target / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for name, text in report.render_pages(target).items():  # the report rendered again, as grade compares it
        (target / name).write_text(text, encoding="utf-8")
    rebind(target)
    return target


@pytest.fixture(scope="module")
def forged(course_ci, standin_dir, tmp_path_factory):
    return forge_greedy(course_ci["run"], tmp_path_factory.mktemp("replay-forgery") / "forged", standin_dir)


@pytest.fixture(scope="module")
def nudged(course_ci, tmp_path_factory):
    """The honest run with P1's saved first-step logits moved by one unit in the last place at one element, every
    hash and figure redone (tests/forging.py)."""
    return nudge_first_step_logits(course_ci["run"], tmp_path_factory.mktemp("nudged") / "run", "P1-G-rep1")


@pytest.mark.slow
def test_a_tensor_moved_in_its_last_bits_passes_every_file_check_and_grade_replay_exits_3_naming_it(
        nudged, standin_dir, monkeypatch):
    """Far inside the protocol's tolerance: only a replay bit for bit (same machine, same kernels) sees it."""
    shared_runs.share_grader_copies(monkeypatch)  # the command replays on the process's one loaded model
    assert verify_run(nudged["run"])["problems"] == []
    status, printed = inferlab_command("grade", nudged["run"], "--replay", "--specimen", "standin", "--artifacts",
                                       standin_dir)
    assert status == EXIT_INTEGRITY, printed
    line = next(line for line in printed.splitlines()
                if "replay: saved tensor generation P1-G-rep1 first_step_logits" in line)
    assert f"{nudged['file']}[{nudged['key']}]" in line and f"element [{nudged['element']}]" in line, line
    assert "allowed: bit for bit" in line, line


@pytest.mark.slow
def test_greedy_ids_forged_with_every_derived_field_pass_every_file_check_and_grade_without_replay(forged):
    assert verify_run(forged)["problems"] == []
    grade = grade_source(forged, load_rubric())
    assert grade.exit_status == EXIT_PASSED, grade.integrity_problems
    assert any(line.startswith(NOT_REPLAYED) for line in grade.not_checked), grade.not_checked


@pytest.mark.slow
def test_grade_replay_finds_the_forged_greedy_ids_and_exits_3_naming_the_part_and_first_difference(
        forged, standin_dir, monkeypatch):
    shared_runs.share_grader_copies(monkeypatch)  # the command replays on the process's one loaded model
    status, printed = inferlab_command("grade", forged, "--replay", "--specimen", "standin", "--artifacts",
                                       standin_dir)
    assert status == EXIT_INTEGRITY, printed
    lines = [line for line in printed.splitlines() if "replay: generation P2-G-rep" in line]
    assert len(lines) == 3 and f"replay: generation P2-G-rep1: ids first differ at step {FORGED_STEP}: " in lines[0]
    assert " in the run, " in lines[0] and " in the replay (top-two margin " in lines[0], lines
    assert NOT_REPLAYED not in printed


@pytest.mark.slow
def test_an_honest_run_graded_with_replay_exits_0_with_every_part_agreeing(course_ci, grader_copy):
    grade = grade_source(course_ci["run"], load_rubric(), replay=grader_copy)
    assert grade.exit_status == EXIT_PASSED, grade.integrity_problems
    replay = grade.facts["replay"]
    assert replay["made"] and replay["agree"] and replay["specimen"] == "standin"
    assert replay["exact"] is True and replay["kernel_settings"] is None  # same machine, same kernels: bit for bit
    assert replay["contradictions"] == 0 and replay["compared"]["generation"] == len(protocol.generation_trials())
    assert replay["compared"]["timing"] == len(protocol.timing_schedule())
    assert any(note.startswith("replay: the run agrees with the replay, bit for bit") for note in grade.notes), \
        grade.notes
    assert any("the grader's copy verified against this checkout's artifacts/standin.json" in note
               for note in grade.notes), grade.notes
    assert not any(line.startswith(NOT_REPLAYED) for line in grade.not_checked), grade.not_checked


@pytest.mark.slow
def test_a_class_replays_on_one_model_per_process_and_each_run_gets_its_own_verdict(
        course_ci, forged, grader_copy, tmp_path):
    loads = grader_copy.loads
    grades = [grade_source(run, load_rubric(), replay=grader_copy)
              for run in (course_ci["run"], forged, course_ci["out"] / "submission.tar.gz")]
    assert [g.exit_status for g in grades] == [EXIT_PASSED, EXIT_INTEGRITY, EXIT_PASSED]
    assert grader_copy.loads == max(loads, 1)  # the model was loaded once, at most, for the three
    model = grader_copy._loaded["standin"][3]
    # the later runs were compared with what an earlier one computed: at least every generate call of two runs
    assert model.reused >= 2 * len(protocol.generation_trials()), (model.reused, model.computed)


@pytest.mark.slow
@pytest.mark.process
def test_grade_replay_with_jobs_grades_a_class_in_two_processes_with_the_same_verdicts(
        course_ci, forged, standin_dir, tmp_path):
    submissions = tmp_path / "class"
    submissions.mkdir()
    shutil.copy(course_ci["out"] / "submission.tar.gz", submissions / "a-honest.tar.gz")
    shutil.copytree(forged, submissions / "b-forged")
    shutil.copytree(course_ci["run"], submissions / "c-honest")
    status, printed = inferlab_command("grade", submissions, "--replay", "--specimen", "standin", "--artifacts",
                                       standin_dir, "--jobs", "2", "--out", tmp_path / "page", "--csv",
                                       tmp_path / "grades.csv")
    assert status == EXIT_INTEGRITY, printed
    rows = {row["source"].rsplit("/", 1)[-1]: row for row in csv.DictReader((tmp_path / "grades.csv").open())}
    assert {name: row["exit_status"] for name, row in rows.items()} == {
        "a-honest.tar.gz": "0", "b-forged": "3", "c-honest": "0"}


def test_a_run_whose_specimen_this_checkout_does_not_know_is_not_replayed_and_that_is_an_integrity_problem(
        runs, tmp_path):  # noqa: F811
    """The pins such a run records are the learner's: they are never used to fetch a copy."""
    run = runs.copy("complete", tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["specimen"]["name"] = "my-own-weights"
    (run / "manifest.json").write_text(json.dumps(manifest))
    rehash(run)
    copy = GraderCopy()
    grade = grade_source(run, load_rubric(), replay=copy)
    assert copy.loads == 0
    found = [p for p in grade.integrity_problems if p.startswith("replay: not made: ")]
    assert found and "the specimen 'my-own-weights' is not one of this checkout's specimens" in found[0], found
    assert grade.exit_status == EXIT_INTEGRITY and grade.facts["replay"]["made"] is False


def test_grading_without_replay_says_no_replay_was_made_in_text_json_and_gradescope(runs):  # noqa: F811
    status, printed = inferlab_command("grade", runs.get("complete"))
    assert f"  - {NOT_REPLAYED}" in printed.split("Not checked (what this grade does not establish):")[1]
    status, printed = inferlab_command("grade", runs.get("complete"), "--format", "json")
    assert any(line.startswith(NOT_REPLAYED) for line in json.loads(printed)["runs"][0]["not_checked"])
    status, printed = inferlab_command("grade", runs.get("complete"), "--format", "gradescope")
    assert f"not checked: {NOT_REPLAYED}" in printed


def test_the_copy_a_replay_runs_on_must_be_asked_for_and_usable(runs, tmp_path, capsys):  # noqa: F811
    assert inferlab_command("grade", runs.get("complete"), "--specimen", "standin")[0] == 2
    assert "give --replay too" in capsys.readouterr().err
    assert inferlab_command("grade", runs.get("complete"), "--replay", "--specimen", "no-such-specimen")[0] == 2
    assert "--replay: the specimen 'no-such-specimen' is not one of this checkout's" in capsys.readouterr().err
    assert inferlab_command("grade", runs.get("complete"), "--replay", "--specimen", "standin", "--artifacts",
                            tmp_path)[0] == 2
    assert "could not be acquired offline and verified" in capsys.readouterr().err


@pytest.mark.slow
def test_grade_against_a_course_run_checks_a_class_by_the_same_comparison(course_ci, nudged, tmp_path):
    """The instructor's own run as the course's: a class of a folder, an archive and the forgery of one tensor."""
    submissions = tmp_path / "class"
    submissions.mkdir()
    shutil.copy(course_ci["out"] / "submission.tar.gz", submissions / "a-honest.tar.gz")
    shutil.copytree(nudged["run"], submissions / "b-nudged")
    status, printed = inferlab_command("grade", submissions, "--against", course_ci["run"], "--out", tmp_path / "page",
                                       "--csv", tmp_path / "grades.csv", "--jobs", "2")
    assert status == EXIT_INTEGRITY, printed
    rows = {row["source"].rsplit("/", 1)[-1]: row for row in csv.DictReader((tmp_path / "grades.csv").open())}
    assert {name: row["exit_status"] for name, row in rows.items()} == {"a-honest.tar.gz": "0", "b-nudged": "3"}
    grade = grade_source(nudged["run"], load_rubric(), replay=CourseRun(course_ci["run"]))
    first = next(p for p in grade.integrity_problems if "generation P1-G-rep1 first_step_logits" in p)
    assert first.startswith("contradicts the course's run: saved tensor") and "under the same conditions" in first
    assert grade.facts["against"]["exact"] is True
    # its timings stand beside the course's as a finding (the forgery copied them: every ratio is 1, none contradicted)
    sides = [f for f in grade.findings if f["kind"] == timing_sides.TIMING_FINDING]
    assert len(sides) == 1 and not [f for f in grade.findings if f["kind"] == timing_sides.CONTRADICTED_FINDING]
    ratios = [m["ratio"] for m in sides[0]["sides"]["metrics"]]
    assert ratios and all(ratio == 1.0 for ratio in ratios), ratios
    assert inferlab_command("grade", nudged["run"], "--against", tmp_path)[0] == 2  # not a run: a usage error
