"""The report's tables of what ran: the recorded protocol, outcome labels, the generation trials, repeatability
and the first-step distribution, each a pure function of one run's view (inferlab.read.runview.RunView).

Every function returns plain data or Markdown cells; the pages (page.py, sections.py, details.py) arrange
them with their prose. Rows count from one. A missing record gives a placeholder cell, never an error.
The measurements' tables (cache, timing, memory, batching) are in measures.py.
"""

from __future__ import annotations

import collections
import json
import re
from typing import Any, Optional

from inferlab import protocol
from inferlab.measure import stats as summaries
from inferlab.report import logits as logit_math
from inferlab.report.fmt import (
    MISSING,
    abbreviate_ids,
    code,
    first_message,
    flag,
    is_number,
    jstr,
    num,
    skip_text,
    text_cell,
    yes_no,
)
from inferlab.read.runview import FAILING, RunView, bracket_id, short_test

# A trial cut off by Ctrl-C or a signal records its error as "KeyboardInterrupt: SIGINT received".
INTERRUPTED_ERROR = re.compile(r"^KeyboardInterrupt\b|\bSIG(INT|TERM|HUP|QUIT|KILL)\b")


# --- the recorded protocol (what this run was told to do) -------------------------------------


def recorded_protocol(view: RunView) -> dict:
    """The protocol as the run recorded it (plan.json, else the manifest); the installed one as a fallback."""
    for source in ((view.plan or {}).get("protocol"), view.manifest.get("protocol")):
        if isinstance(source, dict) and isinstance(source.get("conditions"), dict):
            return source
    return protocol.as_dict()


def _inactive(value: Any, zero_means: Optional[str] = None) -> str:
    if value is None:
        return "inactive"
    if zero_means and value == 0:
        return f"0 ({zero_means})"
    return num(value)


def shared_seed_sentence() -> str:
    """Why two conditions run with one seed can look alike: the seed, not their settings (both pages say it)."""
    sampled = [name for name, condition in protocol.CONDITIONS.items() if condition.do_sample]
    return (f"Conditions run with the same seed share the random draws: each sampling trial resets the generator to "
            f"its seed, so {', '.join(sampled[:-1])} and {sampled[-1]} with seed {protocol.SEEDS[0]} draw the same "
            "random numbers. Where their ids or texts look alike, that can come from the shared draws, not because "
            "their settings agree; compare a condition's seeds with one another, not only with another condition's.")


def conditions_table(view: RunView) -> tuple[list[str], list[list[str]]]:
    """G/S1/S2/S3 with their selection rule, temperature, top-p, top-k, seeds and number of trials."""
    recorded = recorded_protocol(view)
    seeds = recorded.get("seeds") or list(protocol.SEEDS)
    repetitions = recorded.get("greedy_repetitions", protocol.GREEDY_REPETITIONS)
    header = ["condition", "selection", "temperature", "top-p", "top-k", "seeds", "trials per prompt"]
    rows = []
    for name, condition in recorded["conditions"].items():
        condition = condition if isinstance(condition, dict) else {}
        sampling = bool(condition.get("do_sample"))
        rerun = f" + seed {protocol.RERUN_SEED} again" if name == protocol.RERUN_CONDITION else ""
        rows.append([f"**{name}**", "sampling" if sampling else "greedy",
                     _inactive(condition.get("temperature")), _inactive(condition.get("top_p")),
                     _inactive(condition.get("top_k"), "disabled"),
                     (", ".join(map(str, seeds)) + rerun) if sampling else "none (deterministic)",
                     str(len(seeds) + (1 if rerun else 0)) if sampling else f"{repetitions} repetitions"])
    return header, rows


# --- outcome labels: a long reason is printed once and referred to by its label -----------------


def run_stop(view: RunView) -> Optional[str]:
    """Why planned work may have left no record: 'the run was interrupted (SIGINT)', 'the run did not finish',
    'the run stopped early (…)'; None when the session ended on its own."""
    end = view.session_end
    if end is None:
        return "the run did not finish"
    if end.get("interrupted"):
        signals = [str(s) for s in end.get("signals") or []]
        why = ", ".join(dict.fromkeys(signals)) or end.get("stop_reason") or end.get("exit_code_name")
        return f"the run was interrupted ({why or 'no reason recorded'})"
    if end.get("stopped_early"):
        return f"the run stopped early ({end.get('stop_reason') or 'no reason recorded'})"
    return None


class Labels:
    """F1, F2 … for failed tests, R1, R2 … for distinct skip reasons, in record order."""

    def __init__(self, view: RunView):
        self.view = view
        self.failed: dict[int, str] = {}
        self.reasons: dict[str, str] = {}
        self.stop = run_stop(view)
        for outcome in view.tests_by_outcome().values():
            if outcome.get("outcome") in FAILING:
                self.failed[id(outcome)] = f"F{len(self.failed) + 1}"
            elif outcome.get("outcome") == "skipped":
                self.reasons.setdefault(skip_text(outcome), f"R{len(self.reasons) + 1}")

    def brief(self, outcome: Optional[dict]) -> str:
        """'failed, F1' / 'skipped, R2' / 'no outcome recorded' for a cell that stands in for missing data."""
        if outcome is None:
            return f"not reached: {self.stop}" if self.stop else "no outcome recorded"
        state = outcome.get("outcome")
        if state in FAILING:
            return f"{state}, {self.failed.get(id(outcome), '?')}"
        if state == "skipped":
            return f"skipped, {self.reasons.get(skip_text(outcome), '?')}"
        return str(state)

    def trial_cell(self, state: str, test_id: str, record: Optional[dict] = None) -> str:
        """'not run (…)', 'interrupted (…)' or '**failed** (…)' for a trial that produced nothing."""
        outcome = self.view.outcome_of_param(test_id)
        if state == "not run":
            return f"not run ({self.brief(outcome)})"
        why = self.brief(outcome) if outcome is not None else text_cell((record or {}).get("error") or MISSING)
        return f"{'interrupted' if state == 'interrupted' else '**failed**'} ({why})"

    def gap(self, *kinds: str) -> str:
        """Why a section has no records of the kinds: the outcome of a test that should have written them, or why
        none ran (the plan says which tests write which kinds)."""
        missing = self.view.why_missing(*kinds)
        if missing.reason == "evidence":
            return self.brief(self.view.decisive_outcome(missing.evidence.get("test")))
        if missing.reason == "ran":
            return "no record, although the test passed"
        if missing.reason == "no_known_producer":
            return "no test is known to write it: the plan, of schema 1, declares no record kinds"
        if missing.reason in ("deselected", "not_planned"):
            return "not in this run's schedule"
        return f"not reached: {self.stop}" if self.stop else "no record and no outcome explains it"


def failure_rows(view: RunView, labels: Labels) -> list[list[str]]:
    """One row per failed or errored test: label, test, check kind, phase, message (uncut)."""
    rows = []
    for outcome in view.tests_by_outcome().values():
        if outcome.get("outcome") in FAILING:
            rows.append([labels.failed.get(id(outcome), "?"), code(short_test(outcome.get("test"))),
                         view.check_kind(outcome), text_cell(outcome.get("phase")),
                         text_cell(first_message(outcome.get("longrepr")) or "(no message)"), str(outcome.get("seq"))])
    return rows


def skip_rows(view: RunView, labels: Labels) -> list[list[str]]:
    """One row per distinct skip reason: label, reason (uncut), how many tests, which protocol parts."""
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for outcome in view.tests_by_outcome().values():
        if outcome.get("outcome") == "skipped":
            groups[skip_text(outcome)].append(outcome.get("test"))
    return [[labels.reasons.get(reason, "?"), text_cell(reason), str(len(tests)),
             text_cell(", ".join(dict.fromkeys(view.part_label(t) for t in tests)))]
            for reason, tests in groups.items()]


def not_run_by_part(view: RunView) -> list[list[str]]:
    """Per protocol part: tests planned, passed, and not run (skipped or no outcome) or failed."""
    planned = [e.get("test") for e in view.planned] or list(view.tests_by_outcome())
    decisive = view.tests_by_outcome()
    rows: dict[str, collections.Counter] = {}
    for nodeid in planned:
        counter = rows.setdefault(view.part_label(nodeid), collections.Counter())
        outcome = decisive.get(nodeid)
        counter["planned"] += 1
        counter[outcome.get("outcome") if outcome else "no outcome"] += 1
    return [[part, str(c["planned"]), str(c["passed"]), str(c["failed"] + c["error"]),
             str(c["skipped"] + c["no outcome"])] for part, c in rows.items()]


# --- generation ---------------------------------------------------------------------------------


def generation_by_trial(view: RunView) -> dict[str, dict]:
    """The generation records keyed by protocol trial id (records without an id are left out)."""
    found = {}
    for record in view.kind("generation"):
        trial_id = record.get("trial_id") or bracket_id(record.get("test"))
        if trial_id and trial_id not in found:
            found[trial_id] = record
    return found


def text_of(record: dict) -> str:
    """A continuation's text as an escaped JSON string; an empty decode shows as `""`."""
    text = record.get("text")
    return jstr(text) if isinstance(text, str) else MISSING


def trial_state(record: Optional[dict], needs_ids: bool = True) -> str:
    """'ok', 'failed', 'interrupted' or 'not run' for one trial's record (None when the trial left none).

    Only an ok record holds what the trial selected; a failed one holds its error, and one whose error
    is a KeyboardInterrupt or names a signal was cut off by the interruption, not failed by itself.
    """
    if record is None:
        return "not run"
    if record.get("status", "ok") == "ok" and (not needs_ids or isinstance(record.get("generated_ids"), list)):
        return "ok"
    return "interrupted" if INTERRUPTED_ERROR.search(str(record.get("error") or "")) else "failed"


def shortfall(states: list[str]) -> str:
    """'1 failed, 2 not run' for the trials among `states` that produced nothing; '' when all are ok."""
    counts = collections.Counter(states)
    return ", ".join(f"{counts[s]} {s}" for s in ("failed", "interrupted", "not run") if counts[s])


def trial_rows(view: RunView, labels: Labels) -> list[list[str]]:
    """The 26 trials in protocol order: #, trial, stop reason, length, same ids as, text, ids (abbreviated)."""
    records = generation_by_trial(view)
    first_with_ids: dict[str, int] = {}
    rows = []
    for trial in protocol.generation_trials():
        number = trial.index + 1
        record = records.get(trial.test_id)
        state = trial_state(record)
        if state != "ok":
            rows.append([str(number), code(trial.test_id), labels.trial_cell(state, trial.test_id, record), MISSING, "",
                         MISSING, MISSING])
            continue
        ids = record.get("generated_ids")
        key = json.dumps(ids)
        same = first_with_ids.setdefault(key, number)
        rows.append([str(number), code(trial.test_id), text_cell(record.get("stop_reason")),
                     num(record.get("generated_length", len(ids) if isinstance(ids, list) else None)),
                     "" if same == number else f"#{same}", text_of(record), abbreviate_ids(ids)])
    return rows


def _undecided(states: list[str]) -> str:
    """What stands in for a comparison the recorded trials cannot decide."""
    if all(s == "not run" for s in states):
        return "not run"
    ok = states.count("ok")
    return f"{ok} of {len(states)} recorded, {shortfall(states)}: not decidable"


def repeatability(view: RunView) -> list[dict]:
    """Per prompt, from the trials that produced ids only: greedy identity, the seed rerun, distinct
    continuations per sampling condition and early EOS, each saying how many trials it rests on."""
    records = generation_by_trial(view)
    max_new = recorded_protocol(view).get("generation_fixed", {}).get("max_new_tokens", protocol.MAX_NEW_TOKENS)
    found = []
    for prompt_id in protocol.PROMPTS:
        trials = [t for t in protocol.generation_trials() if t.prompt_id == prompt_id]
        states = {t.test_id: trial_state(records.get(t.test_id)) for t in trials}

        def ok_ids(chosen) -> list[str]:
            return [json.dumps(records[t.test_id]["generated_ids"]) for t in chosen if states[t.test_id] == "ok"]

        greedy = [t for t in trials if t.condition == "G"]
        greedy_states = [states[t.test_id] for t in greedy]
        ids = ok_ids(greedy)
        if len(ids) == len(greedy) or len(set(ids)) > 1:  # two recorded repetitions that differ decide it
            missing = shortfall(greedy_states)
            greedy_short = yes_no(len(set(ids)) == 1)
            greedy_cell = f"{greedy_short} ({len(ids)} of {len(greedy)} recorded{', ' + missing if missing else ''})"
        else:
            greedy_short = greedy_cell = _undecided(greedy_states)

        first_id = f"{prompt_id}-{protocol.RERUN_CONDITION}-seed{protocol.RERUN_SEED}"
        pair = [states.get(first_id, "not run"), states.get(first_id + "-rerun", "not run")]
        if pair == ["ok", "ok"]:
            first, rerun = records[first_id], records[first_id + "-rerun"]
            rerun_cell = yes_no(first.get("generated_ids") == rerun.get("generated_ids"))
            cache = rerun.get("generation_cache")
            if isinstance(cache, dict):
                rerun_cell += f"; fresh cache: {flag(cache.get('fresh'))} ({text_cell(cache.get('how'))})"
        elif pair == ["not run", "not run"]:
            rerun_cell = "not run"
        else:
            rerun_cell = f"not decidable: first run {pair[0]}, rerun {pair[1]}"

        distinct = []
        for condition in ("S1", "S2", "S3"):
            runs = [t for t in trials if t.condition == condition and not t.is_rerun]
            run_states = [states[t.test_id] for t in runs]
            ids = ok_ids(runs)
            missing = shortfall(run_states)
            if not ids:
                distinct.append(f"{condition} " + ("not run" if set(run_states) == {"not run"}
                                                    else f"none recorded ({missing})"))
            else:
                distinct.append(f"{condition} {len(set(ids))}/{len(ids)}" + (f" ({missing})" if missing else ""))

        first_runs = [t for t in trials if not t.is_rerun]
        first_states = [states[t.test_id] for t in first_runs]
        completed = [records[t.test_id] for t in first_runs if states[t.test_id] == "ok"]
        missing = shortfall(first_states)
        if not completed:
            early_cell = "not run" if set(first_states) == {"not run"} else f"none recorded ({missing})"
        else:
            early = sum(1 for r in completed if summaries.stopped_early_on_eos(r, max_new))
            early_cell = f"{early} of {len(completed)}" + (f" ({missing})" if missing else "")
        found.append({"prompt_id": prompt_id, "greedy": greedy_cell, "greedy_short": greedy_short,
                      "rerun": rerun_cell, "distinct": ", ".join(distinct), "early_eos": early_cell})
    return found


def repeatability_rows(view: RunView) -> list[list[str]]:
    """Per prompt: greedy identity, the seed rerun (and how its cache was fresh), distinct continuations, early EOS."""
    return [[r["prompt_id"], r["greedy"], r["rerun"], r["distinct"], r["early_eos"]] for r in repeatability(view)]


# --- the first-step distribution ----------------------------------------------------------------


def first_step_distribution(view: RunView) -> list[dict]:
    """Per prompt, from the recorded raw first-step logits: entropy, top-1, ids top-p keeps, P(EOS), equality."""
    recorded = recorded_protocol(view)
    top_p = next((c.get("top_p") for c in recorded["conditions"].values()
                  if isinstance(c, dict) and c.get("top_p") not in (None, 1.0)), 0.8)
    records = generation_by_trial(view)
    checks = {r.get("prompt_id"): r for r in view.kind("first_step_logits_check")}
    eos = {r.get("prompt_id"): r.get("eos_token_id") for r in view.kind("input")}
    found = []
    for prompt_id in protocol.PROMPTS:
        source = next((records[t.test_id] for t in protocol.generation_trials()
                       if t.prompt_id == prompt_id and t.test_id in records
                       and isinstance(records[t.test_id].get("first_step_logits"), dict)), None)
        row: dict = {"prompt_id": prompt_id, "top_p": top_p, "usable": False}
        if source is None:
            row["reason"] = "no first-step logits were saved"
        else:
            vector = view.tensor(source["first_step_logits"])
            row["source"] = f"{source['first_step_logits'].get('file')} [{source['first_step_logits'].get('key')}]"
            if vector is None:
                row["reason"] = f"{row['source']} is missing or unreadable"
            else:
                row.update(logit_math.distribution_row(vector, top_p, eos.get(prompt_id)))
        check = checks.get(prompt_id)
        if isinstance(check, dict) and isinstance(check.get("comparisons"), dict):
            diffs = [c.get("max_abs_diff") for c in check["comparisons"].values() if isinstance(c, dict)]
            passed = [c.get("passed") for c in check["comparisons"].values() if isinstance(c, dict)]
            row["equal_across_conditions"] = all(p is True for p in passed)
            row["max_diff_across_conditions"] = max((d for d in diffs if is_number(d)), default=None)
        found.append(row)
    return found
