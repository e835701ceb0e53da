"""Grading submissions: a run folder, a `pack` archive, or writing alone, each optionally against the course's run.

Exit status of one submission: 0 every required item passes (items a person grades, `manual`, do not block),
1 an item fails, 2 the source cannot be graded (not a run, a refused archive), 3 the run fails verify or
contradicts the course's run. Over several submissions, the worst. Grading reads files only: no model is loaded,
nothing is written into a run, and every path taken from a run's own files stays inside that run
(the explanation is addenda/<name>, the predictions the fixed predictions.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from inferlab import writing
from inferlab.grade import against, archive
from inferlab.grade import items as checklist
from inferlab.grade.rubric import Rubric

EXIT_OK, EXIT_ITEM, EXIT_NOT_GRADED, EXIT_INTEGRITY = 0, 1, 2, 3
NO_COURSE_RUN = ("not checked against the course's run (--against COURSE_RUN): nothing this run measured was "
                 "compared with evidence; items 2 to 6 say only that the run is complete and its files intact")


@dataclass
class Grade:
    """Everything grade says about one submission."""

    source: str
    rubric: Optional[Rubric]  # None: nothing could be graded (the bundle's refusal)
    learner: Optional[str] = None
    error: Optional[str] = None
    items: list = field(default_factory=list)
    integrity: list = field(default_factory=list)
    comparison: Optional[against.Comparison] = None
    findings: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    texts: checklist.Writing = field(default_factory=checklist.Writing)
    hashes: dict = field(default_factory=dict)  # what an exact copy shares: {what: sha256}

    @property
    def exit_status(self) -> int:
        if self.error is not None:
            return EXIT_NOT_GRADED
        if self.integrity:
            return EXIT_INTEGRITY
        if any(i.status == checklist.FAIL and i.item.required for i in self.items):
            return EXIT_ITEM
        return EXIT_OK

    @property
    def score(self) -> float:
        return sum(i.points for i in self.items)

    @property
    def max_score(self) -> float:
        return self.rubric.max_score

    def as_dict(self) -> dict:
        return {"source": self.source, "learner": self.learner, "error": self.error, "exit_status": self.exit_status,
                "score": self.score, "max_score": self.max_score, "rubric": self.rubric.describe(),
                "items": [i.as_dict() for i in self.items], "integrity": self.integrity, "findings": self.findings,
                "notes": self.notes, "against": self.comparison.as_dict() if self.comparison else None}


def run_writing(view) -> checklist.Writing:
    """The learner's texts inside a run: its predictions.md and the last explanation attached (addenda/<name>)."""
    from inferlab.read.addenda import EXPLANATION_KIND, stored_path_error

    texts = checklist.Writing()
    recorded = view.manifest.get("predictions") if isinstance(view.manifest.get("predictions"), dict) else {}
    path = view.directory / "predictions.md"
    if recorded.get("supplied") and path.is_file() and not path.is_symlink():
        texts.predictions = _text(path)
        texts.predictions_before_run = texts.predictions is not None
        texts.where["predictions"] = "predictions.md"
    explained = [e for e in view.addenda if isinstance(e, dict) and e.get("kind") == EXPLANATION_KIND]
    if explained and stored_path_error(explained[-1].get("file")) is None:
        path = view.directory / explained[-1]["file"]
        if path.is_file() and not path.is_symlink():
            texts.explanation = _text(path)
            texts.where["explanation"] = explained[-1]["file"]
    return texts


def _text(path: Path) -> Optional[str]:
    try:
        return writing.read(path).decode("utf-8")
    except writing.NotText:
        return None


def _hashes(texts: checklist.Writing, view=None) -> dict:
    found = {name: hashlib.sha256(text.encode()).hexdigest()
             for name, text in (("predictions", texts.predictions), ("explanation", texts.explanation)) if text}
    if view is not None and (view.directory / "records.jsonl").is_file():
        found["records"] = hashlib.sha256((view.directory / "records.jsonl").read_bytes()).hexdigest()
    return found


def grade_run(view, rubric: Rubric, course=None, course_label: str = "", source: str = "",
              learner: Optional[str] = None) -> Grade:
    """One handed-in run (a RunView), against the course's run when one is given."""
    from inferlab.read.verify import integrity_problems, verify_run

    grade = Grade(source or str(view.directory), rubric, learner=learner)
    if view.is_plan_folder:
        grade.error = f"{view.directory} is a plan folder (written by --plan): no test ran, so there is no run to grade"
        return grade
    problems = integrity_problems(verify_run(view))
    grade.integrity = list(problems)
    if course is None:
        grade.notes.append(NO_COURSE_RUN)
    else:
        grade.comparison = against.compare(view, course, course_label)
        grade.integrity += [f"contradicts the course's run: {lines[0]}"
                            for lines in grade.comparison.contradictions.values() if lines]
        if not grade.comparison.exact and not grade.comparison.different_specimen:
            grade.notes.append(f"compared with the course's run: {grade.comparison.how()}")
    grade.texts = run_writing(view)
    grade.items = checklist.grade_items(rubric, grade.texts, view, problems, grade.comparison)
    grade.findings = checklist.findings(view)
    grade.hashes = _hashes(grade.texts, view)
    return grade


def grade_writing(texts: checklist.Writing, rubric: Rubric, source: str, learner: Optional[str] = None) -> Grade:
    """Writing handed in without a run: the writing items only, saying so."""
    grade = Grade(source, rubric, learner=learner, texts=texts)
    grade.notes.append("no run was handed in: only the writing (items 1 and 7) can earn points")
    grade.items = checklist.grade_items(rubric, texts)
    grade.hashes = _hashes(texts)
    return grade


def grade_source(path: Path, rubric: Rubric, course=None, course_label: str = "") -> Grade:
    """A run folder or a `pack` archive; a Grade with .error when it is neither."""
    from inferlab.read.parse import not_a_run_reason
    from inferlab.read.runview import RunView

    path = Path(path)
    if archive.is_archive(path):
        try:
            with archive.unpacked(path) as (run_dir, submission):
                learner = submission.get("learner")
                why = not_a_run_reason(run_dir)
                if why:
                    return Grade(str(path), rubric, error=why)
                return grade_run(RunView.read(run_dir), rubric, course, course_label, str(path),
                                 learner if isinstance(learner, str) else None)
        except archive.ArchiveError as error:
            return Grade(str(path), rubric, error=str(error))
    why = not_a_run_reason(path)
    if why:
        return Grade(str(path), rubric, error=f"{why} (and not a .tar.gz made by pack)")
    return grade_run(RunView.read(path), rubric, course, course_label)


def flag_copies(grades: list[Grade]) -> None:
    """Exact copies within a class (the same predictions, explanation or records, byte for byte): a note on both
    grades, never a lost point; near copies are for the course's plagiarism tools."""
    seen: dict[tuple, Grade] = {}
    for grade in grades:
        for what, digest in grade.hashes.items():
            first = seen.setdefault((what, digest), grade)
            if first is not grade:
                for one, other in ((grade, first), (first, grade)):
                    one.notes.append(f"exact copy: its {what} is byte for byte that of {other.learner or other.source}")
