"""Issue 33 part 6: the timing trials' own checks, on the tiny model (no experiment run).

a. logits_to_keep is checked on the prefill forward of every timing trial: the last forward of a cache-on trial
   feeds one token, so its logits have one position whether or not the setting was honoured.
g. The P1x8 loop, which has no generate() call in the budget, is checked against generate() by what it feeds the
   model at every step (inferlab.measure.loop_check), with no forward run; P1's stays checked by ids.
"""

from __future__ import annotations

import pytest
import torch

from inferlab import protocol
from inferlab.measure import cache_check, decode_loop, forward_mode, loop_check
from inferlab.measure.decode_loop import run_greedy_loop
from inferlab.specimen.build import tiny_gpt_neox

PROMPT = [5, 17, 33, 2, 9, 40, 11]


@pytest.fixture(scope="module")
def prompt():
    ids = torch.tensor([PROMPT], dtype=torch.long)  # (1, T)
    return ids, torch.ones_like(ids)


def ignoring_logits_to_keep(monkeypatch):
    """A tiny model whose forward returns every position's logits, whatever logits_to_keep asks for."""
    model = tiny_gpt_neox(seed=0)
    real_forward = model.forward

    def full_logits(*args, **kwargs):
        kwargs["logits_to_keep"] = 0
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", full_logits)
    return model


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_a_trial_whose_forwards_ignore_logits_to_keep_is_caught_at_its_prefill(monkeypatch, prompt, use_cache):
    model = ignoring_logits_to_keep(monkeypatch)
    vocab = model.config.vocab_size
    result = run_greedy_loop(model, *prompt, use_cache=use_cache)
    if use_cache:  # the last forward alone could not tell: it fed one token
        assert result.last_logits_shape == [1, 1, vocab]
    assert result.prefill_logits_shape == [1, len(PROMPT), vocab]
    assert result.to_record()["prefill_logits_shape"] == [1, len(PROMPT), vocab]
    kept = cache_check.loop_logits_to_keep(result.prefill_logits_shape, result.last_logits_shape,
                                           protocol.LOGITS_TO_KEEP, vocab)
    assert not kept["ok"] and not kept["prefill"]["ok"]
    assert kept["prefill"]["expected_shape"] == [1, protocol.LOGITS_TO_KEEP, vocab]


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


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_an_honest_trial_passes_the_check_on_both_forwards(prompt, use_cache):
    model = tiny_gpt_neox(seed=0)
    result = run_greedy_loop(model, *prompt, use_cache=use_cache)
    kept = cache_check.loop_logits_to_keep(result.prefill_logits_shape, result.last_logits_shape,
                                           protocol.LOGITS_TO_KEEP, model.config.vocab_size)
    assert kept["ok"] and kept["prefill"]["observed_shape"] == [1, 1, model.config.vocab_size]


# --- g. the P1x8 loop against generate(): its inputs, step by step, with no forward ------------------------


def fed_inputs(model, call) -> list[dict]:
    """What the model received in each forward while call() ran (a pre-hook with kwargs), as loop_check compares."""
    seen = []

    def keep(module, args, kwargs):
        seen.append({name: loop_check._plain(kwargs.get(name)) for name in loop_check.COMPARED})

    handle = model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        call()
    finally:
        handle.remove()
    return seen


def test_generates_preparation_is_what_a_real_generate_call_feeds(prompt):
    """The check's generate() side is generate()'s own: a real greedy call on the tiny model fed exactly these."""
    model = tiny_gpt_neox(seed=0)
    ids, mask = prompt
    config = decode_loop.greedy_generation_config(protocol.TIMING_NEW_TOKENS, eos_token_id=None, pad_token_id=0)
    output = []
    seen = fed_inputs(model, lambda: output.append(model.generate(input_ids=ids, attention_mask=mask,
                                                                  generation_config=config, use_model_defaults=False)))
    generated = output[0][0, ids.shape[1]:].tolist()
    assert len(generated) == protocol.TIMING_NEW_TOKENS
    assert seen == loop_check.generate_step_inputs(model, PROMPT, generated)


def test_the_loops_side_is_what_the_loop_feeds(prompt):
    model = tiny_gpt_neox(seed=0)
    result = []
    seen = fed_inputs(model, lambda: result.append(run_greedy_loop(model, *prompt, use_cache=True)))
    assert seen == loop_check.loop_step_inputs(PROMPT, result[0].generated_ids)


def test_a_long_prompts_loop_agrees_with_generates_inputs_and_runs_no_forward():
    model = tiny_gpt_neox(seed=0)
    long_prompt = (PROMPT + [1]) * 8
    ids = torch.tensor([long_prompt])
    generated = run_greedy_loop(model, ids, torch.ones_like(ids), use_cache=True).generated_ids
    watch = forward_mode.ForwardWatch(model)
    found = loop_check.loop_inputs_match_generate(model, "P1x8", long_prompt, generated, "P1x8-cache_on-rep1")
    assert watch.forwards == 0
    assert found["equal"] and found["steps"] == protocol.TIMING_NEW_TOKENS and found["first_difference"] is None


def test_a_loop_that_feeds_other_positions_than_generate_is_caught(monkeypatch):
    model = tiny_gpt_neox(seed=0)
    real_prepare = decode_loop._prepare

    def shifted(*args):
        buffers = real_prepare(*args)
        buffers.positions += 1  # positions from 1, not from 0 as generate() builds them
        return buffers

    monkeypatch.setattr(decode_loop, "_prepare", shifted)
    found = loop_check.loop_inputs_match_generate(model, "P1x8", PROMPT, [3] * protocol.TIMING_NEW_TOKENS)
    assert not found["equal"]
    assert found["first_difference"] == {"step": 0, "field": "position_ids", "loop": [list(range(1, 8))],
                                         "generate": [list(range(7))]}


@pytest.mark.slow
@pytest.mark.process
def test_a_real_run_checks_every_timing_prompts_loop_against_generate(standin_run):
    """P1 by ids (the matrix's greedy trial); P1x8, which has no generate() call in the budget, by its inputs, with
    no forward run for the check; and the report says both."""
    from shared_runs import records

    check = next(r for r in records(standin_run) if r["kind"] == "loop_vs_generate")
    assert check["equal"] and check["prompt_id"] == "P1"
    assert list(check["inputs_vs_generate"]) == ["P1x8"]
    p1x8 = check["inputs_vs_generate"]["P1x8"]
    assert p1x8["equal"] and p1x8["steps"] == protocol.TIMING_NEW_TOKENS and p1x8["trial"] == "P1x8-cache_on-rep1"
    assert check["forward_mode"]["forwards"] == 0
    report = (standin_run / "report.md").read_text(encoding="utf-8")
    assert "- The loop's inputs for P1x8 (P1x8-cache_on-rep1) against those `generate()`'s own preparation" in report
