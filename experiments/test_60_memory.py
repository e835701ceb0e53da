"""Part 6: tensor payloads we can count exactly, process memory with its meaning, and what stays unmeasured."""

import pytest

from inferlab import protocol
from inferlab.measure import stats


@pytest.mark.records("memory")
@pytest.mark.requires("model_inspection")
def test_parameter_storage(model, record):
    from inferlab.measure import memory

    storage = memory.parameter_storage(model)
    analytic_count = memory.gpt_neox_parameter_count(model.config)
    analytic_bytes = analytic_count * 4  # float32 parameters
    record("memory", measure="parameter_storage", **storage, analytic_parameter_count=analytic_count,
           analytic_bytes_fp32=analytic_bytes,
           note="unique tensor storage of the loaded parameters; not the checkpoint file size and not process memory")
    assert storage["parameter_count"] == analytic_count, (
        f"parameters: counted {storage['parameter_count']}, config formula gives {analytic_count}"
    )
    assert storage["unique_bytes"] == analytic_bytes, (
        f"unique parameter bytes: measured {storage['unique_bytes']}, expected {analytic_bytes} (fp32)"
    )


@pytest.mark.records("memory")
@pytest.mark.requires("model_inspection", "cache_comparison")
def test_cache_storage_at_each_prefix(model, inferlab_run, record):
    """The cache the cache test's cached path built, weighed after each of its forwards (outside every timed
    region): the bytes at every prefix length, with no forward of its own."""
    from inferlab.measure import memory

    comparisons = inferlab_run.records_of("cache_comparison")
    per_prefix = [{"prefix_length": r["prefix_length"], "logical_length": r["cache_seq_length_after_forward"],
                   "unique_bytes": r["cache_unique_bytes_after_forward"], "source_seq": r["seq"],
                   "expected_bytes": memory.expected_kv_cache_bytes(model.config, r["cache_seq_length_after_forward"])}
                  for r in comparisons]
    assert per_prefix, "the cache test recorded no cache_comparison to weigh"
    prompt_id = protocol.CACHE_REFERENCE_TRIAL[0]
    prefill = per_prefix[0]
    record("memory", measure="cache_storage", point=f"after the cache test's prefill of {prompt_id}",
           prompt_id=prompt_id, prompt_length=prefill["prefix_length"], unique_bytes=prefill["unique_bytes"],
           logical_length=prefill["logical_length"], expected_bytes=prefill["expected_bytes"], per_prefix=per_prefix,
           formula="2 x layers x heads x head_dim x tokens x 4 bytes",
           note="weighed by the cache test after each cached forward; no forward was made for this record")
    wrong = [p for p in per_prefix if p["unique_bytes"] != p["expected_bytes"] or p["logical_length"] != p["prefix_length"]]
    assert not wrong, f"cache bytes or length differ from the formula at prefix lengths {wrong}"


@pytest.mark.records("memory")
@pytest.mark.requires("model_inspection", "inputs")
@pytest.mark.parametrize("prompt_id", list(protocol.TIMING_PROMPTS))
def test_cache_storage_after_sixteen_tokens(prompt_id, model, inferlab_run, record):
    """The cache a measured cache-on timing trial ended with: prompt plus the 15 fed-back selections."""
    from inferlab.measure import memory

    trials = [t for t in stats.completed(inferlab_run.records_of("timing_trial"))
              if t["prompt_id"] == prompt_id and t["use_cache"] and not t["warmup"]]
    if not trials:
        pytest.skip(f"not decidable: no measured {prompt_id} cache-on timing trial completed (a missing trial failed "
                    "there, or was not selected)")
    last = trials[-1]
    storage = last["cache_after_loop"]
    expected = memory.expected_kv_cache_bytes(model.config, storage["logical_length"])
    record("memory", measure="cache_storage", point=f"after 16 selections for {prompt_id}", prompt_id=prompt_id,
           prompt_length=last["prompt_length"], source_trial=last["schedule_id"], **storage, expected_bytes=expected,
           note="the 16th selected token is never fed back, so the cache holds prompt + 15 positions")
    assert storage["logical_length"] == last["prompt_length"] + protocol.TIMING_NEW_TOKENS - 1
    assert storage["unique_bytes"] == expected, f"cache bytes: measured {storage['unique_bytes']}, formula {expected}"


@pytest.mark.records("memory")
@pytest.mark.requires("model_inspection")
def test_process_memory(thread_controls, record):
    from inferlab.measure import memory

    baseline, now = thread_controls["baseline_process_memory"], memory.process_memory()
    record("memory", measure="process_rss", baseline=baseline, now=now,
           baseline_point="before the model was loaded (first experiment fixture)",
           claim="none: process-wide figures include the interpreter, libraries and allocator; "
                 "no isolated cache increment is derived from them")
    # A lifetime high-water mark never falls and never sits below the current value.
    assert now["peak_rss"]["bytes"] >= baseline["peak_rss"]["bytes"], (baseline["peak_rss"], now["peak_rss"])
    if now["current_rss"] is not None:
        assert now["peak_rss"]["bytes"] >= now["current_rss"]["bytes"], (now["peak_rss"], now["current_rss"])


@pytest.mark.records("memory")
@pytest.mark.requires("model_inspection")
def test_unmeasured_categories(inferlab_run, record):
    """The tensors we can count are a fraction of the process: the rest is in categories we do not measure."""
    from inferlab.measure import memory

    counted = [r for r in inferlab_run.records_of("memory") if r["measure"] in ("parameter_storage", "cache_storage")]
    counted_bytes = sum(r["unique_bytes"] for r in counted if r["measure"] == "parameter_storage") + max(
        (r["unique_bytes"] for r in counted if r["measure"] == "cache_storage"), default=0)
    now = memory.process_memory()
    process_bytes = (now["current_rss"] or now["peak_rss"])["bytes"]
    record("memory", measure="unmeasured", categories=memory.UNMEASURED_CATEGORIES,
           counted_tensor_bytes=counted_bytes, process_rss_bytes=process_bytes,
           note="parameters plus the largest recorded cache, against the process RSS at this moment")
    assert counted, "no parameter or cache storage was recorded to compare with"
    assert process_bytes > counted_bytes, (
        f"process RSS {process_bytes} B is not above the counted tensor payload {counted_bytes} B"
    )

