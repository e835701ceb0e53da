"""verify's checks that the records are complete for the protocol: every failure has its evidence, every kind is
present or its absence explained, the generation matrix and the timing schedule hold one record per trial in
order, and the budgets are kept."""

from __future__ import annotations

import collections

from inferlab import protocol
from inferlab.base.records import MANIFEST_FILE, RECORDS_FILE
from inferlab.reading.runview import FAILING, NOT_PASSING, bracket_id
from inferlab.verify.checker import Checker

# Kinds a complete run holds at least one record of.
AT_LEAST_ONE = ("specimen", "artifact_acquisition", "model_load", "model_inspection", "thread_controls",
                "first_step_logits_check", "sampling_summary", "cache_criterion", "cache_inspection",
                "cache_divergence", "loop_vs_generate", "memory")


def expected_input_prompts() -> list[str]:
    """Every prompt the protocol tokenizes: the generation prompts, then the timing prompts."""
    return list(dict.fromkeys([*protocol.PROMPTS, *protocol.TIMING_PROMPTS]))


def timing_combinations() -> list[tuple[str, bool]]:
    """(prompt_id, use_cache) of the timing schedule, in schedule order."""
    return list(dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()))


def check_outcome_evidence(checker: Checker) -> None:
    """Every failure with its longrepr, every skip with its reason, the counts as the manifest says, and every
    record that says it failed backed by a non-passing outcome of its test."""
    view = checker.view
    outcomes = checker.of_kind("test_outcome")
    for record in outcomes:
        outcome, test, seq = record.get("outcome"), record.get("test"), record.get("seq")
        if outcome in FAILING and not (record.get("longrepr") or "").strip():
            checker.problem(f"{RECORDS_FILE} seq {seq}: {test} {outcome} with no longrepr (no evidence)")
        if outcome == "skipped" and not (record.get("skip_reason") or "").strip():
            checker.problem(f"{RECORDS_FILE} seq {seq}: {test} skipped with no reason")
        if outcome not in ("passed", *NOT_PASSING):
            checker.problem(f"{RECORDS_FILE} seq {seq}: {test} has outcome {outcome!r}, expected one of "
                            f"passed, failed, error, skipped")
    manifest = checker.manifest
    if manifest is not None and isinstance(manifest.get("outcome_counts"), dict) and not checker.final_records_missing:
        counted = dict(collections.Counter(r.get("outcome") for r in outcomes))
        if counted != manifest["outcome_counts"]:
            checker.problem(f"{MANIFEST_FILE}: outcome_counts {manifest['outcome_counts']} but "
                            f"{RECORDS_FILE} holds {counted}")
    for record in checker.records:
        status = record.get("status")
        if record.get("kind") == "test_outcome" or status not in FAILING:
            continue
        if view.non_passing([record.get("test")]):
            continue
        if record.get("test") in checker.unreached:
            # The session stopped inside this test (a Ctrl-C lands in the trial, which records its failure
            # and re-raises): the test has no outcome at all, which the ending explains. A passed outcome
            # would contradict the record, and is reported below.
            checker.notes.append(f"{RECORDS_FILE} seq {record.get('seq')}: {record.get('kind')} status {status!r}: "
                                 f"its test {record.get('test')} was cut short ({checker.unfinished}), so it has no "
                                 f"outcome")
            continue
        checker.problem(f"{RECORDS_FILE} seq {record.get('seq')}: {record.get('kind')} has status {status!r} "
                        f"but its test {record.get('test')} has no non-passing outcome")


def check_kinds(checker: Checker) -> None:
    """The counts per kind: at least one of most, every allowlisted file, every prompt, the cache test's
    comparisons (consecutive, after the criterion) and summary, one timing summary per combination."""
    for kind in AT_LEAST_ONE:
        if not checker.of_kind(kind):
            checker.require(f"no {kind} record", kind)

    names = [r.get("name") for r in checker.of_kind("artifact_file")]
    if sorted(names, key=str) != sorted(protocol.ALLOWLISTED_FILES):
        checker.require(f"artifact_file records for {sorted(names, key=str)}, expected exactly "
                        f"{sorted(protocol.ALLOWLISTED_FILES)}", "artifact_file")

    inputs = {r.get("prompt_id") for r in checker.of_kind("input")}
    for prompt_id in expected_input_prompts():
        if prompt_id not in inputs:
            checker.require(f"no input record for {prompt_id}", "input")

    comparisons = checker.of_kind("cache_comparison")
    lengths = [r.get("prefix_length") for r in comparisons]
    if not comparisons:
        checker.require("no cache_comparison record", "cache_comparison")
    elif len(comparisons) > protocol.CACHE_MAX_TARGET_TOKENS:
        checker.problem(f"{len(comparisons)} cache_comparison records, expected 1..{protocol.CACHE_MAX_TARGET_TOKENS}")
    elif not all(isinstance(n, int) for n in lengths) or \
            lengths != list(range(lengths[0], lengths[0] + len(lengths))):
        checker.problem(f"cache_comparison prefix lengths {lengths}, expected consecutive integers")
    criteria = checker.of_kind("cache_criterion")
    if criteria and comparisons and min(r["seq"] for r in criteria) > min(r["seq"] for r in comparisons):
        checker.problem("cache_criterion was recorded after the first cache_comparison; it must be declared first")
    summaries = checker.of_kind("cache_summary")
    if len(summaries) != 1:
        if summaries:
            checker.problem(f"{len(summaries)} cache_summary records, expected 1")
        else:
            checker.require("no cache_summary record", "cache_summary")

    present = collections.Counter((r.get("prompt_id"), r.get("use_cache")) for r in checker.of_kind("timing_summary"))
    for combination in timing_combinations():
        if present[combination] > 1:
            checker.problem(f"{present[combination]} timing_summary records for {combination}, expected 1")
        elif not present[combination]:
            checker.require(f"no timing_summary for prompt {combination[0]} use_cache={combination[1]}",
                            "timing_summary")
    extra = set(present) - set(timing_combinations())
    if extra:
        checker.problem(f"timing_summary records for unknown combinations {sorted(map(str, extra))}")


def check_generation(checker: Checker) -> None:
    """The generation matrix: each record a trial of the protocol, in order, once, within the token budget."""
    trials = protocol.generation_trials()
    key_to_index = {(t.prompt_id, t.condition, t.seed, t.repetition): t.index for t in trials}
    seen: dict[int, list[dict]] = collections.defaultdict(list)
    order = []
    new_tokens = 0
    for record in checker.of_kind("generation"):
        key = (record.get("prompt_id"), record.get("condition"), record.get("seed"), record.get("repetition"))
        index = key_to_index.get(key)
        if index is None:
            checker.problem(f"generation seq {record.get('seq')}: {key} is not a trial of the protocol")
            continue
        seen[index].append(record)
        order.append(index)
        test_id = trials[index].test_id
        if record.get("status") != "ok":
            check_failed_trial(checker, "generation", test_id, record)
            continue
        ids = record.get("generated_ids")
        length = record.get("generated_length")
        if isinstance(ids, list) and isinstance(length, int) and len(ids) != length:
            checker.problem(f"generation {test_id}: generated_length {length} but {len(ids)} ids")
        count = len(ids) if isinstance(ids, list) else (length or 0)
        new_tokens += count
        if count > protocol.MAX_NEW_TOKENS:
            checker.problem(f"generation {test_id}: {count} new tokens, the budget is {protocol.MAX_NEW_TOKENS}")
        config = record.get("generation_config")
        if isinstance(config, dict) and config.get("max_new_tokens") not in (None, protocol.MAX_NEW_TOKENS):
            checker.problem(f"generation {test_id}: max_new_tokens {config.get('max_new_tokens')}, "
                            f"expected {protocol.MAX_NEW_TOKENS}")
    one_record_each(checker, "generation", "protocol order: trial indices", order,
                    [(t.test_id, seen[t.index]) for t in trials])
    if new_tokens > protocol.CAPS["generation_new_tokens"]:
        checker.problem(f"generation: {new_tokens} new tokens in all, cap {protocol.CAPS['generation_new_tokens']}")


def one_record_each(checker: Checker, kind: str, order_words: str, order: list, trials: list[tuple]) -> None:
    """The records of a kind in order, and exactly one per planned trial ((test id, records found) each)."""
    if order != sorted(order):
        checker.problem(f"{kind} records are not in {order_words} {order}")
    for test_id, found in trials:
        one_record_per_trial(checker, kind, test_id, found)


def one_record_per_trial(checker: Checker, kind: str, test_id: str, found: list) -> None:
    """Exactly one record per planned trial (none regenerated); a missing one needs a non-passing outcome."""
    if len(found) > 1:
        checker.problem(f"{kind} {test_id}: {len(found)} records, expected 1 (no trial is regenerated)")
        return
    if found:
        return
    view = checker.view
    evidence = view.non_passing_param(test_id)
    if evidence is not None:
        checker.explain(f"{kind} {test_id} missing", evidence)
        return
    trial_tests = [nodeid for nodeid in view.schedule if bracket_id(nodeid) == test_id]
    if not checker.settle(f"{kind} {test_id} missing", view.missing_from(kind, trial_tests)):
        checker.problem(f"{kind} {test_id}: no record and no failed, error or skipped outcome "
                        f"for a test with id [{test_id}]")


def check_failed_trial(checker: Checker, kind: str, test_id: str, record: dict) -> None:
    """A trial recorded as failed must carry its error and a failed or errored test outcome."""
    if not record.get("error"):
        checker.problem(f"{kind} {test_id}: status {record.get('status')!r} without an error message")
    evidence = checker.view.non_passing_param(test_id)
    if evidence is not None:
        checker.explain(f"{kind} {test_id} failed", evidence)
    elif record.get("test") in checker.unreached:  # cut short by the ending; see check_outcome_evidence
        checker.notes.append(f"{kind} {test_id} failed: its test was cut short ({checker.unfinished})")
    else:
        checker.problem(f"{kind} {test_id}: status {record.get('status')!r} but no failed or errored test outcome")


def check_timing(checker: Checker) -> None:
    """The timing schedule: each record at its index with the scheduled prompt, cache and role, in order, once,
    with its 16 ids and non-decreasing selection times, within the selections cap."""
    schedule = protocol.timing_schedule()
    seen: dict[int, list[dict]] = collections.defaultdict(list)
    order = []
    selections = 0
    for record in checker.of_kind("timing_trial"):
        index = record.get("schedule_index")
        if not isinstance(index, int) or not 0 <= index < len(schedule):
            checker.problem(f"timing_trial seq {record.get('seq')}: schedule_index {index!r} is not in the "
                            f"schedule (0..{len(schedule) - 1})")
            continue
        planned = schedule[index]
        seen[index].append(record)
        order.append(index)
        actual = (record.get("prompt_id"), record.get("use_cache"), record.get("warmup"))
        expected = (planned.prompt_id, planned.use_cache, planned.warmup)
        if actual != expected:
            checker.problem(f"timing_trial {planned.test_id}: (prompt_id, use_cache, warmup) = {actual}, the "
                            f"schedule says {expected}")
        if record.get("status") != "ok":
            check_failed_trial(checker, "timing_trial", planned.test_id, record)
            continue
        ids = record.get("generated_ids")
        selections += len(ids) if isinstance(ids, list) else 0
        if not isinstance(ids, list) or len(ids) != protocol.TIMING_NEW_TOKENS:
            checker.problem(f"timing_trial {planned.test_id}: {len(ids) if isinstance(ids, list) else 'no'} "
                            f"generated ids, expected {protocol.TIMING_NEW_TOKENS}")
        times = record.get("token_times_s")
        if not isinstance(times, list) or len(times) != protocol.TIMING_NEW_TOKENS:
            checker.problem(f"timing_trial {planned.test_id}: {len(times) if isinstance(times, list) else 'no'} "
                            f"token times, expected {protocol.TIMING_NEW_TOKENS}")
        elif any(not isinstance(t, (int, float)) for t in times) or any(b < a for a, b in zip(times, times[1:])) \
                or times[0] < 0:
            checker.problem(f"timing_trial {planned.test_id}: token times are not non-negative and non-decreasing")
    one_record_each(checker, "timing_trial", "schedule order: schedule indices", order,
                    [(t.test_id, seen[t.schedule_index]) for t in schedule])
    if selections > protocol.CAPS["timing_selections"]:
        checker.problem(f"timing: {selections} selections in all, cap {protocol.CAPS['timing_selections']}")


def check_budgets(checker: Checker) -> None:
    """The cache test's forwards and the batching calls within their caps."""
    for record in checker.of_kind("cache_summary"):
        forwards = record.get("forward_count")
        if isinstance(forwards, int) and forwards > protocol.CAPS["cache_forwards"]:
            checker.problem(f"cache_summary: {forwards} forwards, cap {protocol.CAPS['cache_forwards']}")
        expected = record.get("forward_count_expected")
        if isinstance(forwards, int) and isinstance(expected, int) and forwards != expected:
            checker.problem(f"cache_summary: {forwards} forwards counted, expected {expected} (2m)")
    calls = [r for r in checker.of_kind("batching") if r.get("record_type") == "call"
             or ("record_type" not in r and r.get("call_index") is not None)]
    if len(calls) > protocol.CAPS["batching_calls"]:
        checker.problem(f"batching: {len(calls)} generate calls, cap {protocol.CAPS['batching_calls']}")
