"""inferlab.measure.cache_check on the tiny model: 2m forwards, agreement on a correct cached path, what each path was
fed, broken paths detected, logits_to_keep checked on every forward that tells, and near ties by the criterion."""

from __future__ import annotations

import math

import pytest
import torch

from inferlab import protocol
from inferlab.measure import cache_check
from inferlab.measure.cache_check import compare_vectors, run_matched_prefix
from inferlab.measure.decode_loop import run_greedy_loop
from inferlab.measure.memory import expected_kv_cache_bytes
from inferlab.specimen.build import tiny_gpt_neox

PROMPT = [5, 17, 33, 2, 9, 40, 11]
M = protocol.CACHE_MAX_TARGET_TOKENS
REAL_STEP_INPUTS = cache_check.cached_step_inputs


@pytest.fixture(scope="module")
def continuation(model):
    ids = torch.tensor([PROMPT])
    return run_greedy_loop(model, ids, torch.ones_like(ids), use_cache=True).generated_ids[:M]


@pytest.fixture(scope="module")
def comparison(model, continuation):
    return run_matched_prefix(model, PROMPT, continuation)


def test_2m_forwards_from_the_prompt_to_the_prompt_plus_m_minus_1_fed_as_recorded_within_the_criterion_and_the_cache(
        model, comparison, continuation):
    result, tensors = comparison
    assert result["forward_count"] == 2 * result["m"] == 2 * M and result["cache_object_reused"]
    lengths = [p["prefix_length"] for p in result["prefixes"]]
    assert lengths == list(range(len(PROMPT), len(PROMPT) + M))
    assert result["prefixes"][-1]["prefix_ids"] == PROMPT + continuation[: M - 1]
    assert sorted(tensors) == sorted(f"{path}/prefix_{n:02d}" for path in ("cached", "uncached") for n in lengths)
    assert result["passed"] and all(p["passed"] for p in result["prefixes"]) and result["warnings"] == []
    for prefix in result["prefixes"]:  # what each path was fed
        k, L = prefix["fed_continuation_tokens"], prefix["prefix_length"]
        uncached, cached = prefix["fed_inputs"]["uncached"], prefix["fed_inputs"]["cached"]
        assert uncached == {"input_ids": prefix["prefix_ids"], "attention_mask": [1] * L,
                            "position_ids": list(range(L)), "cache_position": list(range(L))}
        assert cached == uncached if k == 0 else cached == {"input_ids": [prefix["prefix_ids"][-1]],
                                                            "attention_mask": [1] * L, "position_ids": [L - 1],
                                                            "cache_position": [L - 1]}
    assert result["all_inputs_aligned"]
    cache, length = result["cache"], len(PROMPT) + M - 1  # inspected apart from the config flag
    assert cache["cache_type"] == "DynamicCache" and cache["layer_count"] == model.config.num_hidden_layers
    for layer in cache["layers"]:
        assert layer["logical_length_from_tensor"] == layer["logical_length_from_cache"] == length
        assert (layer["key"]["dtype"], layer["key"]["device"]) == ("torch.float32", "cpu")
    assert cache["unique_bytes"] == cache["expected_bytes"] == expected_kv_cache_bytes(model.config, length)


def test_a_single_target_compares_only_the_prefill(model, continuation):
    result, tensors = run_matched_prefix(model, PROMPT, continuation[:1])
    assert result["forward_count"] == 2 and len(tensors) == 2
    assert result["notes"] == [cache_check.NOTE_PREFILL_ONLY] and not result["cache_reuse_exercised"]
    with pytest.raises(ValueError, match="empty"):
        run_matched_prefix(model, PROMPT, [])
    with pytest.raises(ValueError, match=str(M)):
        run_matched_prefix(model, PROMPT, [1] * (M + 1))


@pytest.mark.parametrize("check", ["fed_positions_aligned", "fed_masks_aligned"])
def test_a_broken_cached_path_fails_the_criterion_and_names_the_misaligned_input(model, continuation, monkeypatch,
                                                                                 check):
    def broken(past_length, new_length):
        step = REAL_STEP_INPUTS(past_length, new_length)
        if past_length and check == "fed_positions_aligned":  # all shifted alike would be invisible to rotary
            step["position_ids"] = step["position_ids"] + 1
        elif past_length:
            step["attention_mask"] = step["attention_mask"].clone()
            step["attention_mask"][0, 0] = 0
        return step

    monkeypatch.setattr(cache_check, "cached_step_inputs", broken)
    result, _ = run_matched_prefix(model, PROMPT, continuation)
    within = [p["checks"]["within_tolerance"] for p in result["prefixes"]]
    flags = [p["checks"][check] for p in result["prefixes"]]
    assert within[0] and flags[0], "the prefill is untouched by the breakage and must still pass"
    assert not result["passed"] and not all(within[1:]) and not any(flags[1:]) and not result["all_inputs_aligned"]


def ignoring_logits_to_keep(monkeypatch, only=None):
    """A tiny model whose forwards (only the only-th, when given) return every position's logits."""
    model, calls = tiny_gpt_neox(seed=0), []
    real_forward = model.forward

    def forward(*args, **kwargs):
        calls.append(1)
        return real_forward(*args, **({**kwargs, "logits_to_keep": 0} if only in (None, len(calls)) else kwargs))

    monkeypatch.setattr(model, "forward", forward)
    return model


def test_logits_to_keep_is_checked_on_both_prefills_and_every_uncached_forward(model, comparison, continuation,
                                                                               monkeypatch):
    expected = [1, protocol.LOGITS_TO_KEEP, model.config.vocab_size]
    assert comparison[0]["prefill_logits_to_keep"] == {path: {"logits_to_keep": 1, "expected_shape": expected,
                                                              "observed_shape": expected, "ok": True}
                                                       for path in ("uncached", "cached")}
    ignoring = run_matched_prefix(ignoring_logits_to_keep(monkeypatch), PROMPT, continuation)[0]
    prefill = ignoring["prefill_logits_to_keep"]
    assert not prefill["uncached"]["ok"] and not prefill["cached"]["ok"] and not ignoring["passed"]
    assert prefill["uncached"]["observed_shape"] == [1, len(PROMPT), expected[-1]]
    # only the second forward (prompt + y1): the prefills cannot tell, its own check does
    second = run_matched_prefix(ignoring_logits_to_keep(monkeypatch, only=2), PROMPT, [3, 4, 5])[0]
    assert all(check["ok"] for check in second["prefill_logits_to_keep"].values())
    assert [p["checks"]["uncached_logits_to_keep"] for p in second["prefixes"]] == [True, False, True]
    assert not second["prefixes"][1]["passed"] and not second["passed"]


def test_compare_vectors_judges_each_entry_by_the_criterion_and_fails_non_finite_values():
    b = torch.tensor([-3.0, 0.5, 3.0, 1000.0])
    same = compare_vectors(b.clone(), b, protocol.CACHE_TOLERANCE)
    assert same["passed"] and same["bitwise_equal"] and same["max_abs_diff"] == 0.0
    scaled = b.clone()
    scaled[3] += 0.05  # within 1e-5 + 1e-4 * 1000 = 0.10001, though far beyond atol alone
    assert compare_vectors(scaled, b, protocol.CACHE_TOLERANCE)["passed"]
    b = torch.linspace(-3, 3, 50)
    a = b.clone()
    a[7] += 1e-3  # far beyond 1e-5 + 1e-4 * |b| for |b| <= 3
    found = compare_vectors(a, b, protocol.CACHE_TOLERANCE)
    assert not found["passed"] and (found["fail_count"], found["fail_fraction"]) == (1, 1 / 50)
    assert found["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    a[1] = math.nan
    nan = compare_vectors(a, b, protocol.CACHE_TOLERANCE)
    assert not nan["finite_a"] and nan["fail_count"] == 2
    with pytest.raises(ValueError, match="shapes differ"):
        compare_vectors(torch.zeros(3), torch.zeros(4), protocol.CACHE_TOLERANCE)


def test_a_near_tie_is_judged_by_the_declared_criterion_even_on_a_bitwise_equal_prefix(model, continuation,
                                                                                        monkeypatch):
    """The stand-in's prefix 14 (margin 0.00222, no error): an old rule (10 x max abs diff) could never flag it."""
    tie = cache_check.near_tie(torch.tensor([13.9, 13.9 - 0.00222, 1.0, -2.0]), protocol.CACHE_TOLERANCE)
    assert tie["allowance"] == pytest.approx(2e-5 + 1e-4 * (tie["top1"] + tie["top2"])) and tie["near_tie"]
    assert not cache_check.near_tie(torch.tensor([13.9, 13.8, 1.0]), protocol.CACHE_TOLERANCE)["near_tie"]
    real = cache_check._both_paths

    def tied(*args, **kwargs):
        uncached, cached, cache, same = real(*args, **kwargs)
        prefix, logits, shape = uncached[0]
        logits = logits.clone()
        top = int(logits.argmax())
        logits[(top + 1) % logits.numel()] = logits[top] - 1e-6  # a near tie at the prompt, identical on both paths
        row = cached[0]
        return [(prefix, logits, shape)] + uncached[1:], [(row[0], logits.clone(), *row[2:])] + cached[1:], cache, same

    monkeypatch.setattr(cache_check, "_both_paths", tied)
    result, _ = run_matched_prefix(model, PROMPT, continuation)
    first = result["prefixes"][0]
    assert first["bitwise_equal"] and first["max_abs_diff"] == 0.0 and first["near_tie"]
    assert first["top2_margin_uncached"] <= first["near_tie_allowance"]
    assert result["near_tie_rule"] == protocol.NEAR_TIE_RULE and result["any_near_tie"]
