"""Consistency of what a run computed from its saved tensors: the matched-prefix comparison (per prefix and in
its summary), the first-step logits check across conditions, the processed scores against the raw logits, each
generation trial's first-step argmax and hash, and the batching rows' first-step statistics.

Only a tensor that matches the SHA-256 its record holds is read (RunView.verified_tensor); one that does not is
already a problem of verify's tensor check, and its derived numbers are said to be not checked.

The statistics are redone in numpy as inferlab.measure.cache_check.compare_vectors and top2_margin do them in torch: in
float64, from the float32 tensors, so the criterion adds no rounding and the values agree bit for bit. The
batching rows' differences are float32, as inferlab.measure.batching computes them on its float32 step logits.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy

from inferlab import protocol
from inferlab.measure import near_tie
from inferlab.reading.runview import tensor_sha256
from inferlab.verify.consistency_shared import Recheck, label, same


def compare_arrays(a, b, atol: float, rtol: float) -> dict:
    """cache_check.compare_vectors of `a` against the reference `b`, in numpy: |a-b| <= atol + rtol*|b|."""
    a64, b64 = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    with numpy.errstate(invalid="ignore", over="ignore"):
        diff = numpy.abs(a64 - b64)
        failing = ~(diff <= atol + rtol * numpy.abs(b64))  # NaN counts as failing
    numel = int(a64.size)
    largest = float(diff.max()) if numel else 0.0
    finite_a, finite_b = bool(numpy.isfinite(a64).all()), bool(numpy.isfinite(b64).all())
    fail_count = int(failing.sum())
    return {
        "numel": numel, "finite_a": finite_a, "finite_b": finite_b,
        "max_abs_diff": (largest if numpy.isfinite(largest) else None) if numel else 0.0,
        "fail_count": fail_count, "fail_fraction": fail_count / numel if numel else 0.0,
        "bitwise_equal": bool(numpy.array_equal(numpy.asarray(a), numpy.asarray(b))),
        "atol": atol, "rtol": rtol, "passed": finite_a and finite_b and fail_count == 0,
    }


def top2_margin(array) -> float:
    """Largest minus second-largest entry, in float64 (cache_check.top2_margin)."""
    values = numpy.sort(numpy.asarray(array, dtype=numpy.float64).reshape(-1))
    return float(values[-1] - values[-2])


def top_two(array) -> tuple[float, float]:
    """The largest and the second-largest entry, in float64 (cache_check.top_two)."""
    values = numpy.sort(numpy.asarray(array, dtype=numpy.float64).reshape(-1))
    return float(values[-1]), float(values[-2])


def near_tie_of(recheck: Recheck, uncached, largest: Optional[float]) -> tuple[bool, dict]:
    """Whether a prefix is near a tie by the rule the run declared, and the fields that rule derives.

    This checkout's rule (protocol.NEAR_TIE_RULE): the margin is within what the criterion lets the two top
    logits move. A run whose cache_criterion declares only a near_tie_factor (written before that rule) judged
    a tie against its observed difference instead; its flags are recomputed by its own rule.
    """
    first, second = top_two(uncached)
    margin = first - second
    criterion = recheck.view.first("cache_criterion") or {}
    factor = criterion.get("near_tie_factor")
    if "near_tie_rule" not in criterion and isinstance(factor, (int, float)) and not isinstance(factor, bool):
        return largest is None or margin < largest * factor, {}
    allowance = protocol.CACHE_TOLERANCE.tie_allowance(first, second)
    return not margin > allowance, {"near_tie_allowance": allowance, "top2_uncached": [first, second]}


def argmax(array) -> int:
    """The index of the first largest entry (torch.argmax's choice among equal values)."""
    return int(numpy.argmax(numpy.asarray(array).reshape(-1)))


def check(recheck: Recheck) -> None:
    """Every tensor check of this module, in order."""
    first_step = _first_step_tensors(recheck)
    _generation(recheck, first_step)
    _first_step_checks(recheck, first_step)
    _cache(recheck)
    _batching(recheck)


UNREFERENCED = "a record that should reference its saved tensor references none"


def _tensor(recheck: Recheck, reference: Any, what: str):
    """The tensor a reference names if it matches its record, else None (said once under `what`, as is a record
    that references none: the figures it holds are then not recomputed from anything)."""
    if not isinstance(reference, dict):
        recheck.not_checked(what, UNREFERENCED)
        return None
    array = recheck.view.verified_tensor(reference)
    if array is None:
        recheck.not_checked(what, f"{reference.get('file')}[{reference.get('key')}] is missing or not as its "
                                  f"record says")
    return array


# --- the generation trials' first-step logits --------------------------------------------------------


def _first_step_tensors(recheck: Recheck) -> dict:
    """{(prompt_id, condition): {"logits": array or None, "scores": array or None}} of the completed trials that
    saved them, the first trial of each pair."""
    found: dict = {}
    keeps = protocol.first_step_trial_ids()
    for record in recheck.completed("generation"):
        key = (record.get("prompt_id"), record.get("condition"))
        if key in found:
            continue
        if not isinstance(record.get("first_step_logits"), dict):
            if record.get("trial_id") in keeps:
                recheck.not_checked("first-step logits statistics", UNREFERENCED)
            continue
        found[key] = {"record": record,
                      "logits": _tensor(recheck, record["first_step_logits"], "first-step logits statistics"),
                      "scores": _tensor(recheck, record.get("first_step_scores"), "processed scores statistics")}
    return found


def _generation(recheck: Recheck, first_step: dict) -> None:
    """Each completed trial's first-step argmax and hash against the saved logits of its prompt and condition."""
    for record in recheck.completed("generation"):
        saved = first_step.get((record.get("prompt_id"), record.get("condition")))
        array = None if saved is None else saved["logits"]
        if array is None:
            continue
        source = f"the saved first-step logits {record.get('prompt_id')}/{record.get('condition')}"
        if saved["record"] is record:
            recheck.expect(record, "first_step_logits_sha256", tensor_sha256(array), source)
            recheck.expect(record, "first_step_logits_shape", list(array.shape), source)
        # Every trial of a prompt and condition sees the same raw first-step logits (selection acts after the
        # forward pass), so the saved ones decide every such trial's argmax (and a greedy trial's first id, which
        # consistency_records checks against that argmax).
        recheck.expect(record, "first_step_logits_argmax", argmax(array), source)
        condition = protocol.CONDITIONS.get(record.get("condition"))
        steps = near_tie.steps_of(record)
        if condition is not None and not condition.do_sample and steps and record.get("generated_ids"):
            _first_greedy_step(recheck, record, steps[0], array, source)


def _first_greedy_step(recheck: Recheck, record: dict, step, array, source: str) -> None:
    """A greedy trial's step 0 top two against the saved first-step logits of the same call: the selected id's
    logit, the best other one and its id, exactly (float32 values read as float64)."""
    values = numpy.asarray(array, dtype=numpy.float32).reshape(-1)  # (vocab,)
    selected = record["generated_ids"][0]
    if not isinstance(selected, int) or not 0 <= selected < values.size:
        return
    others = values.astype(numpy.float64)
    others[selected] = -numpy.inf
    runner_up = int(numpy.argmax(others))
    recorded = [step.top, step.second] + ([step.runner_up] if step.runner_up is not None else [])
    expected = [float(values[selected]), float(others[runner_up])] + ([runner_up] if step.runner_up is not None
                                                                       else [])
    if not same(recorded, expected):
        recheck.differs(record, f"{near_tie.STEP_VALUES_FIELD}[0]", recorded, expected, source)


def _first_step_checks(recheck: Recheck, first_step: dict) -> None:
    """first_step_logits_check and processed_scores_check against the saved logits and scores."""
    tolerance = protocol.CACHE_TOLERANCE
    for record in recheck.view.kind("first_step_logits_check"):
        comparisons, prompt_id = record.get("comparisons"), record.get("prompt_id")
        if not isinstance(comparisons, dict):
            recheck.not_checked(f"{label(record)}", "it holds no comparisons per condition")
            continue
        reference = (first_step.get((prompt_id, record.get("reference", "G"))) or {}).get("logits")
        for condition, recorded in comparisons.items():
            other = (first_step.get((prompt_id, condition)) or {}).get("logits")
            if reference is None or other is None or not isinstance(recorded, dict):
                continue
            expected = compare_arrays(other, reference, tolerance.atol, tolerance.rtol)
            for field, value in expected.items():
                if field in recorded and not same(recorded[field], value):
                    recheck.differs(record, f"comparisons.{condition}.{field}", recorded[field], value,
                                    f"the saved first-step logits {prompt_id}/{condition} against "
                                    f"{prompt_id}/{record.get('reference', 'G')}")
    for record in recheck.view.kind("processed_scores_check"):
        rows, prompt_id = record.get("rows"), record.get("prompt_id")
        for condition, row in (rows.items() if isinstance(rows, dict) else ()):
            saved = first_step.get((prompt_id, condition)) or {}
            recorded = row.get("scores_vs_raw") if isinstance(row, dict) else None
            if protocol.CONDITIONS.get(condition) is not None and isinstance(row, dict) and "temperature" in row:
                if not same(row["temperature"], protocol.CONDITIONS[condition].temperature):
                    recheck.differs(record, f"rows.{condition}.temperature", row["temperature"],
                                    protocol.CONDITIONS[condition].temperature, "the protocol's condition")
            if saved.get("scores") is None or saved.get("logits") is None or not isinstance(recorded, dict):
                continue
            expected = compare_arrays(saved["scores"], saved["logits"], tolerance.atol, tolerance.rtol)
            for field, value in expected.items():
                if field in recorded and not same(recorded[field], value):
                    recheck.differs(record, f"rows.{condition}.scores_vs_raw.{field}", recorded[field], value,
                                    f"the saved scores and raw logits {prompt_id}/{condition}")


# --- the matched-prefix comparison ---------------------------------------------------------------------


def _reference_trial(recheck: Recheck) -> Optional[dict]:
    prompt_id, condition, repetition = protocol.CACHE_REFERENCE_TRIAL
    return next((r for r in recheck.completed("generation") if (r.get("prompt_id"), r.get("condition"),
                                                                  r.get("repetition")) == (prompt_id, condition,
                                                                                           repetition)), None)


def _cache(recheck: Recheck) -> None:
    """Each prefix's statistics from its two saved vectors and its ids from the continuation; the summary from
    the prefixes and the reference trial."""
    comparisons = recheck.view.kind("cache_comparison")
    summary = recheck.view.first("cache_summary")
    if not comparisons and not (summary and summary.get("available", True)):
        return
    reference = _reference_trial(recheck)
    continuation = prompt = None
    if reference is not None and isinstance(reference.get("generated_ids"), list):
        continuation = reference["generated_ids"][:protocol.CACHE_MAX_TARGET_TOKENS]
        prompt = reference.get("prompt_ids")
    revised = recheck.view.first("cache_criterion_revised")
    rows = [_prefix(recheck, k, record, prompt, continuation, revised) for k, record in enumerate(comparisons)]
    if summary is None or not summary.get("available", True):
        return
    m = len(comparisons)
    expected = {"m": m, "forward_count_expected": 2 * m, "cache_reuse_exercised": m > 1,
                "all_argmax_equal": all(r["argmax_equal"] for r in rows),
                "any_near_tie": any(r["near_tie"] for r in rows)}
    if all(r["stats"] is not None for r in rows):
        expected.update({
            "all_within_tolerance": all(r["stats"]["fail_count"] == 0 for r in rows),
            "all_bitwise_equal": all(r["stats"]["bitwise_equal"] for r in rows),
            "numerical_agreement": {"all_within_tolerance": all(r["stats"]["fail_count"] == 0 for r in rows),
                                    "all_bitwise_equal": all(r["stats"]["bitwise_equal"] for r in rows),
                                    "max_abs_diff": max((r["stats"]["max_abs_diff"] or 0.0) for r in rows)},
        })
    expected["token_agreement"] = {"all_argmax_equal": expected["all_argmax_equal"],
                                   "near_tie_prefixes": [r["length"] for r in rows if r["near_tie"]]}
    if all(isinstance(c.get("checks"), dict) for c in comparisons) and comparisons:
        expected["all_inputs_aligned"] = all(c["checks"].get(name) for c in comparisons
                                             for name in ("fed_masks_aligned", "fed_positions_aligned"))
    if reference is not None:
        expected.update({"reference_trial": reference.get("trial_id"), "reference_stop_reason":
                         reference.get("stop_reason"), "continuation": continuation, "prompt_ids": prompt})
    recheck.expect_fields(summary, expected, "its prefix comparisons, their saved tensors and the reference trial")


def _prefix(recheck: Recheck, k: int, record: dict, prompt, continuation, revised) -> dict:
    """One prefix: its fields recomputed; returns what the summary needs (from the tensors where readable)."""
    tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
    cached = _tensor(recheck, tensors.get("cached"), "cache comparison statistics")
    uncached = _tensor(recheck, tensors.get("uncached"), "cache comparison statistics")
    if isinstance(prompt, list) and isinstance(continuation, list) and k < len(continuation):
        recheck.expect(record, "prefix_ids", prompt + continuation[:k], "the reference trial's prompt and continuation")
        recheck.expect(record, "next_target_id", continuation[k], "the reference trial's continuation")
        recheck.expect(record, "prefix_length", len(prompt) + k, "the reference trial's prompt and k fed tokens")
        recheck.expect(record, "fed_continuation_tokens", k, "the record's place in the comparison")
    if isinstance(record.get("prefix_ids"), list):
        recheck.expect(record, "prefix_length", len(record["prefix_ids"]), "len(prefix_ids)")
    stats, near_tie = None, bool(record.get("near_tie"))
    argmax_equal = record.get("argmax_equal", record.get("argmax_cached") == record.get("argmax_uncached"))
    if cached is not None and uncached is not None and cached.shape == uncached.shape:
        tolerance = protocol.CACHE_TOLERANCE
        stats = compare_arrays(cached, uncached, tolerance.atol, tolerance.rtol)
        margin = top2_margin(uncached)
        largest = stats["max_abs_diff"]
        near_tie, tie_fields = near_tie_of(recheck, uncached, largest)
        argmax_equal = argmax(cached) == argmax(uncached)
        expected = {**{key: stats[key] for key in ("max_abs_diff", "fail_count", "fail_fraction", "bitwise_equal")},
                    "argmax_cached": argmax(cached), "argmax_uncached": argmax(uncached), "argmax_equal": argmax_equal,
                    "top2_margin_uncached": margin, "near_tie": near_tie, **tie_fields,
                    "vocab_size_cached": int(cached.shape[-1]), "vocab_size_uncached": int(uncached.shape[-1])}
        recheck.expect_fields(record, expected, "its saved cached and uncached logits")
        checks = record.get("checks")
        if isinstance(checks, dict):
            recheck.expect_fields(checks, {"within_tolerance": stats["fail_count"] == 0,
                                           "finite": stats["finite_a"] and stats["finite_b"]},
                                  f"{label(record)}'s saved logits")
            recheck.expect(record, "passed", all(checks.values()), "all of its checks")
        if isinstance(record.get("revised"), dict) and isinstance(revised, dict):
            again = compare_arrays(cached, uncached, revised.get("atol"), revised.get("rtol"))
            recheck.expect_fields(record["revised"], {key: again[key] for key in ("atol", "rtol", "passed",
                                                                                  "fail_count", "fail_fraction")},
                                  f"{label(record)}'s saved logits under the revised criterion")
    return {"stats": stats, "near_tie": near_tie, "argmax_equal": argmax_equal, "length": record.get("prefix_length")}


# --- the batching rows' first steps ---------------------------------------------------------------------


def _batching(recheck: Recheck) -> None:
    """Each row comparison's first-step difference, argmaxes and margins from the calls' saved first-step logits
    (float32 differences, as inferlab.measure.batching takes them; float64 margins, as top2_margin does)."""
    records = recheck.view.kind("batching")
    calls = {r.get("call_index"): r for r in records if r.get("record_type") == "call"}
    for summary in (r for r in records if r.get("record_type") == "summary"):
        for row in summary.get("comparisons") or []:
            if not isinstance(row, dict) or not isinstance(row.get("row"), int):
                continue
            batch, single = calls.get(row.get("batch_call_index")), calls.get(row.get("singleton_call_index"))
            if not isinstance(batch, dict) or not isinstance(single, dict):
                continue
            batch_logits = _tensor(recheck, batch.get("first_step_logits"), "batching first-step statistics")
            single_logits = _tensor(recheck, single.get("first_step_logits"), "batching first-step statistics")
            if batch_logits is None or single_logits is None or row["row"] >= batch_logits.shape[0]:
                continue
            mine, theirs = batch_logits[row["row"]], single_logits[0]  # (vocab,) each, float32
            expected = {"first_step_max_abs_diff": float(numpy.abs(mine - theirs).max()),
                        "first_step_argmax_batch": argmax(mine), "first_step_argmax_single": argmax(theirs),
                        "first_step_top2_margin_batch": top2_margin(mine),
                        "first_step_top2_margin_single": top2_margin(theirs)}
            where = f"comparisons[batch call {row.get('batch_call_index')} row {row['row']}]"
            for field, value in expected.items():
                if field in row and not same(row[field], value):
                    recheck.differs(summary, f"{where}.{field}", row[field], value,
                                    "the calls' saved first-step logits")
