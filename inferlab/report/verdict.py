"""The run's verdict: whether it finished, whether it ran the complete protocol, and which kind of check failed.

Harness-integrity checks (hashes, caps, dtype, the plan, each trial's execution) say whether the
evidence can be trusted; protocol diagnostics (greedy identity, the seed rerun, the cache
tolerance, loop versus generate, cache divergence) are findings about the computation. A run is
called "every planned test passed" only when it has a session_end record that says it finished
uninterrupted with the complete protocol, every planned test has an outcome, and all passed.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Optional

from inferlab.files import spelled
from inferlab.read.runview import DIAGNOSTIC, FAILING, INTEGRITY, RunView
from inferlab.report import timing_evidence
from inferlab.report.fmt import skip_text

# In order of precedence: the first that applies is the headline, the others follow it as facts.
KINDS = ("plan_only", "collect_only", "records_damaged", "finish_abandoned", "not_finished", "interrupted", "stopped_early", "partial",
         "missing_outcomes", "acquisition_failed", "environment_changed", "integrity_failed", "forwards_unreconciled",
         "diagnostic_failed",
         "skipped", "unexpected_exit", "passed")
MEASURED_KINDS = ("input", "generation", "cache_comparison", "timing_trial", "memory", "batching")
ACQUISITION_KIND = "artifact_acquisition"  # its producer's failure is the headline's subject, not a second finding


@dataclass
class Verdict:
    """The headline kind and sentence, the other statements that apply, and the counts behind them."""

    kind: str
    headline: str
    kinds: list[str] = field(default_factory=list)  # every kind that applies, headline first
    facts: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)  # (check kind, outcome) -> number of tests
    failing: dict = field(default_factory=dict)  # check kind -> [decisive outcome records]
    skipped: list[dict] = field(default_factory=list)
    not_reached: list[str] = field(default_factory=list)
    finished: Optional[bool] = None
    measured_anything: bool = False


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def acquisition_failure(view: RunView) -> Optional[str]:
    """The recorded reason the specimen could not be acquired, in full; None when acquisition did not fail."""
    for record in view.kind("artifact_acquisition"):
        if record.get("ok") is False or record.get("status") == "failed":
            return str(record.get("error") or "no error message was recorded")
    failed = acquisition_test_failures(view)
    if failed:
        from inferlab.report.fmt import message_lines

        return " ".join(message_lines(failed[0].get("longrepr"))) or "no message was recorded"
    return None


def acquisition_test_failures(view: RunView) -> list[dict]:
    """The failing decisive outcomes of the tests that record the acquisition (the plan says which)."""
    producers = set(view.producers(ACQUISITION_KIND))
    return [o for nodeid, o in view.tests_by_outcome().items() if nodeid in producers and o.get("outcome") in FAILING]


def partial_reasons(view: RunView) -> list[str]:
    """Why the schedule is not the complete protocol: session_end's reasons, then the plan's shortfalls."""
    end = view.session_end or {}
    reasons = [str(r) for r in end.get("partial_reasons") or []]
    reasons += [str(s) for s in (view.plan or {}).get("shortfalls") or [] if str(s) not in reasons]
    if end.get("protocol_complete") is False and not reasons:
        reasons.append("the collected schedule is not the complete protocol (no reason was recorded)")
    return reasons


UNPROTECTED = "Nothing in this folder is protected by the manifest's hashes."


def decide(view: RunView, after_session: bool = False) -> Verdict:
    """The verdict of one run, from its records, plan and manifest.

    after_session: the session is over (the command line renders the report later), so a manifest that was
    never finalised means the run's final writes were abandoned. The session itself renders the report before
    it writes the final manifest, so it leaves this False.
    """
    end = view.session_end
    decisive = view.tests_by_outcome()
    counts = collections.Counter((view.check_kind(o), o.get("outcome")) for o in decisive.values())
    failing = {kind: [o for o in decisive.values() if view.check_kind(o) == kind and o.get("outcome") in FAILING]
               for kind in (INTEGRITY, DIAGNOSTIC)}
    skipped = [o for o in decisive.values() if o.get("outcome") == "skipped"]
    not_reached = view.planned_without_outcome()
    if end is not None and isinstance(end.get("tests_without_outcome"), list):
        not_reached += [t for t in end["tests_without_outcome"] if t not in not_reached]
    planned = len(view.planned) or (end or {}).get("tests_planned") or len(decisive)
    ran = f"{len(decisive)} of {planned} planned tests have an outcome"
    acquisition = acquisition_failure(view)
    reasons = partial_reasons(view)
    exit_status = (end or {}).get("exit_status")

    statements: dict[str, str] = {}
    if view.is_plan_folder:
        statements["plan_only"] = ("This folder is a plan (`--plan`), not a run: `plan.json` lists the schedule. "
                                   "No test ran, so there is no verdict.")
    if end is not None and end.get("collect_only"):
        statements["collect_only"] = ("Tests were only collected (`--collect-only`): nothing ran, so there is no "
                                      "verdict.")
    if view.read_problems:
        statements["records_damaged"] = (
            f"**The run's files could not all be read** ({_plural(len(view.read_problems), 'problem')}: "
            f"{'; '.join(view.read_problems[:3])}{'; …' if len(view.read_problems) > 3 else ''}). What follows "
            f"is rendered from what could be read, so evidence may be missing; `{spelled('verify DIR')}` "
            "checks every file against the manifest's hashes.")
    unfinalised = after_session and not view.final_manifest_written
    if unfinalised and end is not None:
        statements["finish_abandoned"] = (
            "**The run's final writes were abandoned.** It has a `session_end` record, but `manifest.json` is still "
            "the one written when the run started (status \"started\" or no `files` inventory): the session stopped "
            f"(a second interrupt, or a crash) while writing its final files. {UNPROTECTED} {ran}.")
    if end is None and "plan_only" not in statements:
        statements["not_finished"] = (
            f"**The run did not finish.** It has no `session_end` record: the process was killed or crashed before "
            f"the session ended (or an inferlab older than that record wrote it). {ran}; the results cover only "
            "those." + (f" {UNPROTECTED}" if unfinalised else ""))
    if end is not None and end.get("interrupted"):
        why = end.get("stop_reason") or end.get("exit_code_name") or "no reason recorded"
        statements["interrupted"] = f"**The run was interrupted** ({why}). {ran}; the rest did not run."
    elif end is not None and end.get("stopped_early"):
        statements["stopped_early"] = (f"**The run stopped early** ({end.get('stop_reason') or 'no reason recorded'}). "
                                       f"{ran}; the rest did not run.")
    if reasons:
        statements["partial"] = ("**Partial run: not the complete protocol.** Why: " + "; ".join(reasons) +
                                 ". Its results cover only the tests it selected.")
    if not_reached and not {"not_finished", "interrupted", "stopped_early"} & set(statements):
        statements["missing_outcomes"] = (f"**{_plural(len(not_reached), 'planned test')} recorded no outcome** "
                                          "although the session ended.")
    if acquisition is not None:
        statements["acquisition_failed"] = "**The specimen could not be acquired, so nothing was measured.**"
    changed = (end or {}).get("environment_changed_during_run") or []
    if changed:
        statements["environment_changed"] = (
            "**The environment changed during the run** (" + "; ".join(map(str, changed)) + "): a source file was "
            "edited or a package changed while it ran, so the source hashes and versions the manifest recorded at "
            "its start may not describe the code that ran. Run it again without editing the checkout.")
    # the acquisition's own failure is already the headline's subject; other integrity failures are not
    subject = {id(o) for o in acquisition_test_failures(view)} if acquisition is not None else set()
    integrity = [o for o in failing[INTEGRITY] if id(o) not in subject]
    if integrity:
        statements["integrity_failed"] = (
            f"**{_plural(len(integrity), 'harness-integrity check')} failed**: the files, controls, plan "
            "or a trial's execution are not as the protocol requires, so results that depend on them cannot be "
            "trusted until the cause is fixed.")
    reconciliation = (end or {}).get("forward_reconciliation")
    if isinstance(reconciliation, dict) and reconciliation.get("ok") is False:
        problems = [str(p) for p in reconciliation.get("problems") or []] or ["no problem named"]
        statements["forwards_unreconciled"] = (
            "**The session's forward count does not match its plan** (" + "; ".join(problems[:3]) +
            ("; …" if len(problems) > 3 else "") + "; `session_end` `forward_reconciliation`): a harness-integrity "
            "fact, so the run did not keep to the protocol's budget and its results cannot be trusted until the "
            "cause is fixed.")
    if failing[DIAGNOSTIC]:
        lead = ("every harness-integrity check that ran passed" if not integrity
                and "forwards_unreconciled" not in statements else "read them after the integrity failure is fixed")
        statements["diagnostic_failed"] = (
            f"**{_plural(len(failing[DIAGNOSTIC]), 'protocol diagnostic')} failed**, and {lead}. A failed "
            "diagnostic is a finding about the computation, kept with its evidence; it does not mean the harness "
            "is broken.")
    if skipped:
        why = collections.Counter(skip_text(o) for o in skipped)
        shown = len(why) == 1 and acquisition is None
        statements["skipped"] = (f"**{_plural(len(skipped), 'planned test')} did not run** (skipped"
                                 + (f": {next(iter(why))}" if shown else ", each for a recorded reason") + ").")
    if exit_status not in (0, None) and not set(statements) - {"skipped", "environment_changed"}:
        statements["unexpected_exit"] = (f"**pytest ended with exit status {exit_status} "
                                         f"({end.get('exit_code_name')})** although no test failed.")
    if not statements:
        statements["passed"] = (
            f"**Every planned test passed**: {len(decisive)} of {planned} "
            f"({counts[(INTEGRITY, 'passed')]} harness-integrity checks, {counts[(DIAGNOSTIC, 'passed')]} protocol "
            "diagnostics); the run finished, and its schedule is the complete protocol.")
    ordered = [kind for kind in KINDS if kind in statements]
    # whether the timing samples had the CPU is a fact about the machine, never the headline
    timing = timing_evidence.status_fact(view)
    return Verdict(kind=ordered[0], headline=statements[ordered[0]], kinds=ordered,
                   facts=[statements[k] for k in ordered[1:]] + ([timing] if timing else []),
                   counts=dict(counts), failing=failing, skipped=skipped, not_reached=not_reached,
                   finished=None if end is None else not (end.get("interrupted") or end.get("stopped_early")),
                   measured_anything=any(view.kind(k) for k in MEASURED_KINDS))


PARTIAL_KINDS = {"not_finished": "the run did not finish", "interrupted": "the run was interrupted",
                 "stopped_early": "the run stopped early", "partial": "not the complete protocol",
                 "missing_outcomes": "planned tests without an outcome"}


def partial_note(verdict: Verdict, view: RunView) -> Optional[str]:
    """A short reason for a plot title when the run is partial ('the run did not finish; 60 of 105 ...'), else None."""
    reasons = [PARTIAL_KINDS[k] for k in verdict.kinds if k in PARTIAL_KINDS]
    if not reasons:
        return None
    planned = len(view.planned) or len(view.tests_by_outcome())
    return "; ".join(reasons) + f"; {len(view.tests_by_outcome())} of {planned} planned tests have an outcome"


def outcome_summary(verdict: Verdict) -> str:
    """'harness integrity: 60 passed, 1 failed; protocol diagnostics: 37 passed' from the verdict's counts."""
    parts = []
    for kind, label in ((INTEGRITY, "harness integrity"), (DIAGNOSTIC, "protocol diagnostics")):
        numbers = sorted((outcome, n) for (k, outcome), n in verdict.counts.items() if k == kind)
        if numbers:
            parts.append(f"{label}: " + ", ".join(f"{n} {outcome}" for outcome, n in numbers))
    return "; ".join(parts) or "no test outcome recorded"
