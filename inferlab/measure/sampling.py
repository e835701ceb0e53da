"""Part 3 generation trials: one generate() call, its complete configuration, processors and outputs.

Everything the library decides inside generate() that affects token selection is made
explicit here: the configuration is built from scratch (the checkpoint's generation_config
is not merged, ``use_model_defaults=False``), the logits processors and stopping criteria
are rebuilt with the same private builders generate() uses in transformers 4.57.1, and the
first step's raw logits come from the same call (``output_logits``), never from a second forward.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
import weakref
from typing import Iterator, Optional

import numpy as np
import torch
from transformers import GenerationConfig
from transformers.cache_utils import Cache
from transformers.generation import LogitsProcessorList

from inferlab import protocol
from inferlab.files import jsonable, tensor_sha256
from inferlab.measure.inputs import token_pieces
from inferlab.measure.messages import capture_messages
from inferlab.measure.near_tie import STEP_IDS_FIELD, STEP_VALUES_FIELD

# generate() receives our config as is; with None it would fall back to the checkpoint's,
# and with True (or None on a >=4.50 checkpoint) it would overwrite our default-valued fields.
USE_MODEL_DEFAULTS = False

OUTPUT_DECODING_LABEL = (
    "tokenizer.decode of the generated ids (skip_special_tokens=True) alone, after generate() returned; "
    "the second decode with special tokens kept is not timed"
)

STOP_RULE_TEXT = (
    "generation stops when the selected token is an EOS id (EosTokenCriteria) or when "
    "prompt_length + max_new_tokens ids exist (MaxLengthCriteria); stop_reason is 'eos' when the last "
    "generated id is EOS, 'max_new_tokens' when exactly max_new_tokens ids were generated and the last "
    "is not EOS, otherwise 'unexplained'"
)


def _describe(objects) -> list[dict]:
    """[{"class", "params"}] for processors or stopping criteria, in application order."""
    return [
        {
            "class": type(obj).__name__,
            "params": {k: jsonable(v) for k, v in vars(obj).items() if not k.startswith("_")},
        }
        for obj in objects
    ]


def build_generation_config(
    condition: protocol.Condition,
    eos_token_id: int,
    pad_token_id: int,
    bos_token_id: Optional[int] = None,
) -> GenerationConfig:
    """A complete GenerationConfig from scratch: protocol fixed values, the condition's controls, token ids.

    GenerationConfig() defaults top_k=50, so sampling conditions carry their explicit top_k=0.
    Greedy passes only do_sample=False; the defaults temperature=1.0, top_p=1.0, top_k=50 then
    stay in to_dict() but no warper is built for them (see processors_for) and no warning fires.
    Every trial returns raw logits and processed scores of every step (16 x vocab floats);
    only the designated trials save them.
    """
    config = GenerationConfig(
        **protocol.GENERATION_FIXED,
        **condition.generate_kwargs(),
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
    )
    config.validate()
    return config


def _prepared_copy(model, generation_config: GenerationConfig, input_ids_length: int) -> GenerationConfig:
    """A copy prepared the way generate() prepares it before building processors (steps 1, 3 and 6)."""
    prepared, _ = model._prepare_generation_config(
        copy.deepcopy(generation_config), use_model_defaults=USE_MODEL_DEFAULTS
    )
    model._prepare_special_tokens(prepared, kwargs_has_attention_mask=True, device=model.device)
    return model._prepare_generated_length(
        generation_config=prepared,
        has_default_max_length=True,
        has_default_min_length=True,
        model_input_name="input_ids",
        input_ids_length=input_ids_length,
        inputs_tensor=None,
    )


def processors_for(model, generation_config: GenerationConfig, input_ids_length: int) -> list[dict]:
    """The logits processors generate() builds for this config, in order: [{"class", "params"}].

    Uses model._get_logits_processor, the builder generate() calls in 4.57.1; it appends the
    former "warpers" (temperature, top-k, top-p, ...) after the processors only when do_sample.
    """
    prepared = _prepared_copy(model, generation_config, input_ids_length)
    processors = model._get_logits_processor(
        generation_config=prepared,
        input_ids_seq_length=input_ids_length,
        encoder_input_ids=None,  # only read by encoder-side penalties, which are inactive here
        prefix_allowed_tokens_fn=None,
        logits_processor=LogitsProcessorList(),
        device=model.device,
        model_kwargs={},
    )
    return _describe(processors)


def timed_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_config: GenerationConfig):
    """One generate() call with the wall clock around it alone: (output, elapsed_s).

    use_model_defaults=False: nothing from the checkpoint's generation_config.json is merged in.
    """
    start = time.perf_counter()
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config,
                            use_model_defaults=USE_MODEL_DEFAULTS)
    return output, time.perf_counter() - start


@contextlib.contextmanager
def observe_builders(model) -> Iterator[dict]:
    """Capture what generate() builds on this model instance: its logits processors, stopping criteria
    and the prepared (effective) GenerationConfig, as {"processors", "criteria", "effective_config"}.

    The private builders are wrapped on the instance only for the duration of the block.
    """
    built: dict = {"processors": [], "criteria": [], "effective_config": None}
    originals = {name: getattr(model, name) for name in ("_get_logits_processor", "_get_stopping_criteria")}

    def observed_processors(*args, **kwargs):
        result = originals["_get_logits_processor"](*args, **kwargs)
        built["processors"] = list(result)
        built["effective_config"] = jsonable(kwargs["generation_config"].to_dict())
        return result

    def observed_criteria(*args, **kwargs):
        result = originals["_get_stopping_criteria"](*args, **kwargs)
        built["criteria"] = list(result)
        return result

    model._get_logits_processor = observed_processors
    model._get_stopping_criteria = observed_criteria
    try:
        yield built
    finally:
        del model._get_logits_processor, model._get_stopping_criteria  # back to the class's methods


class _PreviousCache:
    """A weak reference to the cache object the previous observed generate() call used (no object kept alive)."""

    ref = None

    @classmethod
    def is_same(cls, cache) -> bool:
        return cls.ref is not None and cls.ref() is cache

    @classmethod
    def remember(cls, cache) -> None:
        cls.ref = weakref.ref(cache) if cache is not None else None


@contextlib.contextmanager
def observe_generation_cache(model) -> Iterator[dict]:
    """Watch which cache object each forward of one generate() call receives (a forward pre-hook).

    Yields {"forwards", "first_cache", "length_before_first_forward", "same_object_every_forward"};
    read it with generation_cache_record() after the block. The hook does one identity check per
    forward and nothing else, so it adds next to nothing to the generate() call it watches.
    """
    seen: dict = {"forwards": 0, "first_cache": None, "length_before_first_forward": None,
                  "same_object_every_forward": True}

    def observe(module, args, kwargs):
        cache = kwargs.get("past_key_values")
        if seen["forwards"] == 0:
            seen["first_cache"] = cache
            # Read before this forward runs: what the call started from.
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
    """The generation_cache field: {fresh, how, ...} from what observe_generation_cache saw.

    Fresh means: no cache was passed in, so generate() built its own for this call; the object the
    first forward received was a Cache holding 0 tokens; it was not the object of the previous observed
    call; and every later forward of the call received that same object.
    """
    cache = seen["first_cache"]
    is_cache = isinstance(cache, Cache)
    new_object = is_cache and not _PreviousCache.is_same(cache)
    fresh = (not passed_by_caller and is_cache and seen["length_before_first_forward"] == 0 and new_object
             and seen["same_object_every_forward"])
    _PreviousCache.remember(cache if is_cache else None)
    seen["first_cache"] = None  # release the cache object
    return {
        "fresh": fresh,
        "how": (
            ("the caller passed a cache into generate()" if passed_by_caller else
             "generate() was called without past_key_values, so it built its own cache for this call")
            + "; a forward pre-hook saw the first forward receive a "
            f"{type(cache).__name__} holding {seen['length_before_first_forward']} tokens, "
            f"{'a different object from' if new_object else 'NOT a new object: the same as'} the previous "
            f"observed call's, and {'the same' if seen['same_object_every_forward'] else 'a different'} object "
            f"at every later forward ({seen['forwards']} forwards)"
        ),
        "cache_class": type(cache).__name__,
        "past_key_values_passed_by_caller": passed_by_caller,
        "length_before_first_forward": seen["length_before_first_forward"],
        "new_object": new_object,
        "same_object_every_forward": seen["same_object_every_forward"],
        "forwards": seen["forwards"],
    }


def expected_processor_classes(condition: protocol.Condition) -> list[str]:
    """The processors the protocol expects for a condition, in generate()'s order.

    Only controls that change the logits appear: temperature != 1, then top-k > 0, then top-p < 1.
    No repetition penalty, ban, bias, forced token or minimum length is ever expected.
    """
    if not condition.do_sample:
        return []
    expected = []
    if condition.temperature is not None and condition.temperature != 1.0:
        expected.append("TemperatureLogitsWarper")
    if condition.top_k:
        expected.append("TopKLogitsWarper")
    if condition.top_p is not None and condition.top_p < 1.0:
        expected.append("TopPLogitsWarper")
    return expected


def reset_random_state(seed: int) -> list[dict]:
    """Seed every random generator a sampling trial could draw from; returns what was reset.

    torch.multinomial in generate() draws from torch's default CPU generator; Python's and
    NumPy's generators are not used by generate() but are reset so that nothing hidden differs.
    """
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return [
        {"call": "torch.manual_seed", "seed": seed, "used_by_generate": True},
        {"call": "random.seed", "seed": seed, "used_by_generate": False},
        {"call": "numpy.random.seed", "seed": seed, "used_by_generate": False},
    ]


def step_top_two(step_logits: torch.Tensor, selected_ids: list[int]) -> dict:
    """Per greedy step, the selected id's raw logit and the best other id with its logit, from logits the call
    already returned (no forward): {STEP_VALUES_FIELD: [[top, second], ...], STEP_IDS_FIELD: [[selected, runner-up],
    ...]} (inferlab.measure.near_tie). Relative to the selection, so an exact tie still names the selected id first."""
    logits = step_logits.detach().to(dtype=torch.float32)  # (n, vocab)
    selected = torch.tensor(selected_ids, dtype=torch.long).reshape(-1, 1)  # (n, 1)
    top = logits.gather(1, selected)  # (n, 1)
    others = logits.scatter(1, selected, float("-inf"))  # (n, vocab), the selected id masked out
    second, runner_up = others.max(dim=1)  # (n,), (n,)
    return {STEP_VALUES_FIELD: [[a, b] for a, b in zip(top[:, 0].tolist(), second.tolist())],
            STEP_IDS_FIELD: [[a, b] for a, b in zip(selected[:, 0].tolist(), runner_up.tolist())]}


def stop_reason(generated_ids: list[int], eos_token_id: int, max_new_tokens: int) -> str:
    """'eos', 'max_new_tokens' or 'unexplained', by the rule in STOP_RULE_TEXT."""
    if generated_ids and generated_ids[-1] == eos_token_id:
        return "eos"
    if len(generated_ids) == max_new_tokens:
        return "max_new_tokens"
    return "unexplained"


@torch.inference_mode()
def run_generation_trial(
    model,
    tokenizer,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    condition: protocol.Condition,
    seed: Optional[int],
    eos_token_id: int,
    pad_token_id: int,
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """One generate() call; returns (record, first-step raw logits (vocab,), first-step scores (vocab,)).

    The raw logits are ``output.logits[0]`` of this same call (before any processor), the scores
    ``output.scores[0]`` (after processors: e.g. divided by the temperature, -inf outside top-p).
    Only generate() sits inside the timed region; copies are made after it returns.
    """
    if input_ids.shape[0] != 1:
        raise ValueError(f"run_generation_trial: expected batch size 1, got input_ids shape {tuple(input_ids.shape)}")
    if condition.do_sample and seed is None:
        raise ValueError(f"run_generation_trial: sampling condition {condition.name} needs a seed, got None")
    if not condition.do_sample and seed is not None:
        raise ValueError(f"run_generation_trial: greedy condition {condition.name} takes no seed, got {seed}")

    prompt_length = int(input_ids.shape[1])
    # Messages are captured from building the config onward: GenerationConfig warns at construction.
    with capture_messages() as messages:
        # 1) configuration and the processors/criteria it implies, outside the timed region
        generation_config = build_generation_config(condition, eos_token_id, pad_token_id, tokenizer.bos_token_id)

        # 2) the call: RNG reset immediately before it, timer around it alone; the processors,
        #    criteria and prepared config are observed as generate() builds them, not rebuilt
        rng_reset = reset_random_state(seed) if condition.do_sample else []
        with observe_builders(model) as built, observe_generation_cache(model) as cache_seen:
            output, elapsed_s = timed_generate(model, input_ids, attention_mask, generation_config)
    processors, criteria = _describe(built["processors"]), _describe(built["criteria"])
    generation_cache = generation_cache_record(cache_seen, passed_by_caller=False)  # timed_generate passes none

    # 3) copies, after the call has returned
    sequence = output.sequences[0].detach().clone()  # (T + n,)
    first_step_logits = output.logits[0][0].detach().to(dtype=torch.float32, copy=True)  # (vocab,)
    first_step_scores = output.scores[0][0].detach().to(dtype=torch.float32, copy=True)  # (vocab,)
    vocab_size = model.config.vocab_size
    if first_step_logits.shape != (vocab_size,):
        raise ValueError(
            f"run_generation_trial: first-step logits shape {tuple(first_step_logits.shape)}, "
            f"expected ({vocab_size},) from model.config.vocab_size"
        )

    sequence_ids = sequence.tolist()
    prompt_ids = input_ids[0].tolist()
    if sequence_ids[:prompt_length] != prompt_ids:
        raise ValueError("run_generation_trial: returned sequence does not start with the prompt ids")
    generated_ids = sequence_ids[prompt_length:]
    max_new_tokens = generation_config.max_new_tokens
    start = time.perf_counter()
    text = tokenizer.decode(generated_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    decode_s = time.perf_counter() - start  # output decoding (OUTPUT_DECODING_LABEL), after generate() returned
    # Greedy: every step's top two raw logits, from output.logits of this call (steps x (1, vocab)), after it returned.
    greedy_steps = {} if condition.do_sample or not generated_ids else step_top_two(
        torch.cat([step[:1] for step in output.logits[:len(generated_ids)]]), generated_ids)
    record = {
        "condition": condition.name,
        "condition_controls": {
            "do_sample": condition.do_sample,
            "temperature": condition.temperature,
            "top_p": condition.top_p,
            "top_k": condition.top_k,
        },
        "seed": seed,
        "prompt_ids": prompt_ids,
        "prompt_length": prompt_length,
        "attention_mask": attention_mask[0].tolist(),
        "generated_ids": generated_ids,
        "sequence_ids": sequence_ids,
        "generated_length": len(generated_ids),
        "text": text,
        "text_with_special": tokenizer.decode(
            generated_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        ),
        "generated_pieces": token_pieces(tokenizer, generated_ids),
        "decode_s": decode_s,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "eos_positions": [i for i, t in enumerate(generated_ids) if t == eos_token_id],
        "stop_reason": stop_reason(generated_ids, eos_token_id, max_new_tokens),
        "stop_rule": STOP_RULE_TEXT,
        "stopping_criteria": criteria,
        "generation_config": generation_config.to_dict(),
        "generation_config_effective": built["effective_config"],
        "generation_config_note": (
            "generation_config is what was passed (and replays the trial); generation_config_effective is the "
            "copy generate() prepared and used, with max_length resolved. Fields such as top_k=50 under greedy "
            "are library defaults that build no processor: `processors` lists what acted on the logits"
        ),
        "use_model_defaults": USE_MODEL_DEFAULTS,
        "processors": processors,
        "rng_reset": rng_reset,
        "rng_note": (
            "sampling: generators reset immediately before generate()"
            if condition.do_sample
            else "greedy selection is argmax and draws no random numbers; no reset applied"
        ),
        "logit_steps_returned": len(output.logits),
        "first_step_logits_shape": list(first_step_logits.shape),
        "first_step_logits_sha256": tensor_sha256(first_step_logits),
        "first_step_logits_argmax": int(first_step_logits.argmax()),
        **greedy_steps,
        "generation_cache": generation_cache,
        "warnings": list(messages),
        "elapsed_s": elapsed_s,
        "timed_region": "time.perf_counter() around model.generate() only",
        "status": "ok",
    }
    return record, first_step_logits, first_step_scores


@torch.inference_mode()
def replay_generation(model, prompt_ids: list[int], generation_config_dict: dict, seed: Optional[int]) -> dict:
    """Regenerate from a recorded config dict and seed; returns {"sequence_ids", "generated_ids"}."""
    generation_config = GenerationConfig.from_dict(dict(generation_config_dict))
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)  # (1, T)
    attention_mask = torch.ones_like(input_ids)  # (1, T)
    if generation_config.do_sample:
        if seed is None:
            raise ValueError("replay_generation: the recorded config samples, so a seed is required")
        reset_random_state(seed)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=generation_config,
        use_model_defaults=USE_MODEL_DEFAULTS,
    )
    sequences = output.sequences if hasattr(output, "sequences") else output
    sequence_ids = sequences[0].tolist()
    return {"sequence_ids": sequence_ids, "generated_ids": sequence_ids[len(prompt_ids):]}
