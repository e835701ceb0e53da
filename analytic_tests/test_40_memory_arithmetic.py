"""Part 6 arithmetic: pythia-14m parameter bytes, the weight file's header, and KV-cache bytes.

The parameter count is derived from the configuration by hand (reference.py) and checked against
transformers' GPTNeoXForCausalLM built on the meta device, so no weights are needed.
"""

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from analytic_tests import reference
from inferlab.specimen.build import tiny_gpt_neox

# The architecture fields of the pinned specimen's config.json (EleutherAI/pythia-14m at the pinned
# revision), restated here because these tests must run without the file.
PYTHIA_14M = dict(vocab_size=50304, hidden_size=128, num_hidden_layers=6, num_attention_heads=4,
                  intermediate_size=512, rotary_pct=0.25, tie_word_embeddings=False)
# Expected values worked by hand for the spec; the file size is the one the spec quotes.
PARAMETERS = 14_067_712
FP32_BYTES = 56_270_848
FP16_BYTES = 28_135_424
WEIGHT_FILE_BYTES = 28_143_920
HEADER_AND_LENGTH_PREFIX_BYTES = 8_496


def pythia_count():
    c = PYTHIA_14M
    return reference.gpt_neox_parameter_count(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"],
                                              c["intermediate_size"])


def test_analytic_parameter_count_of_pythia_14m():
    assert pythia_count()["total"] == PARAMETERS


def test_meta_device_model_has_the_analytic_parameter_count():
    with torch.device("meta"):
        model = GPTNeoXForCausalLM(GPTNeoXConfig(**PYTHIA_14M))
    counts = pythia_count()["components"]
    by_component = {name: sum(p.numel() for n, p in model.named_parameters() if f".{name}." in f".{n}")
                    for name in counts}
    assert by_component == counts
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS


def test_parameter_bytes_and_the_weight_file_header():
    total = pythia_count()["total"]
    assert total * torch.finfo(torch.float32).bits // 8 == FP32_BYTES
    assert total * torch.finfo(torch.float16).bits // 8 == FP16_BYTES
    # A safetensors file is an 8-byte length, a JSON header, then the payload: what is left over
    # after an fp16 payload of every parameter is the length prefix plus the header.
    assert WEIGHT_FILE_BYTES - FP16_BYTES == HEADER_AND_LENGTH_PREFIX_BYTES


@pytest.fixture(scope="module")
def model():
    return tiny_gpt_neox()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def cache_bytes(cache) -> int:
    return sum(tensor_bytes(layer.keys) + tensor_bytes(layer.values) for layer in cache.layers)


def parameter_bytes(model) -> int:
    # Unique storages, so tied or shared tensors would be counted once.
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


@torch.inference_mode()
def test_kv_cache_bytes_follow_the_formula_at_each_prefix_length(model):
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])  # (1, T)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
    lengths_and_bytes = [(ids.shape[1], cache_bytes(out.past_key_values))]
    cache = out.past_key_values
    for step in range(3):
        length = ids.shape[1] + step + 1
        out = model(input_ids=torch.tensor([[9]]), attention_mask=torch.ones(1, length, dtype=torch.long),
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        assert cache.get_seq_length() == length
        lengths_and_bytes.append((length, cache_bytes(cache)))
    for layer in cache.layers:
        assert layer.keys.shape == layer.values.shape == (1, cfg.num_attention_heads, length, head_dim)
        assert layer.keys.dtype == torch.float32
    expected = [(t, reference.kv_cache_bytes(cfg.num_hidden_layers, cfg.num_attention_heads, head_dim, t, 4))
                for t, _ in lengths_and_bytes]
    assert lengths_and_bytes == expected


@torch.inference_mode()
def test_parameter_bytes_leave_out_the_cache_and_the_logits(model):
    before = parameter_bytes(model)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])  # (1, T)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
    assert cache_bytes(out.past_key_values) > 0 and tensor_bytes(out.logits) > 0
    assert parameter_bytes(model) == before
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    produced = [out.logits] + [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
    assert not parameter_storages & {t.untyped_storage().data_ptr() for t in produced}
