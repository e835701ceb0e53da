"""Part 4: matched-prefix comparison of the cached and uncached computational paths.

Both paths see the same fixed continuation y_1..y_m, whatever either path would have chosen,
so every compared logit vector answers the same question: "what follows this exact prefix?"
The uncached path makes m full forwards; the cached path one prefill and m-1 one-token forwards.
y_m is never fed: its preceding logits are the last ones compared.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from transformers import DynamicCache

from inferlab import protocol
from inferlab.measure import memory
from inferlab.measure.decode_loop import logits_to_keep_check
from inferlab.measure.loading import capture_messages
from inferlab.protocol import Tolerance

NOTE_PREFILL_ONLY = "prefill only: cache reuse not exercised (one target token, so only the prompt's logits were compared)"


def _finite_or_none(value: float) -> Optional[float]:
    """JSON has no NaN/inf; a non-finite statistic is recorded as None beside an explicit finite flag."""
    return value if value == value and abs(value) != float("inf") else None


def compare_vectors(a: torch.Tensor, b: torch.Tensor, tolerance: Tolerance,
                    reference: str = "uncached reference") -> dict:
    """Compare `a` against the reference `b` under |a-b| <= atol + rtol*|b|; plain dict of the statistics."""
    if a.shape != b.shape:
        raise ValueError(f"compare_vectors: shapes differ, a {tuple(a.shape)} vs reference b {tuple(b.shape)}")
    # float64 so the criterion itself adds no rounding on top of the float32 difference.
    a64, b64 = a.detach().double(), b.detach().double()
    finite_a, finite_b = bool(torch.isfinite(a64).all()), bool(torch.isfinite(b64).all())
    diff = (a64 - b64).abs()
    failing = ~(diff <= tolerance.atol + tolerance.rtol * b64.abs())  # NaN counts as failing
    fail_count = int(failing.sum())
    numel = a64.numel()
    return {
        "numel": numel,
        "finite_a": finite_a,
        "finite_b": finite_b,
        "max_abs_diff": _finite_or_none(float(diff.max())) if numel else 0.0,
        "fail_count": fail_count,
        "fail_fraction": fail_count / numel if numel else 0.0,
        "bitwise_equal": bool(torch.equal(a.detach(), b.detach())),
        "criterion": tolerance.describe(reference),
        "atol": tolerance.atol,
        "rtol": tolerance.rtol,
        "passed": finite_a and finite_b and fail_count == 0,
    }


def top_two(logits: torch.Tensor) -> tuple[float, float]:
    """The largest and second-largest logit of a (vocab,) vector."""
    top = torch.topk(logits.detach().double(), 2).values
    return float(top[0]), float(top[1])


def top2_margin(logits: torch.Tensor) -> float:
    """Largest minus second-largest logit of a (vocab,) vector."""
    first, second = top_two(logits)
    return first - second


def near_tie(logits: torch.Tensor, tolerance: Tolerance) -> dict:
    """Whether the criterion would accept an argmax flip on this (vocab,) reference vector (protocol.NEAR_TIE_RULE):
    {top1, top2, margin, allowance, near_tie}. A non-finite margin counts as near a tie."""
    first, second = top_two(logits)
    margin, allowance = first - second, tolerance.tie_allowance(first, second)
    return {"top1": _finite_or_none(first), "top2": _finite_or_none(second), "margin": _finite_or_none(margin),
            "allowance": _finite_or_none(allowance), "near_tie": not margin > allowance}


def cached_step_inputs(past_length: int, new_length: int) -> dict:
    """Mask and positions for feeding `new_length` tokens after `past_length` cached ones (no padding, batch 1).

    This follows what transformers 4.57.1 generate() passes GPTNeoXForCausalLM: a 2-D mask over past and
    new tokens, cache_position = the new tokens' slots, position_ids = mask.cumsum - 1 for the new tokens.
    """
    total = past_length + new_length
    attention_mask = torch.ones((1, total), dtype=torch.long)  # (1, past + new)
    cache_position = torch.arange(past_length, total, dtype=torch.long)  # (new,)
    position_ids = (attention_mask.cumsum(-1) - 1)[:, past_length:]  # (1, new)
    return {"attention_mask": attention_mask, "cache_position": cache_position, "position_ids": position_ids}


def inspect_cache(cache: Any, model: torch.nn.Module) -> dict:
    """Cache tensors as observed (type, per-layer dtype/device/shape/length, unique bytes), beside config.use_cache."""
    layers = []
    for index, (keys, values) in enumerate(memory.cache_layer_tensors(cache)):
        layers.append(
            {
                "layer": index,
                "key": {"dtype": str(keys.dtype), "device": str(keys.device), "shape": list(keys.shape)},
                "value": {"dtype": str(values.dtype), "device": str(values.device), "shape": list(values.shape)},
                "logical_length_from_tensor": int(keys.shape[-2]),  # keys are (B, heads, T, head_dim)
                "logical_length_from_cache": int(cache.get_seq_length(index)),
            }
        )
    storage = memory.cache_storage(cache)
    return {
        "cache_type": type(cache).__name__,
        "layers": layers,
        "layer_count": len(layers),
        "get_seq_length": int(cache.get_seq_length()),
        "unique_bytes": storage["unique_bytes"],
        "expected_bytes": memory.expected_kv_cache_bytes(
            model.config, int(cache.get_seq_length()), dtype_bytes=_element_size(cache)
        ),
        "config_use_cache": getattr(model.config, "use_cache", None),
    }


def _element_size(cache: Any) -> int:
    keys, _ = memory.cache_layer_tensors(cache)[0]
    return keys.element_size()


def _last_logits(output) -> torch.Tensor:
    return output.logits[0, -1].detach().clone()  # (vocab,)


FED_INPUT_NAMES = ("input_ids", "attention_mask", "position_ids", "cache_position")
ALIGNMENT_CHECKS = ("fed_masks_aligned", "fed_positions_aligned")


def _fed_inputs(kwargs: dict) -> dict:
    """The ids, mask and positions one forward received, as lists of ints (batch row 0; cache_position is 1-D)."""
    fed = {}
    for name in FED_INPUT_NAMES:
        value = kwargs.get(name)
        if value is None:
            fed[name] = None
        else:
            value = value.detach()
            fed[name] = (value[0] if value.dim() == 2 else value).tolist()
    return fed


def fed_alignment(fed_inputs: dict, prefix_length: int, fed_tokens: int) -> dict:
    """Whether both paths fed the model one consistent prefix of `prefix_length` tokens.

    Uncached: a mask of L ones, positions and cache slots 0..L-1. Cached: the prefill (fed_tokens 0)
    the same; a later step one token whose mask covers all L tokens and whose position and cache slot
    are L-1, the uncached path's last ones. {"fed_masks_aligned": bool, "fed_positions_aligned": bool}.
    """
    uncached, cached = fed_inputs.get("uncached"), fed_inputs.get("cached")
    if not uncached or not cached:
        return {name: False for name in ALIGNMENT_CHECKS}
    full = list(range(prefix_length))
    new_slots = full if fed_tokens == 0 else full[-1:]
    masks = uncached["attention_mask"] == cached["attention_mask"] == [1] * prefix_length
    positions = (uncached["position_ids"] == uncached["cache_position"] == full
                 and cached["position_ids"] == cached["cache_position"] == new_slots)
    return {"fed_masks_aligned": masks, "fed_positions_aligned": positions}


def _both_paths(model, prompt_ids: list, continuation: list, common: dict):
    """The 2m forwards: (uncached rows, cached rows, final cache, cache object reused per cached forward).

    uncached rows: (prefix, last logits (vocab,), logits shape); cached rows: the same plus the cache's
    length and unique bytes after the forward.
    """
    m = len(continuation)
    # 1) uncached path: m independent full forwards, no cache object at all
    uncached = []
    for k in range(m):
        prefix = prompt_ids + continuation[:k]
        length = len(prefix)
        out = model(
            input_ids=torch.tensor([prefix], dtype=torch.long),  # (1, L)
            attention_mask=torch.ones((1, length), dtype=torch.long),  # (1, L)
            position_ids=torch.arange(length, dtype=torch.long).unsqueeze(0),  # (1, L)
            cache_position=torch.arange(length, dtype=torch.long),  # (L,)
            past_key_values=None,
            use_cache=False,
            **common,
        )
        uncached.append((prefix, _last_logits(out), list(out.logits.shape)))

    # 2) cached path: one fresh prefill, then y_1..y_{m-1} each fed once into the same cache
    cached = []
    cache = DynamicCache(config=model.config)
    fed = list(prompt_ids)
    step = cached_step_inputs(0, len(fed))
    out = model(input_ids=torch.tensor([fed], dtype=torch.long), past_key_values=cache, use_cache=True, **step, **common)
    same_object = [out.past_key_values is cache]
    cache = out.past_key_values
    cached.append((list(fed), _last_logits(out), list(out.logits.shape), int(cache.get_seq_length()),
                   memory.cache_storage(cache)["unique_bytes"]))
    for k in range(1, m):
        token = continuation[k - 1]
        step = cached_step_inputs(len(fed), 1)
        out = model(input_ids=torch.tensor([[token]], dtype=torch.long), past_key_values=cache, use_cache=True,
                    **step, **common)
        same_object.append(out.past_key_values is cache)
        cache = out.past_key_values
        fed.append(token)
        cached.append((list(fed), _last_logits(out), list(out.logits.shape), int(cache.get_seq_length()),
                       memory.cache_storage(cache)["unique_bytes"]))
    return uncached, cached, cache, same_object


@torch.inference_mode()
def run_matched_prefix(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    continuation: Sequence[int],
    tolerance: Tolerance = protocol.CACHE_TOLERANCE,
    logits_to_keep: int = protocol.LOGITS_TO_KEEP,
) -> tuple[dict, dict[str, torch.Tensor]]:
    """Compare cached and uncached last-position logits on every prefix prompt + y_1..y_k, k = 0..m-1.

    Returns (result, tensors): a JSON-ready result dict and {"cached/prefix_NN", "uncached/prefix_NN": (vocab,)},
    NN being the prefix length in tokens.
    """
    prompt_ids, continuation = [int(t) for t in prompt_ids], [int(t) for t in continuation]
    m = len(continuation)
    if m == 0:
        raise ValueError("run_matched_prefix: continuation is empty; mark the comparison unavailable instead")
    if m > protocol.CACHE_MAX_TARGET_TOKENS:
        raise ValueError(
            f"run_matched_prefix: continuation has {m} tokens, protocol allows at most {protocol.CACHE_MAX_TARGET_TOKENS}"
        )
    if not prompt_ids:
        raise ValueError("run_matched_prefix: prompt_ids is empty")
    vocab_size = model.config.vocab_size
    common = {"logits_to_keep": logits_to_keep, "output_attentions": False, "output_hidden_states": False}

    fed = []  # what each forward actually received, in call order: the uncached m, then the cached m
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: fed.append(_fed_inputs(kwargs)),
                                           with_kwargs=True)
    try:
        with capture_messages() as messages:
            uncached, cached, cache, same_object = _both_paths(model, prompt_ids, continuation, common)
    finally:
        hook.remove()
    fed_uncached, fed_cached = fed[:m], fed[m:]

    # 3) compare, prefix by prefix, after all forwards are done
    prefixes, tensors = [], {}
    for k in range(m):
        prefix_u, logits_u, shape_u = uncached[k]
        prefix_c, logits_c, shape_c, cache_length, cache_bytes = cached[k]
        name = f"prefix_{len(prefix_u):02d}"
        tensors[f"cached/{name}"], tensors[f"uncached/{name}"] = logits_c, logits_u
        stats = compare_vectors(logits_c, logits_u, tolerance)
        tie = near_tie(logits_u, tolerance)
        fed_inputs = {"uncached": fed_uncached[k] if k < len(fed_uncached) else None,
                      "cached": fed_cached[k] if k < len(fed_cached) else None}
        alignment = fed_alignment(fed_inputs, len(prefix_u), k)
        checks = {
            "same_prefix": prefix_c == prefix_u,
            "vocab_dim_cached": logits_c.shape[-1] == vocab_size,
            "vocab_dim_uncached": logits_u.shape[-1] == vocab_size,
            # each uncached forward feeds its whole prefix, so each shows whether logits_to_keep held
            "uncached_logits_to_keep": logits_to_keep_check(shape_u, logits_to_keep, vocab_size)["ok"],
            "finite": stats["finite_a"] and stats["finite_b"],
            "cache_length_matches_prefix": cache_length == len(prefix_c),
            **alignment,
            "within_tolerance": stats["fail_count"] == 0,
        }
        prefixes.append(
            {
                "name": name,
                "fed_continuation_tokens": k,
                "prefix_length": len(prefix_u),
                "prefix_ids": prefix_u,
                "prefix_ids_cached": prefix_c,
                "next_target_id": continuation[k],
                "vocab_size_expected": vocab_size,
                "vocab_size_cached": int(logits_c.shape[-1]),
                "vocab_size_uncached": int(logits_u.shape[-1]),
                "fed_inputs": fed_inputs,
                "logits_shape": {"uncached": shape_u, "cached": shape_c},
                "cache_seq_length_after_forward": cache_length,
                "cache_unique_bytes_after_forward": cache_bytes,
                **{key: stats[key] for key in ("max_abs_diff", "fail_count", "fail_fraction", "bitwise_equal")},
                "argmax_cached": int(logits_c.argmax()),
                "argmax_uncached": int(logits_u.argmax()),
                "argmax_equal": int(logits_c.argmax()) == int(logits_u.argmax()),
                "top2_margin_uncached": tie["margin"],
                "top2_uncached": [tie["top1"], tie["top2"]],
                # Within the allowance, two logits that each pass the criterion could swap the argmax.
                "near_tie_allowance": tie["allowance"],
                "near_tie": tie["near_tie"],
                "checks": checks,
                "passed": all(checks.values()),
            }
        )

    expected_forwards = 2 * m
    eval_mode = not model.training
    notes = [NOTE_PREFILL_ONLY] if m == 1 else []
    prefill_logits = {"uncached": logits_to_keep_check(uncached[0][2], logits_to_keep, vocab_size),
                      "cached": logits_to_keep_check(cached[0][2], logits_to_keep, vocab_size)}
    result = {
        "m": m,
        "prompt_ids": prompt_ids,
        "continuation": continuation,
        "criterion": tolerance.describe(),
        "atol": tolerance.atol,
        "rtol": tolerance.rtol,
        "near_tie_rule": protocol.NEAR_TIE_RULE,
        "logits_to_keep": logits_to_keep,
        "prefill_logits_to_keep": prefill_logits,
        "forward_count": len(fed),
        "forward_count_expected": expected_forwards,
        "cache_object_reused": all(same_object),
        "eval_mode": eval_mode,
        "cache_reuse_exercised": m > 1,
        "notes": notes,
        "prefixes": prefixes,
        "all_within_tolerance": all(p["checks"]["within_tolerance"] for p in prefixes),
        "all_inputs_aligned": all(p["checks"][name] for p in prefixes for name in ALIGNMENT_CHECKS),
        "all_argmax_equal": all(p["argmax_equal"] for p in prefixes),
        "all_bitwise_equal": all(p["bitwise_equal"] for p in prefixes),
        "any_near_tie": any(p["near_tie"] for p in prefixes),
        "cache": inspect_cache(cache, model),
        "warnings": list(messages),
        "passed": (all(p["passed"] for p in prefixes) and len(fed) == expected_forwards and eval_mode
                   and all(check["ok"] for check in prefill_logits.values())),
    }
    return result, tensors
