"""Part 3: one generation trial, a generate() call with its complete configuration, what acted on the logits, and
its outputs.

What generate() decides inside that affects token selection is made explicit: the configuration is built from
scratch (the checkpoint's generation_config is never merged: use_model_defaults=False), the logits processors and
stopping criteria are observed as generate() builds them in this very call, the cache it uses is watched to be a
fresh one, and the first step's raw logits come from the same call (output_logits=True), never from another forward.
"""

from __future__ import annotations

import contextlib
import random
import time
import weakref
from typing import Iterator, Optional

import numpy as np
import torch
from transformers import GenerationConfig
from transformers.cache_utils import Cache

from inferlab import protocol
from inferlab.files import jsonable, tensor_sha256
from inferlab.measure.inputs import token_pieces
from inferlab.measure.loading import capture_messages

OUTPUT_DECODING_LABEL = ("tokenizer.decode of the generated ids (skip_special_tokens=True) alone, after generate() "
                         "returned; the second decode with special tokens kept is not timed")


def build_generation_config(condition: protocol.Condition, eos_token_id: int, pad_token_id: int,
                            bos_token_id: Optional[int] = None) -> GenerationConfig:
    """A complete GenerationConfig from scratch: the protocol's fixed values, the condition's controls, token ids.

    GenerationConfig() defaults top_k=50, so sampling conditions carry their explicit top_k=0. Greedy passes only
    do_sample=False: the defaults temperature=1.0, top_p=1.0, top_k=50 stay in to_dict() but build no warper and
    draw no warning. Every trial returns raw logits and processed scores of every step; only the designated trials
    save them.
    """
    config = GenerationConfig(**protocol.GENERATION_FIXED, **condition.generate_kwargs(), eos_token_id=eos_token_id,
                              pad_token_id=pad_token_id, bos_token_id=bos_token_id, output_logits=True,
                              output_scores=True, return_dict_in_generate=True)
    config.validate()
    return config


def greedy_generation_config(new_tokens: int, eos_token_id, pad_token_id, **extra) -> GenerationConfig:
    """The matrix's complete greedy config for new_tokens ids, returning plain sequences (no per-step logits or
    scores; transformers 4.57.1 still copies each step's last logits in _sample either way)."""
    config = build_generation_config(protocol.CONDITIONS["G"], eos_token_id, pad_token_id)
    config.update(max_new_tokens=new_tokens, output_logits=False, output_scores=False, return_dict_in_generate=False,
                  **extra)
    config.validate()
    return config


def expected_processor_classes(condition: protocol.Condition) -> list[str]:
    """The processors the protocol expects for a condition, in generate()'s order: only controls that change the
    logits (temperature != 1, then top-k > 0, then top-p < 1); never a penalty, ban, bias or minimum length."""
    if not condition.do_sample:
        return []
    return ((["TemperatureLogitsWarper"] if condition.temperature not in (None, 1.0) else [])
            + (["TopKLogitsWarper"] if condition.top_k else [])
            + (["TopPLogitsWarper"] if condition.top_p is not None and condition.top_p < 1.0 else []))


def describe(objects) -> list[dict]:
    """[{"class", "params"}] for processors or stopping criteria, in application order."""
    return [{"class": type(obj).__name__,
             "params": {k: jsonable(v) for k, v in vars(obj).items() if not k.startswith("_")}} for obj in objects]


def timed_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_config: GenerationConfig):
    """One generate() call with the wall clock around it alone: (output, elapsed_s)."""
    start = time.perf_counter()
    # use_model_defaults=False: generate() takes our config as it is (with None it would fall back to the checkpoint's,
    # with True, or None on a >=4.50 checkpoint, overwrite our default-valued fields)
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config,
                            use_model_defaults=False)
    return output, time.perf_counter() - start


@contextlib.contextmanager
def observe_builders(model) -> Iterator[dict]:
    """What generate() builds on this model instance inside the block: {"processors", "criteria",
    "effective_config"} (the prepared config it used). generate()'s private builders (4.57.1) are wrapped on the
    instance for the block only."""
    built: dict = {"processors": [], "criteria": [], "effective_config": None}
    processors, criteria = model._get_logits_processor, model._get_stopping_criteria

    def observed_processors(*args, **kwargs):
        result = processors(*args, **kwargs)
        built["processors"], built["effective_config"] = list(result), jsonable(kwargs["generation_config"].to_dict())
        return result

    def observed_criteria(*args, **kwargs):
        result = criteria(*args, **kwargs)
        built["criteria"] = list(result)
        return result

    model._get_logits_processor, model._get_stopping_criteria = observed_processors, observed_criteria
    try:
        yield built
    finally:
        del model._get_logits_processor, model._get_stopping_criteria  # back to the class's methods


_previous_cache = [None]  # a weak reference to the cache the previous observed call used (no object kept alive)


@contextlib.contextmanager
def observe_generation_cache(model) -> Iterator[dict]:
    """Which cache object each forward of the block receives (a forward pre-hook doing one identity check per
    forward): {"forwards", "first_cache", "length_before_first_forward", "same_object_every_forward"}."""
    seen: dict = {"forwards": 0, "first_cache": None, "length_before_first_forward": None,
                  "same_object_every_forward": True}

    def observe(module, args, kwargs):
        cache = kwargs.get("past_key_values")
        if seen["forwards"] == 0:  # read before the first forward runs: what the call started from
            seen["first_cache"] = cache
            seen["length_before_first_forward"] = int(cache.get_seq_length()) if isinstance(cache, Cache) else None
        elif cache is not seen["first_cache"]:
            seen["same_object_every_forward"] = False
        seen["forwards"] += 1

    handle = model.register_forward_pre_hook(observe, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def generation_cache_record(seen: dict, passed_by_caller: bool = False) -> dict:
    """The generation_cache field. Fresh: no cache was passed in, so generate() built its own; the first forward
    received a Cache holding 0 tokens, not the previous observed call's object; every later forward the same one."""
    cache, length, same = seen["first_cache"], seen["length_before_first_forward"], seen["same_object_every_forward"]
    is_cache = isinstance(cache, Cache)
    new_object = is_cache and not (_previous_cache[0] is not None and _previous_cache[0]() is cache)
    _previous_cache[0] = weakref.ref(cache) if is_cache else None
    seen["first_cache"] = None  # release the cache object
    how = ("the caller passed a cache into generate()" if passed_by_caller else
           "generate() was called without past_key_values, so it built its own cache for this call")
    return {
        "fresh": not passed_by_caller and is_cache and length == 0 and new_object and same,
        "how": (f"{how}; a forward pre-hook saw the first forward receive a {type(cache).__name__} holding {length} "
                f"tokens, {'a different object from' if new_object else 'NOT a new object: the same as'} the "
                f"previous observed call's, and {'the same' if same else 'a different'} object at every later "
                f"forward ({seen['forwards']} forwards)"),
        "cache_class": type(cache).__name__, "past_key_values_passed_by_caller": passed_by_caller,
        "length_before_first_forward": length, "new_object": new_object, "same_object_every_forward": same,
        "forwards": seen["forwards"],
    }


def reset_random_state(seed: int) -> list[dict]:
    """Seed every generator a sampling trial could draw from, and say which: generate()'s torch.multinomial draws
    from torch's default CPU generator; Python's and NumPy's are unused by it but reset so nothing hidden differs."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return [{"call": "torch.manual_seed", "seed": seed, "used_by_generate": True},
            {"call": "random.seed", "seed": seed, "used_by_generate": False},
            {"call": "numpy.random.seed", "seed": seed, "used_by_generate": False}]


def stop_reason(generated_ids: list[int], eos_token_id: int, max_new_tokens: int) -> str:
    """'eos', 'max_new_tokens' or 'unexplained', by protocol.GENERATION_STOP_RULE."""
    if generated_ids and generated_ids[-1] == eos_token_id:
        return "eos"
    return "max_new_tokens" if len(generated_ids) == max_new_tokens else "unexplained"


@torch.inference_mode()
def run_generation_trial(model, tokenizer, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         condition: protocol.Condition, seed: Optional[int], eos_token_id: int,
                         pad_token_id: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """One generate() call: (record, first-step raw logits (vocab,), first-step scores (vocab,)).

    The raw logits are output.logits[0] of this same call (before any processor), the scores output.scores[0]
    (after them: divided by the temperature, -inf outside top-p). Only generate() is inside the timed region.
    """
    if condition.do_sample and seed is None:
        raise ValueError(f"run_generation_trial: sampling condition {condition.name} needs a seed, got None")
    if not condition.do_sample and seed is not None:
        raise ValueError(f"run_generation_trial: greedy condition {condition.name} takes no seed, got {seed}")
    with capture_messages() as messages:  # from the config on: GenerationConfig warns as it is built
        # 1) the configuration, outside the timed region
        config = build_generation_config(condition, eos_token_id, pad_token_id, tokenizer.bos_token_id)
        # 2) the call: generators reset immediately before it, the clock around it alone
        rng_reset = reset_random_state(seed) if condition.do_sample else []
        with observe_builders(model) as built, observe_generation_cache(model) as cache_seen:
            output, elapsed_s = timed_generate(model, input_ids, attention_mask, config)

    # 3) copies and decoding, after the call has returned
    first_step_logits = output.logits[0][0].detach().to(dtype=torch.float32, copy=True)  # (vocab,)
    first_step_scores = output.scores[0][0].detach().to(dtype=torch.float32, copy=True)  # (vocab,)
    sequence_ids, prompt_ids = output.sequences[0].tolist(), input_ids[0].tolist()  # (T + n,), (T,)
    generated_ids = sequence_ids[len(prompt_ids):]
    start = time.perf_counter()
    text = tokenizer.decode(generated_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    decode_s = time.perf_counter() - start  # OUTPUT_DECODING_LABEL
    record = {
        "condition": condition.name,
        "seed": seed, "prompt_ids": prompt_ids, "prompt_length": len(prompt_ids),
        "attention_mask": attention_mask[0].tolist(), "generated_ids": generated_ids, "sequence_ids": sequence_ids,
        "generated_length": len(generated_ids), "text": text,
        "text_with_special": tokenizer.decode(generated_ids, skip_special_tokens=False,
                                              clean_up_tokenization_spaces=False),
        "generated_pieces": token_pieces(tokenizer, generated_ids), "decode_s": decode_s,
        "eos_token_id": eos_token_id, "pad_token_id": pad_token_id,
        "eos_positions": [i for i, t in enumerate(generated_ids) if t == eos_token_id],
        "stop_reason": stop_reason(generated_ids, eos_token_id, config.max_new_tokens),
        "stopping_criteria": describe(built["criteria"]), "generation_config": config.to_dict(),
        "generation_config_effective": built["effective_config"],
        "processors": describe(built["processors"]), "rng_reset": rng_reset,
        "logit_steps_returned": len(output.logits), "first_step_logits_sha256": tensor_sha256(first_step_logits),
        "generation_cache": generation_cache_record(cache_seen),  # timed_generate passes no cache
        "warnings": list(messages), "elapsed_s": elapsed_s,
        "status": "ok",
    }
    return record, first_step_logits, first_step_scores
