"""Forward-call counts on the tiny model: generate, a greedy loop, and the matched-prefix comparison.

Counts come from a forward pre-hook on the model, so they count what actually ran. The loops are
written inline from Parts 4 and 5 of the spec, independent of inferlab's own loop modules.
"""

import contextlib

import pytest
import torch
from transformers import GenerationConfig

from inferlab import protocol
from inferlab.specimen.build import tiny_gpt_neox

PROMPT_IDS = torch.tensor([[11, 12, 13, 14, 15, 16, 17]])  # (1, T) any ids of the tiny vocabulary


@pytest.fixture(scope="module")
def model():
    return tiny_gpt_neox()


@contextlib.contextmanager
def counting_forwards(model):
    """Yield a list that gets one (new input length, had a cache) entry per model forward."""
    calls = []

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        past = kwargs.get("past_key_values")
        calls.append((ids.shape[1], past is not None and past.get_seq_length() > 0))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def generate_fixed_length(model, condition_name, seed):
    """Ordinary generate with EOS unable to end the run early (min_new_tokens), so it makes all 16."""
    config = GenerationConfig(**protocol.CONDITIONS[condition_name].generate_kwargs(), **protocol.GENERATION_FIXED,
                              min_new_tokens=protocol.MAX_NEW_TOKENS)
    if seed is not None:
        torch.manual_seed(seed)
    return model.generate(PROMPT_IDS, attention_mask=torch.ones_like(PROMPT_IDS), pad_token_id=0,
                          generation_config=config)


@pytest.mark.parametrize("name", list(protocol.CONDITIONS))
def test_16_token_generate_is_one_prefill_and_15_later_forwards(model, name):
    seed = None if name == "G" else protocol.SEEDS[0]
    with counting_forwards(model) as calls, torch.inference_mode():
        out = generate_fixed_length(model, name, seed)
    new_tokens = out.shape[1] - PROMPT_IDS.shape[1]
    assert new_tokens == protocol.MAX_NEW_TOKENS
    # First-token selection needs no forward of its own: the prefill's logits give it.
    assert calls[0] == (PROMPT_IDS.shape[1], False), "first forward should be the full-prompt prefill"
    assert calls[1:] == [(1, True)] * (protocol.MAX_NEW_TOKENS - 1)


@torch.inference_mode()
def greedy_loop(model, ids, steps, use_cache):
    """Select `steps` greedy tokens; EOS does not stop the loop (the timing workload's rule)."""
    ids = ids.clone()  # (1, T)
    cache = None
    selected = []
    for step in range(steps):
        if use_cache and cache is not None:
            step_ids = ids[:, -1:]  # (1, 1) only the token not yet in the cache
            position_ids = torch.tensor([[ids.shape[1] - 1]])
        else:
            step_ids = ids  # (1, T + step) the whole sequence
            position_ids = torch.arange(ids.shape[1]).unsqueeze(0)
        out = model(input_ids=step_ids, attention_mask=torch.ones_like(ids), position_ids=position_ids,
                    past_key_values=cache, use_cache=use_cache, logits_to_keep=protocol.LOGITS_TO_KEEP)
        cache = out.past_key_values if use_cache else None
        token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)  # (1, 1)
        selected.append(token.item())
        ids = torch.cat([ids, token], dim=1)
    return selected


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache_on", "cache_off"])
def test_16_token_greedy_loop_makes_16_forwards_and_matches_generate(model, use_cache):
    with counting_forwards(model) as calls:
        selected = greedy_loop(model, PROMPT_IDS, protocol.TIMING_NEW_TOKENS, use_cache)
    assert len(calls) == protocol.TIMING_NEW_TOKENS
    with torch.inference_mode():
        reference = generate_fixed_length(model, "G", None)[0, PROMPT_IDS.shape[1]:].tolist()
    assert selected == reference


@torch.inference_mode()
def matched_prefix_logits(model, prompt_ids, continuation):
    """Part 4: last-position logits for prompt + y_1..y_{j-1}, j = 1..m, uncached and cached."""
    m = len(continuation)
    full = torch.cat([prompt_ids, torch.tensor([continuation])], dim=1)  # (1, T + m)
    prompt_len = prompt_ids.shape[1]
    # 1) uncached: m calls, each on the whole prefix, no cache in or out
    uncached = []
    for j in range(m):
        prefix = full[:, : prompt_len + j]
        out = model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=False)
        uncached.append(out.logits[0, -1])  # (vocab,)
    # 2) cached: one prefill, then y_1..y_{m-1} once each into the same cache (y_m is never fed)
    out = model(input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids), use_cache=True)
    cache, cached = out.past_key_values, [out.logits[0, -1]]
    for j in range(1, m):
        length = prompt_len + j
        out = model(input_ids=full[:, length - 1: length], attention_mask=torch.ones(1, length, dtype=torch.long),
                    position_ids=torch.tensor([[length - 1]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        cached.append(out.logits[0, -1])
    return uncached, cached


def fixed_continuation(model, m):
    with torch.inference_mode():
        return generate_fixed_length(model, "G", None)[0, PROMPT_IDS.shape[1]: PROMPT_IDS.shape[1] + m].tolist()


@pytest.mark.parametrize("m", [1, protocol.CACHE_MAX_TARGET_TOKENS], ids=lambda m: f"m{m}")
def test_matched_prefix_comparison_makes_2m_forwards(model, m):
    continuation = fixed_continuation(model, m)
    with counting_forwards(model) as calls:
        matched_prefix_logits(model, PROMPT_IDS, continuation)
    assert len(calls) == 2 * m
    assert [c for c in calls if not c[1]] == [(PROMPT_IDS.shape[1] + j, False) for j in range(m)] + [(PROMPT_IDS.shape[1], False)]
    assert [c for c in calls if c[1]] == [(1, True)] * (m - 1)
    assert 2 * m <= protocol.CAPS["cache_forwards"]


def test_matched_prefix_logits_agree_within_the_declared_tolerance(model):
    # Confirms the inline loop really compares the same prefixes (a misaligned prefix would not agree).
    tol = protocol.CACHE_TOLERANCE
    uncached, cached = matched_prefix_logits(model, PROMPT_IDS, fixed_continuation(model, protocol.CACHE_MAX_TARGET_TOKENS))
    for j, (a, b) in enumerate(zip(cached, uncached)):
        assert a.shape == (model.config.vocab_size,) and torch.isfinite(a).all()
        failing = ((a - b).abs() > tol.atol + tol.rtol * b.abs()).sum().item()
        assert failing == 0, f"prefix {j}: {failing} logits outside {tol.describe()}"
