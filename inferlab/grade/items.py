"""The lab's seven checklist items, graded for one submission.

Items 1 and 7 are writing: the predictions answer the six questions, and the explanation has text under the
template's headings (its content is for a person: the item's status is then `manual`). Items 2 to 6 are what a
machine measured, and only a handed-in run earns them: the run reached its end, holds the item's records, every
harness-integrity test behind them passed, the run verifies on its own, and nothing in it contradicts the course's
run (inferlab.grade.against). A failed protocol diagnostic (the cache tolerance, greedy repeatability) is a finding
to explain, never a failed item. Every item earns at most its rubric points, by the same checks for every
submission, so none scores more than an honest complete run.
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Optional

from inferlab import writing
from inferlab.files import PROJECT_ROOT, spelled
from inferlab.grade.rubric import Item, Rubric
from inferlab.read.runview import file_of
from inferlab.read.verify import EXPECTED
from inferlab.run.endings import first_line

PASS, FAIL, MANUAL = "pass", "fail", "manual"
ATTACH = ".venv/bin/inferlab attach RUN_DIR my_explanation.md"
RERUN = f"run the experiment again ({spelled('-m pytest experiments ...', 'python')}) and hand in that run"
FINDINGS = "diagnostic"  # the plan's check_kind of a protocol diagnostic
# The record kinds each machine-measured item rests on (never test names); a complete run holds verify's count of
# each, else one.
ITEM_KINDS = {
    2: ("thread_controls", "offline_guard"),
    3: ("specimen", "artifact_acquisition", "artifact_file", "artifact_directory", "model_load", "model_inspection"),
    4: ("input", "eos_ids", "generation"),
    5: ("cache_criterion", "cache_inspection", "cache_summary", "cache_comparison"),
    6: ("timing_trial", "timing_summary", "clock_overhead", "memory"),
}


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
        lines = [f"{c.status}: {c.detail}" + (f" (to fix: {c.fix})" if c.fix and c.status == FAIL else "")
                 for c in self.checks]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"number": self.item.number, "title": self.item.title, "status": self.status,
                "required": self.item.required, "points": self.points, "max_points": self.item.points,
                "manual_points": self.item.manual_points, "checks": [asdict(c) for c in self.checks]}


@dataclass
class Writing:
    """The learner's texts as handed in (None when absent) and where they came from."""

    predictions: Optional[str] = None
    explanation: Optional[str] = None
    predictions_before_run: Optional[bool] = None  # the run copied them before any model computation
    where: dict = field(default_factory=dict)


# --- writing --------------------------------------------------------------------------------------------------


def predictions_checks(texts: Writing, required: int, template_text: Optional[str]) -> list[Check]:
    checks = []
    if texts.predictions is None:
        return [Check("predictions", FAIL, "no predictions were handed in",
                      "answer predictions.md before running, and run with --predictions FILE")]
    if texts.predictions_before_run is True:
        checks.append(Check("predictions_first", PASS, "the run copied the predictions before the model computed"))
    elif texts.predictions_before_run is None:
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


def _kinds_of_tests(view) -> dict[str, set]:
    """Each planned test -> the record kinds it stands for: its own, else those of its experiment file."""
    by_file = collections.defaultdict(set)
    for entry in view.planned:
        by_file[file_of(entry.get("test"))].update(entry.get("records") or [])
    return {e.get("test"): set(e.get("records") or []) or by_file[file_of(e.get("test"))] for e in view.planned}


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
    kinds = _kinds_of_tests(view)
    behind = [view.decisive_outcome(test) for test, own in kinds.items() if own & set(expected)]
    failed = [o for o in behind if o and o.get("outcome") in ("failed", "error") and view.check_kind(o) != FINDINGS]
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
        checks.append(Check("course_run", PASS, "not compared with a course run (--against): nothing this run "
                                                "measured was checked against evidence"))
    elif comparison.different_specimen:
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
            if o.get("outcome") in ("failed", "error") and view.check_kind(o) == FINDINGS]


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
