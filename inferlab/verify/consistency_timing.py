"""Consistency of the timing trials: each trial's seconds from its nanosecond stamps, its TTFT against its prefill
and its first selection, its ids against its prompt, each loop inside the duration of the test that timed it,
the monotonic clock never running backwards in record order, and the timing summaries, the cache divergence and
the loop-vs-generate check recomputed from the trials written before them."""

from __future__ import annotations

from typing import Optional

from inferlab import protocol
from inferlab.base.records import STAMP_FIELD
from inferlab.measure import collector, contention, summaries
from inferlab.verify.consistency_shared import Recheck, common_leaves, label, same

NS_PER_S = 1e9  # the loop divides its integer stamps by this float (decode_loop.LoopResult), and so does this check


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def stamps(record: dict) -> Optional[tuple[int, int, list[int]]]:
    """(t_start_ns, t_prefill_done_ns, token_times_ns) of a timing trial, or None when it records no such stamps."""
    start, prefill, tokens = record.get("t_start_ns"), record.get("t_prefill_done_ns"), record.get("token_times_ns")
    if _is_int(start) and _is_int(prefill) and isinstance(tokens, list) and tokens and all(map(_is_int, tokens)):
        return start, prefill, tokens
    return None


def check(recheck: Recheck) -> None:
    """Every timing check of this module, in order."""
    unstamped = 0
    for record in recheck.completed("timing_trial"):
        unstamped += not _trial(recheck, record)
    if unstamped:
        recheck.not_checked("timing trials' seconds against their nanosecond stamps",
                            f"{unstamped} completed trial(s) record no t_start_ns, t_prefill_done_ns and "
                            f"token_times_ns (their seconds were checked against each other only)")
    _clock_order(recheck)
    _durations(recheck)
    _summaries(recheck)
    _declared_rule(recheck)
    _collector_policy(recheck)


def _collector_policy(recheck: Recheck) -> None:
    """The garbage-collector policy the plan and the manifest declare is the one every timing trial ran under:
    under off_in_spans the collector was off inside the spans and no collection started in one."""
    declared = {}
    for file, data in (("manifest.json", recheck.view.manifest), ("plan.json", recheck.view.plan or {})):
        found = (data.get("collector") or {}).get("policy") if isinstance(data.get("collector"), dict) else None
        if found is not None:
            declared[file] = found
    trials = [t for t in recheck.completed("timing_trial") if "collector" in t]
    if not declared:
        if trials:
            recheck.not_checked("the timing trials' collector policy", "neither the manifest nor the plan declares one")
        return
    if len(set(declared.values())) > 1:
        recheck.checker.problem(f"inconsistent: the collector policy differs between the files that declare it: "
                                f"{declared}")
    policy = next(iter(declared.values()))
    where = " and ".join(declared)
    for trial in trials:
        held = trial["collector"] if isinstance(trial["collector"], dict) else {}
        if held.get("policy") != policy:
            recheck.differs(trial, "collector.policy", held.get("policy"), policy, f"the policy {where} declares")
            continue
        if policy != collector.OFF_IN_SPANS:
            continue
        if held.get("enabled_in_spans") is not False:
            recheck.differs(trial, "collector.enabled_in_spans", held.get("enabled_in_spans"), False,
                            f"the policy {policy} ({where})")
        events = collector.valid_events(trial.get("gc_events"))
        found = stamps(trial)
        if events is None or found is None:
            recheck.checker.problem(f"inconsistent: {label(trial)}: under the collector policy {policy} it records no "
                                    "valid gc_events and stamps to show that no collection ran in its spans")
            continue
        inside = collector.in_span(trial["gc_events"], found[0], found[2][-1])
        if inside["collections"]:
            recheck.checker.problem(f"inconsistent: {label(trial)}: {inside['collections']} collection(s) started "
                                    f"inside its loop span under the policy {policy} ({where}), which switches the "
                                    "collector off there")


def _declared_rule(recheck: Recheck) -> None:
    """The contention rule and the cache verdict's threshold were declared (timing_machine, point before) before the
    first timing trial, and they are the protocol's, by which verify recomputed every trial's flag."""
    before = [r for r in recheck.view.kind("timing_machine") if r.get("point") == "before"]
    trials = recheck.view.kind("timing_trial")
    if not before:
        if any("contended" in t for t in trials):  # verify judged them by the protocol's rule all the same
            recheck.not_checked("the contention rule's declaration", "no timing_machine record (point before): "
                                "its test did not run, so the trials' flags were checked against the protocol's rule")
        return
    declared = before[0]
    for field, wanted, source in (("contention_rule", protocol.CONTENTION_RULE.declaration(), "protocol.CONTENTION_RULE"),
                                  ("cache_verdict", protocol.cache_verdict_declaration(),
                                   "protocol.cache_verdict_declaration()")):
        if field not in declared and field == "cache_verdict":
            recheck.not_checked("the cache verdict's declared threshold", "the timing_machine record predates it")
            continue
        found = declared.get(field) if isinstance(declared.get(field), dict) else {}
        for name, value in wanted.items():
            if not same(found.get(name), value):
                recheck.differs(declared, f"{field}.{name}", found.get(name), value, source)
    first = recheck.before("timing_trial", declared)
    if first:
        recheck.checker.problem(f"inconsistent: {label(declared)}: the contention rule was declared after "
                                f"{len(first)} timing trial(s), not before the first")
    for after in (r for r in recheck.view.kind("timing_machine") if r.get("point") == "after"):
        recheck.expect(after, "trial_counts", contention.contention_counts(recheck.before("timing_trial", after)),
                       "the timing trials before it (contention.contention_counts)")
        recheck.expect(after, "cpu_pressure_share_during", contention.pressure_between(declared, after),
                       "the CPU pressure totals of the two timing_machine records (contention.pressure_between)")


def _trial(recheck: Recheck, record: dict) -> bool:
    """One completed timing trial's derived fields; whether it has nanosecond stamps to derive them from."""
    found = stamps(record)
    times = summaries.token_times(record)
    if found is not None:
        start, prefill_done, tokens = found
        source = "the trial's nanosecond stamps"
        recheck.expect(record, "prefill_s", (prefill_done - start) / NS_PER_S,
                       f"{source} (t_prefill_done_ns - t_start_ns)")
        recheck.expect(record, "ttft_s", (tokens[0] - start) / NS_PER_S, f"{source} (token_times_ns[0] - t_start_ns)")
        recheck.expect(record, "loop_s", (tokens[-1] - start) / NS_PER_S, f"{source} (token_times_ns[-1] - t_start_ns)")
        recheck.expect(record, "token_times_s", [(t - start) / NS_PER_S for t in tokens],
                       f"{source} (token_times_ns - t_start_ns)")
        recheck.expect(record, "mean_post_first_interval_s", summaries.post_first_interval_s(tokens),
                       f"{source} ((t_n - t_1) / (n - 1), summaries.post_first_interval_s)")
        order = [start, prefill_done, *tokens]
        if any(later < earlier for earlier, later in zip(order, order[1:])):
            recheck.checker.problem(f"inconsistent: {label(record)}: its stamps t_start_ns, t_prefill_done_ns, "
                                    f"token_times_ns run backwards: {order}")
    elif times is not None:
        recheck.expect(record, "ttft_s", times[0], "token_times_s[0] (the first selection's time)")
        recheck.expect(record, "loop_s", times[-1], "token_times_s[-1]")
        if len(times) > 1 and all(b >= a for a, b in zip(times, times[1:])):
            recheck.expect(record, "mean_post_first_interval_s", summaries.mean_post_first_interval(times),
                           "token_times_s ((t_n - t_1) / (n - 1))")
    ttft, prefill = record.get("ttft_s"), record.get("prefill_s")
    if _is_number(ttft) and _is_number(prefill) and ttft < prefill:
        recheck.checker.problem(f"inconsistent: {label(record)} ttft_s: recorded {ttft}, below its own prefill_s "
                                f"{prefill}: the first token is selected after the prompt's prefill, never before")
    _trial_ids(recheck, record)
    _trial_contention(recheck, record)
    return found is not None


# A thread's CPU clock is read just outside the wall-clock stamps at both ends, so its span exceeds the wall span
# by those reads (about a microsecond); more than this is not a reading of one thread.
CPU_OVER_WALL_SLACK_NS = 200_000


def _trial_contention(recheck: Recheck, record: dict) -> None:
    """The trial's derived contention fields (cpu_evidence, contended, contention_reasons) recomputed from its raw
    cpu_readings and clock stamps under the protocol's rule; a flag without the readings it derives from is a
    problem, and so is a thread that used more CPU time than its span's wall time."""
    derived = [name for name in ("cpu_evidence", "contended", "contention_reasons") if name in record]
    if not derived and "cpu_readings" not in record:
        recheck.not_checked("timing trials' contention evidence",
                            "trials written before trials recorded their thread's CPU time carry none")
        return
    expected = contention.recorded_evidence(record)
    if expected is None:
        recheck.checker.problem(f"inconsistent: {label(record)}: {', '.join(derived) or 'its evidence'} without the "
                                "raw cpu_readings and clock stamps they derive from")
        return
    source = "its cpu_readings and clock stamps (contention.trial_evidence under protocol.CONTENTION_RULE)"
    for name in ("contended", "contention_reasons", "cpu_evidence"):
        if name not in record:
            recheck.checker.problem(f"inconsistent: {label(record)}: no {name}, which its cpu_readings give as "
                                    f"{expected[name]!r}")
        elif name != "cpu_evidence" or not isinstance(record[name], dict):
            recheck.expect(record, name, expected[name], source)
        else:
            for path, recorded, computed in common_leaves(record[name], expected[name], name):
                if path.endswith("disturbed_by") and isinstance(recorded, list):
                    recorded = [kind for kind in recorded if kind != "minor_fault"]  # labelled until issue 55
                if not same(recorded, computed):
                    recheck.differs(record, path, recorded, computed, source)
    for span, evidence in expected["cpu_evidence"].items():
        cpu, wall = evidence["cpu_ns"], evidence["wall_ns"]
        if cpu is not None and wall is not None and cpu > wall + CPU_OVER_WALL_SLACK_NS:
            recheck.checker.problem(f"inconsistent: {label(record)} cpu_readings: the {span} span used {cpu} ns of "
                                    f"thread CPU time in {wall} ns of wall time; one thread cannot")


def _trial_ids(recheck: Recheck, record: dict) -> None:
    """A timing trial's counts and EOS positions from its ids, and its prompt ids as the prompt was tokenized."""
    ids = record.get("generated_ids")
    if isinstance(ids, list):
        recheck.expect(record, "output_length", len(ids), "len(generated_ids)")
        eos = record.get("eos_token_ids")
        if isinstance(eos, list):
            positions = [i for i, token in enumerate(ids) if token in eos]
            recheck.expect(record, "eos_positions", positions, "generated_ids and eos_token_ids")
            recheck.expect(record, "eos_selected", bool(positions), "generated_ids and eos_token_ids")
            new_tokens = record.get("new_tokens", protocol.TIMING_NEW_TOKENS)
            if _is_int(new_tokens):
                recheck.expect(record, "continued_past_eos", bool(positions) and positions[0] < new_tokens - 1,
                               "eos_positions and new_tokens")
    from inferlab.verify.consistency_records import greedy_steps

    greedy_steps(recheck, record)  # the loop is greedy: each step's top two, when recorded
    prompt = record.get("prompt_ids")
    if isinstance(prompt, list):
        recheck.expect(record, "prompt_length", len(prompt), "len(prompt_ids)")
        tokenized = recheck.inputs().get(record.get("prompt_id"))
        if tokenized is not None and not same(prompt, tokenized):
            recheck.differs(record, "prompt_ids", prompt, tokenized, f"the input record of {record.get('prompt_id')}")


def _clock_order(recheck: Recheck) -> None:
    """perf_counter_ns, read in record order, never runs backwards: every record's envelope stamp, and the stamps
    a timing trial took inside its test, which lie after the record before it and before its own record.

    The model's load stamps are taken in a fixture, perhaps before records that precede its record, so they are
    checked only against each other and their own record, and bound the trials that follow."""
    records = recheck.records
    stamped = sum(1 for r in records if _is_int(r.get(STAMP_FIELD)))
    if not stamped:
        recheck.not_checked("the records' own stamps in record order",
                            f"the records carry no {STAMP_FIELD} (written before records had one); the timing trials' "
                            f"stamps were checked against each other")
    elif stamped < len(records):
        recheck.not_checked(f"the order of the {len(records) - stamped} record(s) without {STAMP_FIELD}",
                            "a record made outside the session's own writer carries no stamp")
    previous: Optional[tuple[int, str]] = None
    for record in records:
        events = []
        found = stamps(record) if record.get("kind") == "timing_trial" else None
        if found is not None:
            start, prefill_done, tokens = found
            events = [("t_start_ns", start), ("t_prefill_done_ns", prefill_done),
                      *((f"token_times_ns[{i}]", t) for i, t in enumerate(tokens))]
        if _is_int(record.get(STAMP_FIELD)):
            events.append((STAMP_FIELD, record[STAMP_FIELD]))
        for name, value in events:
            if previous is not None and value < previous[0]:
                recheck.checker.problem(f"inconsistent: {label(record)} {name} {value} is earlier than {previous[1]} "
                                        f"{previous[0]}: the monotonic clock ran backwards in record order")
            previous = (value, f"{label(record)} {name}")
        if record.get("kind") == "model_load":
            previous = _load_stamps(recheck, record, previous)


def _load_stamps(recheck: Recheck, record: dict, previous: Optional[tuple[int, str]]) -> Optional[tuple[int, str]]:
    start, end, own = record.get("load_start_ns"), record.get("load_end_ns"), record.get(STAMP_FIELD)
    if not (_is_int(start) and _is_int(end)):
        return previous
    order = [start, end] + ([own] if _is_int(own) else [])
    if any(later < earlier for earlier, later in zip(order, order[1:])):
        recheck.checker.problem(f"inconsistent: {label(record)}: load_start_ns, load_end_ns"
                                f"{', ' + STAMP_FIELD if _is_int(own) else ''} run backwards: {order}")
    recheck.expect(record, "elapsed_s", (end - start) / NS_PER_S, "load_end_ns - load_start_ns")
    if previous is None or end > previous[0]:
        return end, f"{label(record)} load_end_ns"
    return previous


def _call_outcomes(recheck: Recheck) -> dict:
    """{node id: the outcome record of its call phase}."""
    return {r.get("test"): r for r in recheck.view.kind("test_outcome") if r.get("phase") == "call"}


def _durations(recheck: Recheck) -> None:
    """Each test that timed something lasted at least as long as what it timed: a timing trial's loop, a
    generation trial's generate() call, the batching calls."""
    outcomes = _call_outcomes(recheck)
    timed = [(r, "loop_s") for r in recheck.completed("timing_trial")] + \
        [(r, "elapsed_s") for r in recheck.completed("generation")]
    for record, field in timed:
        outcome = outcomes.get(record.get("test"))
        elapsed = record.get(field)
        if outcome is None or not _is_number(outcome.get("duration")) or not _is_number(elapsed):
            continue
        if outcome["duration"] < elapsed:
            recheck.checker.problem(f"inconsistent: {label(outcome)} duration: recorded {outcome['duration']} s, "
                                    f"shorter than {label(record)} {field} {elapsed} s that the test timed inside it")


def _summaries(recheck: Recheck) -> None:
    """timing_summary, cache_divergence and loop_vs_generate, each recomputed with its own function from the
    trials written before it (what the test that wrote it read)."""
    for record in recheck.view.kind("timing_summary"):
        trials = recheck.before("timing_trial", record)
        expected = _recompute(recheck, record, summaries.timing_summary, trials, record.get("prompt_id"),
                              record.get("use_cache"))
        if expected is None:
            continue
        recheck.expect_fields(record, expected, "its measured trials (summaries.timing_summary)",
                              skip=("mean_post_first_interval_s",))
        _interval_summary(recheck, record, expected, trials)
    for record in recheck.view.kind("cache_divergence"):
        expected = _recompute(recheck, record, summaries.cache_divergence, recheck.before("timing_trial", record),
                              record.get("prompt_id"))
        if expected is not None:
            recheck.expect_fields(record, expected, "the measured trials' ids (summaries.cache_divergence)")
    for record in recheck.view.kind("loop_vs_generate"):
        expected = _recompute(recheck, record, summaries.loop_vs_generate, recheck.before("timing_trial", record),
                              recheck.before("generation", record), record.get("prompt_id", "P1"))
        if expected is not None:
            recheck.expect_fields(record, expected, "the timing trials' and generation trials' ids "
                                                    "(summaries.loop_vs_generate)")


def _recompute(recheck: Recheck, record: dict, function, *arguments) -> Optional[dict]:
    """function(*arguments), or None (said once) when the records it reads lack what it needs."""
    try:
        return function(*arguments)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        recheck.not_checked(f"{label(record)}", f"cannot be recomputed from the records before it "
                                                f"({type(error).__name__}: {error})")
        return None


def _interval_summary(recheck: Recheck, record: dict, expected: dict, trials: list[dict]) -> None:
    """The summary's post-first-token intervals, as today's writer takes them (each trial's own, from its
    nanosecond stamps) or as the writer before it did (from each trial's seconds, runs before dabe199): each
    exactly, whichever of the two wrote the run. The two differ in the last bits only."""
    field = "mean_post_first_interval_s"
    if field not in record or field not in expected:
        return
    if same(record[field], expected[field]):
        return
    from_seconds = [{k: v for k, v in t.items() if k not in (field, "token_times_ns")} for t in trials]
    older = _recompute(recheck, record, summaries.timing_summary, from_seconds, record.get("prompt_id"),
                       record.get("use_cache"))
    if older is not None and same(record[field], older.get(field)):
        return
    for path, recorded, computed in common_leaves(record[field], expected[field], field):
        if not same(recorded, computed):
            recheck.differs(record, path, recorded, computed, "its measured trials (summaries.timing_summary)")
