"""Controlled loading and inspection of the stand-in: options, records, devices, dtypes, storage bytes."""

from __future__ import annotations

import json

import pytest
import torch

from inferlab import protocol
from inferlab.measure import loading, memory
from inferlab.specimen.build import tiny_gpt_neox

STANDIN_PARAMETERS = 14_067_712  # pythia-14m's parameter count
STANDIN_FP32_BYTES = 56_270_848  # 4 bytes each, no shared storage (untied embeddings)


@pytest.fixture(scope="module")
def loaded(standin_dir, standin_spec):
    return loading.load_specimen(standin_dir, standin_spec)


@pytest.fixture(scope="module")
def inspection(loaded, standin_dir):
    return loading.inspect_model(loaded["model"], standin_dir)


def test_set_threads_records_requested_and_effective():
    record = loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS)
    effective = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    assert record["effective"] == effective and record["matches"] == (record["requested"] == effective)


def test_second_interop_setting_is_recorded_not_hidden():
    loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS)
    record = loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS + 1)
    assert record["errors"] and not record["matches"]


def test_load_uses_the_protocol_controls(loaded):
    options = loaded["model_load"]["options"]
    assert options == {
        "local_files_only": True, "use_safetensors": True, "trust_remote_code": False, "dtype": "float32",
        "attn_implementation": "eager", "device_map": None, "model_class": "GPTNeoXForCausalLM",
        "tokenizer_class": "GPTNeoXTokenizerFast",
    }


def test_load_record_is_json_ready_and_ordered(loaded):
    record = json.loads(json.dumps(loaded["model_load"]))
    assert record["load_start_ns"] < record["load_end_ns"] and record["elapsed_s"] > 0
    assert isinstance(record["warnings"], list) and isinstance(record["log_messages"], list)


def test_tokenizer_is_fast_with_eos_zero(loaded):
    tokenizer = loaded["model_load"]["tokenizer"]
    assert (tokenizer["class"], tokenizer["is_fast"], tokenizer["eos_token_id"]) == ("GPTNeoXTokenizerFast", True, 0)


def test_model_is_in_eval_mode(loaded):
    assert loaded["model"].training is False and loaded["model_load"]["training"] is False


def test_inspection_finds_no_violation(inspection):
    assert inspection["violations"] == []


def test_parameter_count_and_unique_fp32_bytes(inspection):
    assert (inspection["parameter_count"], inspection["unique_parameter_storage_bytes"]) == (
        STANDIN_PARAMETERS,
        STANDIN_FP32_BYTES,
    )


def test_checkpoint_bytes_are_kept_apart_from_loaded_bytes(inspection, standin_spec):
    assert inspection["checkpoint_file_bytes"] == standin_spec.expected["model.safetensors"]["size"]
    assert inspection["checkpoint_file_bytes"] != inspection["unique_parameter_storage_bytes"]


def test_inspection_is_json_ready_with_config(inspection):
    record = json.loads(json.dumps(inspection))
    assert record["class"] == "GPTNeoXForCausalLM" and record["config"]["hidden_size"] == 128
    assert record["attn_implementation"] == "eager"


@torch.inference_mode()
def test_standin_logits_are_finite(loaded):
    ids = loaded["tokenizer"](protocol.PROMPTS["P1"], add_special_tokens=False, return_tensors="pt")["input_ids"]
    logits = loaded["model"](ids).logits  # (1, T, vocab)
    assert logits.shape[-1] == 50304 and bool(torch.isfinite(logits).all())


def test_violations_name_dtype_and_training_mode(standin_dir):
    model = tiny_gpt_neox(seed=0).to(torch.float16).train()
    violations = loading.inspect_model(model, standin_dir)["violations"]
    assert any("dtype expected torch.float32, actual torch.float16" in v for v in violations)
    assert any(v.startswith("model.training") for v in violations)


def test_shared_storage_is_counted_once():
    model = tiny_gpt_neox(seed=0, tie_word_embeddings=True)
    embedding = model.get_input_embeddings().weight
    tensors = [embedding, model.get_output_embeddings().weight]
    assert memory.unique_storage_bytes(tensors) == embedding.numel() * 4


# --- a load that is not faithful to the checkpoint, and a model outside the controls -------------------


def test_faithful_load_reports_no_problem(loaded):
    load = loaded["model_load"]
    assert load["loading_info"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                                    "error_msgs": []}
    assert load["load_problems"] == []


@pytest.fixture(scope="module")
def tiny_spec_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-specs")


def _load_tiny(tmp_path, tiny_spec_root, **damage):
    from tiny_specimen import build_tiny_specimen, write_spec

    from inferlab.specimen import load_spec

    directory = build_tiny_specimen(tmp_path / "tiny", **damage)
    write_spec(tiny_spec_root, directory, name=f"tiny-{tmp_path.name}")
    return loading.load_specimen(directory, load_spec(f"tiny-{tmp_path.name}", tiny_spec_root))["model_load"]


def test_a_faithful_tiny_load_reports_no_problem(tmp_path, tiny_spec_root):
    assert _load_tiny(tmp_path, tiny_spec_root)["load_problems"] == []


def test_missing_weights_are_a_load_problem(tmp_path, tiny_spec_root):
    load = _load_tiny(tmp_path, tiny_spec_root, drop=("gpt_neox.final_layer_norm.bias",))
    assert load["loading_info"]["missing_keys"] == ["gpt_neox.final_layer_norm.bias"]
    assert any(p.startswith("missing_keys: ") and "newly initialised" in p for p in load["load_problems"])
    # transformers' own warning is kept as evidence and named as a problem too
    assert any("newly initialized" in p for p in load["load_problems"] if p.startswith("log "))


def test_unexpected_weights_are_a_load_problem(tmp_path, tiny_spec_root):
    load = _load_tiny(tmp_path, tiny_spec_root, extra=("gpt_neox.stowaway.weight",))
    assert load["loading_info"]["unexpected_keys"] == ["gpt_neox.stowaway.weight"]
    assert any(p.startswith("unexpected_keys: ") and "stowaway" in p for p in load["load_problems"])


def test_load_problems_read_log_messages_even_without_loading_info():
    messages = [{"logger": "transformers.modeling_utils", "level": "WARNING",
                 "message": "Some weights of X were not initialized from the model checkpoint at D and are newly "
                            "initialized: ['a']\nYou should probably TRAIN this model"},
                {"logger": "transformers.tokenization_utils_base", "level": "WARNING", "message": "unrelated"}]
    problems = loading.load_problems({"missing_keys": []}, messages)
    assert problems == ["log transformers.modeling_utils WARNING: Some weights of X were not initialized from the "
                        "model checkpoint at D and are newly initialized: ['a']"]


def test_violations_name_a_device_off_the_cpu_and_another_attention(standin_dir):
    model = tiny_gpt_neox(seed=0, attn_implementation="sdpa").to("meta")
    violations = loading.inspect_model(model, standin_dir)["violations"]
    assert any("device expected cpu, actual meta" in v for v in violations)
    assert any(v == "attn_implementation: expected eager, actual sdpa" for v in violations)


def test_violation_summary_groups_parameters_by_what_is_wrong(standin_dir):
    model = tiny_gpt_neox(seed=0, attn_implementation="sdpa").to(torch.float16)
    inspection = loading.inspect_model(model, standin_dir)
    count = len(list(model.parameters()))
    assert inspection["violation_summary"] == [
        f"dtype expected torch.float32, actual torch.float16 for {count} of {count} parameters "
        f"(first: gpt_neox.embed_in.weight)",
        "attn_implementation: expected eager, actual sdpa",
    ]
    assert len(inspection["violations"]) == count + 1


def test_a_file_swapped_after_verification_is_never_loaded(standin_copy, standin_spec, monkeypatch):
    """Verification reads by path and so would the loader: the load reads only a private, re-hashed copy."""
    from inferlab import specimen

    real_verify = loading.require_verified

    def verify_then_swap(directory, spec):
        report = real_verify(directory, spec)
        weights = standin_copy / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0x01  # another program replaces the verified file
        weights.write_bytes(bytes(data))
        return report

    monkeypatch.setattr(loading, "require_verified", verify_then_swap)
    with pytest.raises(specimen.SpecimenError, match="changed after it was verified"):
        loading.load_specimen(standin_copy, standin_spec)


def test_the_load_record_says_it_read_a_private_verified_copy(loaded):
    assert loaded["model_load"]["loaded_from"] == loading.LOADED_FROM
    assert loaded["model_load"]["directory"] != "" and loaded["model_load"]["verified_copy_s"] >= 0


@pytest.mark.slow
def test_a_config_that_changes_the_architecture_is_a_violation(standin_copy, standin_spec):
    """pythia-14m's config.json is not pinned by hash: an edited one must not pass as the pinned model."""
    import dataclasses

    config_path = standin_copy / "config.json"
    config = json.loads(config_path.read_text())
    config.update(hidden_act="relu", use_parallel_residual=False)
    config_path.write_text(json.dumps(config))
    unpinned = dict(standin_spec.expected, **{"config.json": {"size": None, "sha256": None}})
    spec = dataclasses.replace(standin_spec, expected=unpinned)  # as pythia-14m's spec leaves it
    loaded = loading.load_specimen(standin_copy, spec)
    violations = loading.inspect_model(loaded["model"], standin_copy, spec.architecture)["violations"]
    assert "config.hidden_act: expected 'gelu' (the specimen's pinned architecture), actual 'relu'" in violations
    assert any(v.startswith("config.use_parallel_residual: expected True") for v in violations)


def test_the_offline_specimens_have_the_pinned_architecture(inspection, standin_spec):
    from inferlab import specimen

    assert standin_spec.architecture == specimen.load_spec("pythia-14m").architecture
    assert not loading.architecture_differences(inspection_model_config(inspection), standin_spec.architecture)


def inspection_model_config(inspection):
    from types import SimpleNamespace

    return SimpleNamespace(**inspection["config"])
