"""The after-run page, `report DIR --after` (docs/report.md): the learner's predictions beside their attached
explanation, question by question, and, once an explanation is attached, the tool's own reading of the evidence
beside each answer. Rendered anew from the run's records, manifest and addenda and printed, never written into the
run folder: report.md stays the session's page, checkable with `report --check`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Optional

from inferlab import protocol
from inferlab.files import sha256_file, spelled
from inferlab.measure import usage
from inferlab.read.addenda import EXPLANATION_KIND, REVISED_KIND, declared_verdict, entry_findings, stored_path_error
from inferlab.read.runview import RunView
from inferlab.run.records import PREDICTIONS_FILE
from inferlab.report import SYNTHETIC_BANNER, costs, evidence
from inferlab.report.evidence import MISSING, cell, code, table, yes_no
from inferlab.writing import headings

NUMBERED = re.compile(r"^(\d+)[.)]\s*")
VERDICT_WORDS = {"faster": "faster with the cache", "slower": "slower with the cache",
                 "cannot_tell": "this run cannot tell"}


def quote(lines: list[str]) -> list[str]:
    """The lines as a Markdown quote, blank lines at either end dropped; a note when nothing is left."""
    text = "\n".join(lines).strip("\n").splitlines()
    return [f"> {line}".rstrip() for line in text] if text else ["*(nothing written under this heading)*"]


def numbered(text: Optional[str]) -> dict[int, tuple[str, list[str]]]:
    """{N: (heading, lines under it)} for every heading that starts with a number 'N.'."""
    found = {}
    for _, heading, body in headings(text or ""):
        match = NUMBERED.match(heading)
        if match:
            found.setdefault(int(match.group(1)), (heading, body))
    return found


# --- the tool's reading: what it makes of the evidence, said only beside the learner's answers -----------------


def reading(view: RunView) -> dict:
    """{question number: the tool's reading, as bullet texts; 'conclusions' and 'limitations': its own}."""
    repeat, contended = evidence.repeatability(view), usage.contention_counts(view.kind("timing_trial"))
    return {1: read_greedy(repeat), 2: read_seeds(view, repeat), 3: read_first_step(view), 4: read_cache(view),
            5: read_timing(view, contended), 6: read_memory(view),
            "conclusions": [
                "On selection: the settings change which token is chosen from the same raw logits; greedy selection "
                "repeats exactly in one environment, and sampling repeats when its seed does.",
                "On computation: the cache changes how much of the prefix is recomputed, not what the network "
                "computes (question 4's prefixes); whether that saved time here is question 5's reading."],
            "limitations": [
                "Three seeds per condition estimate no output distribution and pick no best temperature.",
                "One tiny model on CPU, batch one, one thread, short inputs: nothing follows for larger models, GPUs, "
                "long contexts or concurrent serving."]
            + (["The specimen is synthetic: its text says nothing about language."] if view.synthetic else [])
            + (["Contended timing samples: the timing verdicts rest on a busy machine."] if contended["contended"]
               else [])}


def read_greedy(repeat: list[dict]) -> list[str]:
    words = {True: "every recorded greedy repetition selected identical ids",
             False: "the recorded greedy repetitions selected different ids",
             None: "the recorded repetitions cannot decide it"}
    return [f"{r['prompt_id']}: {words[r['greedy']]} — {r['cells'][1]}; the seed-{protocol.RERUN_SEED} rerun: "
            f"{r['cells'][2]}." for r in repeat]


def read_seeds(view: RunView, repeat: list[dict]) -> list[str]:
    records, trials = evidence.generations(view), [t for t in protocol.generation_trials() if t.seed is not None
                                                   and not t.is_rerun]
    same = [f"{a.test_id} = {b.test_id}" for a in trials for b in trials if a.index < b.index
            and (a.prompt_id, a.condition) == (b.prompt_id, b.condition) and a.test_id in records
            and b.test_id in records and records[a.test_id].get("generated_ids") is not None
            and records[a.test_id].get("generated_ids") == records[b.test_id].get("generated_ids")]
    return ["Distinct continuations per condition: " + "; ".join(f"{r['prompt_id']} {r['cells'][3]}" for r in repeat)
            + ".", f"{len(same)} pair(s) of different seeds selected identical ids ({', '.join(same)}): different "
            "seeds need not give different continuations." if same else "No two different seeds selected identical "
            "ids here; three seeds cannot show that they never will, since a concentrated distribution or a tight "
            "filter can leave one candidate."]


def read_first_step(view: RunView) -> list[str]:
    found = []
    for row in evidence.first_step(view):
        if "entropy" not in row:
            found.append(f"{row['prompt_id']}: no usable first-step logits ({row['reason']}).")
            continue
        found.append(f"{row['prompt_id']}: halving the temperature raised the top-1 probability from "
                     f"{row['top1_p'][0]:.3g} to {row['top1_p'][1]:.3g} and cut the entropy from "
                     f"{row['entropy'][0]:.2f} to {row['entropy'][1]:.2f} nats: it reshapes every probability and "
                     f"removes none. Top-p {row['top_p']:g} at temperature 1 kept {row['kept']:,} of {row['vocab']:,} "
                     "ids and removed the rest, leaving the kept ones' ratios as they were." + (
                         " The raw logits were the same under every condition, so the settings changed the selection,"
                         " not what the network computed." if row.get("equal") else ""))
    return found


def read_cache(view: RunView) -> list[str]:
    prefixes = evidence.bound_ratios(view)
    if not prefixes:
        return ["No prefix was compared in this run."]
    worst = max((r["bound_ratio"] for r in prefixes if evidence.is_number(r["bound_ratio"])), default=math.nan)
    agreed = sum(1 for r in prefixes if r.get("argmax_cached") == r.get("argmax_uncached"))
    return [f"{sum(1 for r in prefixes if r.get('passed'))} of {len(prefixes)} prefixes within the declared criterion "
            f"(the worst element at {worst:.3g} of its bound), {sum(1 for r in prefixes if r.get('bitwise_equal'))} "
            f"bitwise equal, argmax agreeing at {agreed}: " + (
                "the cached path computes the same function within the tolerance, reusing the prefix's keys and "
                "values instead of recomputing them; equal mathematics is no promise of identical rounding."
                if all(r.get("passed") for r in prefixes) else "a prefix outside the criterion is a finding: check "
                "masks, positions and stale caches before revising anything.")]


def read_timing(view: RunView, contended: dict) -> list[str]:
    """The timing verdicts in words: faster or slower only when the whole interval lies beyond the declared effect."""
    found = [f"{e['prompt_id']}, {costs.METRIC_NAMES.get(e['metric'], e['metric'])}: "
             f"**{VERDICT_WORDS[e['verdict']]}** ({e['reason']}; {e['samples']} samples)." for e in costs.effects(view)]
    if contended["contended"]:
        found.append(f"{contended['contended']} of {contended['trials']} timing trials were contended: a quieter "
                     "machine may narrow the intervals. A cache saves the repeated prefix work, but at this size the "
                     "per-step overhead may hide it; neither outcome is required.")
    return found or ["No timing trial was measured."]


def read_memory(view: RunView) -> list[str]:
    records = view.kind("memory")
    parameters = next((r.get("unique_bytes") for r in records if r.get("measure") == "parameter_storage"), None)
    cache = max((r.get("unique_bytes") or 0 for r in records if r.get("measure") == "cache_storage"), default=None)
    unmeasured = next((r.get("categories") for r in records if r.get("measure") == "unmeasured"), None) or {}
    return [f"Parameters: {evidence.nbytes(parameters)}; the largest KV cache counted: {evidence.nbytes(cache)}. A "
            "parameter-byte count leaves out that cache and everything the records list as unmeasured: "
            + (", ".join(unmeasured) or MISSING) + ". RSS holds them all mixed with the libraries, so no difference of "
            "two RSS readings isolates one."]


# --- the page ----------------------------------------------------------------------------------------------------


class AfterPage:
    """One run's after-run page, built from its view (read from disk: the addenda are files)."""

    def __init__(self, view: RunView):
        from inferlab.read.verify import addenda_problems, manifest_sha256

        self.view, self.manifest_now = view, manifest_sha256(view)
        self.findings = {e.get("seq"): entry_findings(view.directory, e, self.manifest_now) for e in view.addenda}
        self.problems = addenda_problems(view)  # what verify says of the addenda; `report --after` exits 1 on any

    def text_of(self, entry: Optional[dict]) -> Optional[str]:
        """An addendum's text, only from a regular file directly under addenda/ (never through a link or '..')."""
        if entry is None or stored_path_error(entry.get("file")) is not None:
            return None
        path = self.view.directory / entry["file"]
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() and not path.is_symlink() else None

    def origin(self, entry: dict, in_full: bool = True) -> str:
        """Where an addendum comes from, as its ledger says, and whether it is intact now (why not, in_full)."""
        findings = self.findings.get(entry.get("seq"))
        state = "intact" if not findings else "**changed since it was attached**" + (
            ": " + "; ".join(findings) if in_full else " (below)")
        return (f"{code(str(entry.get('file')), False)}, attached {cell(entry.get('attached_utc'))} by "
                f"`{entry.get('tool')}` (addenda.jsonl seq {entry.get('seq')}, sha256 "
                f"{code(str(entry.get('sha256'))[:16], False)}…); now: {state}")

    def render(self) -> str:
        """The whole page as Markdown."""
        view = self.view
        how = "finished" if view.ending == "finished" else f"**{view.ending}**: {cell(view.unfinished)}"
        lines = [f"# Before and after the run: {view.directory.name}", "",
                 f"> **This is the after-run page, not the run's report.** `{spelled('report DIR --after')}` renders "
                 "it anew from the run's records and what was attached after the session, and it is kept nowhere: "
                 "report.md stays as the session wrote it.", ""]
        lines += [f"> **{SYNTHETIC_BANNER}.** This run's specimen is synthetic: nothing here describes Pythia.", ""] \
            if view.synthetic else []
        lines += table(["", ""], [["record folder", code(str(view.directory))], ["how the session ended", how],
                                  ["manifest.json now", code(str(self.manifest_now)) if self.manifest_now else
                                   "**missing**"], ["addenda", f"{len(view.addenda)} in addenda.jsonl"]]) + [""]
        return "\n".join(lines + self.questions() + self.criteria() + self.every_addendum()).rstrip("\n") + "\n"

    def questions(self) -> list[str]:
        """Where the two texts come from, then each question: predicted, answered, and the tool's reading (only once
        an explanation is attached); then the explanation's conclusions and limitations beside the tool's."""
        explanations = [e for e in self.view.addenda if e.get("kind") == EXPLANATION_KIND]
        entry = explanations[-1] if explanations else None
        lines = ["## The questions: predicted before the run, answered after it, and the tool's reading", ""]
        lines += self.sources(entry, explanations[:-1])
        explained_text = self.text_of(entry)
        predicted, explained = numbered(self.read(PREDICTIONS_FILE)), numbered(explained_text)
        read = reading(self.view) if entry is not None else {}
        for number in sorted(set(predicted) | set(explained) | set(protocol.QUESTIONS)):
            heading = (predicted.get(number) or explained.get(number) or (f"{number}. {protocol.QUESTIONS[number]}",))
            lines += [f"### {cell(heading[0])}", "", f"*Predicted before the run* ({PREDICTIONS_FILE}):", ""]
            lines += quote(predicted[number][1]) if number in predicted else ["*(no such question in the predictions)*"]
            lines += ["", f"*Answered after the run* ({entry['file'] if entry else 'no explanation attached'}):", ""]
            lines += quote(explained[number][1]) if number in explained else ["*(not answered in the explanation)*"]
            if read:
                lines += ["", "*The tool's reading:*", ""] + [f"- {text}" for text in read.get(number, [])]
            lines.append("")
        if explained_text is None:
            return lines
        lines += ["## Conclusions and limitations", ""]
        if not headings(explained_text):
            lines += ["The explanation has no Markdown headings; as attached:", ""] + quote(explained_text.splitlines())
        for level, heading, body in headings(explained_text):
            if level > 1 and not NUMBERED.match(heading) and heading.lower() != "predictions revisited":
                written = quote(body) if any(line.strip() for line in body) else []
                lines += [f"### {cell(heading)}", ""] + written + [""]
        return lines + ["*The tool's reading*, for comparison: the conclusions it would draw from this run,", ""] + [
            f"- {text}" for text in read["conclusions"]] + ["", "and the limitations it would name:", ""] + [
            f"- {text}" for text in read["limitations"]] + [""]

    def sources(self, entry: Optional[dict], earlier: list[dict]) -> list[str]:
        """Where the predictions and the latest explanation come from, and whether each is as it was."""
        predictions = self.view.manifest.get("predictions")
        predictions = predictions if isinstance(predictions, dict) else {}
        if predictions.get("supplied"):
            path = self.view.directory / PREDICTIONS_FILE
            now = sha256_file(path) if path.is_file() else None
            state = ("the copy matches it" if now == predictions.get("sha256") else
                     f"**the copy in the run folder differs from it now** (sha256 {code(str(now), False)})")
            lines = [f"**Written before the run:** {code(PREDICTIONS_FILE, False)}, copied into the run folder at "
                     f"{cell(predictions.get('copied_at_utc'))}, before any model computation (the file was last "
                     f"modified at {cell(predictions.get('source_mtime_utc'))}); sha256 in manifest.json "
                     f"{code(str(predictions.get('sha256'))[:16], False)}…, {state}."
                     + (" **It is still the blank template.**" if predictions.get("template_unanswered") else "")]
        else:
            lines = ["**Written before the run:** no predictions were supplied (`--predictions FILE`)."]
        if entry is None:
            return lines + ["", "**Written after the run:** no explanation is attached yet: fill in a copy of "
                            f"explanation.md and keep it with the run, `{spelled('attach DIR FILE')}`. The tool's "
                            "reading of each question is shown here once it is, beside your answer.", ""]
        structure = entry.get("structure") if isinstance(entry.get("structure"), dict) else {}
        kept = (" Earlier versions, kept too: " + ", ".join(code(str(e.get("file")), False) for e in earlier) + "."
                if earlier else "")
        return lines + ["", f"**Written after the run:** the latest explanation, {self.origin(entry)}; every heading "
                        f"of the template has text of its own: {yes_no(structure.get('ok'))} (its form only; the "
                        f"content is for a person to judge).{kept}", "", "**The tool's reading** (inferlab's own, from "
                        "the records) stands under each answer.", ""]

    def read(self, relative: str) -> Optional[str]:
        try:
            return (self.view.directory / relative).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def criteria(self) -> list[str]:
        """The declared criterion beside every intact revised one, and their verdicts per prefix."""
        view, lines = self.view, ["## The cache criterion: declared, and revised", ""]
        declared, comparisons = view.first("cache_criterion"), view.kind("cache_comparison")
        if declared is None and not comparisons:
            return lines + ["The run recorded no cache criterion and no cache comparison.", ""]
        rows = [["declared", code(str((declared or {}).get("rule") or MISSING)), "the protocol's, recorded by the "
                 f"session (cache_criterion seq {(declared or {}).get('seq')}) before any error was computed", "—",
                 yes_no((view.first("cache_summary") or {}).get("all_within_tolerance"))]]
        columns = [("declared (as recorded)", {r.get("prefix_length"): declared_verdict(r) for r in comparisons})]
        for entry in (e for e in view.addenda if e.get("kind") == REVISED_KIND and not self.findings.get(e.get("seq"))):
            try:
                document = json.loads(self.text_of(entry) or "")
            except ValueError:
                continue
            rows.append([f"revised after the run (seq {entry.get('seq')})",
                         code(str((document.get("revised") or {}).get("rule"))), f"`inferlab revise`, "
                         f"{cell(entry.get('file'))}, attached {cell(entry.get('attached_utc'))}",
                         cell(document.get("justification")),
                         yes_no((document.get("revised_evaluation") or {}).get("all_within_tolerance"))])
            columns.append((f"revised after (seq {entry.get('seq')})", {
                row.get("prefix_length"): (row.get("revised") or {}).get("passed")
                for row in document.get("prefixes") or [] if isinstance(row, dict)}))
        lines += table(["criterion", "rule", "what it is", "justification", "every prefix within it"], rows)
        lines += ["", "Per prefix (within the criterion: yes / **no**):", ""] + table(
            ["prefix length"] + [name for name, _ in columns],
            [[cell(r.get("prefix_length"))] + [yes_no(found.get(r.get("prefix_length"))) for _, found in columns]
             for r in comparisons])
        return lines + ["", "A revised criterion is a second, labelled evaluation of the same saved logits: the "
                        "declared criterion keeps its own verdict, as recorded.", ""]

    def every_addendum(self) -> list[str]:
        """Every ledger entry with its state now, and what verify says of the addenda."""
        lines = ["## Every addendum (added after the session)", ""] + (table(
            ["seq", "kind", "kept as"], [[str(e.get("seq")), cell(e.get("kind")), self.origin(e, in_full=False)]
                                         for e in self.view.addenda]) if self.view.addenda else
            ["Nothing has been attached to this run."]) + [""]
        return lines + (["**What `verify` says of the addenda:**", ""] + [f"- {cell(p)}" for p in self.problems] + [""]
                        if self.problems else [])
