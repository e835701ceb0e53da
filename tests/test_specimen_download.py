"""The bounded download against a well-behaved loopback hub: sizes first, each file once, then verification.

Every refusal that the metadata can justify happens before any body is requested: the hub's request
log shows no GET at all. The hostile hub's faults are in test_specimen_hostile_hub.py.
"""

from __future__ import annotations

import hashlib

import pytest

from inferlab import protocol, specimen
from inferlab.measure import loading
from inferlab.specimen import SpecimenError
from inferlab.specimen.netguard import NetworkBlocked, block_network

WEIGHTS = "model.safetensors"


def cache_root_entries(root, spec) -> list[str]:
    folder = root / spec.name
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.slow
def test_download_fetches_each_allowlisted_file_once_then_reuses(serve, standin_dir, download_spec, tmp_path,
                                                                 monkeypatch):
    spec = download_spec
    hub = serve(standin_dir, spec)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # read at call time, not at import
    with block_network(allow_loopback=True):
        first = specimen.acquire(spec, cache_root=tmp_path)
        requests_after_download = list(hub.requests)
        second = specimen.acquire(spec, cache_root=tmp_path)
    assert (first["acquisition"], second["acquisition"]) == ("download", "reuse:project_cache")
    assert sorted(hub.requested("GET")) == sorted(protocol.ALLOWLISTED_FILES)
    assert hub.requests == requests_after_download  # the reuse made no request at all
    assert first["verification"]["ok"] and first["directory"] == str(specimen.cache_dir(spec, tmp_path))


@pytest.mark.slow
def test_the_weight_body_follows_the_hubs_redirect_to_its_cdn(serve, standin_dir, download_spec, tmp_path):
    hub = serve(standin_dir, download_spec)
    result = specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    fetched = result["remote"]["fetched"][WEIGHTS]
    assert [path.split("/")[-2] for path in fetched["redirects"]] == ["cdn"]
    assert fetched["etag_check"] == "matches" and result["remote"]["files"][WEIGHTS]["lfs"] is True
    assert result["remote"]["fetched"]["config.json"]["etag_check"] == "matches"  # git blob sha1


@pytest.mark.slow
def test_remote_sizes_are_read_before_any_body(serve, standin_dir, download_spec, tmp_path):
    spec = download_spec
    hub = serve(standin_dir, spec)
    result = specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    sizes = {name: entry["size"] for name, entry in result["remote"]["files"].items()}
    assert sizes == {name: pin["size"] for name, pin in spec.expected.items()}
    assert hub.metadata_came_first()
    assert sorted(hub.requested("HEAD")) == sorted(protocol.ALLOWLISTED_FILES)


@pytest.mark.slow
def test_download_leaves_only_the_cache_and_its_lock_file(serve, standin_dir, download_spec, tmp_path):
    result = specimen.acquire(download_spec, cache_root=tmp_path, endpoint=serve(standin_dir, download_spec).endpoint)
    assert cache_root_entries(tmp_path, download_spec) == [download_spec.revision, download_spec.revision + ".lock"]
    assert result["lock"]["path"].endswith(download_spec.revision + ".lock") and result["deadline_s"] == 300


def flip_middle_byte(data: bytes) -> bytes:
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0x01
    return bytes(changed)


def drop_required_file(directory, name="tokenizer.json"):
    (directory / name).unlink()
    return directory


# Every reason the metadata alone gives to refuse: (hub arguments, a piece of the refusal).
METADATA_REFUSALS = {
    "bundle-over-cap": (lambda spec: {"advertise_sizes": {"tokenizer.json": protocol.BUNDLE_CAP_BYTES}},
                        f"bundle: expected at most {protocol.BUNDLE_CAP_BYTES} bytes"),
    "one-file-over-cap": (lambda spec: {"advertise_sizes": {"tokenizer.json": protocol.BUNDLE_CAP_BYTES + 1}},
                          f"tokenizer.json: expected at most {protocol.BUNDLE_CAP_BYTES} bytes (the bundle cap)"),
    "weight-size-not-the-pin": (lambda spec: {"advertise_sizes": {WEIGHTS: spec.expected[WEIGHTS]["size"] + 8}},
                                f"{WEIGHTS}: expected 28143920 bytes (pinned), actual 28143928 bytes advertised"),
    "server-error-on-metadata": (lambda spec: {"faults": {("HEAD", "config.json"): "500"}},
                                 "config.json at inferlab/standin-pythia-14m-architecture@"),
    "redirect-loop-on-metadata": (lambda spec: {"faults": {("HEAD", "tokenizer.json"): "redirect_forever"}},
                                  "redirects in a loop"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(METADATA_REFUSALS))
def test_metadata_refusals_come_before_any_body(serve, standin_dir, download_spec, tmp_path, case):
    arguments, evidence = METADATA_REFUSALS[case]
    hub = serve(standin_dir, download_spec, **arguments(download_spec))
    with pytest.raises(SpecimenError) as error:
        specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert evidence in str(error.value)
    assert hub.gets() == []  # no body was requested, from the hub or its CDN
    assert not specimen.cache_dir(download_spec, tmp_path).exists()
    assert cache_root_entries(tmp_path, download_spec) == [download_spec.revision + ".lock"]


def test_server_error_is_reported_as_such_without_retry(serve, standin_dir, download_spec, tmp_path):
    hub = serve(standin_dir, download_spec, faults={("HEAD", "config.json"): "500"})
    with pytest.raises(SpecimenError, match="HTTP 500 \\(a server error; nothing was retried") as error:
        specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert hub.requested("HEAD").count("config.json") == 1 and "refused before fetching any file" in str(error.value)


def test_required_file_missing_on_the_hub_is_refused_before_any_body(serve, download_spec, standin_copy, tmp_path):
    hub = serve(drop_required_file(standin_copy), download_spec)
    with pytest.raises(SpecimenError, match="tokenizer.json at .*: expected a file, actual: HTTP 404 EntryNotFound"):
        specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert hub.gets() == []


@pytest.mark.slow
def test_changed_weight_bytes_are_refused_with_both_hashes(serve, standin_dir, download_spec, tmp_path):
    hub = serve(standin_dir, download_spec, alter={WEIGHTS: flip_middle_byte})
    actual = hashlib.sha256(flip_middle_byte((standin_dir / WEIGHTS).read_bytes())).hexdigest()
    with pytest.raises(SpecimenError) as error:
        specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    message = str(error.value)
    assert WEIGHTS in message and download_spec.expected[WEIGHTS]["sha256"] in message and actual in message
    assert not specimen.cache_dir(download_spec, tmp_path).exists()  # a rejected download never enters the cache
    assert cache_root_entries(tmp_path, download_spec) == [download_spec.revision + ".lock"]  # no staging left


@pytest.mark.slow
def test_extra_files_on_the_hub_are_never_requested(serve, standin_dir, download_spec, tmp_path):
    extras = {"pytorch_model.bin": b"pickle", "modeling_gpt_neox.py": b"import os", "model.bf16.safetensors": b"x"}
    hub = serve(standin_dir, download_spec, extra_files=extras)
    specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert set(hub.requested()) == set(protocol.ALLOWLISTED_FILES)


def test_offline_with_missing_files_names_them_and_suggests_artifacts(tmp_path):
    spec = specimen.load_spec("pythia-14m")
    with block_network(), pytest.raises(SpecimenError) as error:
        specimen.acquire(spec, cache_root=tmp_path, offline=True)
    assert WEIGHTS in str(error.value) and "--artifacts DIR" in str(error.value)


@pytest.mark.slow
def test_offline_with_a_complete_cache_works_under_the_block(serve, standin_dir, download_spec, tmp_path):
    specimen.acquire(download_spec, cache_root=tmp_path, endpoint=serve(standin_dir, download_spec).endpoint)
    with block_network():
        result = specimen.acquire(download_spec, cache_root=tmp_path, offline=True)
        loaded = loading.load_specimen(result["directory"], download_spec)
    assert result["acquisition"] == "reuse:project_cache"
    assert loaded["model_load"]["model_class"] == "GPTNeoXForCausalLM"


def test_no_hub_fails_at_once_naming_the_endpoint(download_spec, tmp_path):
    import socket

    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    outcome = specimen.acquisition_outcome(download_spec, cache_root=tmp_path, endpoint=endpoint)
    assert outcome["ok"] is False and outcome["acquisition"] == "download" and outcome["deadline_expired"] is False
    assert "expected the hub endpoint to accept a connection" in outcome["error"] and "--artifacts" in outcome["error"]
    assert outcome["directory"] is None and outcome["verification"] is None


def test_offline_mode_refuses_hub_calls_and_restores_flags(download_spec):
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import OfflineModeIsEnabled

    before = constants.HF_HUB_OFFLINE
    url = hf_hub_url(download_spec.repo_id, WEIGHTS, revision=download_spec.revision, endpoint="http://127.0.0.1:9")
    with specimen.offline_mode(), pytest.raises((OfflineModeIsEnabled, NetworkBlocked)) as error:
        get_hf_file_metadata(url)
    assert error.type is OfflineModeIsEnabled and constants.HF_HUB_OFFLINE == before


@pytest.mark.slow
def test_download_through_an_https_style_connect_proxy(serve, standin_dir, download_spec, tmp_path, monkeypatch):
    from hub_server import ConnectProxy

    hub = serve(standin_dir, download_spec)
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        result = specimen.acquire(download_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert result["acquisition"] == "download"
    host_port = hub.endpoint.removeprefix("http://")
    assert proxy.tunnels and set(proxy.tunnels) == {host_port} and len(proxy.tunnels) == len(hub.requests)
