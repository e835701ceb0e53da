"""A run's report, report.md, from its record folder alone (no model): the evidence the lab asks the tool to
summarize, in tables. Here: the page's frame, the run's status (its verdict: can the evidence be trusted?) and what
ran; the other sections are evidence.py's and costs.py's. The report answers no question (`report DIR --after`).

render_report() is a pure function of what the session has written when it renders (records.jsonl, plan.json, the
manifest fields that do not change at session end, the tensors), so `report DIR --check` reproduces it byte for
byte; the command line renders with after_session=True, and only then does a manifest never finalised enter the
verdict (the session renders before it writes that manifest). REPORT_RENDERER_VERSION (in the manifest) names the
text this renderer writes; check() does not compare pages another version wrote.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from inferlab.files import spelled, write_text_atomic
from inferlab.measure import usage
from inferlab.read.runview import DIAGNOSTIC, FAILING, INTEGRITY, RunView, short_test
from inferlab.run.endings import evidence_lines
from inferlab.run.records import PREDICTIONS_FILE, REPORT_FILE, REPORT_RENDERER_VERSION
from inferlab.report import costs, evidence
from inferlab.report.evidence import MISSING, cell, code, jstr, num, table

PAGES = (REPORT_FILE,)
SYNTHETIC_BANNER = "SYNTHETIC SPECIMEN - NOT PYTHIA"
Run = Union[Path, str, RunView]  # a record folder, or a view of one already read


def view_of(run: Run) -> RunView:
    return run if isinstance(run, RunView) else RunView.read(Path(run))


def skip_text(outcome: dict) -> str:
    lines = evidence_lines(outcome.get("longrepr"))
    return outcome.get("skip_reason") or (lines[0] if lines else "(no reason recorded)")


class Labels:
    """F1, F2 … for failed tests and R1, R2 … for distinct skip reasons, in record order; and why a record is
    missing (a failed or skipped producer, a run that stopped, a selection that left it out)."""

    def __init__(self, view: RunView):
        self.view, self.failed, self.reasons, end = view, {}, {}, view.session_end or {}
        signals = ", ".join(dict.fromkeys(map(str, end.get("signals") or []))) or end.get("stop_reason")
        self.stop = ("the run did not finish" if view.session_end is None else f"the run was interrupted ({signals})"
                     if end.get("interrupted") else f"the run stopped early ({end.get('stop_reason')})"
                     if end.get("stopped_early") else None)
        for outcome in view.tests_by_outcome().values():
            if outcome.get("outcome") in FAILING:
                self.failed[id(outcome)] = f"F{len(self.failed) + 1}"
            elif outcome.get("outcome") == "skipped":
                self.reasons.setdefault(skip_text(outcome), f"R{len(self.reasons) + 1}")

    def brief(self, outcome: Optional[dict]) -> str:
        """'failed, F1' / 'skipped, R2' / 'not reached: …': a cell standing in for what a test did not record."""
        if outcome is None:
            return f"not reached: {self.stop}" if self.stop else "no outcome recorded"
        state = outcome.get("outcome")
        label = self.failed.get(id(outcome)) if state in FAILING else self.reasons.get(skip_text(outcome))
        return f"{state}, {label}" if label else str(state)

    def absent(self, kind: str) -> list[str]:
        """'No `kind` record (why).' from what became of the tests that write it."""
        missing = self.view.why_missing(kind)
        if missing.reason == "evidence":
            why = self.brief(self.view.decisive_outcome(missing.evidence.get("test")))
        elif missing.reason in ("ran", "deselected", "not_planned"):
            why = "no record, although the test passed" if missing.reason == "ran" else "not in this run's schedule"
        else:
            why = f"not reached: {self.stop}" if self.stop else "no record and no outcome explains it"
        return [f"No `{kind}` record ({why}).", ""]


# --- the verdict: can the evidence be trusted, and is it the whole protocol? --------------------------------

# In order of precedence: the first that applies is the headline, the others follow it as facts.
KINDS = ("collect_only", "records_damaged", "finish_abandoned", "not_finished", "interrupted", "stopped_early",
         "partial", "missing_outcomes", "acquisition_failed", "environment_changed", "integrity_failed",
         "forwards_unreconciled", "diagnostic_failed", "skipped", "unexpected_exit", "passed")
MEASURED_KINDS = ("input", "generation", "cache_comparison", "timing_trial", "memory", "batching")
UNPROTECTED = "Nothing in this folder is protected by the manifest's hashes."


@dataclass
class Verdict:
    """The headline kind and sentence, the other statements that apply, and what they rest on."""

    kind: str
    headline: str
    kinds: list[str] = field(default_factory=list)  # every kind that applies, headline first
    facts: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)  # (check kind, outcome) -> number of tests
    not_reached: list[str] = field(default_factory=list)
    measured_anything: bool = False


def acquisition_failure(view: RunView) -> Optional[str]:
    """The recorded reason the specimen could not be acquired, in full; None when acquisition did not fail."""
    for record in view.kind("artifact_acquisition"):
        if record.get("ok") is False or record.get("status") == "failed":
            return str(record.get("error") or "no error message was recorded")
    failed = acquisition_outcomes(view)
    return " ".join(evidence_lines(failed[0].get("longrepr"))) or "no message was recorded" if failed else None


def acquisition_outcomes(view: RunView) -> list[dict]:
    producers = set(view.producers("artifact_acquisition"))
    return [o for t, o in view.tests_by_outcome().items() if t in producers and o.get("outcome") in FAILING]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def decide(run: Run, after_session: bool = False) -> Verdict:
    """One run's verdict from its records, plan and manifest; after_session as in the module docstring."""
    view = view_of(run)
    ended, end, decisive = view.session_end is not None, view.session_end or {}, view.tests_by_outcome()
    counts = collections.Counter((view.check_kind(o), o.get("outcome")) for o in decisive.values())
    failing = {kind: [o for o in decisive.values() if view.check_kind(o) == kind and o.get("outcome") in FAILING]
               for kind in (INTEGRITY, DIAGNOSTIC)}
    skipped = collections.Counter(skip_text(o) for o in decisive.values() if o.get("outcome") == "skipped")
    not_reached = view.planned_without_outcome()
    not_reached += [t for t in end.get("tests_without_outcome") or [] if t not in not_reached]
    planned = len(view.planned) or end.get("tests_planned") or len(decisive)
    ran = f"{len(decisive)} of {planned} planned tests have an outcome"
    acquisition, unfinalised = acquisition_failure(view), after_session and not view.final_manifest_written
    shortfalls = (view.plan or {}).get("shortfalls") or []
    reasons = list(dict.fromkeys(map(str, (end.get("partial_reasons") or []) + shortfalls)))
    if end.get("protocol_complete") is False and not reasons:
        reasons.append("the collected schedule is not the complete protocol (no reason was recorded)")
    subject = {id(o) for o in acquisition_outcomes(view)} if acquisition is not None else set()
    integrity = [o for o in failing[INTEGRITY] if id(o) not in subject]  # the acquisition's failure is the headline
    forwards = end.get("forward_reconciliation") if isinstance(end.get("forward_reconciliation"), dict) else {}
    stopped = end.get("stop_reason") or end.get("exit_code_name")
    said = {kind: text for kind, applies, text in (
        ("collect_only", end.get("collect_only"), "Tests were only collected (`--collect-only`): nothing ran, so "
         "there is no verdict."),
        ("records_damaged", view.read_problems, f"**The run's files could not all be read** "
         f"({'; '.join(view.read_problems[:3])}{'; …' if len(view.read_problems) > 3 else ''}): evidence may be "
         f"missing; `{spelled('verify DIR')}` checks every file against the manifest's hashes."),
        ("finish_abandoned", unfinalised and ended, "**The run's final writes were abandoned.** It has a "
         "`session_end` record, but `manifest.json` is still the one written at its start: the session stopped while "
         f"writing its final files. {UNPROTECTED} {ran}."),
        ("not_finished", not ended, "**The run did not finish.** It has no `session_end` record: the process was "
         f"killed or crashed. {ran}; the results cover only those." + (f" {UNPROTECTED}" if unfinalised else "")),
        ("interrupted", end.get("interrupted"), f"**The run was interrupted** ({stopped}). {ran}; the rest did not "
         "run."),
        ("stopped_early", end.get("stopped_early") and not end.get("interrupted"), f"**The run stopped early** "
         f"({stopped}). {ran}; the rest did not run."),
        ("partial", reasons, "**Partial run: not the complete protocol.** Why: " + "; ".join(reasons) + ". Its "
         "results cover only the tests it selected."),
        ("missing_outcomes", not_reached and ended and not end.get("interrupted") and not end.get("stopped_early"),
         f"**{plural(len(not_reached), 'planned test')} recorded no outcome.**"),
        ("acquisition_failed", acquisition is not None, "**The specimen could not be acquired, so nothing was "
         "measured.**"),
        ("environment_changed", end.get("environment_changed_during_run"), "**The environment changed during the "
         "run** (" + "; ".join(map(str, end.get("environment_changed_during_run") or [])) + "): the hashes and "
         "versions the manifest recorded at its start may not describe the code that ran."),
        ("integrity_failed", integrity, f"**{plural(len(integrity), 'harness-integrity check')} failed**: the files, "
         "controls, plan or a trial's execution are not as the protocol requires, so the results that depend on "
         "them cannot be trusted until the cause is fixed."),
        ("forwards_unreconciled", forwards.get("ok") is False, "**The session's forward count does not match its "
         "plan** (" + "; ".join(map(str, (forwards.get("problems") or ["no problem named"])[:3])) + "): the run did "
         "not keep to the protocol's budget, and its results cannot be trusted until the cause is fixed."),
        ("diagnostic_failed", failing[DIAGNOSTIC], f"**{plural(len(failing[DIAGNOSTIC]), 'protocol diagnostic')} "
         "failed**, and " + ("read them after the integrity failure is fixed" if integrity or forwards.get("ok") is
                             False else "every harness-integrity check that ran passed") + ". A failed diagnostic "
         "is a finding about the computation, kept with its evidence; it does not mean the harness is broken."),
        ("skipped", skipped, f"**{plural(sum(skipped.values()), 'planned test')} did not run** (skipped" + (
            f": {next(iter(skipped))}" if len(skipped) == 1 and acquisition is None else ", each for a recorded "
            "reason") + ")."),
    ) if applies}
    if end.get("exit_status") not in (0, None) and not set(said) - {"skipped", "environment_changed"}:
        said["unexpected_exit"] = (f"**pytest ended with exit status {end['exit_status']} "
                                   f"({end.get('exit_code_name')})** although no test failed.")
    said = said or {"passed": f"**Every planned test passed**: {len(decisive)} ({counts[(INTEGRITY, 'passed')]} "
                              f"harness-integrity checks, {counts[(DIAGNOSTIC, 'passed')]} protocol diagnostics); "
                              "the run finished, and its schedule is the complete protocol."}
    kinds = [kind for kind in KINDS if kind in said]
    found = usage.contention_counts(view.kind("timing_trial"))
    timing = ([f"**The timing part was contended**: {found['contended']} of {found['trials']} timing trials did not "
               "have their spans to themselves under the declared rule (marked ‡ in Timing, and kept); rerun on a "
               "quieter machine before citing these timings."] if found["contended"] else [])
    return Verdict(kinds[0], said[kinds[0]], kinds, [said[k] for k in kinds[1:]] + timing, dict(counts), not_reached,
                   any(view.kind(k) for k in MEASURED_KINDS))


def partial_note(verdict: Verdict, view: RunView) -> Optional[str]:
    """A short reason for a plot's title when the run is partial, else None."""
    words = {"not_finished": "the run did not finish", "interrupted": "the run was interrupted", "stopped_early":
             "the run stopped early", "partial": "not the complete protocol", "missing_outcomes": "planned tests "
             "without an outcome"}
    reasons, outcomes = [words[k] for k in verdict.kinds if k in words], len(view.tests_by_outcome())
    planned = len(view.planned) or outcomes
    return "; ".join(reasons) + f"; {outcomes} of {planned} planned tests have an outcome" if reasons else None


# --- the page's frame ------------------------------------------------------------------------------------------


def run_table(view: RunView) -> list[str]:
    """What ran, on what, from where, under which controls."""
    manifest, specimen, end = view.manifest, view.specimen_spec(), view.session_end
    acquisition, files = view.first("artifact_acquisition") or {}, view.kind("artifact_file")
    platform, versions = manifest.get("platform") or {}, manifest.get("distributions") or {}
    model = view.first("model_inspection") or {}
    parameters = [p for p in model.get("parameters") or [] if isinstance(p, dict)]
    modes = [r["forward_mode"] for r in view.records if isinstance(r.get("forward_mode"), dict)]
    forwards, broken = (sum(m.get(k) or 0 for m in modes) for k in ("forwards", "violation_count"))
    predictions, command = manifest.get("predictions") or {}, view.command()[0]
    warned = [r for r in view.records if any(r.get(k) for k in ("warnings", "log_messages", "config_warnings"))]
    rows = [["specimen", cell(f"{specimen.get('name')}: {specimen.get('repo_id')} at {specimen.get('revision')}")
             + (" (**synthetic**)" if view.synthetic else "")],
            ["files", f"{cell(acquisition.get('acquisition'))}, " + ("verified" if acquisition.get("ok") else
                                                                      f"**failed**: {cell(acquisition.get('error'))}")
             + f"; {sum(1 for f in files if f.get('ok') is True)} of {len(files)} files verified (`artifact_file`)"],
            ["environment", cell(f"Python {platform.get('python_version')}, torch {versions.get('torch')}, "
                                 f"transformers {versions.get('transformers')}, {platform.get('os')} "
                                 f"{platform.get('machine')}, {platform.get('cpu_model')} "
                                 f"({platform.get('logical_cpus')} logical CPUs)")
             + "; torch threads " + jstr((view.first("thread_controls") or {}).get("effective"))],
            ["model", cell(f"{model.get('class')}, {model.get('parameter_count')} parameters in "
                           f"{'/'.join(sorted({str(p.get('dtype')) for p in parameters}))} on "
                           f"{'/'.join(sorted({str(p.get('device')) for p in parameters}))}, attention "
                           f"{model.get('attn_implementation')}, training mode {model.get('training')}")
             if model else MISSING],
            ["every forward", f"**{broken} of {forwards} forwards broke the controls**" if broken else
             f"{forwards} forwards in {len(modes)} records, each seen from inside it: all under "
             "`torch.inference_mode()`, none in training mode" if modes else "not observed"],
            ["command", code(command) if command else MISSING],
            ["predictions", f"[{PREDICTIONS_FILE}]({PREDICTIONS_FILE}), sha256 "
             f"`{str(predictions.get('sha256'))[:16]}`…" + (" — **still the blank template**" if predictions.get(
                 "template_unanswered") else "") if predictions.get("supplied") else
             "**none supplied** (`--predictions FILE`)"],
            ["warnings", ", ".join(f"`{r.get('kind')}` seq {r.get('seq')}" for r in warned) or "none captured"],
            ["session end", f"{cell(end.get('exit_code_name'))} (exit status {num(end.get('exit_status'))}); "
             f"{len(view.records)} records" if end else "**not recorded**: the run did not finish"]]
    problems = [f"- reading problem: {cell(p)}" for p in view.read_problems]
    return table(["", ""], rows) + ([""] + problems if problems else [])


def section_status(view: RunView, verdict: Verdict, labels: Labels) -> list[str]:
    """The verdict first, the facts that follow it, the run table, every failure and skip reason with its label."""
    counts = sorted(verdict.counts.items())
    outcomes = "; ".join(f"{label}: " + ", ".join(f"{n} {outcome}" for (k, outcome), n in counts if k == kind)
                         for kind, label in ((INTEGRITY, "harness integrity"), (DIAGNOSTIC, "protocol diagnostics"))
                         if any(k == kind for (k, _), _ in counts))
    lines = ["## Run status", "", f"**Verdict:** {verdict.headline}", ""] + [f"- {fact}" for fact in verdict.facts]
    lines += [f"- Outcomes by kind of check: {outcomes or 'no test outcome recorded'}.", ""] + run_table(view)
    decisive = view.tests_by_outcome().values()
    failures = [[labels.failed[id(o)], code(short_test(o.get("test"))), view.check_kind(o), cell(o.get("phase")),
                 cell(next(iter(evidence_lines(o.get("longrepr"))), "(no message)")), str(o.get("seq"))]
                for o in decisive if id(o) in labels.failed]
    if failures:
        lines += ["", "Failed tests:", ""] + table(["label", "test", "kind of check", "phase", "message", "seq"],
                                                   failures)
    groups = collections.defaultdict(list)
    for outcome in (o for o in decisive if o.get("outcome") == "skipped"):
        groups[skip_text(outcome)].append(view.part_label(outcome.get("test")))
    if groups:
        lines += ["", "Tests that did not run, by reason:", ""] + table(
            ["label", "reason", "tests", "protocol parts"], [[labels.reasons[r], cell(r), str(len(parts)),
                                                              cell(", ".join(dict.fromkeys(parts)))]
                                                             for r, parts in groups.items()])
    if verdict.not_reached:
        shown = ", ".join(map(str, verdict.not_reached[:12])) + (" …" if len(verdict.not_reached) > 12 else "")
        lines += ["", f"Planned but never reached ({len(verdict.not_reached)}): {cell(shown)}"]
    return lines + [""]


def failed_page(view: RunView) -> list[str]:
    """A run that measured nothing: what happened, in full, and what to do next."""
    from inferlab.specimen import acquisition_next_steps

    reason = acquisition_failure(view)
    first = next((o for o in view.tests_by_outcome().values() if o.get("outcome") in FAILING), None)
    lines = ["## What happened", ""]
    if reason is not None:
        acquired = view.first("artifact_acquisition") or {}
        other = acquired.get("other_specimen") if isinstance(acquired.get("other_specimen"), dict) else None
        lines += [(f"`{first.get('test')}` {first.get('outcome')}: " if first else "") + "the specimen's files could "
                  "not be obtained and verified, so no model was loaded and nothing was measured. The recorded reason, "
                  "in full:", "", "```text", reason, "```", "", "## What to do next", ""]
        lines += [f"- {step}" for step in acquisition_next_steps(view.specimen_spec(), acquired.get("acquisition"),
                                                                 other)]
    elif first is not None:
        lines += [f"`{first.get('test')}` {first.get('outcome')}, and nothing was measured after it. Its message, in "
                  "full:", "", "```text", *evidence_lines(first.get("longrepr")), "```"]
    else:
        lines += ["No model computation was recorded and no test failed: every selected test was skipped (reasons "
                  "under Run status)."]
    return lines + ["", f"`{spelled('verify DIR')}` checks that this failure has its evidence.", ""]


def render(view: RunView, verdict: Verdict, plot_errors: Optional[dict] = None) -> str:
    """report.md's Markdown; deterministic in the run's records, plan, stable manifest fields and tensors."""
    from inferlab.report import plots

    labels, plot_errors = Labels(view), dict(plot_errors or {})
    lines = ["# inferlab run report", ""]
    if view.synthetic:
        name = code(str(view.specimen_spec().get("name")), False)
        lines += [f"> **{SYNTHETIC_BANNER}.** This run's specimen ({name}) has pythia-14m's architecture and "
                  "constructed, untrained weights: its text is made up by construction and nothing here describes "
                  "Pythia; only the procedure and the computation carry over.", ""]
    lines += [f"Rendered from this folder's records alone (`{spelled('report DIR')}` prints it again, `--check` "
              "compares it with this file). Every value shown is in the named records of `records.jsonl`.", ""]
    sections = [("status", lambda: section_status(view, verdict, labels))]
    if not verdict.measured_anything:
        sections.append(("failure", lambda: failed_page(view)))
    else:
        sections += [("questions", evidence.section_questions),
                     ("inputs", lambda: evidence.section_inputs(view, labels)),
                     ("trials", lambda: evidence.section_trials(view, labels)),
                     ("repeatability", lambda: evidence.section_repeatability(view)),
                     ("first step", lambda: evidence.section_first_step(view)),
                     ("cache", lambda: evidence.section_cache(view, labels) + plots.links(view, "cache", plot_errors)),
                     ("timing", lambda: costs.section_timing(view, labels) + plots.links(view, "timing", plot_errors)),
                     ("memory", lambda: costs.section_memory(view, labels)),
                     ("batching", lambda: evidence.section_batching(view, labels)),
                     ("limitations", lambda: costs.section_limitations(view))]
    for name, build in sections:
        try:
            lines += build()
        except Exception as error:  # a partial or odd run must still get the rest of its page
            lines += [f"**The {name} section could not be rendered from these records: "
                      f"{cell(f'{type(error).__name__}: {error}')}.**", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# --- the entry points: the session writes the page, the command line prints or checks it -------------------------


def render_report(run: Run, plot_errors: Optional[dict] = None, after_session: bool = False) -> str:
    """report.md's text for a record folder (or a view of one)."""
    view = view_of(run)
    return render(view, decide(view, after_session), plot_errors)


def write_report(run: Run, after_session: bool = False) -> Path:
    """Draw the plots, then write report.md atomically into the record folder; returns its path."""
    from inferlab.report import plots

    view = view_of(run)
    verdict = decide(view, after_session)
    results = plots.write_plots(view.directory, view.records, partial=partial_note(verdict, view),
                                bound_ratios=evidence.bound_ratios(view))
    write_text_atomic(view.directory / REPORT_FILE, render(view, verdict, {r["name"]: r["error"] for r in results
                                                                             if r["error"]}))
    return view.directory / REPORT_FILE


@dataclass
class PageCheck:
    """The page against its regenerated text: 'identical', 'differs' (lines say where), or 'other_renderer'."""

    status: str
    lines: list[str] = field(default_factory=list)


def check(run: Run, after_session: bool = False) -> PageCheck:
    """Render report.md again and compare it with the file, unless another renderer version wrote it."""
    view = view_of(run)
    path = view.directory / REPORT_FILE
    if view.renderer_version != REPORT_RENDERER_VERSION:
        return PageCheck("other_renderer", [
            f"{view.directory}: its pages were rendered by report renderer version {view.renderer_version}, and this "
            f"inferlab renders version {REPORT_RENDERER_VERSION}, so their text is not compared: they are neither "
            f"called identical nor different. `verify` still checks them against the manifest's SHA-256"])
    if not path.is_file():
        return PageCheck("differs", [f"{path} does not exist"])
    old, new = path.read_text(encoding="utf-8"), render_report(view, after_session=after_session)
    first = next((i for i, (a, b) in enumerate(zip(old.splitlines(), new.splitlines())) if a != b),
                 min(len(old.splitlines()), len(new.splitlines())))
    return PageCheck("identical") if old == new else PageCheck(
        "differs", [f"regenerated text differs from {path} from line {first + 1}"])
