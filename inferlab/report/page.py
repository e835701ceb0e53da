"""report.md: the one page a learner reads. Its tables come from tables.py; the full records sit on the
detail page (details.py), which every section links.

A run that measured nothing (it failed at acquisition or loading) gets a short page: what happened,
in full, what to do next, and what did not run.
"""

from __future__ import annotations

from typing import Callable, Optional

from inferlab import guidance, protocol
from inferlab.records import PREDICTIONS_FILE, RECORDS_FILE
from inferlab.report import details as details_page
from inferlab.report import tables
from inferlab.report.fmt import (
    DASH,
    MISSING,
    bullet_list,
    code,
    is_number,
    jstr,
    nbytes,
    num,
    spread,
    table,
    text_cell,
    yes_no,
)
from inferlab.report.verdict import Verdict, acquisition_failure, outcome_summary
from inferlab.report.view import RunView

SYNTHETIC_BANNER = "SYNTHETIC SPECIMEN - NOT PYTHIA"
SYNTHETIC_KINDS = {  # what each offline specimen is, by name; any other synthetic spec says so generically
    "standin": "the stand-in: pythia-14m's architecture, constructed (not trained) weights and a made-up vocabulary",
    "replica": "the replica: pythia-14m's real small files (tokenizer, configuration, weight layout) holding "
               "constructed (not trained) weights",
}
DETAILS_FILE = details_page.DETAILS_FILE
GAP_SENTENCE = (
    "At this size the gap is mostly fixed cost per step that does not grow with the bytes read: Python and "
    "PyTorch dispatch of the step's few hundred small operations, and arithmetic that one thread does not overlap "
    "with memory traffic; the floor assumes every byte streams at the measured copy bandwidth and nothing else "
    "takes time."
)
RSS_WARNING = (
    "Do not subtract these RSS values to get \"model + cache\": the difference also holds allocator retention, "
    "loading copies, library pages first touched later and Python objects, and a peak never falls."
)


def see(section: str) -> str:
    """A link to one section of the detail page."""
    return details_page.link(section)


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
        return ("**yes**: every network connection refused for the whole session" if blocked is not False
                else "**yes** (`--offline`), but the session-wide block is not recorded") + probe
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


def _warnings_cell(view: RunView) -> str:
    found = tables.warnings_by_record(view)
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
        failed_path = (view.first("artifact_acquisition") or {}).get("acquisition")
        lines += bullet_list(guidance.acquisition_next_steps(view.specimen_spec(), failed_path))
    elif first is not None:
        lines += [f"`{first.get('test')}` {first.get('outcome')}, and nothing was measured after it. Its message, in "
                  "full:", "", "```text", *message_lines(first.get("longrepr")), "```"]
    else:
        lines += ["No model computation was recorded, and no test failed."]
    lines += ["", "## What did not run", ""]
    lines += table(["protocol part", "planned", "passed", "failed", "did not run"], tables.not_run_by_part(view))
    reasons = {o.get("skip_reason") for o in verdict.skipped}
    lines += ["", f"Every test that did not run was skipped for a recorded reason ({len(reasons)} distinct; each names "
              "the failure above): " + see("Test outcomes") + ".", "", "## This run", ""]
    lines += run_table(view)
    recorded = sorted({str(r.get("kind")) for r in view.records} - {"test_outcome"})
    lines += [f"Records of kinds {', '.join(f'`{k}`' for k in recorded) or '(none)'}; the environment and the "
              f"specimen spec: {see('Environment')}, {see('Artifacts')}. `python -m inferlab verify DIR` checks that "
              "this failure has its evidence.", ""]
    return lines


# --- the full page ----------------------------------------------------------------------------------


def section_conditions(view: RunView) -> list[str]:
    header, rows = tables.conditions_table(view)
    fixed = tables.recorded_protocol(view).get("generation_fixed") or protocol.GENERATION_FIXED
    return ["## Conditions", ""] + table(header, rows) + [
        "", "*Inactive*: greedy passes no sampling argument. Every trial: "
        + ", ".join(f"`{k}={v}`" for k, v in fixed.items()) + ", normal EOS stopping, plain text with "
        "`add_special_tokens=False`. The complete configs each trial passed and used: " + see("Generation configs")
        + ".", ""]


def section_trials(view: RunView, labels: tables.Labels) -> list[str]:
    count = len(protocol.generation_trials())
    lines = ["## Generation trials", "",
             f"All {count} trials in protocol order. Text is the decoded continuation with special tokens hidden, "
             "as a JSON string (so spaces, newlines and an empty result are visible); *same ids as* names the first "
             "trial that selected identical ids; ids are abbreviated (every id: " + see("Generation trials in full")
             + ")." + (" The text is made up by construction (a synthetic specimen)." if view.synthetic else
                       " Do not read truthfulness or quality into it."), ""]
    lines += table(["#", "trial", "stop", "tokens", "same ids as", "text", "ids"], tables.trial_rows(view, labels))
    return lines + [""]


def section_repeatability(view: RunView) -> list[str]:
    lines = ["## Repeatability", ""]
    lines += table(["prompt", "greedy repetitions identical", f"{protocol.RERUN_CONDITION} seed "
                    f"{protocol.RERUN_SEED} rerun identical", "distinct continuations / seeds recorded",
                    f"early EOS (before token {protocol.MAX_NEW_TOKENS}, first runs)"], tables.repeatability_rows(view))
    return lines + ["", "Counted here from the generation records, comparing only trials that produced ids (a failed, "
                    "interrupted or missing trial is named, never compared). Three seeds neither estimate the output "
                    "distribution nor pick a best temperature, and different seeds may select the same tokens.", ""]


def section_first_step(view: RunView) -> list[str]:
    import math

    lines = ["## First-step distribution", "",
             "What the selection settings acted on: the raw first-step logits the run saved "
             "(`tensors/first_step_logits.safetensors`, G's trial per prompt), turned into probabilities here in "
             "float64. Top-p keeps the smallest set of most probable ids whose mass exceeds p.", ""]
    distribution = tables.first_step_distribution(view)
    rows, vocab = [], None
    for row in distribution:
        same = (f"{yes_no(row['equal_across_conditions'])} (max diff {num(row.get('max_diff_across_conditions'), 3)})"
                if "equal_across_conditions" in row else MISSING)
        if not row.get("usable"):
            rows.append([row["prompt_id"], same, f"not available: {text_cell(row.get('reason'))}"] + [MISSING] * 4)
            continue
        vocab = row["vocab"]
        rows.append([row["prompt_id"], same, f"{row[1.0]['entropy']:.2f}", f"{row[0.5]['entropy']:.2f}",
                     f"{row['top1_id']}: {row[1.0]['top1_p']:.3g} / {row[0.5]['top1_p']:.3g}",
                     f"{row['top_p_kept']:,} of {row['vocab']:,}", num(row.get("eos_p"), 3)])
    top_p = distribution[0]["top_p"] if distribution else 0.8
    lines += table(["prompt", "raw logits equal for G/S1/S2/S3", "entropy T=1 (nats)", "entropy T=0.5",
                    "top-1 id: p at T=1 / T=0.5", f"ids top-p {top_p:g} keeps (T=1)", "P(EOS) at T=1"], rows)
    if vocab:
        lines += ["", f"A uniform distribution over {vocab:,} ids has entropy ln {vocab} = {math.log(vocab):.2f} nats. "
                  "Tensor references and the processed scores: " + see("First-step logits") + "."]
    return lines + [""]


def _plot(spec: dict, plot_errors: dict) -> list[str]:
    if not spec["available"]:
        return [f"Plot not drawn ({spec['title']}): {spec['reason']}.", ""]
    if plot_errors.get(spec["name"]):
        return [f"Plot could not be drawn ({spec['title']}): {text_cell(plot_errors[spec['name']])}.", ""]
    return [f"![{spec['title']}]({spec['file']})", ""]


def _plots(view: RunView, section: str, plot_errors: dict) -> list[str]:
    from inferlab import plots

    lines = []
    for spec in plots.plot_specs(view.records):
        if spec["section"] == section:
            lines += _plot(spec, plot_errors)
    return lines


def section_cache(view: RunView, labels: tables.Labels, plot_errors: dict) -> list[str]:
    lines = ["## Cache: matched prefixes", ""]
    criterion = view.first("cache_criterion")
    rule = (criterion or {}).get("rule") or (criterion or {}).get("criterion") or protocol.CACHE_TOLERANCE.describe()
    lines.append(f"Declared criterion (seq {criterion.get('seq')}, before any error was computed): "
                 f"{code(str(rule), False)}." if criterion else
                 f"No `cache_criterion` record ({labels.gap('test_cache_criterion_declared')}).")
    revised = view.first("cache_criterion_revised")
    summary = view.first("cache_summary") or {}
    if revised:
        evaluation = summary.get("revised_evaluation") if isinstance(summary.get("revised_evaluation"), dict) else {}
        lines += ["", f"**Revised criterion, declared after the errors were seen** (seq {revised.get('seq')}): "
                  f"{code(str(revised.get('rule')), False)}; justification: {text_cell(revised.get('justification'))}. "
                  f"Under it every prefix is within tolerance: {yes_no(evaluation.get('all_within_tolerance'))}. It "
                  "is a second, labelled evaluation: the declared criterion keeps its own verdict (column *passed "
                  "(declared)*)."]
    if summary.get("available") is False:
        lines += ["", f"Comparison unavailable: {text_cell(summary.get('reason'))}.", ""]
    elif summary:
        reuse = ("cache reuse exercised" if summary.get("cache_reuse_exercised")
                 else "**prefill only: cache reuse not exercised**")
        keep = summary.get("prefill_logits_to_keep")
        keep_text = f"; prefill logits shapes {jstr(keep, False)}" if keep is not None else ""
        lines += ["", f"Fixed continuation: the first {num(summary.get('m'))} ids of "
                  f"{code(str(summary.get('reference_trial', MISSING)), False)} (stopped by "
                  f"{text_cell(summary.get('reference_stop_reason'))}); {reuse}; "
                  f"{num(summary.get('forward_count'))} forwards counted (expected "
                  f"{num(summary.get('forward_count_expected'))}){keep_text}."]
    header, rows, _ = tables.cache_rows(view)
    lines += [""]
    if rows:
        lines += table(header, rows)
        lines += ["", f"*max error / bound* is the largest |a−b| / (atol + rtol·|b|) over the vocabulary, from the saved "
                  "logit vectors: below 1 every element passes. A prefix is *near a tie* when its top-two margin is "
                  f"below {protocol.NEAR_TIE_FACTOR:g}× its max abs diff, where rounding could flip the argmax. "
                  "Alignment inputs, cache shapes and every field: " + see("Cache comparison in full") + "."]
    else:
        lines.append(f"No `cache_comparison` record ({labels.gap('test_matched_prefix')}).")
    return lines + [""] + _plots(view, "cache", plot_errors)


def section_timing(view: RunView, labels: tables.Labels, plot_errors: dict) -> list[str]:
    recorded = tables.recorded_protocol(view)
    n = protocol.TIMING_NEW_TOKENS
    lines = ["## Timing", "",
             f"**Stopping rule:** {text_cell(recorded.get('timing_stopping_rule', protocol.TIMING_STOPPING_RULE))}. "
             "These ids are execution samples, not responses.", "",
             "All on `time.perf_counter_ns` from loop start: prefill ends when the next-token logits exist; local TTFT "
             "ends at the first selection (no loading, tokenization, network or queue); mean post-first interval = "
             f"(t{n} − t1)/{n - 1}; throughput = {n}/(t{n} − t0) includes the prompt (its reciprocal is not an "
             "inter-token latency). Warmups are excluded (listed with every timestamp on "
             + see("Timing trials in full") + ").",
             ""]
    rows = tables.timing_rows(view)
    if rows:
        lines += table(["condition", "prompt len", "output len", "metric (ms unless noted)",
                        "samples in schedule order", f"median [min{DASH}max]"], rows)
    else:
        lines.append(f"No measured timing trial ({labels.gap('test_timing_trial')}).")
    lines += [""]
    lines += section_roofline(view)
    phases = tables.phase_rows(view)
    if phases:
        lines += ["Phases timed apart from the loop (ms):", ""]
        lines += table(["phase", "elapsed ms", "boundary"], phases) + [""]
    check = view.first("loop_vs_generate")
    if check:
        lines.append(f"- Loop against `generate()` for {text_cell(check.get('prompt_id'))} (greedy, cache on): equal "
                     f"over {num(check.get('compared_length'))} ids: {yes_no(check.get('equal'))}"
                     + (f", first difference at token {check['first_difference'] + 1}"
                        if isinstance(check.get("first_difference"), int) else "") + ".")
    for record in view.kind("cache_divergence"):
        lines.append(f"- Free-running cache on vs off, {text_cell(record.get('prompt_id'))}: "
                     + (f"**diverged**, first at token {record['first_divergence'] + 1}; these timings then no longer "
                        "compare identical prefixes" if isinstance(record.get("first_divergence"), int)
                        else f"identical ids in all {num(record.get('pairs_compared'))} measured pairs") + ".")
    return lines + [""] + _plots(view, "timing", plot_errors)


def section_roofline(view: RunView) -> list[str]:
    bandwidth, rows = tables.roofline_rows(view)
    if not rows:
        return []
    lines = ["### A floor for one decode step", ""]
    record = view.first("memory_bandwidth") or {}
    if bandwidth is None:
        lines += ["No memory bandwidth was recorded in this run (`memory_bandwidth`), so no floor can be shown; the "
                  "bytes each step must read are listed alone.", ""]
    else:
        lines += [f"Bandwidth of one thread on this machine: {bandwidth / 1e9:.2f} GB/s (median of "
                  f"{num(record.get('repeats'))} copies of {nbytes(record.get('bytes_per_copy'))}, "
                  f"{text_cell(record.get('method'))}, measured outside every timed region). The floor is the bytes "
                  "one decode step must read — every weight it touches (all but the input embedding, of which it reads "
                  "one row) plus, with the cache, the cached keys and values at that step — divided by that bandwidth. "
                  "**It is a floor for this machine, not a prediction.** " + GAP_SENTENCE, ""]
    lines += table(["condition", f"mean post-first interval ms, median [min{DASH}max]", "bytes read per step (mean)",
                    "floor ms", "measured / floor"], rows)
    return lines + [""]


def section_memory(view: RunView, labels: tables.Labels) -> list[str]:
    lines = ["## Memory", "",
             "Tensor payloads counted exactly (unique storage, shared storage counted once); they are not process "
             "memory.", ""]
    rows = tables.memory_rows(view)
    if rows:
        lines += table(["what", "bytes", "check", "note"], rows)
    else:
        lines.append(f"No memory record ({labels.gap('test_parameter_storage', 'test_cache_storage_after_prefill')}).")
    per_prefix = tables.per_prefix_cache_bytes(view)
    if per_prefix:
        lines += ["", f"KV cache held after each cached forward of the cache test, by length: {per_prefix}."]
    rss = tables.rss_rows(view)
    if rss:
        lines += ["", "Process memory (RSS), process-wide. The baseline was taken before the model was loaded, in a "
                  "process that had already imported the interpreter's and the experiment's libraries (torch among "
                  "them), so it already includes them:", ""]
        lines += table(["point", "current", "lifetime peak (cannot be reset)", "source"], rss)
        lines += ["", f"**{RSS_WARNING}**"]
    categories = tables.unmeasured(view)
    if categories:
        lines += ["", "Not measured:", ""] + bullet_list(text_cell(c) for c in categories)
    return lines + [""]


def section_batching(view: RunView, labels: tables.Labels) -> list[str]:
    lines = ["## Batching (optional extension)", ""]
    rows = tables.batching_rows(view)
    if not rows and view.kind("batching"):
        return lines + ["The batching records hold no singleton-against-batch comparison: "
                        + see("Batching details") + ".", ""]
    if not rows:
        return lines + [f"Not run ({labels.gap('test_batching_calls')}).", ""]
    summary = next((r for r in view.kind("batching") if r.get("record_type") == "summary"), {})
    lines += [f"Each request alone against its row of a left-padded two-row batch, in both orders "
              f"({num(summary.get('generate_calls'))} `generate()` calls, pad id {num(summary.get('pad_token_id'))}). "
              "A correctness demonstration, not a throughput benchmark.", ""]
    lines += table(["request", "batch order, row", "padding columns", "first-step max abs diff",
                    "first-step argmax agrees", "unpadded prompt matches", "generated ids identical"], rows)
    return lines + ["", "Why rounding differs in a batch, the calls, masks and positions: " + see("Batching details") +
                    ".", ""]


def section_limitations(view: RunView) -> list[str]:
    inputs = {r.get("prompt_id"): r.get("length") for r in view.kind("input")}
    lengths = ", ".join(f"{p} {n}" for p, n in inputs.items() if n is not None) or MISSING
    clock = tables.clock_overhead_line(view)
    items = []
    if view.synthetic:
        items.append("The specimen is synthetic: nothing here describes Pythia or any trained model.")
    items += [
        "Timestamps add overhead, identical for both cache paths and not subtracted: " +
        (clock if clock else "its size was not measured in this run (no `clock_overhead` record).") + " " +
        tables.benchmark_line(view),
        f"A tiny CPU test: one small model, batch 1, {protocol.INTRA_OP_THREADS} thread, prompts of {lengths} tokens. "
        "Nothing follows for larger models, GPUs, long contexts or concurrent serving.",
        "Three seeds per condition neither estimate the output distribution nor pick a best temperature.",
        "The cache tolerance is a diagnostic for this backend and dtype, not a universal guarantee.",
        "RSS is process-wide; a lifetime peak cannot be reset and isolates no cache increment.",
        "The profiling loop keeps selecting after EOS; those ids are not responses.",
    ]
    return ["## Limitations", ""] + bullet_list(items) + [""]


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
          (bool(view.manifest.get("command") or view.manifest.get("command_line")), "no command"),
          (bool(view.manifest.get("requirements_lock_sha256")), "no lock hash"),
          (bool(view.manifest.get("platform")), "no platform"), _present(view, "thread_controls")],
         "manifest.json (source_sha256, git, command, command_line, requirements_lock_sha256, platform, "
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
    return ["## Submission checklist", ""] + table(["#", "item", "status", "satisfied by"], checklist_rows(view)) + [
        "", "A clear failure report with its evidence is preferable to invented timings or a silently changed "
        "checkpoint.", ""]


def section_conclusions(view: RunView) -> list[str]:
    records = tables.generation_by_trial(view)
    repeat = tables.repeatability(view)
    comparisons = view.kind("cache_comparison")
    diffs = [r.get("max_abs_diff") for r in comparisons if is_number(r.get("max_abs_diff"))]
    ratios = [r["bound_ratio"] for r in tables.bound_ratios(view) if is_number(r.get("bound_ratio"))]
    groups = tables.measured_trials(view)

    def timing(prompt_id: str) -> str:
        on, off = groups.get((prompt_id, True), []), groups.get((prompt_id, False), [])
        length = tables.lengths_of(on + off, "prompt_length")
        return (f"{prompt_id} ({length} prompt tokens): TTFT {spread([t.get('ttft_s') for t in on])} ms with the "
                f"cache vs {spread([t.get('ttft_s') for t in off])} without; post-first interval "
                f"{spread([tables.post_first_interval(t) for t in on])} vs "
                f"{spread([tables.post_first_interval(t) for t in off])} ms")

    greedy = ", ".join(f"{r['prompt_id']} {r['greedy_short']}" for r in repeat) or MISSING
    distinct = "; ".join(f"{r['prompt_id']}: {r['distinct']}" for r in repeat) or MISSING
    states = [tables.trial_state(records.get(t.test_id)) for t in protocol.generation_trials()]
    missing = tables.shortfall(states)
    produced = f"{states.count('ok')} of {len(states)} trials produced ids" + (f" ({missing})" if missing else "")
    lines = ["## Your conclusions: a scaffold", "",
             "> **These are prompts for you, the learner, not conclusions.** The numbers come from the records "
             "(median [min–max]); the claims are yours to make, check and write in your own words, separately from "
             "your predictions.", "",
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
             + ". Prompt: does the cache change what is computed, or only how much is repeated? Is the speed "
             "difference clear at this workload, given the ranges?", "",
             "**Limitation 1.** Prompt: which limitation above most weakens your selection claim, and what "
             "experiment would remove it?", "",
             "**Limitation 2.** Prompt: which most weakens your computation or timing claim (overhead, the tiny CPU "
             "workload, RSS semantics, diverging free-running ids), and how large could it be?", ""]
    return lines


def section_details_index() -> list[str]:
    return ["## Everything else", "",
            "The detail page holds the records behind every section: "
            + ", ".join(see(name) for name in details_page.SECTIONS) + ".", ""]


def render(view: RunView, verdict: Verdict, plot_errors: Optional[dict] = None) -> str:
    """report.md's Markdown for one run; deterministic in its records, plan, stable manifest fields and tensors."""
    plot_errors = dict(plot_errors or {})
    labels = tables.Labels(view)
    lines = ["# inferlab run report", ""] + _banner(view)
    lines += [f"Rendered from this directory's records alone (`python -m inferlab report DIR` rebuilds it; `verify` "
              f"re-checks it). Full records behind each section: [{DETAILS_FILE}]({DETAILS_FILE}).", ""]
    sections: list[tuple[str, Callable[[], list[str]]]]
    if verdict.kind == "plan_only":
        sections = [("status", lambda: section_verdict(verdict)), ("plan", lambda: plan_page(view))]
    elif not verdict.measured_anything:
        sections = [("status", lambda: section_verdict(verdict)), ("failure", lambda: failed_page(view, verdict))]
    else:
        sections = [("status", lambda: section_status(view, verdict, labels)),
            ("conditions", lambda: section_conditions(view)),
            ("trials", lambda: section_trials(view, labels)),
            ("repeatability", lambda: section_repeatability(view)),
            ("first-step distribution", lambda: section_first_step(view)),
            ("cache", lambda: section_cache(view, labels, plot_errors)),
            ("timing", lambda: section_timing(view, labels, plot_errors)),
            ("memory", lambda: section_memory(view, labels)),
            ("batching", lambda: section_batching(view, labels)),
            ("limitations", lambda: section_limitations(view)),
            ("checklist", lambda: section_checklist(view)),
            ("conclusions", lambda: section_conclusions(view)),
            ("details", section_details_index),
        ]
    for name, build in sections:
        try:
            lines += build()
        except Exception as error:  # a partial or odd run must still get the rest of its page
            lines += [f"**The {name} section could not be rendered from these records: "
                      f"{text_cell(f'{type(error).__name__}: {error}')}.**", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
