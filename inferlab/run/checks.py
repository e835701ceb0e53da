"""The prerequisite ledger: which named checks passed, failed or did not run, by which test and why, and the
session limit that counts from the moment setup is done.

A test `provides` checks and `requires` others (its markers). A test whose prerequisite did not pass is
not started; its skip names the first failure of the chain (the root cause), not every link. Plain data in,
plain data out: the plugin turns a refusal into pytest.skip.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Optional

from inferlab import protocol


def first_line(text: Optional[str]) -> str:
    """The message of a failure's text: its first `E   ...` line (pytest puts them near the end), else its last line."""
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    messages = [line.strip()[1:].strip() for line in lines if line.lstrip().startswith("E ")]
    return messages[0] if messages else lines[-1]


class CheckLedger:
    """Each check's status ({status, by, reason, root_cause}), and the session limit's clock."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic):
        self.checks: dict = {}  # check name -> {"status", "by", "reason", "root_cause"}
        self.setup_done_monotonic: Optional[float] = None  # when protocol.SETUP_DONE_CHECK passed
        self.session_limit_skips = 0
        self._root_causes: dict = {}  # node id -> why it was not started (for the checks it provides)
        self._monotonic = monotonic

    def refusal(self, nodeid: str, requires: Iterable[str],
                absent: Optional[Callable[[str], str]] = None) -> Optional[str]:
        """Why this test must not start (the session limit is past, or a prerequisite did not pass), or None.

        absent(name) says why a check that no test has provided yet is missing (absent_prerequisite)."""
        if self.setup_done_monotonic is not None:
            elapsed = self._monotonic() - self.setup_done_monotonic
            if elapsed > protocol.SESSION_LIMIT_S:
                self.session_limit_skips += 1
                return (f"not run: the session limit of {protocol.SESSION_LIMIT_S} s after setup was reached "
                        f"({elapsed:.0f} s since '{protocol.SETUP_DONE_CHECK}' passed) before this test started")
        for name in requires:
            check = self.checks.get(name)
            if check is None:
                cause = absent(name) if absent is not None else f"prerequisite '{name}' has not run"
            elif check["status"] != "passed":
                cause = check["root_cause"]
            else:
                continue
            self._root_causes[nodeid] = cause
            if check is not None and check["status"] == "did not run":
                return f"not run: prerequisite '{name}' did not run, because {cause}"
            return f"not run: {cause}"
        return None

    def update(self, nodeid: str, provides: Iterable[str], outcome: str, phase: str, reason: str) -> None:
        """Record what one test's outcome means for the checks it provides; one failed provider fails a check
        for good. reason: the skip reason, or the failure's message."""
        for name in provides:
            previous = self.checks.get(name)
            if previous is not None and previous["status"] != "passed":
                continue
            if outcome == "passed":
                if phase == "call":
                    self.checks[name] = {"status": "passed", "by": nodeid, "reason": None, "root_cause": None}
                    if name == protocol.SETUP_DONE_CHECK and self.setup_done_monotonic is None:
                        self.setup_done_monotonic = self._monotonic()
                continue
            status = "did not run" if outcome == "skipped" else outcome
            # A provider skipped for its own missing prerequisite passes that root cause on, so a
            # chain of dependents names the first failure instead of nesting every link.
            root_cause = self._root_causes.get(nodeid) or f"prerequisite '{name}' {status} in {nodeid}: {reason}"
            self.checks[name] = {"status": status, "by": nodeid, "reason": reason, "root_cause": root_cause}

    def status_of(self, name: str) -> Optional[str]:
        """passed, failed, error, did not run, or None when no test has provided the check yet."""
        check = self.checks.get(name)
        return check["status"] if check else None


def function_of(nodeid: str) -> str:
    """The test function of a node id: 'test_y' of 'experiments/test_x.py::test_y[P1]'."""
    return nodeid.split("::")[-1].split("[")[0]


def prerequisite_tests(names: Iterable[str], declared: list[dict]) -> list[dict]:
    """The test functions some checks need: those that provide them, then what they require in turn, in file
    order, without repeats. declared: every experiment test function with its provides and requires
    (session_status.experiment_checks), and every collected test that provides a check its function does not (a
    parametrized case marked on its own: its `nodeid` and its `keyword`, the case's id)."""
    chain, wanted, seen = [], list(names), set()
    while wanted:
        check = wanted.pop(0)
        if check in seen:
            continue
        seen.add(check)
        for test in declared:
            if check in test["provides"] and test not in chain:
                chain.append(test)
                wanted += test["requires"]
    return sorted(chain, key=declared.index)


def missing_tests(names: Iterable[str], declared: list[dict], planned: Iterable[str]) -> list[dict]:
    """The tests that provide the checks `names` need (prerequisite_tests) and are not in the schedule."""
    planned = set(planned)
    planned_functions = {function_of(nodeid) for nodeid in planned}
    return [test for test in prerequisite_tests(names, declared)
            if (test["nodeid"] not in planned if test.get("nodeid") else test["function"] not in planned_functions)]


def include_hint(keyword: str, missing: Iterable[dict]) -> str:
    """The -k expression that keeps the selection and adds the missing tests."""
    names = list(dict.fromkeys(test.get("keyword") or test["function"] for test in missing))
    return f"-k '{keyword} or {' or '.join(names)}'"


def absent_prerequisite(name: str, declared: list[dict], planned: Iterable[str], selection: dict,
                        also: Iterable[str] = ()) -> str:
    """Why a required check has not run: which tests that provide it (or that they need) are not in this
    session's schedule, what left them out, and how to include them. selection: the plan's selection; also:
    the test's other required checks that have not run either, whose tests are named too."""
    missing = missing_tests([name, *also], declared, planned)
    if not missing:
        return f"prerequisite '{name}' has not run"
    names = list(dict.fromkeys(test.get("keyword") or test["function"] for test in missing))
    files = list(dict.fromkeys(test["file"] for test in missing))
    keyword, named = selection.get("keyword"), selection.get("named_paths") or []
    if keyword:
        why, how = f"-k {keyword!r} deselected them", include_hint(keyword, missing)
    elif named:
        why, how = f"the command named only {' '.join(named)}", f"name {' '.join(files)} too"
    else:
        why, how = "the command's selection left them out", "run the whole experiments folder"
    return (f"prerequisite '{name}' has not run: the tests it needs are not in this session's schedule "
            f"({', '.join(names)}; {why}); to include them: {how}")


def case_checks(facts: Iterable, declared: list[dict]) -> list[dict]:
    """The collected tests that provide a check their function does not declare (a parametrized case with a
    provides mark of its own), as entries of `declared` named by the case's id, so that a -k hint names it."""
    by_function = {(test["file"], test["function"]): set(test["provides"]) for test in declared}
    found = []
    for fact in facts:
        file, function = fact.nodeid.split("::")[0], function_of(fact.nodeid)
        extra = [name for name in fact.provides if name not in by_function.get((file, function), set())]
        if extra and "[" in fact.nodeid:
            found.append({"file": file, "function": function, "nodeid": fact.nodeid,
                          "keyword": fact.nodeid.split("[", 1)[1].rstrip("]"), "provides": extra,
                          "requires": list(fact.requires)})
    return found
