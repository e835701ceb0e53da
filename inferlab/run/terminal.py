"""What a session prints at its end (the inferlab section), and how pytest's own output is kept from repeating
a long failure message under every test it stopped.

Given a write function (`write(line, **markup)`, as pytest's terminal reporter has) and the run; no pytest
import. The records always keep every text in full: only what is printed is shortened.
"""

from __future__ import annotations

from typing import Callable, Optional

from inferlab import protocol
from inferlab.base.records import RECORDS_FILE, REPORT_FILE
from inferlab.run.checks import first_line

ACQUISITION_CHECK = "acquisition"  # the check whose failure the summary explains with next steps
SEE_FAILURES = "[its message: see FAILURES above]"
SEE_SUMMARY = "[the reason: see the inferlab summary below]"


def specimen_line(specimen: dict) -> str:
    """One line naming the run's specimen; a synthetic one is said to be synthetic, and not Pythia."""
    name, repo_id, revision = specimen.get("name"), specimen.get("repo_id"), specimen.get("revision")
    line = f"specimen: {name} ({repo_id} at revision {revision})"
    if specimen.get("synthetic"):
        line += (f"; SYNTHETIC, not Pythia: its weights are constructed, so nothing this run measures describes "
                 f"{protocol.PINNED_REPO_ID}")
    return line


def write_summary(write: Callable[..., None], run) -> None:
    """The inferlab section's lines: record dir, specimen, outcomes, failures, predictions, acquisition, status."""
    from inferlab.specimen import acquisition_next_steps

    write(f"record dir: {run.record_dir}")
    for line in getattr(run, "ended_elsewhere", []):
        write(line, yellow=True)
    rename = run.ending.rename
    if rename and not rename["renamed"]:
        write(f"record dir: NOT renamed to end in {rename['suffix']} ({rename['error']}); its name does not "
              f"say how the run ended, its manifest does", red=True)
    specimen = run.invocation.specimen or {}
    synthetic = bool(specimen.get("synthetic"))
    write(specimen_line(specimen), yellow=synthetic, bold=synthetic)
    for line in run.ending.environment_changed:
        write(f"environment: CHANGED during the run: {line} (the manifest keeps what was found at the start)",
              red=True)
    counts = ", ".join(f"{n} {k}" for k, n in sorted(run.outcomes.counts.items())) or "no experiment tests ran"
    write(f"outcomes: {counts}")
    for line in run.outcomes.failure_lines:
        write(line)
    predictions = run.predictions or {}
    end = run.ending.session_end
    plan_only = bool(end and end["plan_only"])
    if predictions.get("template_unanswered"):
        write(f"predictions: {predictions['source']} is still the unanswered template "
              f"({predictions['template_check']}). The run goes on, and the manifest says so; the lab asks for "
              f"your predictions before you look at any output.")
    elif not predictions.get("supplied") and not plan_only:
        write("predictions: none supplied (--predictions FILE); the lab asks for them before you look at any output")
    keyword = ((run.schedule.plan or {}).get("selection") or {}).get("keyword")
    if run.schedule.missing and keyword:
        from inferlab.run.checks import include_hint

        write(f"skipped for prerequisites outside the selection: to run them all, "
              f"{include_hint(keyword, run.schedule.missing.values())}", yellow=True)
    acquisition = run.ledger.checks.get(ACQUISITION_CHECK) or {}
    if acquisition.get("status") in ("failed", "error"):
        write("")
        write("The specimen could not be acquired, so nothing was measured. The reason:", bold=True)
        for line in (run.log.acquisition_error or acquisition.get("reason") or "(not recorded)").splitlines():
            write(f"  {line}")
        write("Next steps:", bold=True)
        failed = next(iter(run.records_of("artifact_acquisition")), {})
        other = failed.get("other_specimen")
        for number, step in enumerate(acquisition_next_steps(specimen, failed.get("acquisition"), other),
                                      start=1):
            write(f"  {number}. {step}")
        write("")
    if (run.record_dir / REPORT_FILE).exists():
        write(f"report: {run.record_dir / REPORT_FILE}")


def write_last_line(write: Callable[..., None], run) -> None:
    """The session's last line, after pytest's own counts: what the run is, and whether a failure is the
    harness's (red) or a finding of the protocol that ran (yellow)."""
    from inferlab.run import session_status

    end = run.ending.session_end
    if end is None:
        return
    kind = session_status.failure_kind(end, run.outcomes.counts)
    harness = (not end["complete"] and not end["plan_only"]) or kind in ("harness", "acquisition") \
        or bool(end.get("measured_nothing"))
    write(f"inferlab: {end['status']}", bold=True, red=harness, yellow=kind == "findings" and not harness)


def outcome_of(report) -> tuple[str, Optional[str], Optional[str]]:
    """(outcome, full text, skip reason) of one pytest report: passed, failed (in the call), error (in setup or
    teardown) or skipped; the text is the longrepr in full."""
    outcome = "skipped" if report.skipped else ("failed" if report.when == "call" else "error") \
        if report.failed else "passed"
    text = None if report.longrepr is None else \
        (report.longreprtext if hasattr(report, "longreprtext") else str(report.longrepr))
    return outcome, text, skip_reason(report.longrepr, text) if report.skipped else None


def skip_reason(longrepr, text: Optional[str]) -> str:
    """A skipped test's reason: from pytest's (path, lineno, reason) form, else the message of its text."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return first_line(text)


def shortened_longrepr(longrepr, outcome: str, provides, run, seq: int):
    """What pytest should print instead of a test's longrepr, or None to print it as it is.

    The failed acquisition points to the summary, which explains it once with the next steps; a skip
    whose reason quotes a message printed elsewhere says where instead of repeating it.
    """
    from inferlab.run.session_status import SPECIMEN_CHECKS

    acquisition_error = run.log.acquisition_error
    if outcome == "failed" and ACQUISITION_CHECK in provides and acquisition_error:
        return (f"The specimen could not be acquired. The reason and the next steps are printed once, "
                f"in full, in the inferlab summary below; the traceback is kept in {RECORDS_FILE} seq {seq}.")
    acquired = acquisition_failed_check(run)
    if outcome in ("failed", "error") and set(provides) & set(SPECIMEN_CHECKS) and acquired and acquisition_error:
        # A file check of the copy the acquisition refused: its own problem in one line, never a traceback.
        problem = first_line(str(longrepr)).removeprefix("AssertionError: ")
        return (f"{problem} (one of the reasons the specimen could not be acquired: the reason and the next steps "
                f"are printed once in the inferlab summary below; the full text is kept in {RECORDS_FILE} seq {seq})")
    if outcome != "skipped" or not (isinstance(longrepr, tuple) and len(longrepr) == 3):
        return None
    path, lineno, reason = longrepr
    shorter = shortened_skip_reason(str(reason), known_messages(run.ledger.checks, acquisition_error))
    if acquired and acquisition_error and (SEE_SUMMARY in shorter or any(
            f"prerequisite '{name}' failed" in shorter for name in SPECIMEN_CHECKS)):
        # Every skip that the failed acquisition explains is one line of -ra's summary, at the acquisition test:
        # each test's own reason stays in its record.
        return (str(run.invocation.root / acquired["by"].split("::")[0]), None, NOT_ACQUIRED_SKIP)
    return (path, lineno, shorter) if shorter != reason else None


NOT_ACQUIRED_SKIP = (f"not run: the specimen could not be acquired, so no test could use it {SEE_SUMMARY[:-1]}; "
                     f"each test's own reason is kept in {RECORDS_FILE}]")


def acquisition_failed_check(run) -> Optional[dict]:
    """The ledger's acquisition check when it failed (its `by` names the test), else None."""
    check = run.ledger.checks.get(ACQUISITION_CHECK) or {}
    return check if check.get("status") in ("failed", "error") and check.get("by") else None


def known_messages(checks: dict, acquisition_error: Optional[str]) -> dict:
    """Failure messages printed once elsewhere in the output -> where: each failed check's reason
    (pytest's FAILURES section) and the acquisition error (the inferlab summary)."""
    found = {check["reason"]: SEE_FAILURES for check in checks.values()
             if check["status"] in ("failed", "error") and check.get("reason") and len(check["reason"]) > 40}
    if acquisition_error:
        found[acquisition_error] = SEE_SUMMARY
        for message in list(found):  # the failed check's message quotes the acquisition error
            if acquisition_error in message and message != acquisition_error:
                found[message] = SEE_SUMMARY
    return found


def shortened_skip_reason(reason: str, known: dict) -> str:
    """A skip reason with every message printed elsewhere replaced by where it is printed (longest first)."""
    for message, pointer in sorted(known.items(), key=lambda item: -len(item[0])):
        reason = reason.replace(message, pointer)
    return reason


def start_lines(run) -> list[str]:
    """What the run says at its start: earlier runs found killed and renamed, and predictions that do not answer
    every question, said while they can still be fixed (before any output exists)."""
    predictions = run.predictions or {}
    unanswered = ([f"predictions: {predictions['answers']}: stop now (Ctrl-C) and complete them before you see "
                   "any output, or the grade will say so"] if predictions.get("supplied")
                  and len(predictions.get("answered", [])) < 6 else [])
    return list(run.ended_elsewhere) + unanswered
