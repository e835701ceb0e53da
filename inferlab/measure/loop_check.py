"""The instrumented loop's inputs against generate()'s own, step by step, without running a forward.

P1's loop is checked against generate() by ids: the generation matrix's first greedy trial of P1 is a
generate() call the budget already holds. P1x8 has no such call, and the protocol's budget has no room for one
(Part 3 and Part 5 together use all 800 selections, and no other forward is allowed). What differs between the
two prompts is only what the loop feeds the model, so that is what is checked for them: for the ids a trial
recorded, each step's input ids, attention mask, position ids, cache positions and logits_to_keep as the loop
builds them (decode_loop's own buffers) against those generate()'s own preparation builds
(GenerationMixin._get_initial_cache_position, prepare_inputs_for_generation and
_update_model_kwargs_for_generation, the calls its greedy loop makes around each forward in transformers
4.57.1). No model forward runs: the cache generate() would fill stays empty, and the preparation reads only
cache_position.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from inferlab import protocol
from inferlab.measure import decode_loop
from inferlab.measure.summaries import first_divergence

COMPARED = ("input_ids", "attention_mask", "position_ids", "cache_position", "logits_to_keep", "use_cache")
HOW = ("each step's model inputs from decode_loop's own buffers and slices, against those generate()'s preparation "
       "(_get_initial_cache_position, prepare_inputs_for_generation, _update_model_kwargs_for_generation) builds for "
       "the same ids; no forward runs")


def _plain(value):
    return value.tolist() if isinstance(value, torch.Tensor) else value


def loop_step_inputs(prompt_ids: list[int], generated_ids: list[int],
                     logits_to_keep: int = protocol.LOGITS_TO_KEEP) -> list[dict]:
    """What run_greedy_loop (cache on) feeds the model at each of its len(generated_ids) forwards."""
    prompt = torch.tensor([prompt_ids], dtype=torch.long)  # (1, T)
    buffers = decode_loop._prepare(prompt, torch.ones_like(prompt), len(generated_ids))
    buffers.tokens[0, len(prompt_ids):] = torch.tensor(generated_ids, dtype=torch.long)  # as the loop writes them
    steps, length = [], len(prompt_ids)
    for step in range(len(generated_ids)):
        start, end = (0, length) if step == 0 else (length + step - 1, length + step)
        steps.append({"input_ids": buffers.tokens[:, start:end].tolist(), "attention_mask": buffers.mask[:, :end].tolist(),
                      "position_ids": buffers.positions[:, start:end].tolist(),
                      "cache_position": buffers.cache_positions[start:end].tolist(),
                      "logits_to_keep": logits_to_keep, "use_cache": True})
    return steps


@torch.inference_mode()
def generate_step_inputs(model, prompt_ids: list[int], generated_ids: list[int]) -> list[dict]:
    """What generate() (greedy, cache on, a fresh DynamicCache) would feed the model at each step for these ids."""
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)  # (1, T), grows by one id per step
    cache = DynamicCache(config=model.config)
    model_kwargs = {"attention_mask": torch.ones_like(input_ids), "use_cache": True, "past_key_values": cache}
    if model._supports_logits_to_keep():
        model_kwargs["logits_to_keep"] = 1  # what generate() sets when the model supports it
    model_kwargs = model._get_initial_cache_position(input_ids.shape[1], input_ids.device, model_kwargs)
    steps = []
    for token in generated_ids:
        prepared = model.prepare_inputs_for_generation(input_ids, **model_kwargs)
        steps.append({name: _plain(prepared.get(name)) for name in COMPARED})
        input_ids = torch.cat([input_ids, torch.tensor([[token]], dtype=torch.long)], dim=-1)
        model_kwargs = model._update_model_kwargs_for_generation(CausalLMOutputWithPast(past_key_values=cache),
                                                                 model_kwargs)
    return steps


def loop_inputs_match_generate(model, prompt_id: str, prompt_ids: list[int], generated_ids: list[int],
                               trial: Optional[str] = None) -> dict:
    """Both sides step by step: {prompt_id, steps, equal, first_difference (step, field, loop, generate), how}."""
    loop, generate = loop_step_inputs(prompt_ids, generated_ids), generate_step_inputs(model, prompt_ids, generated_ids)
    difference = None
    for step, (ours, theirs) in enumerate(zip(loop, generate)):
        field = next((name for name in COMPARED if ours[name] != theirs[name]), None)
        if field is not None:
            difference = {"step": step, "field": field, "loop": ours[field], "generate": theirs[field]}
            break
    if difference is None and first_divergence(loop, generate) is not None:
        difference = {"step": min(len(loop), len(generate)), "field": "steps", "loop": len(loop),
                      "generate": len(generate)}
    return {"prompt_id": prompt_id, "trial": trial, "prompt_length": len(prompt_ids), "steps": len(loop),
            "compared": list(COMPARED), "equal": difference is None, "first_difference": difference, "how": HOW}
