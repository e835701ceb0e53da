"""report.md: the one page a learner reads: the verdict and the run table first, then the sections of a run that
measured something (sections.py, checklist.py), or the short page of one that did not, or of a plan. The
tables come from tables.py and measures.py; the full records sit on the detail page (details.py), which
every section links.

A run that measured nothing (it failed at acquisition or loading) gets a short page: what happened,
in full, what to do next, and what did not run.
"""

from __future__ import annotations

from typing import Callable, Optional

from inferlab.files import spelled
from inferlab.run.records import PREDICTIONS_FILE, RECORDS_FILE
from inferlab.report import details as details_page
from inferlab.report import checklist, measures, sections, tables
from inferlab.specimen import acquisition_next_steps
from inferlab.report.fmt import (
    MISSING,
    bullet_list,
    code,
    jstr,
    num,
    table,
    text_cell,
)
from inferlab.read.runview import RunView
from inferlab.report.verdict import Verdict, acquisition_failure, outcome_summary

SYNTHETIC_BANNER = "SYNTHETIC SPECIMEN - NOT PYTHIA"
SYNTHETIC_KINDS = {  # what each offline specimen is, by name; any other synthetic spec says so generically
    "standin": "the stand-in: pythia-14m's architecture, constructed (not trained) weights and a made-up vocabulary",
    "replica": "the replica: pythia-14m's real small files (tokenizer, configuration, weight layout) holding "
               "constructed (not trained) weights",
}
DETAILS_FILE = details_page.DETAILS_FILE
see = sections.see


def _banner(view: RunView) -> list[str]:
    if not view.synthetic:
        return []
    specimen = view.manifest.get("specimen") if isinstance(view.manifest.get("specimen"), dict) else {}
    name = str(specimen.get("name") or "")
    what = SYNTHETIC_KINDS.get(name.split("-")[0], "a synthetic checkpoint with pythia-14m's architecture and "
                                                  "constructed weights")
    return [f"> **{SYNTHETIC_BANNER}.** This run's specimen ({code(name or MISSING, False)}) is {what}. Nothing "
            "here describes Pythia: its text is made up by construction and says nothing about language or any "
            "trained model; only the procedure and the computation checks carry over.", ""]


def _predictions_cell(view: RunView) -> str:
    predictions = view.manifest.get("predictions")
    if not isinstance(predictions, dict):
        return MISSING
    if not predictions.get("supplied"):
        return "**none supplied** (`--predictions FILE`); Part 1 asks for them before any output is seen"
    cell = f"[{PREDICTIONS_FILE}]({PREDICTIONS_FILE}), sha256 {code(str(predictions.get('sha256', MISSING))[:16])}…"
    if predictions.get("template_unanswered"):
        cell += " — **still the blank template: no question is answered**"
    return cell


def _offline_cell(view: RunView) -> str:
    options = view.manifest.get("options") if isinstance(view.manifest.get("options"), dict) else {}
    guard = view.first("offline_guard") or {}
    probe = f"; probe: {text_cell(guard.get('outcome'))}" if guard else ""
    if options.get("offline"):
        blocked = options.get("network_blocked_for_session")
        by = f" ({code(str(options['offline_from']))})" if options.get("offline_from") else ""
        return (f"**yes**{by}: every network connection refused for the whole session" if blocked is not False
                else f"**yes**{by or ' (`--offline`)'}, but the session-wide block is not recorded") + probe
    if options.get("offline") is False:
        return "no: network connections were allowed" + probe
    return MISSING


ACQUISITION_WORDS = {"download": "bounded download", "reuse:artifacts_dir": "local reuse (`--artifacts`)",
                     "reuse:project_cache": "reuse of the project cache",
                     "built_offline": "built offline (not a download)"}
REUSE_METHODS = ("reuse:artifacts_dir", "reuse:project_cache")  # a folder that fails verification is refused


def _files_cell(view: RunView) -> str:
    """How the specimen's files were obtained, labelled by the outcome ('verified' only when it was), and how
    many files present passed their checks."""
    acquisition = view.first("artifact_acquisition") or {}
    files = view.kind("artifact_file")
    method = acquisition.get("acquisition")
    words = ACQUISITION_WORDS.get(method, text_cell(method))
    ok = acquisition.get("ok")
    if ok is None and acquisition.get("status") in ("ok", "failed"):
        ok = acquisition["status"] == "ok"
    if ok is True:
        words += ", verified"
    elif ok is False:
        lines = [line.strip() for line in str(acquisition.get("error") or "").splitlines() if line.strip()]
        why = " ".join(lines[:2]) + (" …" if len(lines) > 2 else "") if lines else "no error was recorded"
        why = why.rstrip(".")  # the cell goes on after it with '; 
        words += f", {'refused' if method in REUSE_METHODS else 'failed'}: {text_cell(why)}"
    if not files:
        return f"{words}; no file was examined"
    present = [f for f in files if f.get("present") is not False]
    ok = sum(1 for f in present if f.get("ok") is True)
    absent = [f.get("name") for f in files if f.get("absent_at_revision")]
    missing = [f.get("name") for f in files if f.get("present") is False and not f.get("absent_at_revision")]
    references = [f.get("reference", {}).get("status") for f in files if isinstance(f.get("reference"), dict)]
    cell = f"{words}; {ok} of {len(present)} files present verified"
    if absent:
        cell += f"; absent at the revision: {', '.join(map(str, absent))}"
    if missing:
        cell += f"; missing from this copy (not checked against the hub): {', '.join(map(str, missing))}"
    if references:
        counts = {s: references.count(s) for s in ("matches", "differs", "absent") if s in references}
        cell += "; against the published reference copies: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    return cell


def _lock_cell(view: RunView) -> str:
    """The installed distributions against requirements.lock at the start of the run: every difference."""
    check = view.manifest.get("lock_check")
    if not isinstance(check, dict):
        return "not checked (the inferlab that wrote this run did not compare the lock)"
    if check.get("error"):
        return f"**could not be read**: {text_cell(check['error'])}"
    if not check.get("found"):
        return f"**no {text_cell(check.get('file'))}** beside the experiment, so nothing was compared"
    differences = [d for d in check.get("differences") or [] if isinstance(d, dict)]
    python = f"Python {text_cell(check.get('python_running'))}"
    if not differences:
        return f"matches {code(str(check.get('file')))}: {num(check.get('pins'))} pins, {python}"
    shown = "; ".join(f"{text_cell(d.get('name'))} locked {text_cell(d.get('locked') or 'not pinned')}, "
                      f"installed {text_cell(d.get('installed') or 'missing')}" for d in differences)
    return f"**{len(differences)} difference(s) from {code(str(check.get('file')))}**: {shown}"


def _forwards_cell(view: RunView) -> str:
    """What the watch inside every forward saw (inferlab.measure.forward_mode): inference mode on, the model not
    training."""
    modes = [r["forward_mode"] for r in view.records if isinstance(r.get("forward_mode"), dict)]
    if not modes:
        return "not observed (no record of this run carries `forward_mode`)"
    forwards = sum(m.get("forwards") or 0 for m in modes)
    broken = sum(m.get("violation_count") or 0 for m in modes)
    if broken:
        return (f"**{broken} of {forwards} forwards broke the controls** (outside `torch.inference_mode()` or in "
                f"training mode); each record's `forward_mode` names them")
    return (f"{forwards} forwards in {len(modes)} records, each seen from inside it: all under "
            f"`torch.inference_mode()`, none in training mode")


def _warnings_cell(view: RunView) -> str:
    found = measures.warnings_by_record(view)
    if not found:
        return "none captured"
    count = sum(len(messages) for _, messages in found)
    return f"**{count} captured** in {len(found)} record(s): {see('Warnings')}"


def plan_page(view: RunView) -> list[str]:
    """A plan folder: what the schedule holds per protocol part, its totals and caps; no verdict."""
    rows = [[row[0], row[1]] for row in tables.not_run_by_part(view)]
    plan = view.plan or {}
    return ["## The plan", ""] + table(["protocol part", "planned tests"], rows) + [
        "", f"Totals: {jstr(plan.get('totals'), False)}; cap violations: {jstr(plan.get('cap_violations'), False)}; "
        f"shortfalls: {jstr(plan.get('shortfalls'), False)}. Every test, in order, is in `plan.json`.", ""] + \
        run_table(view)


def run_table(view: RunView) -> list[str]:
    """What ran, on what, from where: specimen, files, offline, command, predictions, session end, records."""
    command, source = view.command()
    end = view.session_end
    specimen = view.specimen_spec()
    rows = [
        ["specimen", text_cell(f"{specimen.get('name', MISSING)}: {specimen.get('repo_id', MISSING)} at "
                               f"{specimen.get('revision', MISSING)}") + (" (**synthetic**)" if view.synthetic else "")],
        ["files", _files_cell(view)],
        ["offline", _offline_cell(view)],
        ["environment lock", _lock_cell(view)],
        ["every forward", _forwards_cell(view)],
        ["command", (code(command) + ("" if source == "as typed" else f" ({source})")) if command else MISSING],
        ["predictions", _predictions_cell(view)],
        ["session end", (f"{text_cell(end.get('exit_code_name'))} (exit status {num(end.get('exit_status'))})"
                         if end else "**not recorded**: the run did not finish")],
        ["warnings", _warnings_cell(view)],
        ["records", f"{len(view.records)} in `{RECORDS_FILE}`; started {text_cell(view.manifest.get('started_utc'))}"],
    ]
    lines = table(["", ""], rows) + [""]
    problems = [f"- reading problem: {text_cell(p)}" for p in view.read_problems]
    problems += [f"- an earlier report attempt failed (seq {r.get('seq')}): {text_cell(r.get('error'))}"
                 for r in view.kind("report_error")]
    return lines + (problems + [""] if problems else [])


def section_verdict(verdict: Verdict) -> list[str]:
    """The verdict first, then every other statement that applies, then the outcomes by kind of check."""
    return ["## Run status", "", f"**Verdict:** {verdict.headline}", ""] + bullet_list(verdict.facts) + [
        f"- Outcomes by kind of check: {outcome_summary(verdict)}.", ""]


def section_status(view: RunView, verdict: Verdict, labels: tables.Labels) -> list[str]:
    """The verdict, the run table, and every failure and skip reason with its label."""
    lines = section_verdict(verdict) + run_table(view)
    failures = tables.failure_rows(view, labels)
    if failures:
        lines += ["Failed tests (the whole message; tracebacks on " + see("Test outcomes") + "):", ""]
        lines += table(["label", "test", "kind of check", "phase", "message", "seq"], failures) + [""]
    skips = tables.skip_rows(view, labels)
    if skips:
        lines += ["Tests that did not run, by reason:", ""]
        lines += table(["label", "reason", "tests", "protocol parts"], skips) + [""]
    if verdict.not_reached:
        lines += [f"Planned but never reached ({len(verdict.not_reached)}): "
                  + text_cell(", ".join(map(str, verdict.not_reached[:12])))
                  + (" …" if len(verdict.not_reached) > 12 else ""), ""]
    return lines


# --- the short page of a run that measured nothing --------------------------------------------------


def failed_page(view: RunView, verdict: Verdict) -> list[str]:
    """What happened (in full), what to do next, what did not run, and what the run was."""
    from inferlab.report.fmt import message_lines

    reason = acquisition_failure(view)
    first = next((o for o in view.tests_by_outcome().values() if o.get("outcome") in ("failed", "error")), None)
    lines = ["## What happened", ""]
    if reason is not None:
        failed = f"`{first.get('test')}` {first.get('outcome')}: " if first is not None else ""
        lines += [f"{failed}the specimen's files could not be obtained and verified, so no model was loaded and "
                  "nothing was measured. The recorded reason, in full:", "", "```text", reason, "```", "",
                  "## What to do next", ""]
        failed = view.first("artifact_acquisition") or {}
        other = failed.get("other_specimen") if isinstance(failed.get("other_specimen"), dict) else None
        lines += bullet_list(acquisition_next_steps(view.specimen_spec(), failed.get("acquisition"), other))
    elif first is not None:
        lines += [f"`{first.get('test')}` {first.get('outcome')}, and nothing was measured after it. Its message, in "
                  "full:", "", "```text", *message_lines(first.get("longrepr")), "```"]
    else:
        lines += ["No model computation was recorded, and no test failed: every test this run selected was skipped, "
                  "for the reasons below (a check they need was left out of the selection, for example)."]
    lines += ["", "## What did not run", ""]
    lines += table(["protocol part", "planned", "passed", "failed", "did not run"], tables.not_run_by_part(view))
    reasons = {o.get("skip_reason") for o in verdict.skipped}
    names = "the failure above" if reason is not None or first is not None else "why it did not run"
    lines += ["", f"Every test that did not run was skipped for a recorded reason ({len(reasons)} distinct; each names "
              f"{names}): " + see("Test outcomes") + ".", "", "## This run", ""]
    lines += run_table(view)
    recorded = sorted({str(r.get("kind")) for r in view.records} - {"test_outcome"})
    lines += [f"Records of kinds {', '.join(f'`{k}`' for k in recorded) or '(none)'}; the environment and the "
              f"specimen spec: {see('Environment')}, {see('Artifacts')}. `{spelled('verify DIR')}` checks that "
              "this failure has its evidence.", ""]
    return lines


def section_details_index() -> list[str]:
    """The closing links to every section of the detail page."""
    return ["## Everything else", "",
            "The detail page holds the records behind every section: "
            + ", ".join(see(name) for name in details_page.SECTIONS) + ".", ""]


def render(view: RunView, verdict: Verdict, plot_errors: Optional[dict] = None) -> str:
    """report.md's Markdown for one run; deterministic in its records, plan, stable manifest fields and tensors."""
    plot_errors = dict(plot_errors or {})
    labels = tables.Labels(view)
    lines = ["# inferlab run report", ""] + _banner(view)
    lines += [f"Rendered from this directory's records alone (`{spelled('report DIR')}` rebuilds it; `verify` "
              f"re-checks it). Full records behind each section: [{DETAILS_FILE}]({DETAILS_FILE}).", ""]
    parts: list[tuple[str, Callable[[], list[str]]]]
    if verdict.kind == "plan_only":
        parts = [("status", lambda: section_verdict(verdict)), ("plan", lambda: plan_page(view))]
    elif not verdict.measured_anything:
        parts = [("status", lambda: section_verdict(verdict)), ("failure", lambda: failed_page(view, verdict))]
    else:
        parts = [("status", lambda: section_status(view, verdict, labels)),
                 ("conditions", lambda: sections.section_conditions(view)),
                 ("trials", lambda: sections.section_trials(view, labels)),
                 ("repeatability", lambda: sections.section_repeatability(view)),
                 ("first-step distribution", lambda: sections.section_first_step(view)),
                 ("cache", lambda: sections.section_cache(view, labels, plot_errors)),
                 ("timing", lambda: sections.section_timing(view, labels, plot_errors)),
                 ("memory", lambda: sections.section_memory(view, labels)),
                 ("batching", lambda: sections.section_batching(view, labels)),
                 ("limitations", lambda: sections.section_limitations(view)),
                 ("checklist", lambda: checklist.section_checklist(view)),
                 ("conclusions", lambda: checklist.section_conclusions(view)),
                 ("details", section_details_index),
                 ]
    for name, build in parts:
        try:
            lines += build()
        except Exception as error:  # a partial or odd run must still get the rest of its page
            lines += [f"**The {name} section could not be rendered from these records: "
                      f"{text_cell(f'{type(error).__name__}: {error}')}.**", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
