"""verify's whole walk over one Checker: every check, in the order verify states them. The checks' modules
(files, ending, addenda, completeness, consistency) each import the Checker; only this module imports them all, so
no module of verify imports one that imports it."""

from __future__ import annotations

from inferlab.base.records import MANIFEST_FILE
from inferlab.verify import addenda, completeness, consistency, ending, files
from inferlab.verify.checker import Checker


def walk(checker: Checker) -> dict:
    """Every check, in the order verify states them; returns the result."""
    view = checker.view
    for problem in view.problems_of(MANIFEST_FILE):
        checker.reading_problem(problem)
    readable = files.check_records_file(checker)
    if readable and view.is_plan_folder:
        files.check_manifest_and_files(checker)
        addenda.check_addenda(checker)
        ending.check_plan_folder(checker)
        return checker.result(plan_folder=True)
    if readable:
        ending.read_ending(checker)
        ending.report_ending(checker)
    files.check_manifest_and_files(checker)
    addenda.check_addenda(checker)
    ended_early = checker.partial and checker.end is not None and checker.end.get("complete") is False
    explained = checker.unfinished or ended_early
    if checker.manifest is not None and checker.manifest.get("complete") is not True and not explained:
        checker.problem(f"{MANIFEST_FILE}: complete is {checker.manifest.get('complete')!r}, expected true "
                        f"(the session did not finish, was interrupted, or is not the complete protocol: "
                        f"{checker.manifest.get('status', 'no status recorded')})")
    if readable:
        for check in (completeness.check_outcome_evidence, ending.check_plan, ending.check_session_end,
                      completeness.check_kinds, completeness.check_generation, completeness.check_timing,
                      completeness.check_budgets, files.check_report, files.check_tensors,
                      consistency.check_consistency):
            checker.guarded(check)
        checker.complete = ending.is_complete(checker)
    return checker.result(plan_folder=False)
