"""Part 4: the cached and uncached computational paths compared on exactly the same prefixes.

Both paths are fed the same fixed continuation y_1..y_m, whatever either would have chosen, so every compared logit
vector answers one question: what follows this exact prefix? The uncached path makes m full forwards; the cached
path one prefill and m-1 one-token forwards into the cache it returned. y_m is never fed: the logits before it are
the last ones compared. Every prefix is checked to be the same on both paths (ids, mask, positions, cache length)
before its logits are judged against the declared criterion (protocol.CACHE_TOLERANCE).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from transformers import DynamicCache

from inferlab import protocol
from inferlab.measure import memory
from inferlab.measure.decode_loop import logits_to_keep_check
from inferlab.measure.loading import capture_messages
from inferlab.protocol import Tolerance

NOTE_PREFILL_ONLY = ("prefill only: cache reuse not exercised (one target token, so only the prompt's logits were "
                     "compared)")
FED_INPUT_NAMES = ("input_ids", "attention_mask", "position_ids", "cache_position")
ALIGNMENT_CHECKS = ("fed_masks_aligned", "fed_positions_aligned")


def _finite_or_none(value: float) -> Optional[float]:
    """JSON has no NaN or inf: a non-finite statistic is recorded as None, beside an explicit finite flag."""
    return value if math.isfinite(value) else None


def compare_vectors(a: torch.Tensor, b: torch.Tensor, tolerance: Tolerance,
                    reference: str = "uncached reference") -> dict:
    """`a` against the reference `b` under |a-b| <= atol + rtol*|b|: the comparison's statistics."""
    if a.shape != b.shape:
        raise ValueError(f"compare_vectors: shapes differ, a {tuple(a.shape)} vs reference b {tuple(b.shape)}")
    a64, b64 = a.detach().double(), b.detach().double()  # float64: the criterion adds no rounding of its own
    finite_a, finite_b = bool(torch.isfinite(a64).all()), bool(torch.isfinite(b64).all())
    diff = (a64 - b64).abs()
    fail_count = int((~(diff <= tolerance.atol + tolerance.rtol * b64.abs())).sum())  # NaN counts as failing
    numel = a64.numel()
    return {"numel": numel, "finite_a": finite_a, "finite_b": finite_b,
            "max_abs_diff": _finite_or_none(float(diff.max())) if numel else 0.0, "fail_count": fail_count,
            "fail_fraction": fail_count / numel if numel else 0.0,
            "bitwise_equal": bool(torch.equal(a.detach(), b.detach())),
            "criterion": tolerance.describe(reference), "atol": tolerance.atol, "rtol": tolerance.rtol,
            "passed": finite_a and finite_b and fail_count == 0}


def near_tie(logits: torch.Tensor, tolerance: Tolerance) -> dict:
    """The top two of a (vocab,) reference vector, their margin, and whether the criterion would accept an argmax flip
    there (protocol.NEAR_TIE_RULE): {top1, top2, margin, allowance, near_tie}; a non-finite margin counts as near."""
    top1, top2 = (float(v) for v in torch.topk(logits.detach().double(), 2).values)
    margin, allowance = top1 - top2, tolerance.tie_allowance(top1, top2)
    return {"top1": _finite_or_none(top1), "top2": _finite_or_none(top2), "margin": _finite_or_none(margin),
            "allowance": _finite_or_none(allowance), "near_tie": not margin > allowance}


def cached_step_inputs(past_length: int, new_length: int) -> dict:
    """Mask and positions for `new_length` tokens after `past_length` cached ones (no padding, batch 1), as
    transformers 4.57.1 generate() passes them to GPTNeoXForCausalLM: a 2-D mask over past and new tokens, the new
    tokens' slots as cache_position, position_ids = mask.cumsum - 1 for the new tokens."""
    total = past_length + new_length
    attention_mask = torch.ones((1, total), dtype=torch.long)  # (1, past + new)
    return {"attention_mask": attention_mask, "cache_position": torch.arange(past_length, total, dtype=torch.long),
            "position_ids": (attention_mask.cumsum(-1) - 1)[:, past_length:]}  # (new,), (1, new)


def inspect_cache(cache: Any, model: torch.nn.Module) -> dict:
    """The cache's tensors as observed (type, per-layer dtype, device, shape and length, unique bytes), beside the
    config's use_cache flag and the bytes the config predicts."""
    pairs = memory.cache_layer_tensors(cache)
    layers = [{"layer": index,
               "key": {"dtype": str(keys.dtype), "device": str(keys.device), "shape": list(keys.shape)},
               "value": {"dtype": str(values.dtype), "device": str(values.device), "shape": list(values.shape)},
               "logical_length_from_tensor": int(keys.shape[-2]),  # keys are (B, heads, T, head_dim)
               "logical_length_from_cache": int(cache.get_seq_length(index))}
              for index, (keys, values) in enumerate(pairs)]
    length = int(cache.get_seq_length())
    return {"cache_type": type(cache).__name__, "layers": layers, "layer_count": len(layers), "get_seq_length": length,
            "unique_bytes": memory.cache_storage(cache)["unique_bytes"],
            "expected_bytes": memory.expected_kv_cache_bytes(model.config, length,
                                                             dtype_bytes=pairs[0][0].element_size()),
            "config_use_cache": getattr(model.config, "use_cache", None)}


def _fed_inputs(kwargs: dict) -> dict:
    """The ids, mask and positions one forward received, as lists of ints (batch row 0; cache_position is 1-D)."""
    values = {name: kwargs.get(name) for name in FED_INPUT_NAMES}
    return {name: None if v is None else (v.detach()[0] if v.dim() == 2 else v.detach()).tolist()
            for name, v in values.items()}


def fed_alignment(fed_inputs: dict, prefix_length: int, fed_tokens: int) -> dict:
    """Whether both paths fed one consistent prefix of L tokens: uncached a mask of L ones, positions and cache slots
    0..L-1; cached the same at the prefill (fed_tokens 0), later one token whose mask covers all L and whose position
    and slot are L-1, the uncached path's last ones."""
    uncached, cached = fed_inputs.get("uncached"), fed_inputs.get("cached")
    if not uncached or not cached:
        return {name: False for name in ALIGNMENT_CHECKS}
    full = list(range(prefix_length))
    new_slots = full if fed_tokens == 0 else full[-1:]
    return {"fed_masks_aligned": uncached["attention_mask"] == cached["attention_mask"] == [1] * prefix_length,
            "fed_positions_aligned": (uncached["position_ids"] == uncached["cache_position"] == full
                                      and cached["position_ids"] == cached["cache_position"] == new_slots)}


def _both_paths(model, prompt_ids: list, continuation: list, common: dict):
    """The 2m forwards: (uncached rows (prefix, last logits (vocab,), logits shape), cached rows (the same, plus the
    cache's length and unique bytes after the forward), the final cache, whether each forward reused the cache)."""
    uncached = []
    # 1) the uncached path: m independent full forwards, no cache object at all
    for k in range(len(continuation)):
        prefix = prompt_ids + continuation[:k]
        out = model(input_ids=torch.tensor([prefix], dtype=torch.long),  # (1, L)
                    attention_mask=torch.ones((1, len(prefix)), dtype=torch.long),  # (1, L)
                    position_ids=torch.arange(len(prefix), dtype=torch.long).unsqueeze(0),  # (1, L)
                    cache_position=torch.arange(len(prefix), dtype=torch.long),  # (L,)
                    past_key_values=None, use_cache=False, **common)
        uncached.append((prefix, out.logits[0, -1].detach().clone(), list(out.logits.shape)))
    # 2) the cached path: one fresh prefill, then y_1..y_{m-1} each fed once into the cache it returned
    cache, fed, cached, same_object = DynamicCache(config=model.config), [], [], []
    for new in [list(prompt_ids)] + [[token] for token in continuation[:-1]]:
        out = model(input_ids=torch.tensor([new], dtype=torch.long), past_key_values=cache, use_cache=True,
                    **cached_step_inputs(len(fed), len(new)), **common)
        same_object.append(out.past_key_values is cache)
        cache = out.past_key_values
        fed += new
        cached.append((list(fed), out.logits[0, -1].detach().clone(), list(out.logits.shape),
                       int(cache.get_seq_length()), memory.cache_storage(cache)["unique_bytes"]))
    return uncached, cached, cache, same_object


def _prefix_record(k: int, uncached: tuple, cached: tuple, fed_inputs: dict, continuation: list, tolerance: Tolerance,
                   logits_to_keep: int, vocab_size: int) -> dict:
    """The cache_comparison fields of prefix k: what both paths were fed, their statistics and checks."""
    (prefix_u, logits_u, shape_u), (prefix_c, logits_c, shape_c, cache_length, cache_bytes) = uncached, cached
    found, tie = compare_vectors(logits_c, logits_u, tolerance), near_tie(logits_u, tolerance)
    checks = {"same_prefix": prefix_c == prefix_u, "vocab_dim_cached": logits_c.shape[-1] == vocab_size,
              "vocab_dim_uncached": logits_u.shape[-1] == vocab_size,
              # each uncached forward feeds its whole prefix, so each shows whether logits_to_keep held
              "uncached_logits_to_keep": logits_to_keep_check(shape_u, logits_to_keep, vocab_size)["ok"],
              "finite": found["finite_a"] and found["finite_b"],
              "cache_length_matches_prefix": cache_length == len(prefix_c),
              **fed_alignment(fed_inputs, len(prefix_u), k), "within_tolerance": found["fail_count"] == 0}
    argmax_c, argmax_u = int(logits_c.argmax()), int(logits_u.argmax())
    return {
        "name": f"prefix_{len(prefix_u):02d}", "fed_continuation_tokens": k, "prefix_length": len(prefix_u),
        "prefix_ids": prefix_u, "prefix_ids_cached": prefix_c, "next_target_id": continuation[k],
        "fed_inputs": fed_inputs, "logits_shape": {"uncached": shape_u, "cached": shape_c},
        "cache_seq_length_after_forward": cache_length, "cache_unique_bytes_after_forward": cache_bytes,
        **{key: found[key] for key in ("max_abs_diff", "fail_count", "fail_fraction", "bitwise_equal")},
        "argmax_cached": argmax_c, "argmax_uncached": argmax_u, "argmax_equal": argmax_c == argmax_u,
        "top2_margin_uncached": tie["margin"], "top2_uncached": [tie["top1"], tie["top2"]],
        # within the allowance, two logits that each pass the criterion could swap the argmax
        "near_tie_allowance": tie["allowance"], "near_tie": tie["near_tie"], "checks": checks,
        "passed": all(checks.values()),
    }


@torch.inference_mode()
def run_matched_prefix(model: torch.nn.Module, prompt_ids: Sequence[int], continuation: Sequence[int],
                       tolerance: Tolerance = protocol.CACHE_TOLERANCE,
                       logits_to_keep: int = protocol.LOGITS_TO_KEEP) -> tuple[dict, dict[str, torch.Tensor]]:
    """Cached against uncached last-position logits on every prefix prompt + y_1..y_k, k = 0..m-1: (a JSON-ready
    result, {"cached/prefix_NN", "uncached/prefix_NN": (vocab,)} with NN the prefix length in tokens)."""
    prompt_ids, continuation = [int(t) for t in prompt_ids], [int(t) for t in continuation]
    m = len(continuation)
    if m == 0:
        raise ValueError("run_matched_prefix: continuation is empty; mark the comparison unavailable instead")
    if m > protocol.CACHE_MAX_TARGET_TOKENS:
        raise ValueError(f"run_matched_prefix: continuation has {m} tokens, protocol allows at most "
                         f"{protocol.CACHE_MAX_TARGET_TOKENS}")
    vocab_size = model.config.vocab_size
    common = {"logits_to_keep": logits_to_keep, "output_attentions": False, "output_hidden_states": False}
    fed = []  # what each forward received, in call order: the uncached m, then the cached m
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: fed.append(_fed_inputs(kwargs)),
                                           with_kwargs=True)
    try:
        with capture_messages() as messages:
            uncached, cached, cache, same_object = _both_paths(model, prompt_ids, continuation, common)
    finally:
        hook.remove()

    # 3) compare, prefix by prefix, after every forward is done
    prefixes = [_prefix_record(k, uncached[k], cached[k], {"uncached": fed[k] if k < len(fed) else None,
                                                            "cached": fed[m + k] if m + k < len(fed) else None},
                               continuation, tolerance, logits_to_keep, vocab_size) for k in range(m)]
    tensors = {f"{path}/{p['name']}": rows[k][1] for k, p in enumerate(prefixes)
               for path, rows in (("cached", cached), ("uncached", uncached))}
    prefill_logits = {"uncached": logits_to_keep_check(uncached[0][2], logits_to_keep, vocab_size),
                      "cached": logits_to_keep_check(cached[0][2], logits_to_keep, vocab_size)}
    result = {
        "m": m, "prompt_ids": prompt_ids, "continuation": continuation, "criterion": tolerance.describe(),
        "atol": tolerance.atol, "rtol": tolerance.rtol, "near_tie_rule": protocol.NEAR_TIE_RULE,
        "logits_to_keep": logits_to_keep, "prefill_logits_to_keep": prefill_logits, "forward_count": len(fed),
        "forward_count_expected": 2 * m, "cache_object_reused": all(same_object), "eval_mode": not model.training,
        "cache_reuse_exercised": m > 1, "notes": [NOTE_PREFILL_ONLY] if m == 1 else [], "prefixes": prefixes,
        "all_within_tolerance": all(p["checks"]["within_tolerance"] for p in prefixes),
        "all_inputs_aligned": all(p["checks"][name] for p in prefixes for name in ALIGNMENT_CHECKS),
        "all_argmax_equal": all(p["argmax_equal"] for p in prefixes),
        "all_bitwise_equal": all(p["bitwise_equal"] for p in prefixes),
        "any_near_tie": any(p["near_tie"] for p in prefixes), "cache": inspect_cache(cache, model),
        "warnings": list(messages),
    }
    result["passed"] = (all(p["passed"] for p in prefixes) and len(fed) == 2 * m and result["eval_mode"]
                        and all(check["ok"] for check in prefill_logits.values()))
    return result, tensors
