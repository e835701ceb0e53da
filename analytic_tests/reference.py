"""A small reference for the analytic tests, written from the lesson's definitions, not from transformers.

Pure Python (math, fractions): no torch, no transformers, no inferlab selection code, so that the
tests compare two independent implementations. Functions that take probabilities work with floats
or with fractions.Fraction; with Fractions they are exact.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence


# --- token selection -----------------------------------------------------------------


def exact_probs(weights: Sequence[int], inverse_temperature: int = 1) -> list[Fraction]:
    """Exact softmax of logits (log w_i) at temperature 1/k: w_i**k / sum_j w_j**k."""
    powered = [Fraction(w) ** inverse_temperature for w in weights]
    total = sum(powered)
    return [p / total for p in powered]


def scale(logits: Sequence[float], temperature: float) -> list[float]:
    """Temperature: divide every logit by the same positive temperature."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    return [x / temperature for x in logits]


def softmax(logits: Sequence[float]) -> list[float]:
    """Softmax in double precision; -inf logits get probability 0."""
    top = max(logits)
    exps = [math.exp(x - top) if x != -math.inf else 0.0 for x in logits]
    total = math.fsum(exps)
    return [e / total for e in exps]


def descending_order(probs: Sequence) -> list[int]:
    """Indices from most to least probable; equal probabilities keep index order (stable)."""
    return sorted(range(len(probs)), key=lambda i: -probs[i])


def nucleus_keep(probs: Sequence, top_p) -> list[bool]:
    """The lesson's rule: keep the smallest most-probable prefix whose mass reaches top_p.

    Walking down the descending order, a token is kept while the mass kept before it is still
    below top_p; the token that makes the mass reach top_p is the last one kept.
    """
    keep = [False] * len(probs)
    mass = 0
    for i in descending_order(probs):
        if mass >= top_p:
            break
        keep[i] = True
        mass += probs[i]
    return keep


def restrict(probs: Sequence, keep: Sequence[bool]) -> list:
    """Zero the removed tokens and renormalise the kept ones to sum to one."""
    kept_mass = sum(p for p, k in zip(probs, keep) if k)
    return [p / kept_mass if k else 0 * p for p, k in zip(probs, keep)]


def exact_probs_restricted(weights: Sequence[int], keep: Sequence[bool], inverse_temperature: int = 1) -> list[Fraction]:
    """Exact probabilities at temperature 1/k over the kept tokens only (nucleus applied first)."""
    kept = exact_probs([w for w, k in zip(weights, keep) if k], inverse_temperature)
    values = iter(kept)
    return [next(values) if k else Fraction(0) for k in keep]


# --- memory arithmetic -------------------------------------------------------------------


def gpt_neox_parameter_count(vocab_size: int, hidden_size: int, num_layers: int, intermediate_size: int) -> dict:
    """Parameters of an untied GPT-NeoX causal LM, by component, and their total.

    Every linear layer of a GPT-NeoX block has a bias; the output projection (embed_out) has none.
    Each LayerNorm has a weight and a bias. Rotary embeddings have no parameters.
    """
    h, i = hidden_size, intermediate_size
    per_layer = {
        "input_layernorm": 2 * h,
        "post_attention_layernorm": 2 * h,
        "attention.query_key_value": h * 3 * h + 3 * h,
        "attention.dense": h * h + h,
        "mlp.dense_h_to_4h": h * i + i,
        "mlp.dense_4h_to_h": i * h + h,
    }
    counts = {
        "embed_in": vocab_size * h,
        "layers": num_layers * sum(per_layer.values()),
        "final_layer_norm": 2 * h,
        "embed_out": vocab_size * h,
    }
    return {"per_layer": per_layer, "components": counts, "total": sum(counts.values())}


def kv_cache_bytes(num_layers: int, num_heads: int, head_dim: int, tokens: int, bytes_per_element: int) -> int:
    """Keys plus values for every layer: 2 x layers x heads x head_dim x tokens x bytes per element."""
    return 2 * num_layers * num_heads * head_dim * tokens * bytes_per_element
