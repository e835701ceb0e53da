"""inferlab.measure.memory: unique storage, KV-cache bytes against their formula, labelled process figures, and the
time to read a decode step's weights once."""

from __future__ import annotations

import json

import pytest
import torch

from inferlab.measure import memory
from inferlab.measure.decode_loop import run_greedy_loop
from inferlab.specimen.build import tiny_gpt_neox

PROMPT = [5, 17, 33, 2, 9]


def test_unique_storage_counts_views_repeats_and_tied_weights_once():
    base, other = torch.zeros(10, 4), torch.zeros(3)
    assert memory.unique_storage_bytes([base, base, base[2:], base.t(), other]) == base.nbytes + other.nbytes
    model = tiny_gpt_neox(tie_word_embeddings=True)
    assert model.embed_out.weight is model.gpt_neox.embed_in.weight
    storage = memory.parameter_storage(model)
    assert storage["naive_bytes"] - storage["unique_bytes"] == model.embed_out.weight.nbytes
    assert storage["parameter_count"] == sum(p.numel() for p in model.parameters()) == memory.gpt_neox_parameter_count(
        model.config)


@pytest.mark.parametrize("overrides", [{}, {"num_hidden_layers": 3, "num_attention_heads": 2, "hidden_size": 16}],
                         ids=["tiny", "three_layers_two_heads"])
def test_the_kv_cache_formula_equals_a_real_caches_bytes(overrides):
    model = tiny_gpt_neox(**overrides)
    ids = torch.tensor([PROMPT])
    loop = run_greedy_loop(model, ids, torch.ones_like(ids), use_cache=True, new_tokens=4)
    storage = memory.cache_storage(loop.cache)
    fed = len(PROMPT) + 4 - 1
    assert storage["logical_length"] == fed and len(storage["per_layer"]) == model.config.num_hidden_layers
    assert storage["unique_bytes"] == memory.expected_kv_cache_bytes(model.config, fed)
    with pytest.raises(TypeError, match="no .layers"):
        memory.cache_storage(object())


def test_process_memory_is_labelled_from_proc_or_from_getrusage(tmp_path, monkeypatch):
    info = memory.process_memory()
    assert info["peak_rss"]["bytes"] > 0 and info["peak_rss"]["meaning"] == memory.LIFETIME_PEAK
    assert all(info["peak_rss"][key] for key in ("tool", "units_reported", "platform", "source_field"))
    if memory.PROC_STATUS.exists():
        assert info["current_rss"]["meaning"] == memory.CURRENT and info["current_rss"]["bytes"] > 0
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t   200 kB\nVmRSS:\t   150 kB\n")
    assert memory._read_proc_status(status) == {"VmHWM": 200 * 1024, "VmRSS": 150 * 1024}  # KiB to bytes
    monkeypatch.setattr(memory, "PROC_STATUS", tmp_path / "missing")
    fallback = memory.process_memory()
    assert fallback["current_rss"] is None and fallback["peak_rss"]["tool"].startswith("resource.getrusage")
    assert set(memory.UNMEASURED_CATEGORIES) == {"activations", "logits", "workspace", "allocator_retention",
                                                 "runtime_libraries", "loading_copies"}


def test_the_weight_read_reads_every_tensor_of_a_decode_step_but_the_input_embedding():
    model = tiny_gpt_neox(seed=0)
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    threads_before = torch.get_num_threads()
    caches = {"largest_bytes": 10**9, "levels": []}
    result = memory.weight_read_time(model, passes=3, caches=caches)
    assert not calls and torch.get_num_threads() == threads_before  # no forward; the setting left alone
    embedding = model.get_input_embeddings().weight
    assert result["bytes"] == memory.parameter_storage(model)["unique_bytes"] - embedding.numel() * 4
    assert result["left_out"][0]["bytes"] == embedding.numel() * 4 and "floor" not in json.dumps(result)
    assert (result["passes"], len(result["seconds"])) == (3, 3) and all(s > 0 for s in result["seconds"])
    assert result["median_s"] == sorted(result["seconds"])[1] and result["fits_in_largest_cache"] is True
    assert memory.weight_read_time(model, passes=1, caches={"largest_bytes": 1})["fits_in_largest_cache"] is False
    assert memory.weight_read_time(model, passes=1)["fits_in_largest_cache"] == "unknown"
    model.get_output_embeddings().weight = embedding  # tied: the output projection reads the embedding whole
    _, tied = memory.decode_step_weights(model)
    assert tied["left_out"] == [] and tied["bytes"] == memory.parameter_storage(model)["unique_bytes"]
