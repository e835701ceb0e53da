"""grade decodes every recorded id with the grader's own copy of the tokenizer (inferlab.grading.decoded): a text
relabelled after the run, with every hash redone, is an integrity problem even where the learner's tokenizer file
is not at hand (a handed-in run names a folder on the learner's machine). One real stand-in run of the session,
copied; the grader's copy is the session's built stand-in."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from inferlab.grading import decoded
from inferlab.grading.grade import grade_source
from inferlab.grading.rubric import load_rubric
from inferlab.verify import verify_run

from fixtures_records import copy_run, rerender, rewrite_records

ELSEWHERE = "/home/learner/lab12/artifacts/cache/standin/rev"  # the learner's folder, not on the grader's machine


def handed_in(records: list[dict]) -> list[dict]:
    """The records as a grader receives them: the specimen folder they name is on the learner's machine."""
    for record in records:
        if record.get("kind") in ("artifact_acquisition", "artifact_file", "model_load") and \
                isinstance(record.get("directory"), str):
            record["directory"] = ELSEWHERE
    return records


def relabel(records: list[dict]) -> list[dict]:
    """The first greedy generation's text (and its text with special tokens) written anew; its ids unchanged."""
    generation = next(r for r in records if r.get("kind") == "generation" and r.get("status") == "ok")
    generation["text"] = "The cache made every step exact, as predicted."
    generation["text_with_special"] = generation["text"]
    return handed_in(records)


@pytest.fixture
def graders_copy(standin_dir, monkeypatch) -> Path:
    """The grader's project cache holds the stand-in the session built (acquire's cache_dir points there)."""
    acquire = importlib.import_module("inferlab.specimen.acquire")  # the module (the package exports a function)

    monkeypatch.setattr(acquire, "cache_dir", lambda spec, cache_root=None: Path(standin_dir))
    return Path(standin_dir)


def run_like(standin_run: Path, target: Path, change) -> Path:
    run = copy_run(standin_run, target)
    rewrite_records(run, change)
    return rerender(run)  # the report re-rendered from the edited records, every hash redone


@pytest.mark.slow
def test_a_relabelled_text_is_an_integrity_problem_with_the_graders_tokenizer(standin_run, graders_copy, tmp_path):
    run = run_like(standin_run, tmp_path / "relabelled", relabel)
    assert not any("generation" in line and "text" in line for line in verify_run(run)["problems"])  # verify can't
    grade = grade_source(run, load_rubric())
    found = [line for line in grade.integrity_problems if line.startswith(decoded.PREFIX)]
    assert found and grade.exit_status == 3, grade.integrity_problems
    assert "generation seq" in found[0] and "text: recorded" in found[0] and "from generated_ids" in found[0]
    assert "The cache made every step exact" in found[0]


@pytest.mark.slow
def test_an_honest_handed_in_run_decodes_to_its_own_texts(standin_run, graders_copy, tmp_path):
    run = run_like(standin_run, tmp_path / "honest", handed_in)
    grade = grade_source(run, load_rubric())
    assert not any(line.startswith(decoded.PREFIX) for line in grade.integrity_problems)
    assert any("decoded with the grader's copy of the tokenizer" in note and str(graders_copy) in note
               for note in grade.notes)
    assert not any(line.startswith(decoded.PREFIX) for line in grade.not_checked)


@pytest.mark.slow
def test_without_a_graders_copy_the_texts_are_said_to_be_not_checked(standin_run, tmp_path, monkeypatch):
    acquire = importlib.import_module("inferlab.specimen.acquire")  # the module (the package exports a function)

    monkeypatch.setattr(acquire, "cache_dir", lambda spec, cache_root=None: tmp_path / "no-cache")
    run = run_like(standin_run, tmp_path / "relabelled", relabel)
    grade = grade_source(run, load_rubric())
    assert any(line.startswith(decoded.PREFIX) and "has no copy" in line for line in grade.not_checked)
    assert not any(line.startswith(decoded.PREFIX) for line in grade.integrity_problems)


def test_a_copy_that_is_not_the_pinned_file_is_never_used(tmp_path, monkeypatch):
    acquire = importlib.import_module("inferlab.specimen.acquire")  # the module (the package exports a function)

    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / decoded.TOKENIZER_FILE).write_text(json.dumps({"not": "the pinned tokenizer"}))
    monkeypatch.setattr(acquire, "cache_dir", lambda spec, cache_root=None: tmp_path / "copy")
    path, why = decoded.grader_tokenizer_path("standin")
    assert path is None and "is not the file this checkout's artifacts/standin.json pins" in why
    path, why = decoded.grader_tokenizer_path("no-such-specimen")
    assert path is None and "not one of this checkout's" in why
