"""The bounded download against a loopback hub (tests/hub_server.py): sizes before any body, each allowlisted file
once and nothing else, no token; and against a hostile hub, one total deadline, the cap, no retries, bad bodies
refused, nothing partial kept. No assertion is about speed: HANG_GUARD_S turns an unbounded wait into a failure."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from inferlab import protocol, specimen
from inferlab.specimen import DeadlineExpired, SpecimenError
from inferlab.specimen.netguard import block_network

SHORT_DEADLINE_S = 5.0
EXPIRING_DEADLINE_S = 0.5  # a stall or a trickle (a few bytes every 0.2-0.25 s) outlasts it
HANG_GUARD_S = 30  # far beyond the deadline: only a wait the deadline failed to bound reaches it
WEIGHTS = "model.safetensors"
GENERATION_CONFIG = "generation_config.json"


def left_behind(root, spec) -> list[str]:
    """The cache root's specimen folder, without its lock file: after a refusal it must hold nothing."""
    folder = root / spec.name
    return sorted(p.name for p in folder.iterdir() if p.name != spec.revision + ".lock") if folder.is_dir() else []


def acquire(spec, root, hub, **kwargs):
    return specimen.acquire(spec, cache_root=root, endpoint=hub.endpoint, deadline_s=SHORT_DEADLINE_S, **kwargs)


@pytest.mark.slow
def test_a_download_reads_every_size_first_fetches_each_file_once_then_reuses_with_no_request(
        serve, standin_dir, download_spec, tmp_path, monkeypatch):
    extras = {"pytorch_model.bin": b"pickle", "modeling_gpt_neox.py": b"import os", "model.bf16.safetensors": b"x"}
    hub = serve(standin_dir, download_spec, extra_files=extras)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # read at call time, not at import
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # never sent: the lab needs no account
    with block_network(allow_loopback=True):
        first = specimen.acquire(download_spec, cache_root=tmp_path)
        seen = list(hub.requests)
        second = specimen.acquire(download_spec, cache_root=tmp_path, offline=True)
    assert (first["acquisition"], second["acquisition"]) == ("download", "reuse:project_cache")
    assert hub.metadata_came_first() and hub.requests == seen  # the reuse asked nothing
    assert sorted(hub.requested("HEAD")) == sorted(hub.requested("GET")) == sorted(protocol.ALLOWLISTED_FILES)
    assert not any("authorization" in str(headers).lower() for headers in hub.headers)
    remote = first["remote"]
    assert {name: meta["size"] for name, meta in remote["files"].items()} == {
        name: pin["size"] for name, pin in download_spec.expected.items()}
    assert [path.split("/")[-2] for path in remote["fetched"][WEIGHTS]["redirects"]] == ["cdn"]  # the hub's CDN
    assert {fetched["etag_check"] for fetched in remote["fetched"].values()} == {"matches"}
    assert sorted(p.name for p in (tmp_path / download_spec.name).iterdir()) == [
        download_spec.revision, download_spec.revision + ".lock"]
    assert first["deadline_s"] == protocol.ACQUISITION_DEADLINE_S and first["verification"]["ok"]


METADATA_REFUSALS = {  # case: (the hub's arguments, a piece of the refusal)
    "bundle-over-cap": (lambda spec: {"advertise_sizes": {"tokenizer.json": protocol.BUNDLE_CAP_BYTES}},
                        f"bundle: expected at most {protocol.BUNDLE_CAP_BYTES} bytes"),
    "one-file-over-cap": (lambda spec: {"advertise_sizes": {"tokenizer.json": protocol.BUNDLE_CAP_BYTES + 1}},
                          f"tokenizer.json: expected at most {protocol.BUNDLE_CAP_BYTES} bytes (the bundle cap)"),
    "weight-size-not-the-pin": (lambda spec: {"advertise_sizes": {WEIGHTS: spec.expected[WEIGHTS]["size"] + 8}},
                                f"{WEIGHTS}: expected 28143920 bytes (pinned), actual 28143928 bytes advertised"),
    "server-error": (lambda spec: {"faults": {("HEAD", "config.json"): "500"}},
                     "HTTP 500 (a server error; nothing was retried"),
    "redirect-loop": (lambda spec: {"faults": {("HEAD", "tokenizer.json"): "redirect_forever"}},
                      "expected the file within 5 redirects"),
    "required-file-missing": (lambda spec: {"drop": "tokenizer.json"},
                              "tokenizer.json at inferlab/standin-pythia-14m-architecture@"),
    "listed-but-pinned-absent": (lambda spec: {"pins": {GENERATION_CONFIG: {"absent": True}}},
                                 f"{GENERATION_CONFIG}: the spec pins it absent at the revision"),
}


@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("case", sorted(METADATA_REFUSALS))
def test_what_the_metadata_shows_refuses_the_download_before_any_body(serve, standin_copy, download_spec, tmp_path,
                                                                      case):
    arguments, evidence = METADATA_REFUSALS[case]
    arguments = arguments(download_spec)
    if "drop" in arguments:
        (standin_copy / arguments.pop("drop")).unlink()
    spec = dataclasses.replace(download_spec, expected={**download_spec.expected, **arguments.pop("pins", {})})
    hub = serve(standin_copy, spec, **arguments)
    with pytest.raises(SpecimenError) as error:
        acquire(spec, tmp_path, hub)
    assert evidence in str(error.value) and hub.gets() == []  # no body asked for, from the hub or its CDN
    assert left_behind(tmp_path, spec) == []
    if case == "server-error":
        assert hub.requested("HEAD").count("config.json") == 1  # not retried


DEADLINE_FAULTS = {
    "stall-on-metadata": ("HEAD", "config.json", "stall"),
    "headers-trickled-on-metadata": ("HEAD", "tokenizer.json", "trickle_headers"),
    "stall-on-a-body": ("GET", "tokenizer_config.json", "stall"),
    "headers-trickled-on-a-body": ("GET", "config.json", "trickle_headers"),
    "body-trickled": ("GET", WEIGHTS, "trickle"),
}


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("case", sorted(DEADLINE_FAULTS))
def test_one_deadline_bounds_a_stalling_or_trickling_hub(serve, standin_dir, download_spec, tmp_path, case):
    method, name, mode = DEADLINE_FAULTS[case]
    hub = serve(standin_dir, download_spec, faults={(method, name): mode})
    outcome = specimen.acquisition_outcome(download_spec, cache_root=tmp_path, endpoint=hub.endpoint,
                                           deadline_s=EXPIRING_DEADLINE_S)
    assert (outcome["ok"], outcome["deadline_expired"], outcome["deadline_s"]) == (False, True, EXPIRING_DEADLINE_S)
    assert f"the acquisition deadline of {EXPIRING_DEADLINE_S:g} s expired while" in outcome["error"]
    assert name in outcome["error"]  # what was being waited for
    assert left_behind(tmp_path, download_spec) == [] and hub.metadata_came_first()


BODY_FAULTS = {  # mode: a piece of the refusal
    "reset": "the connection failed after",
    "truncated": "the body ended after",
    "longer": "refused before reading it",
    "shorter": "refused before reading it",
    "longer_no_length": "the body is longer than the",
    "wrong_bytes": "differ from what the hub describes",
    "500": "expected HTTP 200 with the body of",
    "redirect_forever": "expected the file within 5 redirects",
}


@pytest.mark.slow
@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("name", ["tokenizer.json", WEIGHTS])
@pytest.mark.parametrize("mode", sorted(BODY_FAULTS))
def test_a_bad_body_is_refused_without_retry_and_nothing_is_kept(serve, standin_dir, download_spec, tmp_path, mode,
                                                                 name):
    # tokenizer.json unpinned, as pythia-14m's small files are: in transit only the hub's ETag checks its bytes
    spec = dataclasses.replace(download_spec, expected={**download_spec.expected,
                                                        "tokenizer.json": {"size": None, "sha256": None}})
    hub = serve(standin_dir, spec, faults={("GET", name): mode})
    with pytest.raises(SpecimenError) as error:
        acquire(spec, tmp_path, hub)
    assert not isinstance(error.value, DeadlineExpired) and BODY_FAULTS[mode] in str(error.value)
    assert name in str(error.value) and left_behind(tmp_path, spec) == []
    before = spec.files.index(name)  # the bodies fetched before this one, in allowlist order
    if mode == "redirect_forever":
        assert len(hub.gets()) == before + 6  # the request and five redirects, then refused
    elif mode == "500":
        assert len(hub.gets()) == before + 1  # not retried


def test_no_hub_fails_at_once_naming_the_endpoint(download_spec, tmp_path):
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    outcome = specimen.acquisition_outcome(download_spec, cache_root=tmp_path, endpoint=endpoint)
    assert (outcome["ok"], outcome["acquisition"], outcome["deadline_expired"]) == (False, "download", False)
    assert "expected the hub endpoint to accept a connection" in outcome["error"] and "--artifacts" in outcome["error"]
    assert outcome["directory"] is None and outcome["verification"] is None
    assert specimen.acquisition_cause(outcome) == "no connection to the hub"


@pytest.mark.slow
def test_a_download_through_a_connect_proxy(serve, standin_dir, download_spec, tmp_path, monkeypatch):
    hub = serve(standin_dir, download_spec)
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", hub.endpoint)  # the loopback hub tunnels to itself
    assert acquire(download_spec, tmp_path, hub)["acquisition"] == "download"
    assert set(hub.tunnels) == {hub.endpoint.removeprefix("http://")} and len(hub.tunnels) == len(hub.requests)


# --- as the real hub lists pythia-14m (built from ../shared/reference/pythia-14m; skipped without it) ------------


@pytest.mark.slow
@pytest.mark.parametrize("listing", ["six", "five"])
def test_the_readme_is_never_asked_for_and_a_missing_generation_config_is_absent_not_substituted(
        serve, replica_listing, replica_listing_spec, tmp_path, listing):
    hub = serve(replica_listing[listing], replica_listing_spec)
    result = acquire(replica_listing_spec, tmp_path, hub)
    assert "README.md" not in hub.requested() and hub.metadata_came_first()
    absent = [] if listing == "six" else [GENERATION_CONFIG]
    assert result["remote"]["absent_at_revision"] == absent
    assert (GENERATION_CONFIG in hub.requested("GET")) is (listing == "six")
    row = next(r for r in result["verification"]["files"] if r["name"] == GENERATION_CONFIG)
    assert (row["present"], row["absent_at_revision"]) == (listing == "six", listing == "five") and row["ok"]
    again = specimen.acquire(replica_listing_spec, cache_root=tmp_path, offline=True)  # the cache keeps the absence
    assert again["acquisition"] == "reuse:project_cache"
    assert next(r for r in again["verification"]["files"] if r["name"] == GENERATION_CONFIG)["ok"]
