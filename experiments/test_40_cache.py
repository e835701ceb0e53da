"""Part 4: cached and uncached logits on exactly the same prefixes."""

import pytest

from inferlab import protocol

CACHE_FILE = "cache_logits"


@pytest.mark.records("cache_criterion")
@pytest.mark.requires("model_inspection")
@pytest.mark.provides("cache_criterion")
def test_cache_criterion_declared(record):
    """The criterion is on record before any cached/uncached error is computed (a justified revised one can be
    kept beside it afterwards: `inferlab revise`)."""
    record("cache_criterion", atol=protocol.CACHE_TOLERANCE.atol, rtol=protocol.CACHE_TOLERANCE.rtol,
           rule=protocol.CACHE_TOLERANCE.describe(), reference="uncached path",
           declared_before_errors=True, near_tie_rule=protocol.NEAR_TIE_RULE)


@pytest.mark.records("cache_inspection", "cache_comparison", "cache_summary")
@pytest.mark.requires("model_inspection", "cache_criterion", "cache_reference_trial")
@pytest.mark.provides("cache_comparison")
@pytest.mark.budget(category="cache", forwards=2 * protocol.CACHE_MAX_TARGET_TOKENS)
def test_matched_prefix(model, inferlab_run, tensor_store, forward_window, record):
    from inferlab.measure import cache_check, loading

    prompt_id, condition, repetition = protocol.CACHE_REFERENCE_TRIAL
    reference = next((r for r in inferlab_run.records_of("generation")
                      if (r["prompt_id"], r["condition"], r["repetition"]) == protocol.CACHE_REFERENCE_TRIAL), None)
    if reference is None or reference.get("status") != "ok" or not reference.get("generated_ids"):
        reason = (f"reference trial {prompt_id}-{condition}-rep{repetition} has no usable generated ids "
                  f"(status {reference and reference.get('status')})")
        record("cache_summary", available=False, reason=reason)
        pytest.skip(f"not run: comparison unavailable: {reason}")

    continuation = reference["generated_ids"][: protocol.CACHE_MAX_TARGET_TOKENS]
    result, tensors = cache_check.run_matched_prefix(model, reference["prompt_ids"], continuation)
    mode = forward_window.summary()
    references = {name: tensor_store.put(CACHE_FILE, name, tensor) for name, tensor in tensors.items()}
    record("cache_inspection", **result["cache"], eval_mode=result["eval_mode"],
           cache_object_reused=result["cache_object_reused"], warnings=result["warnings"])
    for prefix in result["prefixes"]:
        record("cache_comparison", **prefix,
               tensors={"cached": references[f"cached/{prefix['name']}"],
                        "uncached": references[f"uncached/{prefix['name']}"]},
               warnings=result["warnings"])
    summary = {key: value for key, value in result.items() if key not in ("prefixes", "cache")}
    record("cache_summary", available=True, reference_trial=reference["trial_id"],
           reference_stop_reason=reference["stop_reason"], **summary,
           numerical_agreement={"all_within_tolerance": result["all_within_tolerance"],
                                "all_bitwise_equal": result["all_bitwise_equal"],
                                "max_abs_diff": max((p["max_abs_diff"] or 0.0) for p in result["prefixes"])},
           token_agreement={"all_argmax_equal": result["all_argmax_equal"],
                            "near_tie_prefixes": [p["prefix_length"] for p in result["prefixes"] if p["near_tie"]]},
           forward_mode=mode)
    assert result["forward_count"] == result["forward_count_expected"], (
        f"forwards: counted {result['forward_count']}, expected 2m = {result['forward_count_expected']}"
    )
    assert result["eval_mode"], "model.training: expected False, actual True"
    assert not loading.violation_message(mode), loading.violation_message(mode)
    wrong_shape = {path: check for path, check in result["prefill_logits_to_keep"].items() if not check["ok"]}
    assert not wrong_shape, f"prefill logits against logits_to_keep={protocol.LOGITS_TO_KEEP}: {wrong_shape}"


TOLERANCE_CHECK = "within_tolerance"  # the diagnostic; every other per-prefix check is the harness's own


def prefix_record(k: int, inferlab_run) -> dict:
    """The cache_comparison record of prefix k, or a skip when the continuation is shorter (early EOS)."""
    comparisons = inferlab_run.records_of("cache_comparison")
    if k >= len(comparisons):
        pytest.skip(f"not applicable: the fixed continuation has {len(comparisons)} target tokens (early EOS)")
    row = comparisons[k]
    assert row["fed_continuation_tokens"] == k
    return row


@pytest.mark.requires("cache_comparison")
@pytest.mark.parametrize("k", range(protocol.CACHE_MAX_TARGET_TOKENS), ids=lambda k: f"prefix+{k}")
def test_cache_prefix_is_aligned(k, inferlab_run):
    """Prefix k: both paths saw the same ids, masks and positions, gave finite vocabulary-sized logits, and the
    cache holds exactly the prefix. A failure here is the harness's, not a finding about the cache."""
    row = prefix_record(k, inferlab_run)
    failed = {name: ok for name, ok in row["checks"].items() if name != TOLERANCE_CHECK and not ok}
    assert not failed, f"prefix length {row['prefix_length']}: failed alignment checks {sorted(failed)}"


@pytest.mark.diagnostic
@pytest.mark.requires("cache_comparison")
@pytest.mark.parametrize("k", range(protocol.CACHE_MAX_TARGET_TOKENS), ids=lambda k: f"prefix+{k}")
def test_cache_prefix_agrees(k, inferlab_run):
    """Prefix k (the prompt plus k fed continuation tokens): both paths within the declared criterion."""
    row = prefix_record(k, inferlab_run)
    assert row["checks"][TOLERANCE_CHECK], (
        f"prefix length {row['prefix_length']}: max_abs_diff {row['max_abs_diff']}, "
        f"fail_fraction {row['fail_fraction']} under {protocol.CACHE_TOLERANCE.describe()}; "
        f"argmax cached {row['argmax_cached']} vs uncached {row['argmax_uncached']}"
    )
