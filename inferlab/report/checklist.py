"""report.md's submission checklist (the protocol's seven items, each with where it is satisfied) and the
scaffold for the learner's conclusions, from one run's view.
"""

from __future__ import annotations

from inferlab import protocol
from inferlab.files import spelled
from inferlab.run.records import PREDICTIONS_FILE
from inferlab.report import measures, tables, timing_evidence
from inferlab.report.fmt import (
    DASH,
    MISSING,
    is_number,
    num,
    table,
    text_cell,
    yes_no,
)
from inferlab.read.runview import RunView


def _present(view: RunView, kind: str, at_least: int = 1) -> tuple[bool, str]:
    """(enough records of a kind, what is missing): 'no cache_summary record', 'generation: 6 of 26 recorded'."""
    count = len(view.kind(kind))
    if count >= at_least:
        return True, kind
    return False, f"no {kind} record" if count == 0 and at_least == 1 else f"{kind}: {count} of {at_least} recorded"


def checklist_rows(view: RunView) -> list[list[str]]:
    """The protocol's seven submission items: status and where each is satisfied."""
    predictions = view.manifest.get("predictions") if isinstance(view.manifest.get("predictions"), dict) else {}
    answered = bool(predictions.get("supplied")) and not predictions.get("template_unanswered")
    prediction_label = ("predictions are still the blank template" if predictions.get("template_unanswered")
                        else "no predictions were supplied")
    items = [
        ("Original predictions and a separate revised explanation",
         [(answered, prediction_label), (False, "the revised explanation is yours to write")],
         f"{PREDICTIONS_FILE} (copied before the run; sha256 in manifest.json); your explanation, separately", True),
        ("Experiment source and hash/revision, exact commands, environment lock, hardware/thread record, warnings",
         [(bool(view.manifest.get("source_sha256")), "no source hashes"),
          (bool(view.manifest.get("command") or view.manifest.get("argv")), "no command"),
          (bool(view.manifest.get("requirements_lock_sha256")), "no lock hash"),
          (bool(view.manifest.get("platform")), "no platform"), _present(view, "thread_controls")],
         "manifest.json (source_sha256, git, command, argv, requirements_lock_sha256, lock_check, platform, "
         "distributions); records.jsonl (thread_controls; `warnings` in the records)", False),
        ("Checkpoint revision, allowlisted file hashes and sizes, loading options, devices/dtypes, effective "
         "generation config",
         [_present(view, "specimen"), _present(view, "artifact_file", len(protocol.ALLOWLISTED_FILES)),
          _present(view, "model_load"), _present(view, "model_inspection"), _present(view, "generation")],
         "records.jsonl (specimen, artifact_file, model_load, model_inspection, generation.generation_config "
         "and generation.generation_config_effective)", False),
        ("Exact source and serialized inputs, token ids, masks, seeds, stopping rules, output ids/text, all trial "
         "records",
         [_present(view, "input", 3), _present(view, "generation", len(protocol.generation_trials()))],
         "records.jsonl (input, generation); tensors/first_step_logits.safetensors", False),
        ("Cache-prefix alignment checks, tolerance, numerical errors, token agreement, cache shapes/bytes",
         [_present(view, "cache_criterion"), _present(view, "cache_comparison"), _present(view, "cache_summary"),
          _present(view, "cache_inspection")],
         "records.jsonl (cache_criterion, cache_comparison, cache_inspection, cache_summary); "
         "tensors/cache_logits.safetensors", False),
        ("Timing boundaries, schedule, warmups, all measured samples, declared summaries, unmeasured quantities",
         [(view.plan is not None, "no plan.json"), _present(view, "timing_trial", len(protocol.timing_schedule())),
          _present(view, "timing_summary", 4), _present(view, "memory")],
         "plan.json; records.jsonl (timing_trial, timing_summary, phase, memory); the Timing and Memory sections",
         False),
        ("One supported conclusion about selection, one about computation, two limitations",
         [(False, "to be written by the learner")], "yours; the scaffold below", True),
    ]
    rows, stop = [], tables.run_stop(view)
    for number, (item, checks, where, learner) in enumerate(items, start=1):
        missing = [label for ok, label in checks if not ok]
        if learner:
            recorded = len(missing) < len(checks)
            status = ("recorded; " if recorded else "") + "learner: " + "; ".join(missing) if missing else "recorded"
            if missing and not recorded and len(checks) > 1:
                status = "**missing**: " + "; ".join(missing)
        elif not missing:
            status = "recorded"
        elif len(missing) == len(checks):
            status = "**missing**: " + "; ".join(missing)
        else:
            status = "**partial**: " + "; ".join(missing)
        if missing and not learner and stop:
            status += f"; not reached: {stop}"
        rows.append([str(number), text_cell(item), status, text_cell(where)])
    return rows


def section_checklist(view: RunView) -> list[str]:
    """The submission checklist's table."""
    return ["## Submission checklist", ""] + table(["#", "item", "status", "satisfied by"], checklist_rows(view)) + [
        "", "A clear failure report with its evidence is preferable to invented timings or a silently changed "
        "checkpoint.", ""]


def section_conclusions(view: RunView) -> list[str]:
    """The conclusions scaffold: the numbers a claim rests on, and prompts for the learner."""
    records = tables.generation_by_trial(view)
    repeat = tables.repeatability(view)
    comparisons = view.kind("cache_comparison")
    diffs = [r.get("max_abs_diff") for r in comparisons if is_number(r.get("max_abs_diff"))]
    ratios = [r["bound_ratio"] for r in measures.bound_ratios(view) if is_number(r.get("bound_ratio"))]
    groups = measures.measured_trials(view)

    def timing(prompt_id: str) -> str:
        on, off = groups.get((prompt_id, True), []), groups.get((prompt_id, False), [])
        ttft, step = (lambda t: t.get("ttft_s")), measures.post_first_interval
        return (f"{prompt_id} ({measures.lengths_text(on + off)}): TTFT {measures.uncontended_spread(on, ttft)} ms "
                f"with the cache vs {measures.uncontended_spread(off, ttft)} without; post-first interval "
                f"{measures.uncontended_spread(on, step)} vs {measures.uncontended_spread(off, step)} ms")

    greedy = ", ".join(f"{r['prompt_id']} {r['greedy_short']}" for r in repeat) or MISSING
    distinct = "; ".join(f"{r['prompt_id']}: {r['distinct']}" for r in repeat) or MISSING
    states = [tables.trial_state(records.get(t.test_id)) for t in protocol.generation_trials()]
    missing = tables.shortfall(states)
    produced = f"{states.count('ok')} of {len(states)} trials produced ids" + (f" ({missing})" if missing else "")
    lines = ["## Your conclusions: a scaffold", "",
             "> **These are prompts for you, the learner, not conclusions.** The numbers come from the records "
             f"(median [min–max], of the uncontended timing samples; {measures.CONTENDED_MARK}: only contended ones "
             "exist, so all of them); the claims are yours to make, check and write in your own words, separately "
             "from your predictions.", "",
             f"Write them in a copy of explanation.md and keep it with this run: `{spelled('attach DIR FILE')}` "
             f"(a revised cache criterion: `{spelled('revise DIR --cache-criterion ATOL,RTOL --justification TEXT')}`); "
             f"`{spelled('report DIR --after')}` then prints the after-run page, your predictions beside your "
             "explanation, which is not kept in this folder.", "",
             f"**On selection.** Greedy repetitions identical: {greedy}. Distinct continuations over three seeds: "
             f"{distinct}. {produced}. Prompt: the raw first-step logits are the same under every "
             "condition; what did temperature change, and what did top-p change, in the distribution above? What do "
             "three seeds let you claim?", "",
             f"**On computation.** Max abs diff over {len(comparisons)} prefixes: "
             + (f"{num(min(diffs), 3)}{DASH}{num(max(diffs), 3)}" if diffs else MISSING)
             + (f", at most {max(ratios):.3g} of the per-element bound" if ratios else "") + "; argmax agreement: "
             + (yes_no(all(r.get("argmax_cached") == r.get("argmax_uncached") for r in comparisons))
                if comparisons else MISSING) + ". "
             + ("; ".join(timing(p) for p in protocol.TIMING_PROMPTS) if groups else "No timing was measured")
             + f". Whether the cache made this run faster, each metric's interval against the declared "
             f"{protocol.SMALLEST_TIMING_EFFECT:.0%} (the Timing section): {timing_evidence.short_verdicts(view)}. "
             "Prompt: does the cache change what is computed, or only how much is repeated? Is the speed difference "
             "clear at this workload, given the ranges?", "",
             "**Limitation 1.** Prompt: which limitation above most weakens your selection claim, and what "
             "experiment would remove it?", "",
             "**Limitation 2.** Prompt: which most weakens your computation or timing claim (overhead, the tiny CPU "
             "workload, RSS semantics, diverging free-running ids), and how large could it be?", ""]
    return lines


