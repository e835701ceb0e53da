"""Part 5: the instrumented greedy loop over a fixed, alternating schedule, and honest stats."""

import collections

import pytest

from inferlab import protocol
from inferlab.measure import stats

SCHEDULE = protocol.timing_schedule()


def schedule_param(trial):
    category = "timing_warmup" if trial.warmup else "timing_measured"
    budget = pytest.mark.budget(category=category, selections=protocol.TIMING_NEW_TOKENS)
    return pytest.param(trial, marks=[budget], id=trial.test_id)


@pytest.mark.records("timing_machine")
def test_machine_before_timing(inferlab_run, record):
    """The machine just before the first timing trial, the contention rule every trial will be judged by and the
    threshold every cache verdict will be judged against, declared here before any trial runs (as the cache
    tolerance is before any error)."""
    from inferlab.host import machine
    from inferlab.measure import usage

    state = machine.machine_state()
    rule = protocol.CONTENTION_RULE
    # the run's one full collection, here and not before each trial: no trial starts cold after one
    collection = usage.collect_once("test_machine_before_timing: after the machine readings, before the first "
                                        "timing trial")
    from inferlab.measure import decode_loop

    record("timing_machine", point="before", **state, trials=decode_loop.declaration(inferlab_run.collector_policy),
           contention_rule=rule.declaration(), cache_verdict=protocol.cache_verdict_declaration(),
           collection=collection)
    unexplained = machine.unexplained_readings(state)
    assert not unexplained, f"machine readings neither available nor said unavailable: {unexplained}"


@pytest.mark.records("timing_trial", "phase")
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("trial", [schedule_param(t) for t in SCHEDULE])
def test_timing_trial(trial, model, tokenizer, encoded_prompts, inferlab_run, forward_window, record):
    from inferlab.measure import decode_loop, inputs, loading, memory

    encoded = encoded_prompts[trial.prompt_id]
    eos_id = encoded["record"]["eos_token_id"]
    identity = {"prompt_id": trial.prompt_id, "use_cache": trial.use_cache, "warmup": trial.warmup,
                "schedule_index": trial.schedule_index, "repetition": trial.repetition, "schedule_id": trial.test_id}
    messages = []
    try:
        # The capture wraps the whole loop: it is set up before t_start and read after t_16.
        with loading.capture_messages() as messages:
            result = decode_loop.run_greedy_loop(model, encoded["input_ids"], encoded["attention_mask"],
                                                 use_cache=trial.use_cache, eos_token_id=eos_id,
                                                 collector_policy=inferlab_run.collector_policy)
    except BaseException as error:  # a trial timeout arrives as pytest's Failed, a BaseException
        record("timing_trial", **identity, status="failed", error=f"{type(error).__name__}: {error}",
               warnings=messages, forward_mode=forward_window.summary())
        raise
    # Everything below is outside the timed region.
    mode = forward_window.summary()
    text, decode_s = decode_loop.decode_profiling_text(tokenizer, result.generated_ids)
    cache_after = memory.cache_storage(result.cache) if result.cache is not None else None
    record("timing_trial", **{**result.to_record(), **identity}, status="ok", prompt_ids=encoded["record"]["token_ids"],
           profiling_text_not_a_response=text, profiling_pieces=inputs.token_pieces(tokenizer, result.generated_ids),
           decode_s=decode_s, cache_after_loop=cache_after, warnings=messages, forward_mode=mode)
    record("phase", name="output_decoding", trial_id=trial.test_id, source="timing", elapsed_s=decode_s,
           label=decode_loop.PROFILING_DECODING_LABEL)
    assert len(result.generated_ids) == protocol.TIMING_NEW_TOKENS, (
        f"selected {len(result.generated_ids)} tokens, the workload fixes {protocol.TIMING_NEW_TOKENS}"
    )
    times = result.token_times_ns
    assert all(a < b for a, b in zip(times, times[1:])) and result.t_start_ns <= result.t_prefill_done_ns <= times[0]
    # The prefill's shape is the one that tells: a cache-on step's forward feeds one token whatever logits_to_keep is.
    kept = decode_loop.loop_logits_to_keep(result.prefill_logits_shape, result.last_logits_shape,
                                           protocol.LOGITS_TO_KEEP, model.config.vocab_size)
    assert kept["ok"], f"logits against logits_to_keep={protocol.LOGITS_TO_KEEP}: {kept}"
    assert not loading.violation_message(mode), loading.violation_message(mode)


@pytest.mark.records("timing_machine")
def test_machine_after_timing(inferlab_run, record):
    """The machine just after the last timing trial, with how many trials the declared rule marked contended; the
    freeze of the one collection before the block is undone here."""
    from inferlab.host import machine
    from inferlab.measure import usage

    usage.thaw()
    state = machine.machine_state()
    counts = usage.contention_counts(inferlab_run.records_of("timing_trial"))
    before = next((r for r in inferlab_run.records_of("timing_machine") if r.get("point") == "before"), None)
    record("timing_machine", point="after", **state, trial_counts=counts,
           cpu_pressure_share_during=machine.pressure_between(before, state) if before else None)
    unexplained = machine.unexplained_readings(state)
    assert not unexplained, f"machine readings neither available nor said unavailable: {unexplained}"
    assert before is not None, "no timing_machine record from before the timing trials"


@pytest.mark.records("clock_overhead")
def test_timestamp_overhead(record):
    """What the loop's own clock reads cost, measured in this run from the clock alone (no forward, between
    trials); beside it benchmarks/overhead.py's figures for the whole instrumentation (the per-forward hook too),
    labelled as another run's (its date, commit and machine), never as this one's."""
    from inferlab.host import machine
    from inferlab.measure import decode_loop

    overhead = decode_loop.clock_overhead()
    record("clock_overhead", **overhead, benchmark=machine.benchmark_figures())
    assert overhead["elapsed_ns"] > 0, f"{overhead['reads']} clock reads took {overhead['elapsed_ns']} ns"
    assert overhead["reads_per_trial"] == decode_loop.clock_reads_per_trial(protocol.TIMING_NEW_TOKENS)


@pytest.mark.records("weight_read")
@pytest.mark.requires("model_inspection")
def test_decode_step_weight_read(model, record):
    """How long reading the decode step's own weight tensors once takes, in the session's thread setting and
    outside every timed region (no forward), beside this machine's cache sizes and whether the weights fit."""
    from inferlab.host import machine
    from inferlab.measure import memory

    read = memory.weight_read_time(model, caches=machine.cache_sizes())
    record("weight_read", **read)
    assert read["threads"] == {"intra_op": protocol.INTRA_OP_THREADS, "inter_op": protocol.INTER_OP_THREADS}, (
        f"threads: expected the session's {protocol.INTRA_OP_THREADS}/{protocol.INTER_OP_THREADS}, actual {read['threads']}")
    assert all(s > 0 for s in read["seconds"]), f"a pass took no measurable time: {read['seconds']}"


@pytest.mark.records("loop_vs_generate")
@pytest.mark.diagnostic
@pytest.mark.requires("model_inspection", "inputs")
def test_loop_matches_generate(model, inferlab_run, forward_window, record):
    """The loop's cache-on selections equal generate()'s greedy ones for P1, up to generate's EOS stop. The other
    timing prompts have no generate() call in the budget: for each, the inputs the loop fed at every step of its
    first measured cache-on trial equal those generate()'s own preparation builds for the same ids (no forward)."""
    from inferlab.measure import decode_loop

    trials = inferlab_run.records_of("timing_trial")
    check = decode_loop.loop_vs_generate(trials, inferlab_run.records_of("generation"))
    inputs = {}
    for prompt_id in sorted(check.get("not_compared") or []):
        trial = next((t for t in stats.completed(trials)
                      if t["prompt_id"] == prompt_id and t["use_cache"] and not t["warmup"]), None)
        if trial is not None:
            inputs[prompt_id] = decode_loop.loop_inputs_match_generate(model, prompt_id, trial["prompt_ids"],
                                                                      trial["generated_ids"], trial["schedule_id"])
    record("loop_vs_generate", **check, inputs_vs_generate=inputs, forward_mode=forward_window.summary())
    if not check["available"]:
        pytest.skip(f"not decidable: {check['reason']} (a missing trial failed there, or was not selected)")
    assert check["equal"], (
        f"loop ids {check['loop_ids']} vs generate ids {check['generate_ids']}: first difference at "
        f"{check['first_difference']}"
    )
    unequal = {prompt_id: found["first_difference"] for prompt_id, found in inputs.items() if not found["equal"]}
    assert not unequal, f"the loop's inputs against generate()'s preparation: {unequal}"


@pytest.mark.records("timing_summary")
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
@pytest.mark.parametrize("prompt_id", list(protocol.TIMING_PROMPTS))
def test_timing_summary(prompt_id, use_cache, inferlab_run, record):
    summary = stats.timing_summary(inferlab_run.records_of("timing_trial"), prompt_id, use_cache)
    record("timing_summary", **summary)
    skip_unless_measured(inferlab_run, prompt_id, (use_cache,))
    assert summary["measured_trials"] == protocol.TIMING_MEASURED_PER_COMBINATION, (
        f"{prompt_id} cache {'on' if use_cache else 'off'}: {summary['measured_trials']} measured trials, "
        f"schedule has {protocol.TIMING_MEASURED_PER_COMBINATION}"
    )


def skip_unless_measured(inferlab_run, prompt_id: str, sides: tuple) -> None:
    """Skip as not decidable when a measured trial of the prompt on these sides (cache on, off) did not complete:
    it failed, recorded as that trial's failure, or the selection left it out. With every trial there, a check
    reading them asserts what it finds."""
    done = collections.Counter(t["use_cache"] for t in stats.completed(inferlab_run.records_of("timing_trial"))
                               if t["prompt_id"] == prompt_id and not t["warmup"])
    short = [side for side in sides if done[side] < protocol.TIMING_MEASURED_PER_COMBINATION]
    if short:
        pytest.skip(f"not decidable: fewer than {protocol.TIMING_MEASURED_PER_COMBINATION} measured {prompt_id} "
                    f"cache-{'on' if short[0] else 'off'} trials completed ({done[short[0]]})")


@pytest.mark.records("cache_divergence")
@pytest.mark.diagnostic
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("prompt_id", list(protocol.TIMING_PROMPTS))
def test_cache_divergence(prompt_id, inferlab_run, record):
    """Free-running cache-on and cache-off ids: where, if anywhere, they first differ (an observation)."""
    divergence = stats.cache_divergence(inferlab_run.records_of("timing_trial"), prompt_id)
    record("cache_divergence", **divergence)
    skip_unless_measured(inferlab_run, prompt_id, (True, False))
    assert divergence["pairs_compared"] == protocol.TIMING_MEASURED_PER_COMBINATION, (
        f"{prompt_id}: compared {divergence['pairs_compared']} cache-on/off pairs, expected "
        f"{protocol.TIMING_MEASURED_PER_COMBINATION}"
    )
