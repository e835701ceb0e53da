"""The bounded download against a local hub-compatible server: sizes first, six files once, then verification."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from hub_server import HubServer

from inferlab import loading, protocol, specimen
from inferlab.netguard import NetworkBlocked, block_network
from inferlab.specimen import SpecimenError

WEIGHTS = "model.safetensors"


@pytest.fixture
def spec(standin_spec):
    """The stand-in's pins as a non-synthetic specimen, so acquisition must download it."""
    return dataclasses.replace(standin_spec, synthetic=False)


@pytest.fixture
def serve(standin_dir, spec):
    """Start a HubServer over the built stand-in (keyword arguments configure faults); stopped after the test."""
    servers = []

    def start(directory=standin_dir, **faults):
        server = HubServer(directory, spec.repo_id, spec.revision, **faults).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_download_fetches_each_allowlisted_file_once_then_reuses(serve, spec, tmp_path, monkeypatch):
    hub = serve()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # read at call time, not at import
    with block_network(allow_loopback=True):
        first = specimen.acquire(spec, cache_root=tmp_path)
        requests_after_download = list(hub.requests)
        second = specimen.acquire(spec, cache_root=tmp_path)
    assert (first["acquisition"], second["acquisition"]) == ("download", "reuse:project_cache")
    assert sorted(hub.requested("GET")) == sorted(protocol.ALLOWLISTED_FILES)
    assert hub.requests == requests_after_download  # the reuse made no request at all
    assert first["verification"]["ok"] and first["directory"] == str(specimen.cache_dir(spec, tmp_path))


def test_remote_sizes_are_read_before_any_body(serve, spec, tmp_path):
    hub = serve()
    result = specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    sizes = {name: entry["size"] for name, entry in result["remote"]["files"].items()}
    assert sizes == {name: pin["size"] for name, pin in spec.expected.items()}
    # The metadata pass: one HEAD per allowlisted file, all before the first GET.
    first_get = [method for method, _ in hub.requests].index("GET")
    metadata_pass = hub.requests[: len(protocol.ALLOWLISTED_FILES)]
    assert len(metadata_pass) <= first_get and {m for m, _ in metadata_pass} == {"HEAD"}
    assert sorted(hub.requested()[: len(metadata_pass)]) == sorted(protocol.ALLOWLISTED_FILES)


def test_download_leaves_no_staging_behind(serve, spec, tmp_path):
    specimen.acquire(spec, cache_root=tmp_path, endpoint=serve().endpoint)
    assert sorted(p.name for p in (tmp_path / spec.name).iterdir()) == [spec.revision]


def test_oversize_bundle_is_refused_before_any_body(serve, spec, tmp_path):
    hub = serve(advertise_sizes={"tokenizer.json": protocol.BUNDLE_CAP_BYTES})
    with pytest.raises(SpecimenError, match=f"bundle: expected at most {protocol.BUNDLE_CAP_BYTES} bytes") as error:
        specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert "refused before fetching any file" in str(error.value)
    assert hub.requested("GET") == [] and not (tmp_path / spec.name).exists()


def test_weight_size_differing_from_the_pin_is_refused_before_any_body(serve, spec, tmp_path):
    pinned = spec.expected[WEIGHTS]["size"]
    hub = serve(advertise_sizes={WEIGHTS: pinned + 8})
    with pytest.raises(SpecimenError, match=f"{WEIGHTS}: expected {pinned} bytes \\(pinned\\), actual {pinned + 8}"):
        specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert hub.requested("GET") == []


def test_file_missing_on_the_hub_is_refused_before_any_body(serve, spec, standin_copy, tmp_path):
    (standin_copy / "tokenizer.json").unlink()
    hub = serve(standin_copy)
    with pytest.raises(SpecimenError, match="tokenizer.json at .*: expected a file, actual: HTTP 404"):
        specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert hub.requested("GET") == []


def flip_middle_byte(data: bytes) -> bytes:
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0x01
    return bytes(changed)


def test_changed_weight_bytes_are_refused_with_both_hashes(serve, spec, standin_dir, tmp_path):
    hub = serve(alter={WEIGHTS: flip_middle_byte})
    actual = hashlib.sha256(flip_middle_byte((standin_dir / WEIGHTS).read_bytes())).hexdigest()
    with pytest.raises(SpecimenError) as error:
        specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    message = str(error.value)
    assert WEIGHTS in message and spec.expected[WEIGHTS]["sha256"] in message and actual in message
    assert not specimen.cache_dir(spec, tmp_path).exists()  # a rejected download never enters the cache


def test_extra_files_on_the_hub_are_never_requested(serve, spec, tmp_path):
    extras = {"pytorch_model.bin": b"pickle", "modeling_gpt_neox.py": b"import os", "model.bf16.safetensors": b"x"}
    hub = serve(extra_files=extras)
    specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert set(hub.requested()) == set(protocol.ALLOWLISTED_FILES)


def test_offline_with_missing_files_names_them_and_suggests_artifacts(tmp_path):
    spec = specimen.load_spec("pythia-14m")
    with block_network(), pytest.raises(SpecimenError) as error:
        specimen.acquire(spec, cache_root=tmp_path, offline=True)
    assert WEIGHTS in str(error.value) and "--artifacts DIR" in str(error.value)


def test_offline_with_a_complete_cache_works_under_the_block(serve, spec, tmp_path):
    specimen.acquire(spec, cache_root=tmp_path, endpoint=serve().endpoint)
    with block_network():
        result = specimen.acquire(spec, cache_root=tmp_path, offline=True)
        loaded = loading.load_specimen(result["directory"], spec)
    assert result["acquisition"] == "reuse:project_cache"
    assert loaded["model_load"]["model_class"] == "GPTNeoXForCausalLM"


def test_offline_mode_refuses_hub_calls_and_restores_flags(spec, tmp_path):
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import OfflineModeIsEnabled

    before = constants.HF_HUB_OFFLINE
    url = hf_hub_url(spec.repo_id, WEIGHTS, revision=spec.revision, endpoint="http://127.0.0.1:9")
    with specimen.offline_mode(), pytest.raises((OfflineModeIsEnabled, NetworkBlocked)) as error:
        get_hf_file_metadata(url)
    assert error.type is OfflineModeIsEnabled and constants.HF_HUB_OFFLINE == before

