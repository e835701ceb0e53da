"""What a session can honestly claim at its end: which protocol parts it planned, why it is partial,
whether it reached its end, and the one line that says so.

Plain functions of plain data (node ids, option values, counts); the plugin gathers the data from
pytest and writes the results into plan.json, the `session_end` record and the manifest.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path
from typing import Iterable, Optional

from inferlab import protocol

# The protocol calls batching an optional extension: leaving it out does not make a run partial. An experiment
# module says it is optional with `pytestmark = [..., pytest.mark.optional_extension]`; this is read from its
# source, so that a file that was not even collected is still known to be optional.
OPTIONAL_MARKER = "optional_extension"


def file_of(nodeid: str) -> str:
    """The file part of a node id: 'experiments/test_x.py' of 'experiments/test_x.py::test_y[P1]'."""
    return nodeid.split("::")[0]


def experiment_parts(root: Path, experiments_dir: str) -> list[dict]:
    """One entry per experiment file on disk: {file, title, optional}; the title is its docstring's first line."""
    parts = []
    for path in sorted((Path(root) / experiments_dir).glob("test_*.py")):
        try:
            module = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            module = None
        docstring = (ast.get_docstring(module) or "") if module is not None else ""
        parts.append({
            "file": f"{experiments_dir}/{path.name}",
            "title": docstring.strip().splitlines()[0] if docstring.strip() else path.stem,
            "optional": module is not None and declares_optional(module),
        })
    return parts


def _marker_names(decorators: list, marker: str) -> list[str]:
    """The string arguments of every `@pytest.mark.<marker>(...)` among a function's decorators."""
    names = []
    for decorator in decorators:
        if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute) \
                and decorator.func.attr == marker:
            names += [arg.value for arg in decorator.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return names


def experiment_checks(root: Path, experiments_dir: str) -> list[dict]:
    """Every experiment test function on disk with the checks it provides and requires, read from its source
    ({file, function, provides, requires}), so that a test that was deselected or never collected is known too."""
    found = []
    for path in sorted((Path(root) / experiments_dir).glob("test_*.py")):
        try:
            module = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in module.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                found.append({"file": f"{experiments_dir}/{path.name}", "function": node.name,
                              "provides": _marker_names(node.decorator_list, "provides"),
                              "requires": _marker_names(node.decorator_list, "requires")})
    return found


def declares_optional(module: ast.Module) -> bool:
    """Whether a module's `pytestmark` assignment names the optional_extension marker."""
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            if any(isinstance(n, ast.Attribute) and n.attr == OPTIONAL_MARKER for n in ast.walk(node.value)):
                return True
    return False


def part_counts(parts: list[dict], collected: Iterable[str], planned: Iterable[str]) -> list[dict]:
    """Each part with how many of its tests were collected (before any deselection) and planned (after)."""
    collected_by_file = collections.Counter(file_of(n) for n in collected)
    planned_by_file = collections.Counter(file_of(n) for n in planned)
    return [{**part, "collected": collected_by_file[part["file"]], "planned": planned_by_file[part["file"]]}
            for part in parts]


def part_shortfalls(counted_parts: list[dict], named_tests: bool) -> tuple[list[str], list[str]]:
    """(shortfalls of the core protocol parts, notes on optional parts left out), one line each."""
    shortfalls, optional_notes = [], []
    for part in counted_parts:
        label = f"{part['file']} ({part['title']})"
        if part["collected"] == 0:
            line = f"{label}: not collected, so none of its tests is planned"
        elif part["planned"] < part["collected"]:
            line = (f"{label}: {part['planned']} of its {part['collected']} tests planned "
                    f"({part['collected'] - part['planned']} deselected)")
        elif named_tests:
            line = f"{label}: only the {part['planned']} test(s) named on the command line were collected"
        else:
            continue
        (optional_notes if part["optional"] else shortfalls).append(line)
    return shortfalls, optional_notes


def plan_shortfalls(totals: dict, counted_parts: list[dict], named_tests: bool) -> tuple[list[str], list[str]]:
    """Every way the planned schedule falls short of the complete protocol: the trial totals, then each part."""
    parts, optional_notes = part_shortfalls(counted_parts, named_tests)
    return protocol.shortfalls(totals) + parts, optional_notes


def selection_reasons(selection: dict, deselected_core: int, named_paths: list[str]) -> list[str]:
    """The options or causes that made the schedule smaller than the protocol, one line each.

    selection holds the options in effect: keyword (-k), markexpr (-m), deselect (--deselect),
    last_failed (--lf, with failures on record), stepwise (--sw).
    """
    named = []
    if selection.get("keyword"):
        named.append(f"-k {selection['keyword']!r}")
    if selection.get("markexpr"):
        named.append(f"-m {selection['markexpr']!r}")
    if selection.get("deselect"):
        named.append("--deselect " + " ".join(selection["deselect"]))
    if selection.get("stepwise"):
        named.append("--sw (stepwise)")
    reasons = []
    if selection.get("last_failed"):
        # --lf filters files while collecting, so the counts below cannot see all that it left out.
        reasons.append("--lf: only the tests that failed last time were collected and run")
    if deselected_core:
        by = " and ".join(named) or ("--lf" if selection.get("last_failed") else "an option or plugin")
        reasons.append(f"{by} deselected {deselected_core} protocol test(s)")
    if named_paths:
        reasons.append("the command named " + ", ".join(named_paths) + " instead of the whole experiments folder")
    return reasons


def stop_reason(*, exit_code_name: str, signals: list[str], should_stop, should_fail, tests_failed: int,
                session_limit_skips: int, refused: Optional[str] = None) -> Optional[str]:
    """Why the session stopped before its end, or None when it ran through its schedule; refused: why the run was
    refused after it claimed its folder (a test order that is not the protocol's), before any test ran."""
    if signals:
        more = f", then {len(signals) - 1} more signal(s)" if len(signals) > 1 else ""
        return f"interrupted by {signals[0]}{more}"
    if exit_code_name == "INTERRUPTED":
        return "interrupted (KeyboardInterrupt or pytest.exit)"
    if should_fail:
        return f"-x/--maxfail after {tests_failed} failure(s)"
    if should_stop:
        return f"stopped: {should_stop}" if isinstance(should_stop, str) else "stopped by a plugin or option"
    if exit_code_name == "INTERNAL_ERROR":
        return "internal error (see the traceback above the summary)"
    if exit_code_name == "USAGE_ERROR":
        return f"usage error: {refused}" if refused else "usage error"
    if session_limit_skips:
        return (f"session limit: {session_limit_skips} test(s) not started after the {protocol.SESSION_LIMIT_S} s "
                f"limit")
    return None


def session_end_fields(*, exit_status: int, exit_code_name: str, signals: list[str], collect_only: bool,
                       plan_only: bool, stopped_reason: Optional[str], planned: list[str],
                       with_outcome: set, partial_reasons: list[str], optional_notes: list[str],
                       failures_by_check_kind: Optional[dict] = None, acquisition_failure: Optional[dict] = None,
                       outcome_counts: Optional[dict] = None) -> dict:
    """The `session_end` record's fields (schema 1), plus `complete`, `plan_only`, `signals`, `optional_left_out`,
    `failures_by_check_kind` ({integrity: n, diagnostic: m}: the failed or errored tests of each kind),
    `acquisition_failure` ({cause, failed_tests}: the specimen could not be acquired, and how many failed tests
    check its acquisition and files; None when it was) and `measured_nothing` (the session reached its end and
    every test it ran was skipped: the selection left out what its tests need).

    complete: the session reached its end, every planned test has an outcome, and the plan is the
    complete protocol. Nothing else may be called complete.
    """
    without = [nodeid for nodeid in planned if nodeid not in with_outcome]
    interrupted = bool(signals) or exit_code_name == "INTERRUPTED"
    stopped_early = stopped_reason is not None and not collect_only and not plan_only
    protocol_complete = not partial_reasons
    reached_end = (exit_code_name in ("OK", "TESTS_FAILED") and not interrupted and not stopped_early
                   and not collect_only and not plan_only)
    return {
        "exit_status": exit_status,
        "exit_code_name": exit_code_name,
        "interrupted": interrupted,
        "signals": list(signals),
        "stopped_early": stopped_early,
        "stop_reason": stopped_reason,
        "collect_only": collect_only,
        "plan_only": plan_only,
        "tests_planned": len(planned),
        "tests_with_outcome": len(planned) - len(without),
        "tests_without_outcome": without,
        "protocol_complete": protocol_complete,
        "partial_reasons": list(partial_reasons),
        "optional_left_out": list(optional_notes),
        "failures_by_check_kind": {kind: int((failures_by_check_kind or {}).get(kind, 0)) for kind in CHECK_KINDS},
        "acquisition_failure": dict(acquisition_failure) if acquisition_failure else None,
        "measured_nothing": reached_end and bool(planned) and outcome_counts is not None
        and measured_nothing(outcome_counts),
        "complete": reached_end and not without and protocol_complete and bool(planned),
    }


FORWARDS_HOW = ("the session's forward watch (inferlab.measure.forward_mode) counted every forward of the model; "
                "the plugin read its count at the start and end of each test, and the plan's budgets give each "
                "test's most (inferlab.run.plan.planned_forwards)")


def reconcile_forwards(counted: int, by_test: dict, budget: dict) -> dict:
    """session_end's `forward_reconciliation`: every forward of the session against the plan's forward totals.

    counted: the forwards the watch saw in the whole session; by_test: {node id: forwards counted while it ran};
    budget: plan.forward_budget of the planned schedule. A forward outside every test, a test over its budget, or
    a session over the plan's total is a problem, each line naming both numbers; any problem is a failed
    harness-integrity fact (failure_kind). Fewer forwards than the most is no problem: an EOS stops a generation.
    """
    allowed = budget.get("by_test") or {}
    accounted = sum(by_test.values())
    problems = []
    if counted != accounted:
        problems.append(f"forwards: the session ran {counted}, its tests ran {accounted}: "
                        f"{counted - accounted} ran outside every test")
    if counted > budget.get("at_most", 0):
        problems.append(f"forwards: the session ran {counted}, the plan allows at most {budget.get('at_most', 0)}")
    for nodeid, forwards in by_test.items():
        if forwards > allowed.get(nodeid, 0):
            problems.append(f"forwards: {nodeid} ran {forwards}, the plan allows it at most {allowed.get(nodeid, 0)}")
    return {"counted": counted, "accounted_by_tests": accounted, "planned_at_most": budget.get("at_most", 0),
            "by_test": {nodeid: {"forwards": forwards, "planned_at_most": allowed.get(nodeid, 0)}
                        for nodeid, forwards in by_test.items() if forwards or allowed.get(nodeid, 0)},
            "ok": not problems, "problems": problems, "how": FORWARDS_HOW}


def forwards_failed(end: dict) -> bool:
    """Whether session_end's forward reconciliation found a forward the plan does not account for."""
    reconciliation = end.get("forward_reconciliation")
    return isinstance(reconciliation, dict) and reconciliation.get("ok") is False


def measured_nothing(outcome_counts: dict) -> bool:
    """Whether no test ran to an outcome other than a skip: nothing passed, failed or errored."""
    return not any(int(outcome_counts.get(outcome) or 0) for outcome in ("passed", "failed", "error"))


# The checks a failed acquisition fails with it: the acquisition itself, and the files it should have verified.
SPECIMEN_CHECKS = ("acquisition", "artifacts_verified")


NOTHING_MEASURED_EXIT = 5  # pytest's "no tests ran" (ExitCode.NO_TESTS_COLLECTED): a selection that measured nothing
HARNESS_FAILED_EXIT = 1  # pytest's "tests failed" (ExitCode.TESTS_FAILED): a session-level integrity fact failed


def session_exit_status(end: dict, exit_status: int, ok_status: int, interrupted_status: int) -> int:
    """The exit status a session ends with, given pytest's and session_end: an interrupted session says so (pytest
    may not know: a second Ctrl-C inside its own interrupt handling left 0); one whose tests all passed still fails
    when the session's forward count does not match its plan (no test carries that fact), and one that measured
    nothing does not exit as a success. Any other status is pytest's own."""
    if end.get("interrupted"):
        return interrupted_status
    if exit_status != ok_status:
        return exit_status
    if forwards_failed(end):
        return HARNESS_FAILED_EXIT
    if end.get("measured_nothing"):
        return NOTHING_MEASURED_EXIT
    return exit_status


CHECK_KINDS = ("integrity", "diagnostic")  # a harness-integrity check, or a protocol diagnostic (its failure a finding)


def failure_kind(end: dict, outcome_counts: dict) -> Optional[str]:
    """'acquisition' when the specimen could not be acquired and every failed test is one that checks its
    acquisition or files (nothing could be measured, and nothing else failed: not a harness fault);
    'harness' when a harness-integrity check failed or errored (or pytest ended badly with no test failing);
    'findings' when only protocol diagnostics failed: the protocol ran and found something; None when nothing
    failed. A session_end without failures_by_check_kind (an older one) counts every failure as the harness's."""
    by_kind = end.get("failures_by_check_kind")
    failed = int(outcome_counts.get("failed") or 0) + int(outcome_counts.get("error") or 0)
    if forwards_failed(end):  # a harness-integrity fact of the whole session, whatever the tests said
        return "harness"
    acquisition = end.get("acquisition_failure") if isinstance(end.get("acquisition_failure"), dict) else None
    if isinstance(by_kind, dict) and failed and failed == sum(by_kind.get(k, 0) for k in CHECK_KINDS):
        if acquisition is not None and not by_kind.get("diagnostic") \
                and by_kind.get("integrity") == acquisition.get("failed_tests"):
            return "acquisition"
        return "harness" if by_kind.get("integrity") else "findings"
    if failed or end.get("exit_code_name") not in ("OK", None):
        return "harness"
    return None


def failure_clause(end: dict, outcome_counts: dict) -> str:
    """What the status line adds for failures: the harness failed, or the protocol ran and found something."""
    kind = failure_kind(end, outcome_counts)
    by_kind = end.get("failures_by_check_kind") if isinstance(end.get("failures_by_check_kind"), dict) else {}
    if kind == "findings":
        count = by_kind.get("diagnostic", 0)
        return (f"; the protocol ran and found {count} finding(s): failed protocol diagnostic(s), kept with their "
                f"evidence; no harness-integrity check failed")
    clause = ""
    if kind == "acquisition":
        return ("; no harness check failed: the acquisition's reason and the next steps are printed once, above, "
                "and in the report")
    if kind == "harness" and by_kind.get("integrity"):
        clause = (f"; the HARNESS FAILED: {by_kind['integrity']} harness-integrity check(s) failed or errored, so its "
                  f"results cannot be trusted until the cause is fixed")
    if forwards_failed(end):
        problems = end["forward_reconciliation"].get("problems") or ["no problem named"]
        more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
        clause += (f"; the HARNESS FAILED its forward count ({problems[0]}{more}: session_end forward_reconciliation), "
                   f"so the run did not keep to the plan's budget")
    return clause


def status_line(end: dict, outcome_counts: Optional[dict] = None) -> str:
    """One line that says what the run is: a plan, unfinished, partial, or complete; and why."""
    planned, missing = end["tests_planned"], len(end["tests_without_outcome"])
    counts = ", ".join(f"{n} {k}" for k, n in sorted((outcome_counts or {}).items()))
    counts = f" ({counts})" if counts else ""
    if end["plan_only"]:
        head = f"a PLAN only ({planned} tests planned): no test ran and nothing was measured"
    elif end["collect_only"]:
        head = f"collect only (--co): {planned} tests collected, none ran"
    elif end["interrupted"] or end["stopped_early"]:
        head = (f"the run did NOT finish ({end['stop_reason']}): {missing} of {planned} planned tests have no "
                f"outcome{counts}")
    elif end["exit_code_name"] not in ("OK", "TESTS_FAILED"):
        head = f"the session ended with {end['exit_code_name']}: {missing} of {planned} planned tests have no outcome"
    elif missing:
        head = f"{missing} of {planned} planned tests have no outcome{counts}"
    else:
        head = f"the session reached its end: all {planned} planned tests have an outcome{counts}"
    # Leaving out the optional extension keeps a run complete, but the line says it is not there.
    optional = end.get("optional_left_out") or []
    left_out = ("; the optional extension was left out: " + "; ".join(optional)) if optional else ""
    head += failure_clause(end, outcome_counts or {}) if not (end["plan_only"] or end["collect_only"]) else ""
    if end.get("measured_nothing"):
        exits = (f"but its forward count failed too, so the session exits with status {HARNESS_FAILED_EXIT}"
                 if forwards_failed(end) else f"so the session exits with status {NOTHING_MEASURED_EXIT}")
        head = (f"NOTHING was measured: every one of the {planned} selected tests was skipped (the checks they need "
                f"were not in the selection; each skip names the one it waited for), {exits}; " + head)
    elif failure_kind(end, outcome_counts or {}) == "acquisition" and not (end["plan_only"] or end["collect_only"]):
        cause = (end.get("acquisition_failure") or {}).get("cause") or "the acquisition failed"
        head = f"NOTHING was measured: the specimen could not be acquired ({cause}); " + head
    if end.get("environment_changed_during_run"):
        head += ("; the ENVIRONMENT CHANGED during the run (" + "; ".join(end["environment_changed_during_run"]) +
                 "), so what the manifest recorded at its start may not be what ran")
    if end["partial_reasons"]:
        return f"{head}; PARTIAL, not the complete protocol: " + "; ".join(end["partial_reasons"]) + left_out
    if end["complete"]:
        return f"{head}; the plan is the complete protocol" + left_out
    return head


def outcome_suffix(end: dict, outcome_counts: dict) -> Optional[str]:
    """The suffix a run made under --runs-dir gets for how it ended; None for a complete run that passed.

    -incomplete: it did not reach its end; -failed: the harness failed (a harness-integrity check failed or
    errored); -findings: the protocol ran and only protocol diagnostics failed (a finding, not a broken
    harness); -partial: not the complete protocol; -partial-failed and -partial-findings: both, so that
    `ls runs` tells them from a complete run. The records say the same (session_end failures_by_check_kind).
    """
    if end["plan_only"]:
        return None
    if end["interrupted"] or end["stopped_early"] or end["collect_only"] or end["tests_without_outcome"]:
        return "-incomplete"
    kind = failure_kind(end, outcome_counts)
    ending = {"harness": "failed", "acquisition": "failed", "findings": "findings", None: None}[kind]
    if not end["protocol_complete"]:
        return f"-partial-{ending}" if ending else "-partial"
    return f"-{ending}" if ending else None
