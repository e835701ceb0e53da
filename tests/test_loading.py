"""inferlab.measure.loading: the controlled load and its record, an unfaithful load, a model outside the controls,
every forward watched, and the warnings a model call raises."""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from types import SimpleNamespace

import pytest
import torch

from inferlab import protocol, specimen
from inferlab.measure import loading
from inferlab.specimen.build import tiny_gpt_neox

STANDIN_PARAMETERS = 14_067_712  # pythia-14m's parameter count
STANDIN_FP32_BYTES = 56_270_848  # 4 bytes each, no shared storage (untied embeddings)


@pytest.fixture(scope="module")
def inspection(loaded, standin_dir):
    return loading.inspect_model(loaded["model"], standin_dir)


def test_set_threads_records_requested_and_effective_and_a_refused_second_setting():
    record = loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS)
    assert record["effective"] == {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    refused = loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS + 1)
    assert refused["errors"] and not refused["matches"]  # torch takes the inter-op count once: said, not hidden


def test_the_load_applies_the_controls_its_record_says_so_and_the_inspection_counts_apart_from_the_checkpoint(
        loaded, inspection, standin_spec):
    record = json.loads(json.dumps(loaded["model_load"]))
    assert record["options"] == {
        "local_files_only": True, "use_safetensors": True, "trust_remote_code": False, "dtype": "float32",
        "attn_implementation": "eager", "device_map": None, "model_class": "GPTNeoXForCausalLM",
        "tokenizer_class": "GPTNeoXTokenizerFast"}
    assert record["load_start_ns"] < record["load_end_ns"] and record["elapsed_s"] > 0
    assert (record["tokenizer"]["class"], record["tokenizer"]["is_fast"], record["tokenizer"]["eos_token_id"]) == (
        "GPTNeoXTokenizerFast", True, 0)
    assert loaded["model"].training is False and record["training"] is False
    assert record["loaded_from"] == loading.LOADED_FROM and record["verified_copy_s"] >= 0
    assert record["loading_info"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                                      "error_msgs": []} and record["load_problems"] == []
    assert inspection["violations"] == [] and inspection["attn_implementation"] == "eager"
    assert (inspection["parameter_count"], inspection["unique_parameter_storage_bytes"]) == (
        STANDIN_PARAMETERS, STANDIN_FP32_BYTES)
    assert inspection["checkpoint_file_bytes"] == standin_spec.expected["model.safetensors"]["size"]
    assert inspection["checkpoint_file_bytes"] != inspection["unique_parameter_storage_bytes"]
    assert json.loads(json.dumps(inspection))["config"]["hidden_size"] == 128
    assert standin_spec.architecture == specimen.load_spec("pythia-14m").architecture
    assert not loading.architecture_differences(SimpleNamespace(**inspection["config"]), standin_spec.architecture)


def test_violations_name_each_control_a_model_breaks_grouped_in_the_summary(standin_dir):
    model = tiny_gpt_neox(seed=0, attn_implementation="sdpa").to(torch.float16).train()
    inspection = loading.inspect_model(model, standin_dir)
    count = len(list(model.parameters()))
    assert inspection["violation_summary"] == [
        f"dtype expected torch.float32, actual torch.float16 for {count} of {count} parameters "
        f"(first: gpt_neox.embed_in.weight)",
        "attn_implementation: expected eager, actual sdpa", "model.training: expected False (eval mode), actual True"]
    assert len(inspection["violations"]) == count + 2
    off_cpu = loading.inspect_model(tiny_gpt_neox(seed=0).to("meta"), standin_dir)["violations"]
    assert any("device expected cpu, actual meta" in v for v in off_cpu)


def test_a_load_that_is_not_faithful_to_the_checkpoint_names_its_problems(tmp_path):
    from tiny_specimen import build_tiny_specimen, write_spec

    missing, unexpected = "gpt_neox.final_layer_norm.bias", "gpt_neox.stowaway.weight"
    directory = build_tiny_specimen(tmp_path / "tiny", drop=(missing,), extra=(unexpected,))
    write_spec(tmp_path, directory, name="tiny-damaged")
    load = loading.load_specimen(directory, specimen.load_spec("tiny-damaged", tmp_path))["model_load"]
    for key, found in (("missing_keys", missing), ("unexpected_keys", unexpected)):
        assert load["loading_info"][key] == [found]
        assert any(p.startswith(f"{key}: ") and found in p for p in load["load_problems"])
    # transformers' own warning of the missing weight is kept as evidence and named as a problem too
    assert any("newly initialized" in p for p in load["load_problems"] if p.startswith("log "))


def test_a_file_swapped_after_verification_is_never_loaded(standin_copy, standin_spec, monkeypatch):
    """Verification reads by path and so would the loader: the load reads only a private, re-hashed copy."""
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


@pytest.mark.slow
def test_a_config_that_changes_the_architecture_is_a_violation(standin_copy, standin_spec):
    """pythia-14m's config.json is not pinned by hash: an edited one must not pass as the pinned model."""
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


@pytest.fixture
def watched():
    model = tiny_gpt_neox(seed=0)
    watch = loading.ForwardWatch(model)
    yield model, watch
    watch.remove()


def test_a_forward_outside_inference_mode_or_in_training_mode_is_a_violation_with_its_number(watched):
    model, watch = watched
    ids = torch.tensor([[5, 17, 33]])
    with torch.inference_mode():
        model(ids)  # forward 1: before the window, and within the controls
    window = watch.window()
    model(ids)  # forward 2: no inference mode
    model.train()
    with torch.inference_mode():
        model(ids)  # forward 3: training
    model.eval()
    summary = window.summary()
    assert summary["forwards"] == 2 and summary["violations"] == [
        {"forward": 2, "inference_mode": False, "training": False, "grad_enabled": True},
        {"forward": 3, "inference_mode": True, "training": True, "grad_enabled": False}]
    assert not summary["all_inference_mode"] and not summary["none_training"]
    message = loading.violation_message(summary)
    assert message.startswith("2 of 2 forwards broke the controls") and "forward 2 of the session" in message
    later = watch.window()
    with torch.inference_mode():
        model(ids)
    assert later.summary()["violation_count"] == 0  # a window sees only its own forwards
    watch.remove()
    model(ids)
    assert watch.forwards == 4  # removed: no longer counted


def test_the_capture_sees_warnings_and_library_logs_even_when_the_library_is_set_quieter_or_the_block_raises():
    library = logging.getLogger("transformers")
    before, handlers = library.level, [list(logging.getLogger(n).handlers) for n in loading.LIBRARY_LOGGERS]
    library.setLevel(logging.ERROR)
    messages = []
    try:
        with pytest.raises(RuntimeError), loading.capture_messages() as messages:
            logging.getLogger("transformers.generation.utils").warning("probe-log")
            logging.getLogger("torch.probe").warning("probe-torch-log")
            logging.getLogger("transformers.x").info("just-info")
            warnings.warn("probe-warning", UserWarning)
            raise RuntimeError("a trial timeout, say")  # the list is complete all the same
        assert library.level == logging.ERROR  # restored
    finally:
        library.setLevel(before)
    assert [m.split(":")[0] for m in messages] == ["transformers logger transformers.generation.utils WARNING",
                                                   "torch logger torch.probe WARNING", "UserWarning"]
    assert [list(logging.getLogger(n).handlers) for n in loading.LIBRARY_LOGGERS] == handlers  # none left behind
