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

from inferlab import memory, protocol
from inferlab.protocol import Tolerance

NOTE_PREFILL_ONLY = "only the prefill was compared; cache reuse not exercised"


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


def top2_margin(logits: torch.Tensor) -> float:
    """Largest minus second-largest logit of a (vocab,) vector."""
    top = torch.topk(logits.detach().double(), 2).values
    return float(top[0] - top[1])


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

    forward_calls = []
    hook = model.register_forward_hook(lambda module, args, output: forward_calls.append(1))
    try:
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
            uncached.append((prefix, _last_logits(out)))

        # 2) cached path: one fresh prefill, then y_1..y_{m-1} each fed once into the same cache
        cached = []
        cache = DynamicCache(config=model.config)
        fed = list(prompt_ids)
        step = cached_step_inputs(0, len(fed))
        out = model(input_ids=torch.tensor([fed], dtype=torch.long), past_key_values=cache, use_cache=True, **step, **common)
        same_object = [out.past_key_values is cache]
        cache = out.past_key_values
        cached.append((list(fed), _last_logits(out), int(cache.get_seq_length()), memory.cache_storage(cache)["unique_bytes"]))
        for k in range(1, m):
            token = continuation[k - 1]
            step = cached_step_inputs(len(fed), 1)
            out = model(input_ids=torch.tensor([[token]], dtype=torch.long), past_key_values=cache, use_cache=True, **step, **common)
            same_object.append(out.past_key_values is cache)
            cache = out.past_key_values
            fed.append(token)
            cached.append((list(fed), _last_logits(out), int(cache.get_seq_length()), memory.cache_storage(cache)["unique_bytes"]))
    finally:
        hook.remove()

    # 3) compare, prefix by prefix, after all forwards are done
    prefixes, tensors = [], {}
    for k in range(m):
        prefix_u, logits_u = uncached[k]
        prefix_c, logits_c, cache_length, cache_bytes = cached[k]
        name = f"prefix_{len(prefix_u):02d}"
        tensors[f"cached/{name}"], tensors[f"uncached/{name}"] = logits_c, logits_u
        stats = compare_vectors(logits_c, logits_u, tolerance)
        margin = top2_margin(logits_u)
        max_abs = stats["max_abs_diff"]
        checks = {
            "same_prefix": prefix_c == prefix_u,
            "vocab_dim_cached": logits_c.shape[-1] == vocab_size,
            "vocab_dim_uncached": logits_u.shape[-1] == vocab_size,
            "finite": stats["finite_a"] and stats["finite_b"],
            "cache_length_matches_prefix": cache_length == len(prefix_c),
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
                "cache_seq_length_after_forward": cache_length,
                "cache_unique_bytes_after_forward": cache_bytes,
                **{key: stats[key] for key in ("max_abs_diff", "fail_count", "fail_fraction", "bitwise_equal")},
                "argmax_cached": int(logits_c.argmax()),
                "argmax_uncached": int(logits_u.argmax()),
                "argmax_equal": int(logits_c.argmax()) == int(logits_u.argmax()),
                "top2_margin_uncached": margin,
                # Close to a tie a tiny numerical difference can flip the argmax.
                "near_tie": max_abs is None or margin < max_abs * protocol.NEAR_TIE_FACTOR,
                "checks": checks,
                "passed": all(checks.values()),
            }
        )

    expected_forwards = 2 * m
    eval_mode = not model.training
    notes = [NOTE_PREFILL_ONLY] if m == 1 else []
    result = {
        "m": m,
        "prompt_ids": prompt_ids,
        "continuation": continuation,
        "criterion": tolerance.describe(),
        "atol": tolerance.atol,
        "rtol": tolerance.rtol,
        "near_tie_factor": protocol.NEAR_TIE_FACTOR,
        "logits_to_keep": logits_to_keep,
        "forward_count": len(forward_calls),
        "forward_count_expected": expected_forwards,
        "cache_object_reused": all(same_object),
        "eval_mode": eval_mode,
        "cache_reuse_exercised": m > 1,
        "notes": notes,
        "prefixes": prefixes,
        "all_within_tolerance": all(p["checks"]["within_tolerance"] for p in prefixes),
        "all_argmax_equal": all(p["argmax_equal"] for p in prefixes),
        "all_bitwise_equal": all(p["bitwise_equal"] for p in prefixes),
        "any_near_tie": any(p["near_tie"] for p in prefixes),
        "cache": inspect_cache(cache, model),
        "passed": all(p["passed"] for p in prefixes) and len(forward_calls) == expected_forwards and eval_mode,
    }
    return result, tensors
