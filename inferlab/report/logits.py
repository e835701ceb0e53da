"""Arithmetic on recorded logit vectors (numpy, float64): the first-step distribution and the cache error ratio.

The report reads the tensors the run saved; nothing here runs a model. Selection rules follow the
transformers 4.57.1 processors the trials used (TemperatureLogitsWarper divides by T;
TopPLogitsWarper keeps the smallest set of most probable ids whose mass reaches top_p, at least one).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy


def probabilities(logits, temperature: float = 1.0) -> numpy.ndarray:
    """softmax(logits / T) in float64."""
    scaled = numpy.asarray(logits, dtype=numpy.float64).reshape(-1) / temperature
    shifted = numpy.exp(scaled - scaled.max())
    return shifted / shifted.sum()


def entropy_nats(probs: numpy.ndarray) -> float:
    """-sum p ln p over the ids with p > 0."""
    positive = probs[probs > 0]
    return float(-(positive * numpy.log(positive)).sum())


def top_p_kept(probs: numpy.ndarray, top_p: float) -> int:
    """How many ids TopPLogitsWarper keeps: drop the least probable ids whose cumulative mass is <= 1 - top_p."""
    ascending = numpy.sort(probs)
    removed = int((numpy.cumsum(ascending) <= 1 - top_p).sum())
    return max(1, len(probs) - removed)


def distribution_row(logits, top_p: float, eos_id: Optional[int], temperatures=(1.0, 0.5)) -> dict:
    """Entropy, top-1 id and probability per temperature, ids kept by top-p at T=1, and P(EOS)."""
    vector = numpy.asarray(logits, dtype=numpy.float64).reshape(-1)
    if vector.size == 0 or not numpy.isfinite(vector).all():
        return {"usable": False, "reason": "the recorded vector is empty or holds non-finite values"}
    row = {"usable": True, "vocab": int(vector.size), "max_entropy": math.log(vector.size),
           "top1_id": int(vector.argmax()), "logit_range": float(vector.max() - vector.min())}
    for temperature in temperatures:
        probs = probabilities(vector, temperature)
        row[temperature] = {"entropy": entropy_nats(probs), "top1_p": float(probs.max())}
    base = probabilities(vector, 1.0)
    row["top_p_kept"] = top_p_kept(base, top_p)
    row["eos_p"] = float(base[eos_id]) if isinstance(eos_id, int) and 0 <= eos_id < vector.size else None
    return row


def bound_ratio(cached, uncached, atol: float, rtol: float) -> Optional[float]:
    """max_i |a_i - b_i| / (atol + rtol*|b_i|), b uncached: 1 is the criterion's edge, below 1 passes."""
    a = numpy.asarray(cached, dtype=numpy.float64).reshape(-1)
    b = numpy.asarray(uncached, dtype=numpy.float64).reshape(-1)
    if a.shape != b.shape or a.size == 0 or not (numpy.isfinite(a).all() and numpy.isfinite(b).all()):
        return None
    return float((numpy.abs(a - b) / (atol + rtol * numpy.abs(b))).max())
