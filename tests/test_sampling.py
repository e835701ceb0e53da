"""inferlab.measure.sampling: one generate() trial, its complete config, processors and raw logits."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GenerationConfig

from inferlab import protocol
from inferlab.measure.inputs import encode_prompt
from inferlab.measure.loading import capture_messages
from inferlab.measure.sampling import (
    build_generation_config,
    generation_cache_record,
    observe_generation_cache,
    processors_for,
    reset_random_state,
    run_generation_trial,
    stop_reason,
)
from inferlab.specimen.build import tiny_gpt_neox, tiny_tokenizer

@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_gpt_neox(vocab_size=len(tokenizer))


@pytest.fixture(scope="module")
def prompt(tokenizer):
    record, input_ids, attention_mask = encode_prompt(tokenizer, "P1", protocol.PROMPTS["P1"])
    return record, input_ids, attention_mask


def trial(model, tokenizer, prompt, condition_name, seed=None, eos_token_id=None):
    record, input_ids, attention_mask = prompt
    eos = record["eos_token_id"] if eos_token_id is None else eos_token_id
    return run_generation_trial(
        model, tokenizer, input_ids, attention_mask,
        protocol.CONDITIONS[condition_name], seed, eos, record["pad_token_id"],
    )


@pytest.fixture(scope="module")
def first_trials(model, tokenizer, prompt):
    """The first trial of each condition (greedy, and the sampling conditions at the first seed)."""
    return {
        name: trial(model, tokenizer, prompt, name, None if name == "G" else protocol.SEEDS[0])
        for name in protocol.CONDITIONS
    }


# --- repeatability -----------------------------------------------------------------------


@pytest.mark.slow
def test_greedy_repetitions_return_identical_ids(model, tokenizer, prompt):
    runs = [trial(model, tokenizer, prompt, "G")[0] for _ in range(protocol.GREEDY_REPETITIONS)]
    assert [r["generated_ids"] for r in runs[1:]] == [runs[0]["generated_ids"]] * (len(runs) - 1)
    assert all(r["rng_reset"] == [] for r in runs)


@pytest.mark.slow
def test_same_seed_reproduces_after_another_seed_ran(model, tokenizer, prompt):
    seed, other = protocol.RERUN_SEED, protocol.SEEDS[1]
    first = trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, seed)[0]
    trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, other)  # moves the global generator on
    again = trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, seed)[0]
    assert again["generated_ids"] == first["generated_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", protocol.SEEDS)
@pytest.mark.parametrize("condition_name", ["S1", "S2", "S3"])
def test_each_sampling_trial_runs_and_records_its_reset(model, tokenizer, prompt, condition_name, seed):
    record = trial(model, tokenizer, prompt, condition_name, seed)[0]
    assert record["status"] == "ok"
    assert [r["seed"] for r in record["rng_reset"]] == [seed] * 3
    assert [r["call"] for r in record["rng_reset"]] == ["torch.manual_seed", "random.seed", "numpy.random.seed"]
    assert record["generated_length"] == len(record["generated_ids"]) == record["logit_steps_returned"]
    assert 1 <= record["generated_length"] <= protocol.MAX_NEW_TOKENS
    assert record["sequence_ids"] == record["prompt_ids"] + record["generated_ids"]


def test_seed_is_required_for_sampling_and_refused_for_greedy(model, tokenizer, prompt):
    with pytest.raises(ValueError, match="needs a seed"):
        trial(model, tokenizer, prompt, "S1", None)
    with pytest.raises(ValueError, match="takes no seed"):
        trial(model, tokenizer, prompt, "G", 17)


def test_reset_random_state_makes_all_generators_repeat():
    import random

    import numpy as np

    reset_random_state(5)
    first = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
    reset_random_state(5)
    assert (torch.rand(3).tolist(), random.random(), float(np.random.rand())) == first


# --- configuration and processors ---------------------------------------------------------


@pytest.mark.parametrize(
    "condition_name, expected",
    [
        ("G", []),
        ("S1", []),  # temperature 1.0, top_p 1.0 and top_k 0 build no warper
        ("S2", ["TemperatureLogitsWarper"]),
        ("S3", ["TopPLogitsWarper"]),
    ],
)
def test_processors_per_condition(model, condition_name, expected):
    config = build_generation_config(protocol.CONDITIONS[condition_name], 0, 0, 0)
    assert [p["class"] for p in processors_for(model, config, 9)] == expected


def test_temperature_is_applied_before_top_p(model):
    both = protocol.Condition("T+P", do_sample=True, temperature=0.5, top_p=0.8, top_k=0)
    processors = processors_for(model, build_generation_config(both, 0, 0, 0), 9)
    assert [p["class"] for p in processors] == ["TemperatureLogitsWarper", "TopPLogitsWarper"]
    assert processors[0]["params"] == {"temperature": 0.5}
    assert processors[1]["params"]["top_p"] == 0.8


def test_top_k_zero_is_what_removes_the_top_k_warper(model):
    # Positive control: the library default top_k=50 would add a TopK warper under sampling.
    default_k = protocol.Condition("k50", do_sample=True, temperature=1.0, top_p=1.0, top_k=50)
    assert [p["class"] for p in processors_for(model, build_generation_config(default_k, 0, 0, 0), 9)] == [
        "TopKLogitsWarper"
    ]


@pytest.mark.parametrize("condition_name", ["S1", "S2", "S3"])
def test_sampling_config_dict_holds_explicit_top_k_zero(condition_name):
    condition = protocol.CONDITIONS[condition_name]
    config = build_generation_config(condition, 0, 0, 0).to_dict()
    assert (config["do_sample"], config["top_k"], config["temperature"], config["top_p"]) == (
        True, 0, condition.temperature, condition.top_p,
    )


def test_config_dict_is_complete_with_defaults():
    config = build_generation_config(protocol.CONDITIONS["G"], 0, 0, 0)
    full, diff = config.to_dict(), config.to_diff_dict()
    assert set(diff) < set(full)
    assert {k: full[k] for k in protocol.GENERATION_FIXED} == protocol.GENERATION_FIXED
    assert full["do_sample"] is False
    # Defaults present in the record although greedy never applies them.
    assert {"temperature", "top_p", "top_k", "repetition_penalty", "no_repeat_ngram_size", "min_length"} <= set(full)


def test_checkpoint_generation_config_does_not_leak_in(tokenizer, prompt):
    # A checkpoint whose own generation_config samples with top_k=7 must not change our greedy trial.
    model = tiny_gpt_neox(vocab_size=len(tokenizer))
    reference = trial(model, tokenizer, prompt, "G")[0]
    model.generation_config.do_sample, model.generation_config.top_k = True, 7
    config = build_generation_config(protocol.CONDITIONS["G"], 0, 0, 0)
    prepared, _ = model._prepare_generation_config(copy.deepcopy(config), use_model_defaults=False)
    assert prepared.to_dict() == config.to_dict()
    leaked = trial(model, tokenizer, prompt, "G")[0]
    assert leaked["processors"] == []
    assert leaked["generated_ids"] == reference["generated_ids"]


# --- warnings -------------------------------------------------------------------------------


def test_greedy_trial_emits_no_warnings(first_trials):
    assert first_trials["G"][0]["warnings"] == []


def test_capture_sees_the_inactive_flag_warning_that_greedy_avoids():
    # Positive control for the no-warning test: a sample-only flag under greedy is warned about.
    with capture_messages() as messages:
        GenerationConfig(do_sample=False, temperature=0.5)
    assert any("temperature" in m for m in messages)


# --- first-step logits ----------------------------------------------------------------------


def test_first_step_logits_have_vocab_shape(model, first_trials):
    for record, logits, scores in first_trials.values():
        assert logits.shape == scores.shape == (model.config.vocab_size,)
        assert logits.dtype == torch.float32
        assert record["first_step_logits_shape"] == [model.config.vocab_size]


def test_first_step_logits_equal_across_conditions(first_trials):
    logits = {name: t[1] for name, t in first_trials.items()}
    assert all(torch.equal(logits["G"], value) for value in logits.values())
    assert len({t[0]["first_step_logits_sha256"] for t in first_trials.values()}) == 1


def test_temperature_scores_are_processed_logits_not_raw(first_trials):
    # In 4.57.1 `scores` hold the processed logits (divided by T, not log-softmaxed); `logits` are raw.
    _, logits, scores = first_trials["S2"]
    temperature = protocol.CONDITIONS["S2"].temperature
    assert not torch.equal(scores, logits)
    assert torch.equal(scores, logits / temperature)


def test_top_p_scores_mask_tokens_that_raw_logits_keep(first_trials):
    _, logits, scores = first_trials["S3"]
    kept = torch.isfinite(scores)
    assert torch.isfinite(logits).all()
    assert not kept.all()
    assert torch.equal(scores[kept], logits[kept])


def test_greedy_scores_equal_raw_logits(first_trials):
    _, logits, scores = first_trials["G"]
    assert torch.equal(scores, logits)


# --- stopping -------------------------------------------------------------------------------


def test_stop_reason_rule():
    assert stop_reason([5, 0], eos_token_id=0, max_new_tokens=16) == "eos"
    assert stop_reason(list(range(1, 17)), eos_token_id=0, max_new_tokens=16) == "max_new_tokens"
    assert stop_reason(list(range(1, 16)) + [0], eos_token_id=0, max_new_tokens=16) == "eos"
    assert stop_reason([5, 6], eos_token_id=0, max_new_tokens=16) == "unexplained"


def test_selected_eos_stops_generation(model, tokenizer, prompt):
    # Declaring the greedy first token to be the EOS id must end the trial after one selection.
    first_token = trial(model, tokenizer, prompt, "G")[0]["generated_ids"][0]
    record = trial(model, tokenizer, prompt, "G", eos_token_id=first_token)[0]
    assert record["generated_ids"] == [first_token]
    assert (record["generated_length"], record["stop_reason"], record["eos_positions"]) == (1, "eos", [0])


def test_full_length_trial_is_stopped_by_max_new_tokens(first_trials):
    record = first_trials["G"][0]
    if record["eos_positions"]:
        pytest.fail(f"precondition: the tiny model's greedy run selected EOS at {record['eos_positions']}")
    assert (record["generated_length"], record["stop_reason"]) == (protocol.MAX_NEW_TOKENS, "max_new_tokens")


@pytest.mark.parametrize("condition_name", list(protocol.CONDITIONS))
def test_expected_processors_match_what_generate_builds(model, condition_name):
    from inferlab.measure.sampling import expected_processor_classes

    condition = protocol.CONDITIONS[condition_name]
    config = build_generation_config(condition, eos_token_id=0, pad_token_id=0)
    built = [p["class"] for p in processors_for(model, config, input_ids_length=8)]
    assert built == expected_processor_classes(condition)


def test_expected_processors_include_a_top_k_that_is_not_zero():
    from inferlab.measure.sampling import expected_processor_classes

    condition = protocol.Condition("K", do_sample=True, temperature=0.7, top_p=0.9, top_k=50)
    assert expected_processor_classes(condition) == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]


def test_recorded_processors_are_observed_from_the_real_call(model, tokenizer, prompt, monkeypatch):
    """Whatever generate() actually builds is what the record lists, even something the config did not ask for."""
    from transformers.generation import RepetitionPenaltyLogitsProcessor

    original = type(model)._get_logits_processor

    def with_a_stowaway(self, *args, **kwargs):
        processors = original(self, *args, **kwargs)
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=1.3))
        return processors

    monkeypatch.setattr(type(model), "_get_logits_processor", with_a_stowaway)
    record, _, _ = trial(model, tokenizer, prompt, "G")
    assert [p["class"] for p in record["processors"]] == ["RepetitionPenaltyLogitsProcessor"]
    assert record["generation_config_effective"]["max_length"] == record["prompt_length"] + protocol.MAX_NEW_TOKENS
    assert "_get_logits_processor" not in vars(model)  # the observer left the instance as it found it


# --- a fresh generation cache per trial ----------------------------------------------------------


def test_every_trial_records_a_fresh_generation_cache(first_trials):
    for name, (record, _, _) in first_trials.items():
        cache = record["generation_cache"]
        assert cache["fresh"], (name, cache)
        assert (cache["cache_class"], cache["length_before_first_forward"]) == ("DynamicCache", 0)
        assert cache["forwards"] == record["generated_length"] and cache["past_key_values_passed_by_caller"] is False
        assert "built its own cache" in cache["how"]


@pytest.mark.slow
def test_same_seed_rerun_states_a_fresh_cache_of_its_own(model, tokenizer, prompt):
    first = trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, protocol.RERUN_SEED)[0]
    rerun = trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, protocol.RERUN_SEED)[0]
    assert first["generation_cache"]["fresh"] and rerun["generation_cache"]["fresh"]
    assert rerun["generation_cache"]["new_object"]


@torch.inference_mode()
def test_a_cache_that_already_holds_tokens_is_not_fresh(model, prompt):
    """Negative control: a forward that starts from a filled cache is reported as not fresh, and why."""
    from transformers import DynamicCache

    _, input_ids, attention_mask = prompt
    stale = DynamicCache(config=model.config)
    model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=stale, use_cache=True)
    with observe_generation_cache(model) as seen:
        model(input_ids=input_ids[:, -1:], past_key_values=stale, use_cache=True)
    cache = generation_cache_record(seen, passed_by_caller=True)
    assert not cache["fresh"] and cache["length_before_first_forward"] == input_ids.shape[1]
    assert "passed a cache" in cache["how"]


def test_the_same_cache_object_twice_is_not_new(model):
    """A harness that handed one cache object to two calls would be caught even if the object were emptied."""
    from transformers import DynamicCache

    reused = DynamicCache(config=model.config)
    for _ in range(2):
        cache = generation_cache_record({"forwards": 1, "first_cache": reused, "length_before_first_forward": 0,
                                         "same_object_every_forward": True})
    assert not cache["new_object"] and not cache["fresh"] and "NOT a new object" in cache["how"]
