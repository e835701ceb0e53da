"""Grading one submission (a run folder, a `pack` archive, or writing alone) on the lab's seven checklist items.

Items 1 and 7 are writing: predictions that answer the six questions, an explanation with text under the template's
headings (what it says is for a person: the item is then `manual`). Items 2 to 6 are earned only by a handed-in run
that reached its end, holds the item's records, passed the harness-integrity tests behind them, verifies on its
own, and is not contradicted by the course's run (inferlab.grade.against); a failed protocol diagnostic is a finding
to explain, never a failed item. The same checks hold for every submission, so none scores above an honest complete
run. Exit status: 0 every required item passes, 1 one fails, 2 not gradable, 3 fails verify or contradicts the
course's run; over several submissions, the worst. Every path taken from a run's own files stays inside that run.
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from inferlab import writing
from inferlab.files import PROJECT_ROOT, sha256_bytes, sha256_file, spelled
from inferlab.grade import against, archive
from inferlab.grade.rubric import Item, Rubric
from inferlab.read.addenda import EXPLANATION_KIND, stored_path_error
from inferlab.read.parse import not_a_run_reason
from inferlab.read.runview import DIAGNOSTIC, FAILING, RunView
from inferlab.read.verify import EXPECTED, integrity_problems, verify_run
from inferlab.run.endings import first_line
from inferlab.run.plan import file_of

PASS, FAIL, MANUAL = "pass", "fail", "manual"
ATTACH = ".venv/bin/inferlab attach RUN_DIR my_explanation.md"
RERUN = f"run the experiment again ({spelled('-m pytest experiments ...', 'python')}) and hand in that run"
# The record kinds each machine-measured item rests on; a complete run holds verify.EXPECTED of each, else one.
ITEM_KINDS = {
    2: ("thread_controls", "offline_guard"),
    3: ("specimen", "artifact_acquisition", "artifact_file", "artifact_directory", "model_load", "model_inspection"),
    4: ("input", "eos_ids", "generation"),
    5: ("cache_criterion", "cache_inspection", "cache_summary", "cache_comparison"),
    6: ("timing_trial", "timing_summary", "clock_overhead", "memory"),
}


EXIT_OK, EXIT_ITEM, EXIT_NOT_GRADED, EXIT_INTEGRITY = 0, 1, 2, 3
NO_COURSE_RUN = ("not checked against the course's run (--against COURSE_RUN): nothing this run measured was "
                 "compared with evidence; items 2 to 6 say only that the run is complete and its files intact")


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: Optional[str] = None


@dataclass
class ItemGrade:
    item: Item
    checks: list[Check]

    @property
    def status(self) -> str:
        states = {c.status for c in self.checks}
        return FAIL if FAIL in states else MANUAL if MANUAL in states else PASS

    @property
    def points(self) -> float:
        return self.item.points if self.status in (PASS, MANUAL) else 0.0

    def message(self) -> str:
        return "\n".join(f"{c.status}: {c.detail}" + (f" (to fix: {c.fix})" if c.fix and c.status == FAIL else "")
                         for c in self.checks)

    def as_dict(self) -> dict:
        return {"number": self.item.number, "title": self.item.title, "status": self.status,
                "required": self.item.required, "points": self.points, "max_points": self.item.points,
                "manual_points": self.item.manual_points, "checks": [asdict(c) for c in self.checks]}


@dataclass
class Writing:
    """The learner's texts as handed in (None when absent)."""

    predictions: Optional[str] = None
    explanation: Optional[str] = None
    in_run: bool = False  # the predictions came in a run, which copied them before any model computation


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
    texts: Writing = field(default_factory=Writing)
    hashes: dict = field(default_factory=dict)  # what an exact copy shares: {what: sha256}

    @property
    def exit_status(self) -> int:
        if self.error is not None:
            return EXIT_NOT_GRADED
        if self.integrity:
            return EXIT_INTEGRITY
        if any(i.status == FAIL and i.item.required for i in self.items):
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


# --- writing --------------------------------------------------------------------------------------------------


def predictions_checks(texts: Writing, required: int, template_text: Optional[str]) -> list[Check]:
    checks = []
    if texts.predictions is None:
        return [Check("predictions", FAIL, "no predictions were handed in",
                      "answer predictions.md before running, and run with --predictions FILE")]
    if texts.in_run:
        checks.append(Check("predictions_first", PASS, "the run copied the predictions before the model computed"))
    else:
        checks.append(Check("predictions_first", MANUAL, "handed in without a run: nothing shows they were "
                                                         "written first; a person judges"))
    answers = writing.question_answers(texts.predictions, template_text)
    ok = len(answers.answered) >= required
    checks.append(Check("predictions_answered", PASS if ok else FAIL, answers.summary() + f" (required: {required})",
                        None if ok else "answer every question in a few words of your own, before a new run"))
    return checks


def sections_check(texts: Writing, sections: tuple[str, ...], template_text: Optional[str]) -> Check:
    name = "explanation"
    if texts.explanation is None:
        return Check(name, FAIL, "no explanation was handed in", f"write it from explanation.md and `{ATTACH}`")
    if template_text is None:
        return Check(name, MANUAL, "the explanation template is absent here: its headings were not checked")
    found = writing.sections_written(texts.explanation, template_text)
    gaps = [f"{s}: no such heading" for s in sections if s in found["missing"]]
    gaps += [f"{s}: {found['empty'][s]}" for s in sections if s in found["empty"]]
    if gaps:
        return Check(name, FAIL, "not written: " + "; ".join(gaps),
                     "write each section in your own words, citing records, and attach the file again")
    return Check(name, MANUAL, f"{len(sections)} section(s) written; a person grades what they say")


# --- what a machine measured ---------------------------------------------------------------------------------


def run_checks(view, number: int, problems: list[str], comparison) -> list[Check]:
    """Item `number` (2 to 6) of a handed-in run: ended, complete, its tests passed, verifies, agrees."""
    failed_acquisition = next((r for r in view.kind("artifact_acquisition") if r.get("ok") is False), None)
    if failed_acquisition is not None:  # one cause, said once per item, not every test it stopped
        cause = first_line(str(failed_acquisition.get("error") or "no reason recorded"))[:300]
        return [Check("measured", FAIL, f"nothing was measured: the specimen could not be acquired ({cause})",
                      "make the specimen available (--specimen standin, or --artifacts DIR with a verified copy) "
                      "and run again")]
    checks = []
    if view.unfinished:
        checks.append(Check("finished", FAIL, f"the run did not reach its end: {view.unfinished}", RERUN))
    expected = {kind: EXPECTED.get(kind, 1) for kind in ITEM_KINDS[number]}
    short = []
    for kind, count in expected.items():
        found = [r for r in view.kind(kind) if r.get("status", "ok") == "ok" and r.get("available", True)]
        if len(found) < count:
            short.append(f"{kind} {len(found)} of {count}")
    checks.append(Check("records", FAIL, "records missing: " + ", ".join(short), RERUN) if short else
                  Check("records", PASS, f"{sum(expected.values())} or more records of {', '.join(expected)}"))
    by_file = collections.defaultdict(set)  # a test stands for the record kinds it writes, else its file's
    for entry in view.planned:
        by_file[file_of(str(entry.get("test")))].update(entry.get("records") or [])
    behind = [view.decisive_outcome(e.get("test")) for e in view.planned
              if (set(e.get("records") or []) or by_file[file_of(str(e.get("test")))]) & set(expected)]
    failed = [o for o in behind if o and o.get("outcome") in FAILING and view.check_kind(o) != DIAGNOSTIC]
    if failed:
        first = failed[0]
        reason = first_line(first.get("longrepr"))[:300]
        checks.append(Check("tests", FAIL, f"{len(failed)} harness test(s) behind this item failed; the first: "
                                           f"{first.get('test')}: {reason}", "fix its cause and run again"))
    else:
        checks.append(Check("tests", PASS, f"every harness test behind this item that ran passed ({len(behind)})"))
    if problems:
        checks.append(Check("verifies", FAIL, f"the run's files fail verify: {problems[0]}"
                                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                            "hand in the run folder as its session wrote it"))
    if comparison is None:
        return checks  # the grade's note says once that nothing measured was checked (NO_COURSE_RUN)
    if comparison.different_specimen:
        checks.append(Check("course_run", FAIL, f"not comparable: {comparison.different_specimen}",
                            "run the specimen the course names and hand in that run"))
    elif comparison.contradictions.get(number):
        found = comparison.contradictions[number]
        checks.append(Check("course_run", FAIL, f"contradicts the course's run: {found[0]}"
                                                + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""), RERUN))
    else:
        counted = comparison.compared.get(number, 0)
        exact = "exact" if comparison.exact else "not exact"
        detail = (f"agrees with the course's run ({counted} values compared, {exact})" if counted
                  else "nothing of this item is compared with the course's run")
        checks.append(Check("course_run", PASS, detail))
    return checks


def findings(view) -> list[str]:
    """Failed protocol diagnostics: findings to explain, with their message."""
    return [f"{o.get('test')}: {first_line(o.get('longrepr'))[:300]}"
            for o in view.tests_by_outcome().values()
            if o.get("outcome") in FAILING and view.check_kind(o) == DIAGNOSTIC]


def grade_items(rubric: Rubric, texts: Writing, view=None, problems: list[str] = (),
                comparison=None) -> list[ItemGrade]:
    """Every item of the rubric for one submission: `view` is the handed-in run (None when only writing came),
    `problems` what verify found in it."""
    predictions, explanation = (writing.template(PROJECT_ROOT, name)
                                for name in (writing.PREDICTIONS_TEMPLATE, writing.EXPLANATION_TEMPLATE))
    grades = []
    for number, item in sorted(rubric.items.items()):
        if number in (1, 7):
            checks = predictions_checks(texts, rubric.require_answered_predictions, predictions) if number == 1 else []
            checks.append(sections_check(texts, item.sections, explanation))
        elif view is None:
            checks = [Check("run", FAIL, "no run was handed in: what a machine measures is earned by a run",
                            "run the experiment, `pack` the run and hand in the archive")]
        else:
            checks = run_checks(view, number, problems, comparison)
        grades.append(ItemGrade(item, checks))
    return grades


# --- a submission -------------------------------------------------------------------------------------------


def run_writing(view) -> Writing:
    """The learner's texts inside a run: its predictions.md and the last explanation attached (addenda/<name>)."""
    texts = Writing()
    recorded = view.manifest.get("predictions") if isinstance(view.manifest.get("predictions"), dict) else {}
    path = view.directory / "predictions.md"
    if recorded.get("supplied") and path.is_file() and not path.is_symlink():
        texts.predictions = _text(path)
        texts.in_run = True
    explained = [e for e in view.addenda if e.get("kind") == EXPLANATION_KIND]
    if explained and stored_path_error(explained[-1].get("file")) is None:
        path = view.directory / explained[-1]["file"]
        if path.is_file() and not path.is_symlink():
            texts.explanation = _text(path)
    return texts


def _text(path: Path) -> Optional[str]:
    try:
        return writing.read(path).decode("utf-8")
    except writing.NotText:
        return None


def _hashes(texts: Writing, view=None) -> dict:
    found = {name: sha256_bytes(text.encode())
             for name, text in (("predictions", texts.predictions), ("explanation", texts.explanation)) if text}
    if view is not None and (view.directory / "records.jsonl").is_file():
        found["records"] = sha256_file(view.directory / "records.jsonl")
    return found


def grade_run(view, rubric: Rubric, course=None, course_label: str = "", source: str = "",
              learner: Optional[str] = None) -> Grade:
    """One handed-in run (a RunView), against the course's run when one is given."""
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
    grade.items = grade_items(rubric, grade.texts, view, problems, grade.comparison)
    grade.findings = findings(view)
    grade.hashes = _hashes(grade.texts, view)
    return grade


def grade_writing(texts: Writing, rubric: Rubric, source: str, learner: Optional[str] = None) -> Grade:
    """Writing handed in without a run: the writing items only, saying so."""
    grade = Grade(source, rubric, learner=learner, texts=texts)
    grade.notes.append("no run was handed in: only the writing (items 1 and 7) can earn points")
    grade.items = grade_items(rubric, texts)
    grade.hashes = _hashes(texts)
    return grade


def grade_source(path: Path, rubric: Rubric, course=None, course_label: str = "") -> Grade:
    """A run folder or a `pack` archive; a Grade with .error when it is neither."""
    path = Path(path)
    if path.is_file() and path.name.endswith(archive.SUFFIXES):
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
