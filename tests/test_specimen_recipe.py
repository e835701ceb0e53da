"""The recipe's constructed weights behave like a trained model's where the lab looks: peaked, context-dependent
next-token distributions, realistic logits, a reachable EOS, and attention that keeps the cache test's power."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inferlab import protocol
from inferlab.measure import cache_check, loading
from inferlab.specimen import build, recipe
from shared_runs import records


def model_from_recipe(variant: recipe.Variant = recipe.BASE):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    fields = {key: value for key, value in build.CONFIG.items() if not key.startswith("inferlab_")}
    model = GPTNeoXForCausalLM(GPTNeoXConfig(**fields, attn_implementation="eager"))
    state = {name: torch.from_numpy(array.astype(np.float32)) for name, array in recipe.weights(variant).items()}
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def prompt_ids(loaded):
    tokenizer = loaded["tokenizer"]
    return {p: tokenizer(text, add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
            for p, text in protocol.PROMPTS.items()}


@torch.inference_mode()
def last_logits(model, ids) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0, -1].double()  # (vocab,)


def test_the_structure_has_no_short_loop():
    """No cluster succeeds itself and no loop is shorter than all 40 clusters: greedy cannot repeat one token."""
    for channel, successor in recipe.structure().successor.items():
        seen, cluster = [], 0
        for _ in range(recipe.CLUSTERS):
            seen.append(cluster)
            cluster = int(successor[cluster])
        assert cluster == 0 and sorted(seen) == list(range(recipe.CLUSTERS)), channel


def test_the_first_step_of_every_prompt_is_peaked_with_realistic_logits(loaded, prompt_ids):
    for prompt_id, ids in prompt_ids.items():
        logits = last_logits(loaded["model"], ids)
        log_p = torch.log_softmax(logits, -1)
        ordered = log_p.exp().sort(descending=True).values
        facts = {"entropy": float(-(log_p.exp() * log_p).sum()), "top1": float(ordered[0]),
                 "top_p_ids": int((ordered.cumsum(0) - ordered < 0.8).sum()),  # the smallest prefix reaching 0.8
                 "span": float(logits.max() - logits.min())}
        # the bar for the stand-in's first step under G, and a realistic logit range
        assert facts["entropy"] <= 6.0 and facts["top1"] >= 0.05, (prompt_id, facts)
        assert facts["top_p_ids"] <= 2000 and facts["span"] >= 20.0, (prompt_id, facts)


@pytest.mark.slow
def test_context_before_the_last_token_changes_the_distribution(loaded, prompt_ids):
    """P1 and P2 both end with '.': without layer 0's attention output their next-token distributions coincide."""
    assert prompt_ids["P1"][-1] == prompt_ids["P2"][-1]

    def total_variation(model) -> float:
        p1 = torch.softmax(last_logits(model, prompt_ids["P1"]), -1)
        p2 = torch.softmax(last_logits(model, prompt_ids["P2"]), -1)
        return 0.5 * float((p1 - p2).abs().sum())

    ablated = model_from_recipe()
    with torch.no_grad():
        ablated.gpt_neox.layers[0].attention.dense.weight.zero_()
    assert total_variation(ablated) < 0.02
    assert total_variation(loaded["model"]) > 0.2


@pytest.mark.slow
def test_positional_heads_attend_to_one_and_two_tokens_back():
    """Layer 0's heads find their offsets from rotary positions alone, over a long random sequence."""
    model = model_from_recipe()
    length = 300
    ids = torch.from_numpy(np.random.default_rng(0).integers(2, recipe.VOCAB, size=(1, length)))
    with torch.inference_mode():
        weights = model(input_ids=ids, output_attentions=True).attentions[0][0]  # (heads, T, T)
    for head, offset in enumerate(recipe.HEAD_OFFSETS):
        rows = torch.arange(offset, length)
        on_target = weights[head, rows, rows - offset]
        assert float(on_target.min()) > 0.99, (head, offset, float(on_target.min()))


@pytest.mark.slow
def test_eos_is_reachable_by_sampling_and_rare_for_greedy():
    """Across random contexts EOS is a real candidate after EOS clusters and almost never the argmax."""
    model = model_from_recipe()
    structure = recipe.structure()
    contexts = torch.from_numpy(np.random.default_rng(1).integers(2, recipe.VOCAB, size=(400, 6)))
    with torch.inference_mode():
        logits = model(input_ids=contexts).logits[:, -1].double()  # (400, vocab)
    p_eos = torch.softmax(logits, -1)[:, recipe.EOS_ID]
    after_eos_cluster = torch.from_numpy(np.isin(structure.cluster[contexts[:, -1].numpy()], structure.eos_clusters))
    assert after_eos_cluster.any() and (~after_eos_cluster).any()
    assert float(p_eos[after_eos_cluster].mean()) > 0.05
    assert float(p_eos[~after_eos_cluster].max()) < 1e-4
    assert float((logits.argmax(-1) == recipe.EOS_ID).double().mean()) < 0.02


@pytest.mark.slow
@pytest.mark.parametrize("forced", ["eos", "token"])
def test_a_variant_forces_eos_after_its_cluster_or_one_token_after_every_context(forced):
    """tests/variants.py's: EOS the argmax after a chosen token's cluster, or an id without a token everywhere."""
    last = torch.from_numpy(np.random.default_rng(2).integers(2, recipe.VOCAB, size=(50, 5)))
    if forced == "eos":
        last[:, -1] = 4011
        variant, expected = recipe.Variant(forced_eos_clusters=(int(recipe.structure().cluster[4011]),)), recipe.EOS_ID
    else:
        variant, expected = recipe.Variant(forced_token=50290), 50290
    with torch.inference_mode():
        chosen = model_from_recipe(variant)(input_ids=last).logits[:, -1].argmax(-1)
    assert set(chosen.tolist()) == {expected}


@pytest.mark.slow
@pytest.mark.parametrize("corruption", ["position_plus_one", "stale_entry"])
def test_a_corrupted_cached_path_moves_logits_far_outside_the_tolerance(loaded, prompt_ids, monkeypatch, corruption):
    """The cache test keeps its power on this specimen: a position shifted by one, or the entry at p-1 masked."""
    real = cache_check.cached_step_inputs

    def corrupt(past_length, new_length):
        inputs = real(past_length, new_length)
        if past_length and corruption == "position_plus_one":
            inputs["position_ids"] = inputs["position_ids"] + 1
        elif past_length:
            inputs["attention_mask"] = inputs["attention_mask"].clone()
            inputs["attention_mask"][0, past_length - 1] = 0
        return inputs

    model, ids = loaded["model"], prompt_ids["P1"]
    with torch.inference_mode():
        continuation = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      max_new_tokens=protocol.CACHE_MAX_TARGET_TOKENS, do_sample=False,
                                      eos_token_id=0, pad_token_id=0)[0, len(ids):].tolist()
    clean, _ = cache_check.run_matched_prefix(model, ids, continuation)
    assert clean["all_within_tolerance"]
    monkeypatch.setattr(cache_check, "cached_step_inputs", corrupt)
    broken, _ = cache_check.run_matched_prefix(model, ids, continuation)
    decode_steps = broken["prefixes"][1:]
    assert decode_steps and all(not p["checks"]["within_tolerance"] for p in decode_steps)
    # far outside: a thousand times the absolute term of the criterion, not a rounding-level miss
    assert min(p["max_abs_diff"] for p in decode_steps) > 1000 * protocol.CACHE_TOLERANCE.atol


def test_the_standins_matrix_stops_early_on_eos_and_greedy_p1_gives_the_cache_test_8_tokens(standin_run):
    """Issue 12's bar, read from the session's complete stand-in run (the matrix as the experiment computes it)."""
    trials = {r["trial_id"]: r for r in records(standin_run) if r["kind"] == "generation"}
    assert sorted(trials) == sorted(trial.test_id for trial in protocol.generation_trials())
    assert all(r["status"] == "ok" for r in trials.values()), {t: r["status"] for t, r in trials.items()}
    early = [trial_id for trial_id, r in trials.items()
             if r["stop_reason"] == "eos" and r["generated_length"] < protocol.MAX_NEW_TOKENS]
    [greedy_p1] = [trials[trial.test_id]["generated_ids"] for trial in protocol.generation_trials()
                   if (trial.prompt_id, trial.condition, trial.repetition) == protocol.CACHE_REFERENCE_TRIAL]
    assert early, "no trial of the matrix stopped early on EOS"
    assert recipe.EOS_ID not in greedy_p1[:protocol.CACHE_MAX_TARGET_TOKENS - 1]
    assert len(greedy_p1) >= protocol.CACHE_MAX_TARGET_TOKENS
