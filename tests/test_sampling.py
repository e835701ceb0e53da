"""inferlab.measure.sampling on the tiny model: one generate() trial, its complete config, what acted on the logits
(observed in the call), its raw first-step logits, its stop, its generators and its fresh cache."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import DynamicCache, GenerationConfig, RepetitionPenaltyLogitsProcessor

from inferlab import protocol
from inferlab.measure.inputs import encode_prompt
from inferlab.measure.loading import capture_messages
from inferlab.measure.sampling import (build_generation_config, expected_processor_classes, generation_cache_record,
                                       observe_generation_cache, reset_random_state, run_generation_trial, stop_reason)
from inferlab.specimen.build import tiny_gpt_neox
from tiny_specimen import tiny_tokenizer


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_gpt_neox(vocab_size=len(tokenizer))


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return encode_prompt(tokenizer, "P1", protocol.PROMPTS["P1"])


def trial(model, tokenizer, prompt, condition, seed=None, eos_token_id=None):
    record, input_ids, attention_mask = prompt
    condition = protocol.CONDITIONS[condition] if isinstance(condition, str) else condition
    eos = record["eos_token_id"] if eos_token_id is None else eos_token_id
    return run_generation_trial(model, tokenizer, input_ids, attention_mask, condition, seed, eos,
                                record["pad_token_id"])


@pytest.fixture(scope="module")
def first_trials(model, tokenizer, prompt):
    """The first trial of each condition (greedy, and the sampling conditions at the first seed)."""
    return {name: trial(model, tokenizer, prompt, name, None if name == "G" else protocol.SEEDS[0])
            for name in protocol.CONDITIONS}


# --- repeatability and the generators -------------------------------------------------------------------------------


@pytest.mark.slow
def test_greedy_repeats_and_a_seed_repeats_after_another_seed_ran(model, tokenizer, prompt):
    runs = [trial(model, tokenizer, prompt, "G")[0] for _ in range(protocol.GREEDY_REPETITIONS)]
    assert len({tuple(r["generated_ids"]) for r in runs}) == 1 and all(r["rng_reset"] == [] for r in runs)
    seed, other = protocol.RERUN_SEED, protocol.SEEDS[1]
    first = trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, seed)[0]
    trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, other)  # moves the global generator on
    again = trial(model, tokenizer, prompt, protocol.RERUN_CONDITION, seed)[0]
    assert again["generated_ids"] == first["generated_ids"]
    assert first["generation_cache"]["fresh"] and again["generation_cache"]["fresh"]  # a fresh cache of its own


@pytest.mark.parametrize("condition", ["S1", "S2", "S3"])
def test_a_sampling_trial_resets_every_generator_and_records_its_ids(first_trials, condition):
    record = first_trials[condition][0]
    assert [(r["call"], r["seed"]) for r in record["rng_reset"]] == [
        ("torch.manual_seed", 17), ("random.seed", 17), ("numpy.random.seed", 17)]
    assert record["generated_length"] == len(record["generated_ids"]) == record["logit_steps_returned"]
    assert 1 <= record["generated_length"] <= protocol.MAX_NEW_TOKENS
    assert record["sequence_ids"] == record["prompt_ids"] + record["generated_ids"]
    cache = record["generation_cache"]  # generate() built its own, new, empty cache, the same at every forward
    assert cache["fresh"] and cache["new_object"] and cache["forwards"] == record["generated_length"]


def test_a_seed_is_required_for_sampling_and_refused_for_greedy(model, tokenizer, prompt):
    with pytest.raises(ValueError, match="needs a seed"):
        trial(model, tokenizer, prompt, "S1", None)
    with pytest.raises(ValueError, match="takes no seed"):
        trial(model, tokenizer, prompt, "G", 17)
    reset_random_state(5)
    first = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
    reset_random_state(5)
    assert (torch.rand(3).tolist(), random.random(), float(np.random.rand())) == first


# --- the configuration and what acted on the logits -----------------------------------------------------------------


def test_each_condition_gets_exactly_its_own_processors_in_generates_order(first_trials, model, tokenizer, prompt):
    built = {name: [p["class"] for p in record["processors"]] for name, (record, _, _) in first_trials.items()}
    assert built == {"G": [], "S1": [], "S2": ["TemperatureLogitsWarper"], "S3": ["TopPLogitsWarper"]}
    assert built == {name: expected_processor_classes(c) for name, c in protocol.CONDITIONS.items()}
    assert first_trials["S2"][0]["processors"][0]["params"] == {"temperature": 0.5}
    # temperature acts before top-p; the library's default top_k=50 builds a TopKLogitsWarper
    both = protocol.Condition("T+P", do_sample=True, temperature=0.5, top_p=0.8, top_k=0)
    default_k = protocol.Condition("k50", do_sample=True, temperature=1.0, top_p=1.0, top_k=50)
    for condition, expected in ((both, ["TemperatureLogitsWarper", "TopPLogitsWarper"]),
                                (default_k, ["TopKLogitsWarper"])):
        record = trial(model, tokenizer, prompt, condition, 17)[0]
        assert [p["class"] for p in record["processors"]] == expected_processor_classes(condition) == expected
    for name in ("S1", "S2", "S3"):  # so the sampling conditions carry an explicit top_k=0
        config = build_generation_config(protocol.CONDITIONS[name], 0, 0, 0).to_dict()
        assert (config["do_sample"], config["top_k"]) == (True, 0)


def test_the_recorded_config_is_complete_the_checkpoints_own_never_leaks_in_and_greedy_draws_no_warning(tokenizer,
                                                                                                         prompt):
    config = build_generation_config(protocol.CONDITIONS["G"], 0, 0, 0)
    full = config.to_dict()
    assert set(config.to_diff_dict()) < set(full) and full["do_sample"] is False
    assert {k: full[k] for k in protocol.GENERATION_FIXED} == protocol.GENERATION_FIXED
    assert {"temperature", "top_p", "top_k", "repetition_penalty", "no_repeat_ngram_size", "min_length"} <= set(full)
    model = tiny_gpt_neox(vocab_size=len(tokenizer))
    reference = trial(model, tokenizer, prompt, "G")[0]
    model.generation_config.do_sample, model.generation_config.top_k = True, 7  # a checkpoint that samples
    leaked = trial(model, tokenizer, prompt, "G")[0]
    assert leaked["processors"] == [] and leaked["generated_ids"] == reference["generated_ids"]
    assert reference["warnings"] == []
    with capture_messages() as messages:  # the positive control: a sample-only flag under greedy draws one
        GenerationConfig(do_sample=False, temperature=0.5)
    assert any("temperature" in m for m in messages)


def test_the_recorded_processors_are_observed_from_the_real_call(model, tokenizer, prompt, monkeypatch):
    """Whatever generate() actually builds is what the record lists, even something the config did not ask for."""
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


def test_the_first_step_logits_are_raw_and_the_same_under_every_condition_and_the_scores_processed(model, first_trials):
    logits = {name: t[1] for name, t in first_trials.items()}
    assert all(v.shape == (model.config.vocab_size,) and v.dtype == torch.float32 for v in logits.values())
    assert all(torch.equal(logits["G"], value) for value in logits.values())
    assert len({t[0]["first_step_logits_sha256"] for t in first_trials.values()}) == 1
    _, raw, scores = first_trials["G"]
    assert torch.equal(scores, raw)
    _, raw, scores = first_trials["S2"]  # in 4.57.1 scores are divided by T, not log-softmaxed
    assert torch.equal(scores, raw / protocol.CONDITIONS["S2"].temperature)
    _, raw, scores = first_trials["S3"]  # top-p: -inf outside the nucleus, the raw values inside it
    kept = torch.isfinite(scores)
    assert torch.isfinite(raw).all() and not kept.all() and torch.equal(scores[kept], raw[kept])


def test_the_stop_reason_rule_and_a_trial_stopped_by_its_eos_or_by_max_new_tokens(model, tokenizer, prompt,
                                                                                    first_trials):
    assert stop_reason([5, 0], eos_token_id=0, max_new_tokens=16) == "eos"
    assert stop_reason(list(range(1, 17)), eos_token_id=0, max_new_tokens=16) == "max_new_tokens"
    assert stop_reason(list(range(1, 16)) + [0], eos_token_id=0, max_new_tokens=16) == "eos"
    assert stop_reason([5, 6], eos_token_id=0, max_new_tokens=16) == "unexplained"
    full = first_trials["G"][0]
    assert not full["eos_positions"], "precondition: the tiny model's greedy run selected EOS"
    assert (full["generated_length"], full["stop_reason"]) == (protocol.MAX_NEW_TOKENS, "max_new_tokens")
    first_token = full["generated_ids"][0]  # declared the EOS id: the trial ends after one selection
    record = trial(model, tokenizer, prompt, "G", eos_token_id=first_token)[0]
    assert (record["generated_ids"], record["stop_reason"], record["eos_positions"]) == ([first_token], "eos", [0])


@torch.inference_mode()
def test_a_cache_that_holds_tokens_or_was_used_before_is_not_fresh(model, prompt):
    _, input_ids, attention_mask = prompt
    stale = DynamicCache(config=model.config)
    model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=stale, use_cache=True)
    with observe_generation_cache(model) as seen:
        model(input_ids=input_ids[:, -1:], past_key_values=stale, use_cache=True)
    cache = generation_cache_record(seen, passed_by_caller=True)
    assert not cache["fresh"] and cache["length_before_first_forward"] == input_ids.shape[1]
    assert "passed a cache" in cache["how"]
    reused = DynamicCache(config=model.config)  # handed to two calls: caught even were it emptied
    for _ in range(2):
        cache = generation_cache_record({"forwards": 1, "first_cache": reused, "length_before_first_forward": 0,
                                         "same_object_every_forward": True})
    assert not cache["new_object"] and not cache["fresh"] and "NOT a new object" in cache["how"]
