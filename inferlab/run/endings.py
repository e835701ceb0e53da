"""How a session ends, honestly: the signals it received, the session_end record and the one line that says what
the run is, its exit status, the name its folder gets, earlier runs found killed, and what the terminal prints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from typing import Callable, Optional

import pluggy

from inferlab import protocol
from inferlab.run.plan import include_hint
from inferlab.files import spelled
from inferlab.run.records import (CLAIM_FILE, ENDED_NAME, MANIFEST_FILE, RECORDS_FILE, RENAME_NOTE, REPORT_FILE,
                                  RecordDirError, rename_incomplete)

hookimpl = pluggy.HookimplMarker("pytest")  # the watch is registered as a plugin of the session (pluggy, not pytest)
CHECK_KINDS = ("integrity", "diagnostic")  # a harness-integrity check, or a protocol diagnostic (a finding)
SPECIMEN_CHECKS = ("acquisition", "artifacts_verified")  # what a failed acquisition fails with it
NOTHING_MEASURED_EXIT, HARNESS_FAILED_EXIT = 5, 1  # pytest's "no tests ran" and "tests failed"


def evidence_lines(longrepr: Optional[str]) -> list[str]:
    """The `E   ...` lines of a pytest longrepr (pytest puts them near the end), in full; else its last line."""
    lines = [line for line in str(longrepr or "").strip().splitlines() if line.strip()]
    return [line.strip()[1:].strip() for line in lines if line.lstrip().startswith("E ")] or lines[-1:]


def first_line(text: Optional[str]) -> str:
    """The message of a failure's text: its first evidence line."""
    return next(iter(evidence_lines(text)), "")


class SignalWatch:
    """Handlers for SIGINT and SIGTERM that remember each signal, by name, in order. A signal stops the session as
    Ctrl-C does (KeyboardInterrupt), also when code swallowed the one before (torch can turn it into a RuntimeError).
    Once pytest is stopping, or the final records are being written, one more is noted and does not tear those
    writes; the next abandons them: one line, and the process exits at once with 128 + the signal's number."""

    def __init__(self, exit_process: Callable[[int], None] = os._exit):
        self.received: list[str] = []  # before the final records began
        self.during_finish: list[str] = []  # while they were written
        self.stopping = self.finishing = False  # pytest unwinds an interrupt; the final records are being written
        self.absorbed = 0
        self.on_abandon: Optional[Callable[[], str]] = None  # where the run stands, said when it is abandoned
        self._previous: dict = {}
        self._exit_process = exit_process

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    @hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.stopping = True  # pytest has the interrupt in hand: a signal from now on is noted, not raised

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        (self.during_finish if self.finishing else self.received).append(name)
        if not (self.stopping or self.finishing):
            raise KeyboardInterrupt(f"{name} received")
        self.absorbed += 1
        if self.absorbed == 1:  # raising would cut short pytest's clean-up or the final records
            sys.stderr.write(f"\ninferlab: {name} received; the run is stopping and writing its final records "
                             f"(seconds). Send it once more to abandon them.\n")
            sys.stderr.flush()
            return
        try:  # one line, never a traceback from whatever ran (a plot, a file write)
            where = self.on_abandon() if self.on_abandon is not None else ""
        except Exception as error:
            where = f"(where the run stands is unknown: {type(error).__name__}: {error})"
        try:
            sys.stdout.flush()
            sys.stderr.write(f"\ninferlab: {name} received again: the final records are abandoned, exiting with "
                             f"status {128 + signum}. {where}".rstrip() + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        self._exit_process(128 + signum)


# --- session_end, its status line, the exit status and the folder's name -------------------------------------------


def stop_reason(*, exit_code_name: str, signals: list[str], should_stop, should_fail, tests_failed: int,
                session_limit_skips: int, refused: Optional[str] = None) -> Optional[str]:
    """Why the session stopped before its end, or None when it ran through its schedule; refused: why the run was
    refused after it claimed its folder (a test order that is not the protocol's)."""
    if signals:
        return f"interrupted by {signals[0]}" + (f", then {len(signals) - 1} more signal(s)" if signals[1:] else "")
    if should_stop:  # before INTERRUPTED, which is how pytest ends a session told to stop
        return f"stopped: {should_stop}" if isinstance(should_stop, str) else "stopped by a plugin or option"
    if exit_code_name == "INTERRUPTED":
        return "interrupted (KeyboardInterrupt or pytest.exit)"
    if should_fail:
        return f"-x/--maxfail after {tests_failed} failure(s)"
    if exit_code_name == "INTERNAL_ERROR":
        return "internal error (see the traceback above the summary)"
    if exit_code_name == "USAGE_ERROR":
        return f"usage error: {refused}" if refused else "usage error"
    if session_limit_skips:
        return f"session limit: {session_limit_skips} test(s) not started after the {protocol.SESSION_LIMIT_S} s limit"
    return None


def reconcile_forwards(counted: int, by_test: dict, budget: dict) -> dict:
    """session_end's forward_reconciliation: the forwards the session's watch counted (counted; by_test: {node id:
    forwards while it ran}) against the plan's forward budget (plan.forward_budget). A forward outside every test,
    a test over its budget or a session over the plan's total is a problem naming both numbers; fewer is none (an
    EOS stops a generation)."""
    allowed, accounted, at_most = budget.get("by_test") or {}, sum(by_test.values()), budget.get("at_most", 0)
    problems = [f"forwards: the session ran {counted}, its tests ran {accounted}: {counted - accounted} ran outside "
                f"every test"] if counted != accounted else []
    problems += [f"forwards: the session ran {counted}, the plan allows at most {at_most}"] if counted > at_most else []
    problems += [f"forwards: {nodeid} ran {n}, the plan allows it at most {allowed.get(nodeid, 0)}"
                 for nodeid, n in by_test.items() if n > allowed.get(nodeid, 0)]
    return {"counted": counted, "accounted_by_tests": accounted, "planned_at_most": at_most,
            "by_test": {nodeid: n for nodeid, n in by_test.items() if n}, "ok": not problems, "problems": problems}


def forwards_failed(end: dict) -> bool:
    return isinstance(end.get("forward_reconciliation"), dict) and end["forward_reconciliation"].get("ok") is False


def session_end(*, exit_status: int, exit_code_name: str, signals: list[str], collect_only: bool, plan_only: bool,
                stop_reason: Optional[str], planned: list[str], with_outcome: set, partial_reasons: list[str],
                outcome_counts: dict, optional_notes: list[str] = (), failures_by_check_kind: Optional[dict] = None,
                acquisition_failure: Optional[dict] = None, environment_changed: list[str] = (),
                forward_reconciliation: Optional[dict] = None) -> dict:
    """The session_end record's fields and its status line. complete: the session reached its end, every planned
    test has an outcome, and the plan is the complete protocol; nothing else may be called complete."""
    without = [nodeid for nodeid in planned if nodeid not in with_outcome]
    interrupted = bool(signals) or exit_code_name == "INTERRUPTED"
    stopped_early = stop_reason is not None and not collect_only and not plan_only
    reached_end = (exit_code_name in ("OK", "TESTS_FAILED") and not interrupted and not stopped_early
                   and not collect_only and not plan_only)
    end = {"exit_status": exit_status, "exit_code_name": exit_code_name, "interrupted": interrupted,
           "signals": list(signals), "stopped_early": stopped_early, "stop_reason": stop_reason,
           "collect_only": collect_only, "plan_only": plan_only, "tests_planned": len(planned),
           "tests_without_outcome": without, "protocol_complete": not partial_reasons,
           "partial_reasons": list(partial_reasons),
           "failures_by_check_kind": {k: int((failures_by_check_kind or {}).get(k, 0)) for k in CHECK_KINDS},
           "acquisition_failure": dict(acquisition_failure) if acquisition_failure else None,
           "measured_nothing": reached_end and bool(planned) and not any(
               outcome_counts.get(outcome) for outcome in ("passed", "failed", "error")),
           "complete": reached_end and not without and not partial_reasons and bool(planned),
           "environment_changed_during_run": list(environment_changed)}
    if forward_reconciliation is not None:
        end["forward_reconciliation"] = forward_reconciliation
    end["status"] = status_line(end, dict(outcome_counts), optional_notes)
    return end


def exit_status(end: dict, pytest_status: int, ok_status: int, interrupted_status: int) -> int:
    """The status the session exits with: interrupted says so (pytest may not know: a second Ctrl-C inside its own
    interrupt handling left 0); all tests passed but a forward the plan does not allow fails (no test carries it);
    a selection that measured nothing is no success. Any other status is pytest's own."""
    if end.get("interrupted"):
        return interrupted_status
    if pytest_status != ok_status:
        return pytest_status
    return HARNESS_FAILED_EXIT if forwards_failed(end) else NOTHING_MEASURED_EXIT if end.get("measured_nothing") \
        else pytest_status


def failure_kind(end: dict, counts: dict) -> Optional[str]:
    """'acquisition' when the specimen could not be acquired and every failed test checks its acquisition or files;
    'harness' when a harness-integrity check failed (or the forward count, or pytest ended badly with no failure);
    'findings' when only protocol diagnostics failed; None when nothing failed. A session_end without
    failures_by_check_kind counts every failure as the harness's."""
    by_kind, acquisition = end.get("failures_by_check_kind"), end.get("acquisition_failure")
    failed = int(counts.get("failed") or 0) + int(counts.get("error") or 0)
    if forwards_failed(end):
        return "harness"
    if isinstance(by_kind, dict) and failed and failed == sum(by_kind.get(k, 0) for k in CHECK_KINDS):
        if isinstance(acquisition, dict) and not by_kind.get("diagnostic") \
                and by_kind.get("integrity") == acquisition.get("failed_tests"):
            return "acquisition"
        return "harness" if by_kind.get("integrity") else "findings"
    return "harness" if failed or end.get("exit_code_name") not in ("OK", None) else None


def status_line(end: dict, counts: Optional[dict] = None, optional_notes=()) -> str:
    """One line that says what the run is: a plan, unfinished, partial or complete; and why."""
    counts = counts or {}
    planned, missing = end["tests_planned"], len(end["tests_without_outcome"])
    told = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    told = f" ({told})" if told else ""
    if end["plan_only"]:
        head = f"a PLAN only ({planned} tests planned): no test ran and nothing was measured"
    elif end["collect_only"]:
        head = f"collect only (--co): {planned} tests collected, none ran"
    elif end["interrupted"] or end["stopped_early"]:
        head = f"the run did NOT finish ({end['stop_reason']}): {missing} of {planned} planned tests have no " \
               f"outcome{told}"
    elif end["exit_code_name"] not in ("OK", "TESTS_FAILED"):
        head = f"the session ended with {end['exit_code_name']}: {missing} of {planned} planned tests have no outcome"
    elif missing:
        head = f"{missing} of {planned} planned tests have no outcome{told}"
    else:
        head = f"the session reached its end: all {planned} planned tests have an outcome{told}"
    kind = failure_kind(end, counts) if not (end["plan_only"] or end["collect_only"]) else None
    by_kind = end.get("failures_by_check_kind") if isinstance(end.get("failures_by_check_kind"), dict) else {}
    if kind == "findings":
        head += (f"; the protocol ran and found {by_kind.get('diagnostic', 0)} finding(s): failed protocol "
                 "diagnostic(s), kept with their evidence; no harness-integrity check failed")
    elif kind == "acquisition":
        head += ("; no harness check failed: the acquisition's reason and the next steps are printed once, above, "
                 "and in the report")
    elif kind == "harness" and by_kind.get("integrity"):
        head += (f"; the HARNESS FAILED: {by_kind['integrity']} harness-integrity check(s) failed or errored, so its "
                 "results cannot be trusted until the cause is fixed")
    if kind and forwards_failed(end):
        problems = end["forward_reconciliation"].get("problems") or ["no problem named"]
        more = f", and {len(problems) - 1} more" if len(problems) > 1 else ""
        head += (f"; the HARNESS FAILED its forward count ({problems[0]}{more}: session_end forward_reconciliation), "
                 "so the run did not keep to the plan's budget")
    if end.get("measured_nothing"):
        exits = (f"but its forward count failed too, so the session exits with status {HARNESS_FAILED_EXIT}"
                 if forwards_failed(end) else f"so the session exits with status {NOTHING_MEASURED_EXIT}")
        head = (f"NOTHING was measured: every one of the {planned} selected tests was skipped (the checks they need "
                f"were not in the selection; each skip names the one it waited for), {exits}; " + head)
    elif kind == "acquisition":
        cause = (end.get("acquisition_failure") or {}).get("cause") or "the acquisition failed"
        head = f"NOTHING was measured: the specimen could not be acquired ({cause}); " + head
    if end.get("environment_changed_during_run"):
        head += ("; the ENVIRONMENT CHANGED during the run (" + "; ".join(end["environment_changed_during_run"]) +
                 "), so what the manifest recorded at its start may not be what ran")
    left_out = ("; the optional extension was left out: " + "; ".join(optional_notes)) if optional_notes else ""
    if end["partial_reasons"]:
        return f"{head}; PARTIAL, not the complete protocol: " + "; ".join(end["partial_reasons"]) + left_out
    return f"{head}; the plan is the complete protocol{left_out}" if end["complete"] else head


def outcome_suffix(end: dict, counts: dict) -> Optional[str]:
    """The suffix a run made under --runs-dir gets for how it ended (None for a complete run that passed):
    -incomplete (it did not reach its end), -failed (the harness failed, or nothing could be acquired), -findings
    (only protocol diagnostics failed), -partial (not the complete protocol), -partial-failed, -partial-findings."""
    if end["plan_only"]:
        return None
    if end["interrupted"] or end["stopped_early"] or end["collect_only"] or end["tests_without_outcome"]:
        return "-incomplete"
    ending = {"harness": "failed", "acquisition": "failed", "findings": "findings"}.get(failure_kind(end, counts))
    if not end["protocol_complete"]:
        return f"-partial-{ending}" if ending else "-partial"
    return f"-{ending}" if ending else None


# --- the terminal ----------------------------------------------------------------------------------------------------

SEE_FAILURES, SEE_SUMMARY = "[its message: see FAILURES above]", "[the reason: see the inferlab summary below]"
NOT_ACQUIRED_SKIP = (f"not run: the specimen could not be acquired, so no test could use it {SEE_SUMMARY[:-1]}; "
                     f"each test's own reason is kept in {RECORDS_FILE}]")


def acquisition_failed(run) -> Optional[dict]:
    """The ledger's acquisition check when it failed, with the error of the acquisition record; else None."""
    check = run.ledger.checks.get(SPECIMEN_CHECKS[0]) or {}
    errors = [str(r["error"]) for r in run.records_of("artifact_acquisition") if r.get("error")]
    return {**check, "error": errors[-1] if errors else None} if check.get("status") in ("failed", "error") else None


def shortened_longrepr(longrepr, outcome: str, provides, run, seq: int):
    """What pytest prints instead of a test's longrepr (the record keeps it whole), or None to print it as it is:
    the failed acquisition and its file checks point to the summary, which explains the failure once with the next
    steps; a skip the failed acquisition explains is one line of -ra's summary; a skip reason quoting a message
    printed elsewhere says where instead of repeating it."""
    failed = acquisition_failed(run)
    error = (failed or {}).get("error")
    if error and outcome == "failed" and SPECIMEN_CHECKS[0] in provides:
        return (f"The specimen could not be acquired. The reason and the next steps are printed once, in full, in the "
                f"inferlab summary below; the traceback is kept in {RECORDS_FILE} seq {seq}.")
    if error and outcome in ("failed", "error") and set(provides) & set(SPECIMEN_CHECKS):
        problem = first_line(str(longrepr)).removeprefix("AssertionError: ")
        return (f"{problem} (one of the reasons the specimen could not be acquired: the reason and the next steps "
                f"are printed once in the inferlab summary below; the full text is kept in {RECORDS_FILE} seq {seq})")
    if outcome != "skipped" or not (isinstance(longrepr, tuple) and len(longrepr) == 3):
        return None
    path, lineno, reason = longrepr
    known = {check["reason"]: SEE_FAILURES for check in run.ledger.checks.values()
             if check["status"] in ("failed", "error") and len(check.get("reason") or "") > 40}
    if error:
        known.update({message: SEE_SUMMARY for message in [*known, error] if error in message})
    shorter = str(reason)
    for message, pointer in sorted(known.items(), key=lambda item: -len(item[0])):
        shorter = shorter.replace(message, pointer)
    if error and (SEE_SUMMARY in shorter or any(f"prerequisite '{c}' failed" in shorter for c in SPECIMEN_CHECKS)):
        return str(run.invocation.root / failed["by"].split("::")[0]), None, NOT_ACQUIRED_SKIP
    return (path, lineno, shorter) if shorter != reason else None


def start_lines(run) -> list[str]:
    """At the start: earlier runs found killed and renamed; predictions that do not answer every question, said
    while they can still be fixed (before any output exists)."""
    predictions = run.predictions or {}
    return list(run.ended_elsewhere) + ([f"predictions: {predictions['answers']}: stop now (Ctrl-C) and complete them "
                                         "before you see any output, or the grade will say so"]
                                        if predictions.get("supplied") and len(predictions.get("answered", [])) < 6
                                        else [])


def summary(write: Callable[..., None], run) -> None:
    """The inferlab section: record dir, specimen, outcomes, failures, predictions, the -k hint, the acquisition."""
    from inferlab.specimen import acquisition_next_steps

    write(f"record dir: {run.record_dir}")
    for line in run.ended_elsewhere:
        write(line, yellow=True)
    if run.rename and not run.rename["renamed"]:
        write(f"record dir: NOT renamed to end in {run.rename['suffix']} ({run.rename['error']}); its name does not "
              f"say how the run ended, its manifest does", red=True)
    specimen = run.invocation.specimen or {}
    synthetic = bool(specimen.get("synthetic"))  # said to be synthetic, and not Pythia
    write(f"specimen: {specimen.get('name')} ({specimen.get('repo_id')} at revision {specimen.get('revision')})" + (
        f"; SYNTHETIC, not Pythia: its weights are constructed, so nothing this run measures describes "
        f"{protocol.PINNED_REPO_ID}" if synthetic else ""), yellow=synthetic, bold=synthetic)
    for line in run.environment_changed:
        write(f"environment: CHANGED during the run: {line} (the manifest keeps what was found at the start)", red=True)
    write("outcomes: " + (", ".join(f"{n} {k}" for k, n in sorted(run.counts.items())) or "no experiment tests ran"))
    for line in run.failure_lines:
        write(line)
    predictions = run.predictions or {}
    if predictions.get("template_unanswered"):
        write(f"predictions: {predictions['source']} is still the unanswered template ({predictions['answers']}). "
              f"The run goes on, and the manifest says so; the lab asks for your predictions before you look at any "
              f"output.")
    elif not predictions.get("supplied") and run.invocation.mode != "plan":
        write("predictions: none supplied (--predictions FILE); the lab asks for them before you look at any output")
    keyword = ((run.plan or {}).get("selection") or {}).get("keyword")
    if run.missing and keyword:
        write(f"skipped for prerequisites outside the selection: to run them all, "
              f"{include_hint(keyword, run.missing.values())}", yellow=True)
    failed = acquisition_failed(run)
    if failed:
        write("")
        write("The specimen could not be acquired, so nothing was measured. The reason:", bold=True)
        for line in (failed["error"] or failed.get("reason") or "(not recorded)").splitlines():
            write(f"  {line}")
        write("Next steps:", bold=True)
        record = next(iter(run.records_of("artifact_acquisition")), {})
        steps = acquisition_next_steps(specimen, record.get("acquisition"), record.get("other_specimen"))
        for number, step in enumerate(steps, start=1):
            write(f"  {number}. {step}")
        write("")
    if (run.record_dir / REPORT_FILE).exists():
        write(f"report: {run.record_dir / REPORT_FILE}")


def last_line(write: Callable[..., None], run) -> None:
    """The session's last line, after pytest's own counts: what the run is; red for the harness's failure or an
    unfinished or empty run, yellow for a finding of the protocol that ran."""
    end = run.session_end
    if end is not None:
        kind = failure_kind(end, run.counts)
        harness = (not end["complete"] and not end["plan_only"]) or kind in ("harness", "acquisition") \
            or bool(end.get("measured_nothing"))
        write(f"inferlab: {end['status']}", bold=True, red=harness, yellow=kind == "findings" and not harness)
    if run.end_unwritten:  # after session_end was made: the folder does not hold that end whole
        write(f"inferlab: its final records were not all written: {run.end_unwritten}", bold=True, red=True)


def abandon_note(run) -> str:
    """Where a run whose final records are abandoned stands; under --runs-dir its folder is renamed -incomplete."""
    try:
        final = json.loads((run.record_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("session_end")
    except (OSError, ValueError, AttributeError):
        final = None
    if final is not None:
        return f"Its final records were written in {run.record_dir}; only the terminal summary is cut short."
    renamed = ""
    if run.invocation.named_by_plugin and not ENDED_NAME.search(run.record_dir.name):
        with contextlib.suppress(RecordDirError, OSError):
            claim = json.loads((run.record_dir / CLAIM_FILE).read_text(encoding="ascii"))
            run.record_dir = rename_incomplete(
                run.record_dir, "its own session abandoned its final records (a stop signal received again while "
                "they were written), so the run did not finish", {"pid": os.getpid(),
                                                                  "command": run.invocation.command},
                run.clock(), claim)
            renamed = f"It is renamed {run.record_dir.name} now ({RENAME_NOTE} says why). "
    return (f"{renamed}{run.record_dir} keeps the manifest written when the run began (complete: false), so it "
            f"reads as unfinished; `{spelled(f'verify {run.record_dir}')}` lists what it holds.")
