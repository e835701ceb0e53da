"""The after-run page: what was written before the run beside what was written after it, each labelled as what
it is. `python -m inferlab report DIR --after` prints it; it is never written into the run folder.

It is rendered from the run's records, its manifest and its addenda (inferlab.reading.addenda), every time anew:
  - the predictions (predictions.md, copied by the session before any model computation, with the SHA-256
    and times the manifest holds) beside the latest attached explanation, question by question (a
    prediction's heading "N. ..." meets the explanation's "N. ..."), then the explanation's conclusions
    and limitations;
  - the declared cache criterion and its verdict as the session recorded them, beside every revised one
    (the run's --revised-cache-criterion, and each `inferlab revise` addendum), per prefix;
  - every addendum with its ledger entry, and whether it is intact now (inferlab.read.verify's check).
report.md stays the session's own page, checkable with `report --check`; this page depends on what was
attached later, so it has no place among the session's files.
"""

from __future__ import annotations

import json
import re
from typing import Optional

from inferlab.read.addenda import (
    EXPLANATION_KIND,
    REVISED_KIND,
    entry_findings,
    stored_path_error,
)
from inferlab.writing import headings as sections
from inferlab.files import spelled
from inferlab.run.records import PREDICTIONS_FILE
from inferlab.read.runview import RunView
from inferlab.report.fmt import MISSING, code, table, text_cell, yes_no
from inferlab.report.page import SYNTHETIC_BANNER

NUMBERED = re.compile(r"^(\d+)[.)]\s*")
NOTHING = "*(nothing written under this heading)*"
DASH_CELL = "—"


def _quote(lines: list[str]) -> list[str]:
    """The lines as a Markdown quote, blank lines at either end dropped; a note when nothing is left."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return [f"> {line}".rstrip() for line in lines] if lines else [NOTHING]


def _read(view: RunView, relative: str) -> Optional[str]:
    try:
        return (view.directory / relative).read_text(encoding="utf-8", errors="replace")
    except (OSError, TypeError):
        return None


def _addendum_text(view: RunView, entry: Optional[dict]) -> Optional[str]:
    """An addendum's text, only from a regular file directly under addenda/ (never through a link or '..')."""
    if entry is None or view.directory is None or stored_path_error(entry.get("file")) is not None:
        return None
    path = view.directory / entry["file"]
    return _read(view, entry["file"]) if path.is_file() and not path.is_symlink() else None


def _numbered(text: Optional[str]) -> dict[int, tuple[str, list[str]]]:
    """{N: (heading, lines under it)} for every heading that starts with a number 'N.'."""
    found = {}
    for _, heading, body in sections(text or ""):
        match = NUMBERED.match(heading)
        if match:
            found.setdefault(int(match.group(1)), (heading, body))
    return found


def form_of(structure) -> str:
    """The explanation's structure check, as the ledger recorded it, in words."""
    if not isinstance(structure, dict) or structure.get("ok") is None:
        return "not checked"
    if structure.get("ok"):
        return f"every heading of {structure.get('template')}, each with text of its own"
    missing, empty = structure.get("headings_missing") or [], structure.get("empty_sections") or []
    parts = ([f"{len(missing)} heading(s) of {structure.get('template')} missing ({'; '.join(missing)})"]
             if missing else []) + ([f"{len(empty)} section(s) holding only the template's guidance "
                                     f"({'; '.join(empty)})"] if empty else [])
    return text_cell(", and ".join(parts))


class AfterPage:
    """One run's after-run page, built from its view (read from disk: the addenda are files)."""

    def __init__(self, view: RunView):
        self.view = view
        from inferlab.read.verify import manifest_sha256

        self.manifest_now = manifest_sha256(view)
        self.findings = {entry.get("seq"): entry_findings(view.directory, entry, self.manifest_now)
                         for entry in view.addenda} if view.directory is not None else {}
        self._problems: Optional[list[str]] = None

    @property
    def problems(self) -> list[str]:
        """What verify says of the addenda (inferlab.read.verify), once: empty when every addendum is intact
        and listed. `report --after` exits 1 when it is not."""
        if self._problems is None:
            from inferlab.read.verify import addenda_problems

            self._problems = addenda_problems(self.view)
        return self._problems

    def origin(self, entry: dict, in_full: bool = True) -> str:
        """Where an addendum comes from, as its ledger says, and whether it is intact now (why not, in_full)."""
        findings = self.findings.get(entry.get("seq"))
        state = "intact" if not findings else "**changed since it was attached**" + (
            ": " + "; ".join(findings) if in_full else " (below)")
        unfinished = "" if entry.get("run_finished", True) else f"; attached to a run that was {entry.get('run_state')}"
        return (f"{code(str(entry.get('file')), False)}, attached {text_cell(entry.get('attached_utc'))} by "
                f"`{entry.get('tool')}` (addenda.jsonl seq {entry.get('seq')}, sha256 "
                f"{code(str(entry.get('sha256'))[:16], False)}…){unfinished}; now: {state}")

    # --- the page ---------------------------------------------------------------------------------

    def render(self) -> str:
        """The whole page as Markdown."""
        view = self.view
        name = view.directory.name if view.directory is not None else "(a run)"
        lines = [f"# Before and after the run: {name}", "",
                 f"> **This is the after-run page, not the run's report.** `{spelled('report DIR --after')}` "
                 "renders it anew from the run's records and the addenda attached after the session (addenda.jsonl, "
                 "addenda/); it is not kept in the run folder (save it elsewhere if you want a copy). report.md is the "
                 "session's own page and stays as the session wrote it. Each part below says whether it was written "
                 "before the run, recorded by the session, or added after it.", ""]
        if view.synthetic:
            lines += [f"> **{SYNTHETIC_BANNER}.** This run's specimen is synthetic: nothing here describes Pythia.", ""]
        lines += self.facts() + self.predictions_and_explanation() + self.criteria() + self.every_addendum()
        return "\n".join(lines).rstrip("\n") + "\n"

    def facts(self) -> list[str]:
        """The run in four rows: where, how its session ended, its manifest now, how many addenda."""
        view = self.view
        how = "finished" if view.ending == "finished" else f"**{view.ending}**: {text_cell(view.unfinished)}"
        rows = [["record dir", code(str(view.directory))], ["how the session ended", how],
                ["manifest.json now", code(str(self.manifest_now)) if self.manifest_now else "**missing**"],
                ["addenda", f"{len(view.addenda)} in addenda.jsonl"]]
        return table(["", ""], rows) + [""]

    def latest(self, kind: str) -> Optional[dict]:
        """The last ledger entry of a kind (the newest version), or None."""
        entries = [entry for entry in self.view.addenda if entry.get("kind") == kind]
        return entries[-1] if entries else None

    def predictions_and_explanation(self) -> list[str]:
        """Where the predictions and the latest explanation come from, then the two side by side."""
        view = self.view
        predictions = view.manifest.get("predictions") if isinstance(view.manifest.get("predictions"), dict) else {}
        lines = ["## Predictions (before the run) beside the explanation (after it)", ""]
        predicted_text = None
        if predictions.get("supplied"):
            now = _sha256_or_none(view.directory / PREDICTIONS_FILE) if view.directory is not None else None
            state = "the copy matches it" if now == predictions.get("sha256") else (
                f"**the copy in the run folder differs from it now** (sha256 {code(str(now), False)})")
            lines.append(f"**Written before the run:** {code(PREDICTIONS_FILE, False)}, copied into the run folder at "
                         f"{text_cell(predictions.get('copied_at_utc'))}, before any model computation (the file was "
                         f"last modified at {text_cell(predictions.get('source_mtime_utc'))}); sha256 in "
                         f"manifest.json {code(str(predictions.get('sha256'))[:16], False)}…, {state}."
                         + (" **It is still the blank template.**" if predictions.get("template_unanswered") else ""))
            predicted_text = _read(view, PREDICTIONS_FILE)
        else:
            lines.append("**Written before the run:** no predictions were supplied (`--predictions FILE`), so there "
                         "is nothing from before the run to set beside the explanation.")
        entry = self.latest(EXPLANATION_KIND)
        explained_text = _addendum_text(view, entry)
        if entry is None:
            lines += ["", "**Written after the run:** no explanation is attached yet. Fill in a copy of "
                      f"explanation.md and keep it with the run: `{spelled('attach DIR FILE')}`.", ""]
        else:
            earlier = [e for e in self.view.addenda if e.get("kind") == EXPLANATION_KIND and e is not entry]
            lines += ["", f"**Written after the run:** the latest explanation, {self.origin(entry)}. Its form when "
                      f"attached: {form_of(entry.get('structure'))} (the form only: the content is for a person to "
                      f"judge)."
                      + (f" Earlier versions, kept too: {', '.join(code(str(e.get('file')), False) for e in earlier)}."
                         if earlier else ""), ""]
        lines += self.questions(predicted_text, explained_text, entry)
        return lines

    def questions(self, predicted_text, explained_text, entry) -> list[str]:
        """Each numbered question: predicted before, revisited after; then the explanation's other sections."""
        predicted, explained = _numbered(predicted_text), _numbered(explained_text)
        lines = []
        for number in sorted(set(predicted) | set(explained)):
            heading = (predicted.get(number) or explained.get(number))[0]
            lines += [f"### {text_cell(heading)}", "", f"*Predicted before the run* ({PREDICTIONS_FILE}):", ""]
            lines += (_quote(predicted[number][1]) if number in predicted
                      else ["*(no such question in the predictions)*"])
            lines += ["", f"*Revisited after the run* ({entry['file'] if entry else 'no explanation attached'}):", ""]
            lines += _quote(explained[number][1]) if number in explained else ["*(not revisited in the explanation)*"]
            lines.append("")
        if explained_text is None:
            return lines
        rest = [(level, heading, body) for level, heading, body in sections(explained_text)
                if level > 1 and not NUMBERED.match(heading) and heading.lower() != "predictions revisited"]
        lines += ["## Conclusions and limitations (written after the run)", ""]
        if not sections(explained_text):
            lines += ["The explanation has no Markdown headings; as attached:", ""]
            lines += _quote(explained_text.splitlines())
        for _, heading, body in rest:
            lines += [f"### {text_cell(heading)}", ""] + (_quote(body) if any(l.strip() for l in body) else []) + [""]
        return lines

    # --- the cache criterion ---------------------------------------------------------------------

    def revisions(self) -> list[tuple[dict, dict]]:
        """(ledger entry, document) of every intact, readable revised-criterion addendum."""
        kept = []
        for entry in self.view.addenda:
            if entry.get("kind") == REVISED_KIND and not self.findings.get(entry.get("seq")):
                try:
                    kept.append((entry, json.loads(_addendum_text(self.view, entry) or "")))
                except ValueError:
                    continue
        return kept

    def criteria(self) -> list[str]:
        """The declared criterion beside every revised one, and their verdicts per prefix."""
        from inferlab.read.addenda import declared_verdict

        view = self.view
        declared = view.first("cache_criterion")
        summary = view.first("cache_summary") or {}
        comparisons = view.kind("cache_comparison")
        lines = ["## The cache criterion: declared, and revised", ""]
        if declared is None and not comparisons:
            return lines + ["The run recorded no cache criterion and no cache comparison.", ""]
        rows = [["declared", code(str((declared or {}).get("rule") or (declared or {}).get("criterion") or MISSING)),
                 f"the protocol's, recorded by the session (cache_criterion seq {(declared or {}).get('seq')}) before "
                 f"any error was computed", DASH_CELL, yes_no(summary.get("all_within_tolerance"))]]
        columns = [("declared (as recorded)", {r.get("prefix_length"): declared_verdict(r) for r in comparisons})]
        during = view.first("cache_criterion_revised")
        if during:
            evaluation = summary.get("revised_evaluation")
            evaluation = evaluation if isinstance(evaluation, dict) else {}
            rows.append(["revised during the run", code(str(during.get("rule"))),
                         f"--revised-cache-criterion, recorded by the session (cache_criterion_revised seq "
                         f"{during.get('seq')})", text_cell(during.get("justification")),
                         yes_no(evaluation.get("all_within_tolerance"))])
            columns.append(("revised during the run", {r.get("prefix_length"): (r.get("revised") or {}).get("passed")
                                                       for r in comparisons if isinstance(r.get("revised"), dict)}))
        for entry, document in self.revisions():
            revised = document.get("revised") or {}
            evaluation = document.get("revised_evaluation") or {}
            rows.append([f"revised after the run (seq {entry.get('seq')})", code(str(revised.get("rule"))),
                         f"`inferlab revise`, {text_cell(entry.get('file'))}, attached "
                         f"{text_cell(entry.get('attached_utc'))}", text_cell(document.get("justification")),
                         yes_no(evaluation.get("all_within_tolerance"))])
            columns.append((f"revised after (seq {entry.get('seq')})",
                            {row.get("prefix_length"): (row.get("revised") or {}).get("passed")
                             for row in document.get("prefixes") or [] if isinstance(row, dict)}))
        lines += table(["criterion", "rule", "what it is", "justification", "every prefix within it"], rows)
        lengths = [r.get("prefix_length") for r in comparisons]
        lines += ["", "Per prefix (within the criterion: yes / **no**):", ""]
        lines += table(["prefix length"] + [name for name, _ in columns],
                       [[text_cell(length)] + [yes_no(verdicts.get(length)) for _, verdicts in columns]
                        for length in lengths])
        lines += ["", "A revised criterion is a second, labelled evaluation of the same saved logits: the declared "
                  "criterion keeps its own verdict, as recorded.", ""]
        return lines

    # --- every addendum ------------------------------------------------------------------------

    def every_addendum(self) -> list[str]:
        """Every ledger entry with its state now, and what verify says of the addenda."""
        lines = ["## Every addendum (added after the session)", ""]
        if not self.view.addenda:
            lines += ["Nothing has been attached to this run.", ""]
        else:
            rows = [[str(e.get("seq")), text_cell(e.get("kind")), self.origin(e, in_full=False)]
                    for e in self.view.addenda]
            lines += table(["seq", "kind", "kept as"], rows) + [""]
        problems = self.problems
        if problems:
            lines += ["**What `verify` says of the addenda:**", ""] + [f"- {text_cell(p)}" for p in problems] + [""]
        return lines


def render(view: RunView) -> str:
    """The after-run page of one run, as Markdown."""
    return AfterPage(view).render()


def _sha256_or_none(path):
    from inferlab.files import sha256_file

    try:
        return sha256_file(path)
    except OSError:
        return None
