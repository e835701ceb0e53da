"""The Checker: one line per problem while walking one run's view, in the order verify states them.

It holds what the checks share (the view, the problems and explained gaps found so far, how the session
ended) and the rules for a gap: a missing record is a problem unless one of the tests that write it has
a recorded non-passing outcome, or none of them ran because the run left them out or never reached them.
"""

from __future__ import annotations

import collections
from typing import Optional

from inferlab.base.records import MANIFEST_FILE, PLAN_FILE
from inferlab.reading.runview import DIAGNOSTIC, FAILING, INTEGRITY, Missing, Problem, RunView, function_name


class Checker:
    """Collects one line per problem, and one per explained gap, while the check modules walk a run."""

    def __init__(self, view: RunView):
        self.view = view
        self.records = view.records
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.not_checked: list[str] = []  # consistency checks the run's files do not allow, one line each
        self.files_checked = 0
        self.suppressed = 0  # missing records and outcomes explained by the ending or the deselection
        self.suppressed_outcomes = 0  # of which: planned tests without an outcome (the rest are records)
        # How the session ended (set by ending.read_ending once the records could be read).
        self.end: Optional[dict] = None
        self.unfinished: Optional[str] = None
        self.live = False  # no session_end, and the process its claim names is still running (the session)
        self.partial: list[str] = []
        self.completeness: list[str] = []  # the unfinished and partial lines (ending.report_ending), also problems
        self.complete = False  # ending.is_complete, once every check has run
        self.unreached: set = set()
        self.final_records_missing = False  # unfinished, and the manifest is still the one from the start
        self.manifest: Optional[dict] = view.manifest if view.manifest_found else None
        self.plan: Optional[dict] = None  # set once verify has stated plan.json's reading problems
        self.unknown_producer: list[str] = []  # gaps no test is known to fill (a schema-1 plan): one line for all
        self._unknown_line: Optional[int] = None

    # --- recording ------------------------------------------------------------------------------------

    def problem(self, text: str) -> None:
        """One problem line."""
        self.problems.append(text)

    def where(self, file: str):
        """How a line names a whole file: its path under the record dir."""
        return self.view.directory / file if self.view.directory is not None else file

    def reading_problem(self, problem: Problem) -> None:
        """A problem met reading manifest.json, plan.json or records.jsonl, as verify states it."""
        if problem.file == MANIFEST_FILE and problem.code == "missing":
            self.problem(f"{self.where(MANIFEST_FILE)}: missing; no file can be checked against it")
        elif problem.line is None and (problem.file in (MANIFEST_FILE, PLAN_FILE) or problem.code == "unreadable"):
            self.problem(f"{self.where(problem.file)}: {problem.what}")
        else:
            self.problem(str(problem))

    def explain(self, what: str, evidence: Optional[dict]) -> None:
        """A gap with its evidence: the outcome of the test that should have written it."""
        if evidence is None:
            return
        self.notes.append(f"{what}: explained by {evidence.get('test')} {evidence.get('outcome')} "
                          f"(seq {evidence.get('seq')})")

    def suppress(self, what: str, why: str) -> None:
        """A gap the ending or the deselection explains: noted, counted, not listed as a problem."""
        self.suppressed += 1
        self.notes.append(f"{what}: {why}")

    def of_kind(self, kind: str) -> list[dict]:
        """The records of one kind."""
        return self.view.kind(kind)

    # --- gaps -----------------------------------------------------------------------------------------

    def require(self, what: str, *kinds: str) -> None:
        """A missing record of one of the kinds: explained, left out, or a problem (see the module's rule)."""
        missing = self.view.why_missing(*kinds)
        if self.settle(what, missing):
            return
        if missing.reason == "no_known_producer":
            if self._unknown_line is None:
                self._unknown_line = len(self.problems)
                self.problem("")  # stated in full once every such gap is known, by result()
            self.unknown_producer.append(what)
        elif not missing.producers:
            self.problem(f"{what}, and no planned test declares that it writes it")
        else:
            names = ", ".join(dict.fromkeys(function_name(p) for p in missing.producers))
            self.problem(f"{what}, and none of its producing tests ({names}) has a failed, error or skipped outcome")

    def settle(self, what: str, missing: Missing) -> bool:
        """Note a gap that evidence, the ending or the deselection explains; False when nothing does."""
        if missing.reason == "evidence":
            self.explain(what, missing.evidence)
        elif missing.reason == "not_reached":
            self.suppress(what, f"not reached ({self.unfinished})")
        elif missing.reason == "deselected":
            self.suppress(what, "deselected (partial run)")
        else:
            return False
        return True

    def acquisition_failure(self) -> Optional[dict]:
        """{cause, failed_tests} when the specimen could not be acquired (the session_end says so, or, in a run
        older than that field, its artifact_acquisition record), else None; failed_tests counts the failed tests
        that check the acquisition or the files."""
        from inferlab.run.session_status import SPECIMEN_CHECKS
        from inferlab.specimen import acquisition_cause

        end = self.view.session_end or {}
        if isinstance(end.get("acquisition_failure"), dict):
            return dict(end["acquisition_failure"])
        failed = next((r for r in self.of_kind("artifact_acquisition") if r.get("ok") is False), None)
        if failed is None:
            return None
        checking = {e.get("test") for e in self.view.planned if set(e.get("provides") or ()) & set(SPECIMEN_CHECKS)}
        count = sum(1 for o in self.view.tests_by_outcome().values()
                    if o.get("outcome") in FAILING and o.get("test") in checking)
        return {"cause": acquisition_cause(failed), "failed_tests": count}

    def guarded(self, check) -> None:
        """Run one check; records of the wrong shape where it reads them (a list where an id belongs, a text
        where a number does) are a problem that names the check, and the other checks still run."""
        try:
            check(self)
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as error:
            self.problem(f"malformed records: {check.__module__.rsplit('.', 1)[-1]}.{check.__name__} could not read "
                         f"them ({type(error).__name__}: {error}); what it checks is not established")

    def result(self, plan_folder: bool) -> dict:
        """What verify found, as plain data."""
        if self._unknown_line is not None:
            gaps = self.unknown_producer
            self.problems[self._unknown_line] = (
                f"no known producer: {len(gaps)} gap(s) that no test of this run is known to fill, because "
                f"{PLAN_FILE} (schema {self.view.schema}) declares no record kinds and no record of these kinds was "
                f"written, so no outcome can explain them: " + "; ".join(gaps))
        outcomes = collections.Counter(r.get("outcome") for r in self.of_kind("test_outcome"))
        failing = collections.Counter(self.view.check_kind(o) for o in self.view.tests_by_outcome().values()
                                      if o.get("outcome") in FAILING)
        return {
            "record_dir": str(self.view.directory) if self.view.directory is not None else None,
            "plan_folder": plan_folder,
            "planned_tests": len((self.plan or {}).get("schedule") or []),
            "ok": not self.problems,
            "problems": list(self.problems),
            "explained_gaps": list(self.notes),
            "not_checked": list(self.not_checked),
            "unfinished": self.unfinished,
            "partial": list(self.partial),
            "complete": self.complete,
            "completeness": list(self.completeness),
            "not_listed": self.suppressed,
            "not_listed_outcomes": self.suppressed_outcomes,
            "not_listed_records": self.suppressed - self.suppressed_outcomes,
            # From the outcomes' check kinds, never from the folder's name: a failed harness-integrity check, or
            # only failed protocol diagnostics (the protocol ran and found something).
            "failures_by_check_kind": {kind: failing.get(kind, 0) for kind in (INTEGRITY, DIAGNOSTIC)},
            "acquisition_failure": self.acquisition_failure(),
            "records": len(self.records),
            "files_checked": self.files_checked,
            "outcome_counts": dict(sorted(outcomes.items())),
            "all_tests_passed": bool(outcomes) and set(outcomes) == {"passed"},
            "schema": self.view.schema,
            "addenda": len(self.view.addenda),  # entries of addenda.jsonl (inferlab.verify.addenda checks them)
            "notes": list(self.view.notes),
        }

