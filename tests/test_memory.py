"""Memory accounting: unique storage, KV-cache bytes against their formula, labelled process figures."""

from __future__ import annotations

import json

import pytest
import torch

from inferlab.measure import memory
from inferlab.measure.decode_loop import run_greedy_loop
from inferlab.specimen.build import tiny_gpt_neox

PROMPT = [5, 17, 33, 2, 9]


def test_unique_storage_counts_views_and_repeats_once():
    base = torch.zeros(10, 4)
    assert memory.unique_storage_bytes([base, base, base[2:], base.t()]) == base.nbytes
    other = torch.zeros(3)
    assert memory.unique_storage_bytes([base, other]) == base.nbytes + other.nbytes


def test_tied_embeddings_are_counted_once():
    model = tiny_gpt_neox(tie_word_embeddings=True)
    assert model.embed_out.weight is model.gpt_neox.embed_in.weight
    storage = memory.parameter_storage(model)
    embedding_bytes = model.embed_out.weight.nbytes
    assert storage["naive_bytes"] - storage["unique_bytes"] == embedding_bytes
    assert storage["parameter_count"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_hidden_layers": 3, "num_attention_heads": 2, "hidden_size": 16}],
    ids=["tiny", "three_layers_two_heads"],
)
def test_expected_kv_bytes_equal_a_real_cache(overrides):
    model = tiny_gpt_neox(**overrides)
    ids = torch.tensor([PROMPT])
    result = run_greedy_loop(model, ids, torch.ones_like(ids), use_cache=True, new_tokens=4)
    fed = len(PROMPT) + 4 - 1
    storage = memory.cache_storage(result.cache)
    assert storage["logical_length"] == fed
    assert storage["unique_bytes"] == memory.expected_kv_cache_bytes(model.config, fed)
    assert len(storage["per_layer"]) == model.config.num_hidden_layers


def test_cache_storage_rejects_an_unknown_object():
    with pytest.raises(TypeError, match="no .layers"):
        memory.cache_storage(object())


def test_process_memory_is_labelled():
    info = memory.process_memory()
    peak = info["peak_rss"]
    assert peak["bytes"] > 0 and peak["meaning"] == memory.LIFETIME_PEAK
    for key in ("tool", "units_reported", "platform", "source_field"):
        assert peak[key]
    if memory.PROC_STATUS.exists():
        assert info["current_rss"]["meaning"] == memory.CURRENT and info["current_rss"]["bytes"] > 0


def test_proc_status_kb_are_converted_to_bytes(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t   200 kB\nVmRSS:\t   150 kB\n")
    assert memory._read_proc_status(status) == {"VmHWM": 200 * 1024, "VmRSS": 150 * 1024}


def test_without_proc_falls_back_to_getrusage(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "PROC_STATUS", tmp_path / "missing")
    info = memory.process_memory()
    assert info["current_rss"] is None
    assert info["peak_rss"]["tool"].startswith("resource.getrusage") and info["peak_rss"]["bytes"] > 0
    assert info["peak_rss"]["meaning"] == memory.LIFETIME_PEAK


def test_unmeasured_categories_are_declared():
    expected = {"activations", "logits", "workspace", "allocator_retention", "runtime_libraries", "loading_copies"}
    assert set(memory.UNMEASURED_CATEGORIES) == expected
    assert all(memory.UNMEASURED_CATEGORIES.values())


def test_the_weight_read_reads_every_tensor_of_a_decode_step_but_the_input_embedding():
    """Issue 26 A1: the time to read the step's own weights once, in the thread setting as it is, no forward."""
    from inferlab.specimen.build import tiny_gpt_neox

    model = tiny_gpt_neox(seed=0)
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    threads_before = torch.get_num_threads()
    caches = {"largest_bytes": 10**9, "levels": []}
    result = memory.weight_read_time(model, passes=3, caches=caches)
    assert not calls and torch.get_num_threads() == threads_before  # no forward; the setting left alone
    embedding = model.get_input_embeddings().weight
    expected = memory.parameter_storage(model)["unique_bytes"] - embedding.numel() * embedding.element_size()
    assert result["bytes"] == expected and result["left_out"][0]["bytes"] == embedding.numel() * 4
    assert (result["passes"], len(result["seconds"])) == (3, 3) and all(s > 0 for s in result["seconds"])
    assert result["median_s"] == sorted(result["seconds"])[1] and result["threads"]["intra_op"] == threads_before
    assert result["fits_in_largest_cache"] is True and result["caches"] == caches
    assert "floor" not in json.dumps(result)
    assert memory.weight_read_time(model, passes=1, caches={"largest_bytes": 1})["fits_in_largest_cache"] is False
    assert memory.weight_read_time(model, passes=1)["fits_in_largest_cache"] == "unknown"


def test_a_tied_output_projection_keeps_the_embedding_in_the_read():
    from inferlab.specimen.build import tiny_gpt_neox

    model = tiny_gpt_neox(seed=0)
    model.get_output_embeddings().weight = model.get_input_embeddings().weight
    tensors, read = memory.decode_step_weights(model)
    assert read["left_out"] == [] and read["bytes"] == memory.parameter_storage(model)["unique_bytes"]


def test_the_weight_read_rejects_no_passes():
    from inferlab.specimen.build import tiny_gpt_neox

    with pytest.raises(ValueError, match="passes"):
        memory.weight_read_time(tiny_gpt_neox(seed=0), passes=0)
