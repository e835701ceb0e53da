"""The lab's seven submission checklist items, each as concrete checks over one run's view (RunView), with
their evidence. Pure functions: no model, no writes.

Items 2 to 6 are what the run recorded, so a machine can check them. Items 1 and 7 are written work: the
predictions are checked for being there and answered, and the explanation (attached after the run, see
inferlab.reading.addenda) for being there; its content is for a person to grade, so the item's status is `manual`,
carrying its structure check, and `fail` only when the work is absent. Both are judged from the files
themselves, with the grader's templates (inferlab.grading.recompute), never from the flags the manifest or the
ledger carries.

A harness-integrity test that failed or did not run fails the item whose records it writes (the plan says
which kinds a test writes). A failed protocol diagnostic is never an item failure: it is a finding (see
inferlab.grading.grade).
"""

from __future__ import annotations

from typing import Callable, Optional

from inferlab import protocol
from inferlab.base.commands import spelled
from inferlab.run import predictions
from inferlab.grading.evidence import (
    FAIL,
    MANUAL,
    PASS,
    RERUN,
    Check,
    Evidence,
    failed,
    kinds_present,
    manifest_evidence,
    missing_check,
    passed,
)
from inferlab.base.records import PLAN_FILE, PREDICTIONS_FILE
from inferlab.recheck.trusted import cache_reference_trial
from inferlab.reading.runview import DIAGNOSTIC, FAILING, RunView, file_of, short_test
from inferlab.report.fmt import message_lines

# The record kinds each item rests on: a harness-integrity test that writes one of them and did not pass fails
# that item. Kinds that only protocol diagnostics write (first_step_logits_check, sampling_summary,
# loop_vs_generate, cache_divergence) belong to no item; neither does 'phase', which most parts write.
ITEM_KINDS = {
    2: ("thread_controls", "offline_guard"),
    3: ("specimen", "artifact_acquisition", "artifact_file", "artifact_directory", "model_load", "model_inspection"),
    4: ("input", "eos_ids", "generation", "processed_scores_check"),
    5: ("cache_criterion", "cache_criterion_revised", "cache_inspection", "cache_comparison", "cache_summary"),
    6: ("timing_trial", "timing_summary", "clock_overhead", "benchmark_reference", "memory", "memory_bandwidth"),
}
# The timing boundaries item 6 asks for, as the experiments name their phase records.
PHASE_BOUNDARIES = ("artifact_acquisition", "model_and_tokenizer_load", "tokenization", "output_decoding")
EXPERIMENT_SOURCES = ("inferlab/", "experiments/", "conftest.py", "pytest.ini")
EXPLANATION_KIND = "explanation"
ATTACH_HINT = spelled("attach RUN_DIR my_explanation.md")


# --- which tests stand behind an item ----------------------------------------------------------------


def test_kinds(view: RunView) -> dict[str, set]:
    """Each planned test -> the record kinds it stands for: its own declared kinds, else (a test that writes no
    record, such as a check over another test's records) those its experiment file's other tests declare."""
    by_file: dict[str, set] = {}
    for entry in view.planned:
        by_file.setdefault(file_of(entry.get("test")), set()).update(entry.get("records") or [])
    found = {}
    for entry in view.planned:
        own = set(entry.get("records") or [])
        found[entry.get("test")] = own or by_file.get(file_of(entry.get("test")), set())
    for nodeid in view.tests_by_outcome():  # a test the plan does not list: by the kinds it wrote
        if nodeid not in found:
            found[nodeid] = {r.get("kind") for r in view.records if r.get("test") == nodeid and
                             r.get("kind") != "test_outcome"}
    return found


def item_of_kinds(kinds: set) -> list[int]:
    """The items whose record kinds meet `kinds`."""
    return [number for number, item_kinds in ITEM_KINDS.items() if kinds & set(item_kinds)]


def integrity_tests_check(view: RunView, number: int, kinds_of: dict[str, set]) -> Check:
    """No harness-integrity test behind the item failed or errored. A skipped one does not fail it by itself: a
    skip that left a record missing fails the check of that record, with the skip as its evidence, and a skip
    that left nothing missing (a prefix beyond an early EOS is not applicable) is no failure."""
    behind = [nodeid for nodeid, kinds in kinds_of.items() if number in item_of_kinds(kinds)]
    outcomes = [o for o in (view.decisive_outcome(n) for n in behind)
                if o is not None and view.check_kind(o) != DIAGNOSTIC]
    bad = [o for o in outcomes if o.get("outcome") in FAILING]
    if not bad:
        skipped = [o for o in outcomes if o.get("outcome") == "skipped"]
        ran = len(outcomes) - len(skipped)
        return passed("integrity_tests", f"every harness-integrity test behind this item that ran passed ({ran})"
                      + (f"; {len(skipped)} skipped, each with its recorded reason" if skipped else ""),
                      records=skipped)
    first = bad[0]
    message = " ".join(message_lines(first.get("longrepr")))[:300]
    return failed("integrity_tests", f"{len(bad)} harness-integrity test(s) behind this item failed; the first: "
                  f"{short_test(first.get('test'))} {first.get('outcome')}" + (f": {message}" if message else ""),
                  "read the failing test's message in records.jsonl (or report.md), fix its cause and run again",
                  records=bad)


# --- item 1 and 7: written work ----------------------------------------------------------------------


def latest_explanation(view: RunView) -> Optional[dict]:
    """The last explanation attached to the run (a later attach revises an earlier one), or None."""
    entries = [e for e in view.addenda if isinstance(e, dict) and e.get("kind") == EXPLANATION_KIND]
    return entries[-1] if entries else None


def _ledger_evidence(entry: dict) -> list[Evidence]:
    from inferlab.reading.addenda import LEDGER_FILE

    seq = entry.get("seq") if isinstance(entry.get("seq"), int) else None
    return [Evidence(LEDGER_FILE, EXPLANATION_KIND, seq), Evidence(str(entry.get("file")))]


def explanation_attached(view: RunView) -> Check:
    """An explanation is attached to the run (addenda.jsonl)."""
    entry = latest_explanation(view)
    if entry is None:
        problems = "; ".join(str(p) for p in view.addenda_problems[:2])
        return failed("explanation_attached", "no explanation is attached to this run" +
                      (f" (the ledger has problems: {problems})" if problems else ""),
                      f"write your explanation from explanation.md and attach it: {ATTACH_HINT}")
    return passed("explanation_attached", f"{entry.get('file')} attached {entry.get('attached_utc')} "
                  f"(from {entry.get('original_name')})", extra=_ledger_evidence(entry))


def written_sections(view: RunView, name: str, sections: tuple[str, ...], what: str) -> Check:
    """`manual` when the explanation holds text under at least one of the item's headings (a person grades it),
    `fail` when it holds none of them. The structure is recomputed from the attached file with the grader's
    template (inferlab.grading.recompute); the one attach recorded is checked against it, never used."""
    from inferlab.grading.recompute import explanation_structure

    entry = latest_explanation(view)
    if entry is None:
        return failed(name, f"{what}: absent (no explanation attached)",
                      f"write it under the headings of explanation.md and attach the file: {ATTACH_HINT}")
    structure, why = explanation_structure(view, entry)
    evidence = _ledger_evidence(entry)
    if structure is None or structure.get("ok") is None:
        why = why or structure.get("note") or "the structure could not be checked"
        return Check(name, MANUAL, f"{what}: attached, structure not checked ({why}); a person reads it", None,
                     evidence)
    missing = [s for s in sections if s in (structure.get("headings_missing") or [])]
    empty = [s for s in sections if s in (structure.get("empty_sections") or [])]
    written = [s for s in sections if s not in missing and s not in empty]
    if sections and not written:
        return Check(name, FAIL, f"{what}: absent: the explanation has no text under " + "; ".join(sections),
                     "write these sections in your own words (citing the records) and attach the file again",
                     evidence)
    gaps = ([f"missing heading(s): {'; '.join(missing)}"] if missing else []) + \
           ([f"still the template's text: {'; '.join(empty)}"] if empty else [])
    return Check(name, MANUAL, f"{what}: written ({len(written)} of {len(sections)} sections); a person grades "
                 "its content" + (f"; {', '.join(gaps)}" if gaps else ""),
                 "complete: " + "; ".join(gaps) if gaps else None, evidence)


def predictions_answered(view: RunView, evidence: list, required: int) -> Check:
    """Item 1: at least `required` of the six questions answered, judged from predictions.md itself (the rule is
    inferlab.run.predictions'; the manifest's template flag is only checked against it)."""
    from inferlab.grading.recompute import predictions_answers

    found, why = predictions_answers(view)
    fix = ("answer each of the six questions (every Prediction/Uncertainty/Why field, or one numbered section per "
           "question, each in a few words of your own), then make a new run with them")
    if found is None:
        return failed("predictions_answered", f"the predictions cannot be read: {why}", fix, extra=evidence)
    count = len(found.answered)
    if count < required:
        need = "all six" if required == len(predictions.QUESTIONS) else f"at least {required} of six"
        return failed("predictions_answered", f"{found.summary()}; this rubric requires {need}", fix, extra=evidence)
    return passed("predictions_answered", found.summary() + (f" (this rubric requires {required})"
                                                             if required < len(predictions.QUESTIONS) else ""),
                  extra=evidence)


def item_1(view: RunView, sections: tuple[str, ...], kinds_of,
           required_answers: int = len(predictions.QUESTIONS)) -> list[Check]:
    """Predictions written before the run, answered; and a separate, revised explanation."""
    recorded = view.manifest.get("predictions") if isinstance(view.manifest.get("predictions"), dict) else {}
    listed = PREDICTIONS_FILE in (view.manifest.get("files") or {})
    evidence = [manifest_evidence("predictions")] + ([Evidence(PREDICTIONS_FILE)] if listed else [])
    checks = []
    if recorded.get("supplied") and listed:
        checks.append(passed("predictions_supplied", f"{PREDICTIONS_FILE} was copied into the run before any "
                             f"model computation ({recorded.get('copied_at_utc')})", extra=evidence))
    else:
        why = "the manifest says none were supplied" if not recorded.get("supplied") else \
            f"the manifest says they were, but {PREDICTIONS_FILE} is not in its file inventory"
        checks.append(failed("predictions_supplied", f"no predictions in this run: {why}",
                             "answer predictions.md BEFORE running, then run with --predictions FILE; predictions "
                             "cannot be added to a run afterwards", extra=evidence))
    if recorded.get("supplied"):
        checks.append(predictions_answered(view, evidence, required_answers))
    checks.append(explanation_attached(view))
    checks.append(written_sections(view, "revised_explanation", sections, "the revised explanation of the "
                                   "predictions"))
    return checks


def item_7(view: RunView, sections: tuple[str, ...], kinds_of) -> list[Check]:
    """Two conclusions and two limitations, in the attached explanation."""
    return [explanation_attached(view),
            written_sections(view, "conclusions_and_limitations", sections, "the conclusions and limitations")]


# --- items 2 to 6: what the run recorded -------------------------------------------------------------


def _manifest_field(view: RunView, name: str, label: str, fix: str, test: Callable = bool) -> Check:
    value = view.manifest.get(name)
    if test(value):
        return passed(name, f"{label} recorded", extra=[manifest_evidence(name)])
    return failed(name, f"{label}: not recorded in manifest.json", fix, extra=[manifest_evidence(name)])


def _all_records(view: RunView, name: str, what: str, kind: str, test: Callable, fix: str) -> Check:
    """Every record of a kind passes `test`; the ones that do not are the evidence."""
    records = view.kind(kind)
    absent = kinds_present(view, name, what, kind)
    if absent is not None:
        return absent
    bad = [r for r in records if not test(r)]
    if bad:
        return failed(name, f"{what}: {len(bad)} of {len(records)} {kind} records lack it", fix, records=bad)
    return passed(name, f"{what}: every {kind} record ({len(records)})", records)


def item_2(view: RunView, sections, kinds_of) -> list[Check]:
    """Experiment source and its hashes or revision, the command, the lock, machine and threads, warnings."""
    hashes = view.manifest.get("source_sha256") if isinstance(view.manifest.get("source_sha256"), dict) else {}
    covered = [p for p in EXPERIMENT_SOURCES if any(f == p or f.startswith(p) for f in hashes)]
    git = view.manifest.get("git") if isinstance(view.manifest.get("git"), dict) else {}
    revision = f"; commit {git.get('commit')}" + (" with uncommitted changes (git.dirty)" if git.get("dirty") else "") \
        if git.get("commit") else "; no git commit recorded (the source hashes identify it)"
    if len(covered) == len(EXPERIMENT_SOURCES):
        source = passed("source_hashes", f"SHA-256 of {len(hashes)} source files{revision}",
                        extra=[manifest_evidence("source_sha256"), manifest_evidence("git")])
    else:
        source = failed("source_hashes", "the manifest's source hashes do not cover " +
                        ", ".join(p for p in EXPERIMENT_SOURCES if p not in covered),
                        "run the experiment with this harness: it hashes its own source into the manifest",
                        extra=[manifest_evidence("source_sha256")])
    command, how = view.command()
    command_check = passed("command", f"the command: {command} ({how})", extra=[manifest_evidence("command")]) \
        if command else failed("command", "the command was not recorded", RERUN, extra=[manifest_evidence("command")])
    platform = view.manifest.get("platform") if isinstance(view.manifest.get("platform"), dict) else {}
    machine = [platform.get(k) for k in ("os", "machine", "cpu_model", "logical_cpus")]
    machine_check = passed("machine", "machine: " + ", ".join(str(v) for v in machine), extra=[
        manifest_evidence("platform")]) if all(v not in (None, "") for v in machine) else failed(
        "machine", f"the machine record is incomplete: {platform or 'none'}", RERUN,
        extra=[manifest_evidence("platform")])
    threads = _all_records(
        view, "threads", "effective thread settings", "thread_controls",
        lambda r: isinstance(r.get("effective"), dict), RERUN)
    loads = view.kind("model_load")
    warning_records = loads + [r for r in view.kind("generation") if r.get("status", "ok") == "ok"]
    uncaught = [r for r in warning_records if not isinstance(r.get("warnings"), list)]
    if not loads:
        warnings = missing_check(view, "warnings", "the warnings captured at loading", "model_load")
    elif uncaught:
        warnings = failed("warnings", f"{len(uncaught)} load or generation record(s) carry no captured warnings",
                          RERUN, records=uncaught)
    else:
        count = sum(len(r["warnings"]) for r in warning_records)
        warnings = passed("warnings", f"warnings captured at loading and in every generation trial ({count} "
                          "warning(s))", records=loads)
    return [source, command_check,
            _manifest_field(view, "requirements_lock_sha256", "the environment lock's SHA-256", RERUN),
            machine_check, threads, warnings]


def observed(inspection: dict, what: str) -> list:
    """The devices (or dtypes) a model inspection observed: its summary field, else each parameter's."""
    summary = inspection.get(f"{what}s")
    if isinstance(summary, list) and summary:
        return summary
    parameters = inspection.get("parameters")
    if not isinstance(parameters, list):
        return []
    return sorted({str(p.get(what)) for p in parameters if isinstance(p, dict) and p.get(what) is not None})


def item_3(view: RunView, sections, kinds_of) -> list[Check]:
    """Checkpoint revision, allowlisted file hashes and sizes, loading options, devices and dtypes, the full
    effective generation configuration."""
    specimen = _all_records(
        view, "revision", "the checkpoint's repository and revision", "specimen",
        lambda r: bool(r.get("revision")) and bool(r.get("repo_id")), RERUN)
    files = {r.get("name"): r for r in view.kind("artifact_file")}
    required = [n for n in protocol.ALLOWLISTED_FILES if n not in protocol.OPTIONAL_FILES]
    if not files:
        artifacts = missing_check(view, "artifact_files", "the allowlisted files' hashes and sizes", "artifact_file")
    else:
        absent = [n for n in protocol.ALLOWLISTED_FILES if n not in files]
        unhashed = [n for n in required if n in files and not (files[n].get("sha256") and
                                                               isinstance(files[n].get("size"), int))]
        wrong = [files[n] for n in files if files[n].get("ok") is False]
        if absent or unhashed or wrong:
            parts = ([f"no record for {', '.join(absent)}"] if absent else []) + \
                    ([f"no hash or size for {', '.join(unhashed)}"] if unhashed else []) + \
                    [f"{r.get('name')}: {r.get('problem') or 'does not match its pin'}" for r in wrong]
            artifacts = failed("artifact_files", "the allowlisted files: " + "; ".join(parts),
                               f"use the pinned files (check them with {spelled('check-artifacts DIR')}) and "
                               "run again", records=wrong or list(files.values()))
        else:
            artifacts = passed("artifact_files", f"hash and size of each of the {len(files)} allowlisted files, each "
                               "as pinned", list(files.values()))
    options = _all_records(
        view, "loading_options", "the loading options", "model_load", lambda r: isinstance(r.get("options"), dict),
        RERUN)
    inspection = _all_records(
        view, "devices_dtypes", "the observed devices and dtypes", "model_inspection",
        lambda r: bool(observed(r, "device")) and bool(observed(r, "dtype")), RERUN)
    config = _all_records(view, "generation_config", "the effective generation configuration", "generation",
                          lambda r: r.get("status", "ok") != "ok" or isinstance(
                              r.get("generation_config_effective", r.get("generation_config")), dict), RERUN)
    return [specimen, artifacts, options, inspection, config]


def item_4(view: RunView, sections, kinds_of) -> list[Check]:
    """The inputs exactly as fed, the seeds, the stopping rules, and every trial's ids and text."""
    inputs = {r.get("prompt_id"): r for r in view.kind("input")}
    wanted = list(dict.fromkeys([*protocol.PROMPTS, *protocol.TIMING_PROMPTS]))
    fields = ("source", "serialized", "token_ids", "attention_mask")
    if not inputs:
        input_check = missing_check(view, "inputs", "the inputs as fed", "input")
    else:
        absent = [p for p in wanted if p not in inputs]
        short = [r for r in inputs.values() if any(r.get(f) is None for f in fields)]
        if absent or short:
            input_check = failed("inputs", "the inputs: " + "; ".join(
                ([f"no record for {', '.join(absent)}"] if absent else []) +
                [f"{r.get('prompt_id')} lacks {', '.join(f for f in fields if r.get(f) is None)}" for r in short]),
                RERUN, records=short or list(inputs.values()))
        else:
            input_check = passed("inputs", f"source, serialized text, token ids and mask of {', '.join(wanted)}",
                                 list(inputs.values()))
    by_trial = {}
    for record in view.kind("generation"):
        by_trial.setdefault(record.get("trial_id"), record)
    trials = protocol.generation_trials()
    if not by_trial:
        return [input_check, missing_check(view, "trials", "the generation trials", "generation")]
    absent = [t.test_id for t in trials if t.test_id not in by_trial]
    broken = [by_trial[t.test_id] for t in trials if t.test_id in by_trial and (
        by_trial[t.test_id].get("status", "ok") != "ok" or not isinstance(by_trial[t.test_id].get("generated_ids"), list)
        or by_trial[t.test_id].get("text") is None)]
    if absent:
        missing = view.why_missing("generation")
        why = missing_check(view, "trials", "", "generation") if missing.reason != "ran" else None
        trial_check = failed("trials", f"{len(absent)} of {len(trials)} generation trials have no record (the first: "
                             f"{absent[0]})" + (f"{why.detail}" if why else ""), why.fix if why else RERUN,
                             records=list(by_trial.values()))
    elif broken:
        first = broken[0]
        trial_check = failed("trials", f"{len(broken)} of {len(trials)} trials produced no ids or text; the first: "
                             f"{first.get('trial_id')} ({first.get('status')}: {first.get('error')})",
                             "find the cause in the trial's error and run again", records=broken)
    else:
        trial_check = passed("trials", f"ids and text of all {len(trials)} trials", list(by_trial.values()))
    sampled = [t for t in trials if protocol.CONDITIONS[t.condition].do_sample and t.test_id in by_trial]
    unseeded = [by_trial[t.test_id] for t in sampled if by_trial[t.test_id].get("seed") != t.seed
                or not by_trial[t.test_id].get("rng_reset")]
    seeds = failed("seeds", f"{len(unseeded)} sampled trial(s) without their seed or its reset recorded", RERUN,
                   records=unseeded) if unseeded else passed(
        "seeds", f"the seed and the random-state reset of each of the {len(sampled)} sampled trials",
        [by_trial[t.test_id] for t in sampled])
    completed = [r for r in by_trial.values() if r.get("status", "ok") == "ok"]
    unstopped = [r for r in completed if not r.get("stop_reason")]
    stopping = failed("stopping_rules", f"{len(unstopped)} trial(s) without a stop reason", RERUN, records=unstopped) \
        if unstopped else passed("stopping_rules", f"why each of the {len(completed)} completed trials stopped",
                                 completed)
    return [input_check, trial_check, seeds, stopping]


def item_5(view: RunView, sections, kinds_of) -> list[Check]:
    """The matched-prefix cache comparison: the declared tolerance, every prefix, the summary, cache shapes."""
    criterion = kinds_present(view, "tolerance", "the declared criterion", "cache_criterion")
    if criterion is None:
        record = view.first("cache_criterion")
        criterion = passed("tolerance", f"declared before any comparison: {record.get('criterion')}", [record])
    summary = view.first("cache_summary")
    comparisons = view.kind("cache_comparison")
    if summary is not None and summary.get("available") is False:
        prefixes = failed("prefixes", f"the comparison was unavailable: {summary.get('reason') or summary.get('notes')}",
                          f"the greedy trial the comparison follows ({cache_reference_trial()}) must succeed; fix its "
                          "failure and run again",
                          records=[summary])
    elif not comparisons:
        prefixes = missing_check(view, "prefixes", "the per-prefix comparisons", "cache_comparison")
    else:
        fields = ("max_abs_diff", "fail_fraction", "argmax_cached", "argmax_uncached", "top2_margin_uncached")
        short = [r for r in comparisons if any(r.get(f) is None for f in fields)]
        expected = (summary or {}).get("m")
        if short:
            prefixes = failed("prefixes", f"{len(short)} prefix comparison(s) lack errors, argmaxes or margins",
                              RERUN, records=short)
        elif isinstance(expected, int) and len(comparisons) != expected:
            prefixes = failed("prefixes", f"{len(comparisons)} prefix comparisons, the summary says m = {expected}",
                              RERUN, records=comparisons)
        else:
            agree = sum(1 for r in comparisons if r.get("argmax_cached") == r.get("argmax_uncached"))
            prefixes = passed("prefixes", f"{len(comparisons)} prefixes: max abs diff, fail fraction, argmaxes "
                              f"({agree} of {len(comparisons)} agree) and top-two margins", comparisons)
    summary_check = kinds_present(view, "summary", "the comparison's summary", "cache_summary") or passed(
        "summary", "numerical and token agreement summarised", view.kind("cache_summary"))
    inspection = kinds_present(view, "cache_shapes", "the cache's dtype, shapes and bytes", "cache_inspection") or \
        passed("cache_shapes", "the cache's type, shapes and bytes inspected", view.kind("cache_inspection"))
    return [criterion, prefixes, summary_check, inspection]


def item_6(view: RunView, sections, kinds_of) -> list[Check]:
    """Timing boundaries, the schedule and its warmups, every measured sample, the summaries, the unmeasured."""
    from inferlab.report import measures

    schedule = passed("schedule", f"{PLAN_FILE} holds the schedule ({len(view.planned)} planned tests)",
                      extra=[Evidence(PLAN_FILE)]) if view.planned else failed(
        "schedule", f"{PLAN_FILE} is missing or holds no schedule", RERUN, extra=[Evidence(PLAN_FILE)])
    by_index = {}
    for record in view.kind("timing_trial"):
        by_index.setdefault(record.get("schedule_index"), record)
    planned = protocol.timing_schedule()
    if not by_index:
        trials = missing_check(view, "samples", "the timing trials", "timing_trial")
    else:
        absent = [t.test_id for t in planned if t.schedule_index not in by_index]
        broken = [by_index[t.schedule_index] for t in planned if t.schedule_index in by_index and (
            by_index[t.schedule_index].get("status", "ok") != "ok" or measures.token_times(
                by_index[t.schedule_index]) is None or by_index[t.schedule_index].get("ttft_s") is None)]
        warmups = sum(1 for t in planned if t.warmup)
        if absent:
            why = view.why_missing("timing_trial")
            reason = missing_check(view, "samples", "", "timing_trial").detail if why.reason != "ran" else ""
            trials = failed("samples", f"{len(absent)} of {len(planned)} timing trials have no record (the first: "
                            f"{absent[0]}){reason}", RERUN, records=list(by_index.values()))
        elif broken:
            trials = failed("samples", f"{len(broken)} timing trial(s) without their timestamps; the first: "
                            f"{broken[0].get('schedule_id')} ({broken[0].get('status')})", RERUN, records=broken)
        else:
            trials = passed("samples", f"{warmups} warmups and {len(planned) - warmups} measured trials, each with "
                            "its prefill, TTFT and every selection time", list(by_index.values()))
    wanted = 2 * len(protocol.TIMING_PROMPTS)
    summaries = kinds_present(view, "summaries", "the declared timing summaries", "timing_summary", wanted) or passed(
        "summaries", f"median, min and max for each of the {wanted} prompt and cache combinations",
        view.kind("timing_summary"))
    phases = {r.get("name") for r in view.kind("phase")}
    absent = [p for p in PHASE_BOUNDARIES if p not in phases]
    boundaries = failed("boundaries", f"no phase record for {', '.join(absent)}", RERUN,
                        records=view.kind("phase")) if absent else passed(
        "boundaries", "acquisition, loading, tokenization and output decoding timed separately", view.kind("phase"))
    unmeasured = measures.unmeasured(view)
    unmeasured_check = passed("unmeasured", f"{len(unmeasured)} quantities named as not measured",
                              [r for r in view.kind("memory")]) if unmeasured else (
        kinds_present(view, "unmeasured", "the memory records", "memory") or failed(
            "unmeasured", "no record names what was not measured", RERUN, records=view.kind("memory")))
    return [schedule, boundaries, trials, summaries, unmeasured_check]


ITEM_CHECKS = {1: item_1, 2: item_2, 3: item_3, 4: item_4, 5: item_5, 6: item_6, 7: item_7}


def item_checks(view: RunView, number: int, sections: tuple[str, ...] = (),
                kinds_of: Optional[dict] = None, required_answers: int = len(predictions.QUESTIONS)) -> list[Check]:
    """The concrete checks of one checklist item over a run, the integrity tests behind it last; item 1 asks
    for `required_answers` of the six predictions (the rubric's require_answered_predictions)."""
    kinds_of = test_kinds(view) if kinds_of is None else kinds_of
    checks = item_1(view, sections, kinds_of, required_answers) if number == 1 else \
        ITEM_CHECKS[number](view, sections, kinds_of)
    if number in ITEM_KINDS:
        checks.append(integrity_tests_check(view, number, kinds_of))
    return checks


def item_status(checks: list[Check]) -> str:
    """fail when any check fails; else manual when a person must grade something; else pass."""
    statuses = {c.status for c in checks}
    return FAIL if FAIL in statuses else MANUAL if MANUAL in statuses else PASS


def diagnostic_failures(view: RunView) -> list[dict]:
    """The decisive outcomes of protocol diagnostics that failed: findings, never item failures."""
    return [o for o in view.tests_by_outcome().values()
            if view.check_kind(o) == DIAGNOSTIC and o.get("outcome") in ("failed", "error")]


def unattributed_failures(view: RunView, kinds_of: dict) -> list[dict]:
    """Harness-integrity tests that failed and stand behind no item (the optional extension's)."""
    return [o for nodeid, o in view.tests_by_outcome().items()
            if o.get("outcome") in FAILING and view.check_kind(o) != DIAGNOSTIC
            and not item_of_kinds(kinds_of.get(nodeid, set()))]
