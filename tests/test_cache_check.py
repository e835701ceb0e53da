"""Matched-prefix cache comparison: forward count, agreement on a correct path, detection of broken ones."""

from __future__ import annotations

import math

import pytest
import torch

from inferlab import protocol
from inferlab.measure import cache_check
from inferlab.measure.cache_check import compare_vectors, run_matched_prefix
from inferlab.measure.decode_loop import run_greedy_loop
from inferlab.measure.memory import expected_kv_cache_bytes
from inferlab.measure.stats import first_divergence
from inferlab.specimen.build import tiny_gpt_neox

PROMPT = [5, 17, 33, 2, 9, 40, 11]
M = protocol.CACHE_MAX_TARGET_TOKENS


@pytest.fixture(scope="module")
def model():
    return tiny_gpt_neox(seed=0)


@pytest.fixture(scope="module")
def continuation(model):
    ids = torch.tensor([PROMPT])
    return run_greedy_loop(model, ids, torch.ones_like(ids), use_cache=True).generated_ids[:M]


@pytest.fixture(scope="module")
def comparison(model, continuation):
    return run_matched_prefix(model, PROMPT, continuation)


def test_uses_exactly_2m_forwards(comparison):
    result, _ = comparison
    assert result["forward_count"] == 2 * result["m"] == 2 * M


def test_every_prefix_passes_on_the_tiny_model(comparison):
    result, _ = comparison
    failing = [p["name"] for p in result["prefixes"] if not p["passed"]]
    assert result["passed"] and not failing, failing


def test_prefixes_run_from_prompt_alone_to_prompt_plus_m_minus_1(comparison, continuation):
    result, tensors = comparison
    lengths = [p["prefix_length"] for p in result["prefixes"]]
    assert lengths == list(range(len(PROMPT), len(PROMPT) + M))
    assert result["prefixes"][-1]["prefix_ids"] == PROMPT + continuation[: M - 1]
    assert sorted(tensors) == sorted(f"{path}/prefix_{n:02d}" for path in ("cached", "uncached") for n in lengths)


def test_uncached_logits_agree_with_an_independent_recomputation(model, comparison):
    result, tensors = comparison
    for prefix in result["prefixes"]:
        with torch.inference_mode():
            reference = model(torch.tensor([prefix["prefix_ids"]])).logits[0, -1]  # (vocab,)
        stats = compare_vectors(tensors[f"uncached/{prefix['name']}"], reference, protocol.CACHE_TOLERANCE)
        assert stats["passed"], (prefix["name"], stats)


def test_cache_inspection_matches_the_fed_length(model, comparison):
    result, _ = comparison
    cache = result["cache"]
    length = len(PROMPT) + M - 1
    assert cache["cache_type"] == "DynamicCache" and cache["layer_count"] == model.config.num_hidden_layers
    for layer in cache["layers"]:
        assert layer["logical_length_from_tensor"] == layer["logical_length_from_cache"] == length
        assert layer["key"]["dtype"] == "torch.float32" and layer["key"]["device"] == "cpu"
    assert cache["unique_bytes"] == expected_kv_cache_bytes(model.config, length)


def test_a_single_target_compares_only_the_prefill(model, continuation):
    result, tensors = run_matched_prefix(model, PROMPT, continuation[:1])
    assert result["forward_count"] == 2 and len(tensors) == 2
    assert result["notes"] == [cache_check.NOTE_PREFILL_ONLY] and not result["cache_reuse_exercised"]


def _wrong_decode_positions(past_length, new_length):
    step = REAL_STEP_INPUTS(past_length, new_length)
    if past_length:  # shifting every position alike would be invisible to rotary attention
        step["position_ids"] = step["position_ids"] + 1
    return step


def _first_token_masked(past_length, new_length):
    step = REAL_STEP_INPUTS(past_length, new_length)
    if past_length:
        step["attention_mask"] = step["attention_mask"].clone()
        step["attention_mask"][0, 0] = 0
    return step


REAL_STEP_INPUTS = cache_check.cached_step_inputs


@pytest.mark.parametrize("broken", [_wrong_decode_positions, _first_token_masked], ids=["wrong_positions", "wrong_mask"])
def test_a_broken_cached_path_is_detected(model, continuation, monkeypatch, broken):
    monkeypatch.setattr(cache_check, "cached_step_inputs", broken)
    result, _ = run_matched_prefix(model, PROMPT, continuation)
    within = [p["checks"]["within_tolerance"] for p in result["prefixes"]]
    assert within[0], "the prefill is untouched by the breakage and must still pass"
    assert not result["passed"] and not all(within[1:])


def test_rejects_empty_and_overlong_continuations(model):
    with pytest.raises(ValueError, match="empty"):
        run_matched_prefix(model, PROMPT, [])
    with pytest.raises(ValueError, match=str(protocol.CACHE_MAX_TARGET_TOKENS)):
        run_matched_prefix(model, PROMPT, [1] * (protocol.CACHE_MAX_TARGET_TOKENS + 1))


def test_compare_vectors_identical():
    a = torch.linspace(-3, 3, 50)
    stats = compare_vectors(a, a.clone(), protocol.CACHE_TOLERANCE)
    assert stats["passed"] and stats["bitwise_equal"] and stats["max_abs_diff"] == 0.0


def test_compare_vectors_counts_each_failing_entry():
    b = torch.linspace(-3, 3, 50)
    a = b.clone()
    a[7] += 1e-3  # far beyond 1e-5 + 1e-4 * |b| for |b| <= 3
    stats = compare_vectors(a, b, protocol.CACHE_TOLERANCE)
    assert not stats["passed"] and stats["fail_count"] == 1 and stats["fail_fraction"] == 1 / 50
    assert stats["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)


def test_compare_vectors_scales_with_the_reference():
    b = torch.tensor([1000.0])
    # 0.05 is within 1e-5 + 1e-4 * 1000 = 0.10001, though far beyond atol alone.
    assert compare_vectors(b + 0.05, b, protocol.CACHE_TOLERANCE)["passed"]


def test_compare_vectors_fails_on_non_finite_values():
    b = torch.zeros(4)
    a = b.clone()
    a[1] = math.nan
    stats = compare_vectors(a, b, protocol.CACHE_TOLERANCE)
    assert not stats["passed"] and not stats["finite_a"] and stats["fail_count"] == 1


def test_compare_vectors_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        compare_vectors(torch.zeros(3), torch.zeros(4), protocol.CACHE_TOLERANCE)


@pytest.mark.parametrize(
    "a, b, expected",
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2], [1, 2, 3], 2), ([], [], None)],
    ids=["equal", "differ_at_1", "shorter", "empty"],
)
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


# --- what each path was fed, and logits_to_keep on both prefills ------------------------------------


def test_both_paths_record_what_they_fed(comparison):
    result, _ = comparison
    T = len(PROMPT)
    for prefix in result["prefixes"]:
        k, L = prefix["fed_continuation_tokens"], prefix["prefix_length"]
        uncached, cached = prefix["fed_inputs"]["uncached"], prefix["fed_inputs"]["cached"]
        assert uncached == {"input_ids": prefix["prefix_ids"], "attention_mask": [1] * L,
                            "position_ids": list(range(L)), "cache_position": list(range(L))}
        if k == 0:
            assert cached == uncached
        else:
            assert cached == {"input_ids": [prefix["prefix_ids"][-1]], "attention_mask": [1] * L,
                              "position_ids": [L - 1], "cache_position": [L - 1]}
        assert L == T + k and prefix["checks"]["fed_masks_aligned"] and prefix["checks"]["fed_positions_aligned"]
    assert result["all_inputs_aligned"]


@pytest.mark.parametrize("broken, check", [(_wrong_decode_positions, "fed_positions_aligned"),
                                           (_first_token_masked, "fed_masks_aligned")],
                         ids=["wrong_positions", "wrong_mask"])
def test_misaligned_inputs_are_named_in_the_checks(model, continuation, monkeypatch, broken, check):
    monkeypatch.setattr(cache_check, "cached_step_inputs", broken)
    result, _ = run_matched_prefix(model, PROMPT, continuation)
    flags = [p["checks"][check] for p in result["prefixes"]]
    assert flags[0] and not any(flags[1:]) and not result["all_inputs_aligned"]


def test_prefill_of_both_paths_returns_only_the_kept_positions(model, comparison):
    result, _ = comparison
    expected = [1, protocol.LOGITS_TO_KEEP, model.config.vocab_size]
    for path in ("uncached", "cached"):
        check = result["prefill_logits_to_keep"][path]
        assert check == {"logits_to_keep": protocol.LOGITS_TO_KEEP, "expected_shape": expected,
                         "observed_shape": expected, "ok": True}
    assert all(p["logits_shape"] == {"uncached": expected, "cached": expected} for p in result["prefixes"])


def test_a_forward_that_ignores_logits_to_keep_is_caught(continuation, monkeypatch):
    """If a path's prefill returned every position, the silent [0, -1] slice would hide it; the check must not."""
    model = tiny_gpt_neox(seed=0)
    real_forward = model.forward

    def full_logits(*args, **kwargs):
        kwargs["logits_to_keep"] = 0
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", full_logits)
    result, _ = run_matched_prefix(model, PROMPT, continuation)
    prefill = result["prefill_logits_to_keep"]
    assert not prefill["uncached"]["ok"] and not prefill["cached"]["ok"] and not result["passed"]
    assert prefill["uncached"]["observed_shape"] == [1, len(PROMPT), model.config.vocab_size]


def test_warnings_during_the_forwards_are_captured(continuation):
    import warnings

    model = tiny_gpt_neox(seed=0)
    hook = model.register_forward_hook(lambda module, args, output: warnings.warn("forward-probe", UserWarning))
    try:
        result, _ = run_matched_prefix(model, PROMPT, continuation)
    finally:
        hook.remove()
    assert sum("forward-probe" in m for m in result["warnings"]) == 2 * len(continuation)


def test_no_warnings_on_a_clean_run(comparison):
    assert comparison[0]["warnings"] == []


# --- a justified revised criterion, beside the declared one ---------------------------------------------


def _revised(atol, rtol):
    from inferlab.measure.revised_criterion import RevisedCriterion

    return RevisedCriterion(protocol.Tolerance(atol=atol, rtol=rtol), "a reason the learner gives")


# --- near ties are judged by the declared criterion, not by the observed error (issue 26, A2) ------------------


def test_a_margin_within_what_the_criterion_lets_the_two_logits_move_is_a_near_tie():
    """The stand-in's prefix 14: margin 0.00222 while the criterion lets each top logit move about 0.0014."""
    logits = torch.tensor([13.9, 13.9 - 0.00222, 1.0, -2.0], dtype=torch.float32)  # (vocab,)
    tie = cache_check.near_tie(logits, protocol.CACHE_TOLERANCE)
    top1, top2 = (float(v) for v in torch.topk(logits.double(), 2).values)
    assert tie["allowance"] == pytest.approx(2e-5 + 1e-4 * (abs(top1) + abs(top2)))
    assert tie["margin"] == pytest.approx(top1 - top2) and tie["margin"] < tie["allowance"] and tie["near_tie"]
    wide = cache_check.near_tie(torch.tensor([13.9, 13.8, 1.0]), protocol.CACHE_TOLERANCE)
    assert not wide["near_tie"] and wide["margin"] > wide["allowance"]


def test_a_bitwise_equal_prefix_near_a_tie_is_flagged(model, continuation, monkeypatch):
    """With the observed error zero the old rule (10 x max abs diff) could never flag it; the criterion's can."""
    real = cache_check._both_paths

    def tied(*args, **kwargs):
        uncached, cached, cache, same = real(*args, **kwargs)
        prefix, logits, shape = uncached[0]
        logits = logits.clone()
        top = int(logits.argmax())
        logits[(top + 1) % logits.numel()] = logits[top] - 1e-6  # a near-tie at the prompt, identical on both paths
        row = cached[0]
        return [(prefix, logits, shape)] + uncached[1:], [(row[0], logits.clone(), *row[2:])] + cached[1:], cache, same

    monkeypatch.setattr(cache_check, "_both_paths", tied)
    result, _ = run_matched_prefix(model, PROMPT, continuation)
    first = result["prefixes"][0]
    assert first["bitwise_equal"] and first["max_abs_diff"] == 0.0
    assert first["near_tie"] and first["top2_margin_uncached"] <= first["near_tie_allowance"]
    assert result["near_tie_rule"] == protocol.NEAR_TIE_RULE and result["any_near_tie"]
    assert all(not p["near_tie"] for p in result["prefixes"][1:] if p["top2_margin_uncached"] > p["near_tie_allowance"])


def test_the_cache_test_checks_logits_to_keep_on_every_uncached_forward_not_only_the_first(monkeypatch):
    """Each uncached forward feeds a whole prefix: one that ignores logits_to_keep after the first is caught."""
    model = tiny_gpt_neox(seed=0)
    real_forward = model.forward
    calls = []

    def full_after_the_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second uncached forward (prompt + y1)
            kwargs["logits_to_keep"] = 0
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", full_after_the_first)
    result, _ = cache_check.run_matched_prefix(model, PROMPT, [3, 4, 5])
    assert all(check["ok"] for check in result["prefill_logits_to_keep"].values())  # the first forwards could not tell
    assert [p["checks"]["uncached_logits_to_keep"] for p in result["prefixes"]] == [True, False, True]
    assert not result["prefixes"][1]["passed"] and not result["passed"]
