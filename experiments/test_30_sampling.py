"""Part 3: the 26-trial sampling matrix, its raw first-step logits, and what repeats."""

import pytest

from inferlab import protocol
from inferlab.measure import stats

TRIALS = protocol.generation_trials()
FIRST_STEP_FILE = "first_step_logits"
FIRST_STEP_SCORES_FILE = "first_step_scores"
REFERENCE = "G's raw first-step logits"


def trial_param(trial):
    budget = pytest.mark.budget(category="generation", selections=protocol.MAX_NEW_TOKENS)
    # the matched-prefix cache test follows this trial's ids (Part 4): it requires this check
    reference = [pytest.mark.provides("cache_reference_trial")] if trial.is_cache_reference else []
    return pytest.param(trial, marks=[budget, *reference], id=trial.test_id)


# A failed trial is recorded and the matrix goes on; the checks below read whatever trials exist
# and name any that are missing, rather than being skipped wholesale by one failure.
@pytest.mark.records("generation", "phase")
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("trial", [trial_param(t) for t in TRIALS])
def test_generation_trial(trial, model, tokenizer, encoded_prompts, tensor_store, forward_window, record):
    from inferlab.measure import loading, sampling

    encoded = encoded_prompts[trial.prompt_id]
    identity = {"trial_index": trial.index, "trial_id": trial.test_id, "prompt_id": trial.prompt_id,
                "condition": trial.condition, "seed": trial.seed, "repetition": trial.repetition,
                "is_rerun": trial.is_rerun}
    try:
        fields, logits, scores = sampling.run_generation_trial(
            model, tokenizer, encoded["input_ids"], encoded["attention_mask"],
            protocol.CONDITIONS[trial.condition], trial.seed,
            eos_token_id=encoded["record"]["eos_token_id"], pad_token_id=encoded["record"]["pad_token_id"],
        )
    except BaseException as error:  # a trial timeout arrives as pytest's Failed, a BaseException
        record("generation", **identity, status="failed", error=f"{type(error).__name__}: {error}",
               forward_mode=forward_window.summary())
        raise
    first_step = first_step_scores = None
    if trial.keeps_first_step_logits:
        key = f"{trial.prompt_id}/{trial.condition}"
        first_step = tensor_store.put(FIRST_STEP_FILE, key, logits)
        first_step_scores = tensor_store.put(FIRST_STEP_SCORES_FILE, key, scores)
    assert (fields["condition"], fields["seed"]) == (trial.condition, trial.seed)
    mode = forward_window.summary()
    record("generation", **{**fields, **identity}, first_step_logits=first_step, first_step_scores=first_step_scores,
           forward_mode=mode)
    record("phase", name="output_decoding", trial_id=trial.test_id, source="generation",
           elapsed_s=fields["decode_s"], label=sampling.OUTPUT_DECODING_LABEL)
    assert fields["generated_length"] <= protocol.MAX_NEW_TOKENS, (
        f"generated {fields['generated_length']} tokens, budget {protocol.MAX_NEW_TOKENS}"
    )
    assert fields["generation_cache"]["fresh"], f"not a fresh generation cache: {fields['generation_cache']['how']}"
    assert not loading.violation_message(mode), loading.violation_message(mode)


@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("condition", list(protocol.CONDITIONS))
def test_processors_are_only_the_conditions_controls(condition, inferlab_run):
    """generate() built exactly the processors the condition implies: no hidden top-k, penalty or filter."""
    from inferlab.measure.sampling import expected_processor_classes

    expected = expected_processor_classes(protocol.CONDITIONS[condition])
    built = {r["trial_id"]: [p["class"] for p in r["processors"]]
             for r in stats.completed(inferlab_run.records_of("generation")) if r["condition"] == condition}
    if not built:
        pytest.skip(f"not decidable: no {condition} trial completed (each failure is recorded with its trial)")
    wrong = {trial: classes for trial, classes in built.items() if classes != expected}
    assert not wrong, f"{condition}: expected processors {expected}, generate built {wrong}"


@pytest.mark.requires("model_inspection", "inputs")
def test_no_generation_warnings(inferlab_run):
    """A complete, neutral config draws no warning (for example about sampling flags under greedy)."""
    warned = {r["trial_id"]: r["warnings"] for r in inferlab_run.records_of("generation") if r.get("warnings")}
    assert not warned, f"warnings during generation: {warned}"


@pytest.mark.records("first_step_logits_check")
@pytest.mark.diagnostic
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("prompt_id", list(protocol.PROMPTS))
def test_first_step_logits_do_not_depend_on_selection(prompt_id, tensor_store, record):
    """Selection settings act after the forward pass, so every condition sees the same raw logits."""
    from inferlab.measure.cache_check import compare_vectors

    reference = tensor_store.get(FIRST_STEP_FILE, f"{prompt_id}/G")
    comparisons = {}
    for condition in protocol.CONDITIONS:
        other = tensor_store.get(FIRST_STEP_FILE, f"{prompt_id}/{condition}")
        comparisons[condition] = compare_vectors(other, reference, protocol.CACHE_TOLERANCE, REFERENCE)
    record("first_step_logits_check", prompt_id=prompt_id, reference="G",
           tolerance=protocol.CACHE_TOLERANCE.describe(REFERENCE), comparisons=comparisons)
    failing = {c: r["max_abs_diff"] for c, r in comparisons.items() if not r["passed"]}
    assert not failing, (
        f"{prompt_id}: first-step raw logits differ from G beyond {protocol.CACHE_TOLERANCE.describe(REFERENCE)}: "
        f"{failing}"
    )


@pytest.mark.records("processed_scores_check")
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("prompt_id", list(protocol.PROMPTS))
def test_processed_scores_differ_where_temperature_is_not_one(prompt_id, tensor_store, record):
    """The processed scores are not the raw logits when the temperature rescales them (S2)."""
    from inferlab.measure.cache_check import compare_vectors

    rows = {}
    for name, condition in protocol.CONDITIONS.items():
        raw = tensor_store.get(FIRST_STEP_FILE, f"{prompt_id}/{name}")
        scores = tensor_store.get(FIRST_STEP_SCORES_FILE, f"{prompt_id}/{name}")
        rows[name] = {"temperature": condition.temperature,
                      "scores_vs_raw": compare_vectors(scores, raw, protocol.CACHE_TOLERANCE, "raw logits")}
    record("processed_scores_check", prompt_id=prompt_id, rows=rows)
    tempered = [n for n, c in protocol.CONDITIONS.items() if c.temperature not in (None, 1.0)]
    assert tempered, "the protocol has no condition with temperature != 1"
    same = [n for n in tempered if rows[n]["scores_vs_raw"]["bitwise_equal"]]
    assert not same, f"{prompt_id}: processed scores equal raw logits under temperature != 1 for {same}"


@pytest.mark.records("sampling_summary")
@pytest.mark.diagnostic
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("prompt_id", list(protocol.PROMPTS))
def test_greedy_repetitions_identical(prompt_id, inferlab_run, record):
    summary = stats.sampling_summary(inferlab_run.records_of("generation"), prompt_id)
    record("sampling_summary", **summary)
    greedy = summary["greedy_repeatability"]
    if greedy["repetitions"] != protocol.GREEDY_REPETITIONS:
        # a trial that did not complete is the trial's own failure, recorded there; no finding either way
        pytest.skip(f"not decidable: {greedy['repetitions']} of {protocol.GREEDY_REPETITIONS} greedy repetitions "
                    f"completed (failed or not run: {summary['trials_failed']})")
    assert greedy["identical"], f"{prompt_id}: greedy repetitions differ: {greedy['distinct_sequences']}"


@pytest.mark.diagnostic
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("prompt_id", list(protocol.PROMPTS))
def test_same_seed_rerun_identical(prompt_id, inferlab_run):
    summary = stats.sampling_summary(inferlab_run.records_of("generation"), prompt_id)
    rerun = summary["seed_rerun"]
    if rerun["first"] is None or rerun["rerun"] is None:
        pytest.skip(f"not decidable: the {protocol.RERUN_CONDITION} seed {protocol.RERUN_SEED} first run or its "
                    f"rerun did not complete (failed or not run: {summary['trials_failed']})")
    assert rerun["identical"], (
        f"{prompt_id}: {protocol.RERUN_CONDITION} seed {protocol.RERUN_SEED} first run {rerun['first']} "
        f"vs rerun {rerun['rerun']}"
    )
