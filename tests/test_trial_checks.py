"""Issue 33 part 6: the timing trials' own checks, on the tiny model (no experiment run).

a. logits_to_keep is checked on the prefill forward of every timing trial: the last forward of a cache-on trial
   feeds one token, so its logits have one position whether or not the setting was honoured.
"""

from __future__ import annotations

import pytest
import torch

from inferlab import cache_check, protocol
from inferlab.decode_loop import run_greedy_loop
from inferlab.tiny_model import tiny_gpt_neox

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


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_an_honest_trial_passes_the_check_on_both_forwards(prompt, use_cache):
    model = tiny_gpt_neox(seed=0)
    result = run_greedy_loop(model, *prompt, use_cache=use_cache)
    kept = cache_check.loop_logits_to_keep(result.prefill_logits_shape, result.last_logits_shape,
                                           protocol.LOGITS_TO_KEEP, model.config.vocab_size)
    assert kept["ok"] and kept["prefill"]["observed_shape"] == [1, 1, model.config.vocab_size]
