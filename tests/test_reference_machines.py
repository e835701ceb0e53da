"""A reference across machines, with real stand-in runs: a run computed with another CPU kernel set (as on
another CPU) agrees with a reference made under this machine's default one, and a reference of another specimen
is a usage error. The runs are real experiment runs made once per session (tests/shared_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.grading.grade import grade_source
from inferlab.grading.reference import load_reference
from inferlab.grading.rubric import load_rubric

from fixtures_records import copy_run
from forging import nudge_first_step_logits
from grading_helpers import submit_ready, verify_reads_addenda
from shared_runs import OTHER_KERNELS, other_kernels_once

pytestmark = [pytest.mark.process, pytest.mark.slow]


@pytest.fixture(scope="module")
def other_kernels_run(tmp_path_factory) -> Path:
    made = other_kernels_once(tmp_path_factory)
    assert made.returncode == 0, made.tail()
    return made.run


def reference_of(run: Path, target: Path) -> Path:
    assert main(["reference", str(run), "-o", str(target)]) == 0
    return target


def kernels(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())["torch_build"]["cpu_kernels"]


def test_a_run_under_another_kernel_set_passes_a_reference_made_under_the_default_one(
        standin_run, other_kernels_run, tmp_path, capsys):
    assert kernels(other_kernels_run)["env_ATEN_CPU_CAPABILITY"] == OTHER_KERNELS
    assert kernels(other_kernels_run)["capability"] != kernels(standin_run)["capability"], \
        "the two runs used the same kernel set: the test compares nothing across kernels"
    reference = reference_of(standin_run, tmp_path / "REF.json")
    grade = grade_source(other_kernels_run, load_rubric(), load_reference(reference), reference_file=str(reference))
    assert grade.reference["contradictions"] == [], grade.reference["contradictions"]
    compared = grade.reference["compared"]
    assert compared["generation"] == 26 and compared["timing"] == 24 and compared["first_step"] == 8
    assert any(note.startswith("CPU kernels: the run DEFAULT") for note in grade.reference["notes"])
    learner = submit_ready(copy_run(other_kernels_run, tmp_path / "learner"))
    if not verify_reads_addenda(learner):
        pytest.skip("verify on this branch does not read the addenda layout yet (issue 23)")
    capsys.readouterr()
    assert main(["grade", str(learner), "--reference", str(reference)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "and the run agrees with the reference" in out and "CPU kernels: DEFAULT kernels" in out


def test_a_stand_in_run_against_a_replica_reference_is_a_usage_error(standin_run, replica_run, tmp_path, capsys):
    reference = reference_of(replica_run, tmp_path / "REF-replica.json")
    capsys.readouterr()
    assert main(["grade", str(standin_run), "--reference", str(reference)]) == 2
    out = capsys.readouterr().out
    assert "is of specimen 'replica', the run of specimen 'standin'" in out, out
    assert "contradict" not in out


def test_compare_shows_both_kernel_sets(standin_run, other_kernels_run, capsys):
    assert main(["compare", str(standin_run), str(other_kernels_run)]) == 0
    out = capsys.readouterr().out
    assert "CPU kernels" in out and ": DIFFER" in out and "dir2: DEFAULT kernels (ATEN_CPU_CAPABILITY=default)" in out


def test_an_honest_run_under_other_kernels_against_the_machines_own_is_no_integrity_problem_and_says_why_not_exact(
        standin_run, other_kernels_run):
    from inferlab.grading.replayed import CourseRun

    grade = grade_source(other_kernels_run, load_rubric(), replay=CourseRun(standin_run))
    assert not [p for p in grade.integrity_problems if "course's run" in p], grade.integrity_problems
    assert grade.facts["against"]["compared"] and grade.facts["against"]["exact"] is False
    assert grade.facts["against"]["counts"]["tensors"] == 36  # every saved tensor, element by element
    line = next(line for line in grade.not_checked if line.startswith("against the course's run: bit-for-bit"))
    assert "kernel set: 'DEFAULT' in the run" in line and f"ATEN_CPU_CAPABILITY: '{OTHER_KERNELS}' in the run" in line


def test_a_tensor_edited_beyond_the_tolerance_under_other_kernels_is_named_against_the_course_run(
        standin_run, other_kernels_run, tmp_path):
    """Across kernel sets the comparison cannot be exact, but the course run's files are at hand: every saved tensor
    is compared element by element within the tolerance. One element moved far (never a top id, so the top values
    agree) with every hash and figure redone is named, with its place."""
    from inferlab.grading.replayed import CourseRun

    forged = nudge_first_step_logits(other_kernels_run, tmp_path / "forged", "P1-G-rep1", by=1.0)
    grade = grade_source(forged["run"], load_rubric(), replay=CourseRun(standin_run))
    assert grade.facts["against"]["exact"] is False
    named = [line for line in grade.integrity_problems if line.startswith(
        "contradicts the course's run: saved tensor generation P1-G-rep1 first_step_logits")]
    assert named and f"element [{forged['element']}]" in named[0] and "beyond the tolerance" in named[0], \
        grade.integrity_problems


def test_the_same_run_replayed_under_its_own_recorded_kernel_setting_agrees_bit_for_bit(
        other_kernels_run, standin_dir):
    from inferlab.grading.replayed import GraderCopy

    grade = grade_source(other_kernels_run, load_rubric(), replay=GraderCopy("standin", standin_dir))
    replay = grade.facts["replay"]
    assert replay["made"] and replay["agree"], grade.integrity_problems
    assert replay["exact"] is True and replay["kernel_settings"]["ATEN_CPU_CAPABILITY"] == OTHER_KERNELS
    assert any(f"under the run's kernel settings (ATEN_CPU_CAPABILITY={OTHER_KERNELS}" in n for n in grade.notes)
    assert not [line for line in grade.not_checked if "bit-for-bit" in line], grade.not_checked


def test_the_replay_command_makes_that_replay_where_grade_does(other_kernels_run, standin_dir, monkeypatch, capsys):
    """`inferlab replay` takes the same path as grade --replay above: a child under the run's recorded settings
    (the child itself is what that test checks; here it is stood in for, to see what the command hands it and
    what it says when the child cannot replay)."""
    from inferlab.recheck import elsewhere

    asked = []

    def child(run_dir, specimen, artifacts, settings):
        asked.append((Path(run_dir), specimen, Path(artifacts), settings))
        return {"made": False, "reason": "the stand-in for the child refuses"}

    monkeypatch.setattr(elsewhere, "replay_in_child", child)
    assert main(["replay", str(other_kernels_run), "--artifacts", str(standin_dir)]) == 2
    [(run_dir, specimen, artifacts, settings)] = asked
    assert (run_dir, specimen, artifacts) == (other_kernels_run, "standin", standin_dir)
    assert settings["ATEN_CPU_CAPABILITY"] == OTHER_KERNELS
    assert "replay: the stand-in for the child refuses" in capsys.readouterr().err
