"""Acquisition as the real hub lists pythia-14m: six or five files, a README that is never requested,
small files compared with the published copies, and a wrong weight file named for what it is.

The bundle (tests/conftest.py: replica_listing) is built from ../shared/reference/pythia-14m; these
tests skip, naming that folder, where it is absent.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
from pathlib import Path

import pytest

from inferlab import specimen
from inferlab.specimen import SpecimenError, weights

WEIGHTS = "model.safetensors"
GENERATION_CONFIG = "generation_config.json"
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def rows(result: dict) -> dict:
    return {row["name"]: row for row in result["verification"]["files"]}


@pytest.mark.slow
def test_all_six_files_are_fetched_and_the_readme_never_requested(serve, replica_listing, replica_listing_spec,
                                                                  tmp_path):
    hub = serve(replica_listing["six"], replica_listing_spec)
    result = specimen.acquire(replica_listing_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert sorted(hub.requested("GET")) == sorted(replica_listing_spec.files)
    assert "README.md" not in hub.requested() and hub.metadata_came_first()
    found = rows(result)
    assert {name: found[name]["reference"]["status"] for name in SMALL_FILES} == dict.fromkeys(SMALL_FILES, "matches")
    assert found[GENERATION_CONFIG]["present"] and found[GENERATION_CONFIG]["absent_at_revision"] is False
    assert found[WEIGHTS]["reference"] is None and result["remote"]["absent_at_revision"] == []


@pytest.mark.slow
def test_five_files_without_generation_config_is_recorded_absent_not_substituted(serve, replica_listing,
                                                                                 replica_listing_spec, tmp_path):
    hub = serve(replica_listing["five"], replica_listing_spec)
    result = specimen.acquire(replica_listing_spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert result["acquisition"] == "download" and result["remote"]["absent_at_revision"] == [GENERATION_CONFIG]
    assert result["remote"]["files"][GENERATION_CONFIG]["http_status"] == 404
    assert GENERATION_CONFIG not in hub.requested("GET") and "README.md" not in hub.requested()
    row = rows(result)[GENERATION_CONFIG]
    assert (row["ok"], row["present"], row["absent_at_revision"]) == (True, False, True)
    assert sorted(p.name for p in Path(result["directory"]).iterdir()) == sorted(
        set(replica_listing_spec.files) - {GENERATION_CONFIG})
    again = specimen.acquire(replica_listing_spec, cache_root=tmp_path, offline=True)  # the cache reuses the absence
    assert again["acquisition"] == "reuse:project_cache" and rows(again)[GENERATION_CONFIG]["absent_at_revision"]


def test_a_required_file_the_hub_lacks_is_refused_before_any_body(serve, replica_listing, replica_listing_spec,
                                                                  tmp_path):
    listing = tmp_path / "listing"
    shutil.copytree(replica_listing["five"], listing, symlinks=True)
    (listing / "special_tokens_map.json").unlink()
    hub = serve(listing, replica_listing_spec)
    with pytest.raises(SpecimenError, match="special_tokens_map.json at .*: expected a file, actual: HTTP 404"):
        specimen.acquire(replica_listing_spec, cache_root=tmp_path / "cache", endpoint=hub.endpoint)
    assert hub.gets() == []


def test_a_file_pinned_absent_that_the_hub_lists_is_refused_before_any_body(serve, replica_listing,
                                                                            replica_listing_spec, tmp_path):
    spec = dataclasses.replace(replica_listing_spec,
                               expected={**replica_listing_spec.expected, GENERATION_CONFIG: {"absent": True}})
    hub = serve(replica_listing["six"], spec)
    with pytest.raises(SpecimenError, match="generation_config.json: the spec pins it absent at the revision"):
        specimen.acquire(spec, cache_root=tmp_path, endpoint=hub.endpoint)
    assert hub.gets() == []


def test_a_small_file_unlike_the_published_copy_is_recorded_differs_never_refused(replica_listing,
                                                                                   replica_listing_spec, tmp_path):
    copy = Path(shutil.copytree(replica_listing["five"], tmp_path / "copy"))
    (copy / "README.md").unlink()
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").unlink()  # a real file in place of the symlink
    (copy / "config.json").write_text(json.dumps({**config, "use_cache": False}))
    report = specimen.check_specimen_files(copy, replica_listing_spec)
    found = {row["name"]: row for row in report["files"]}
    assert report["ok"] and found["config.json"]["reference"]["status"] == "differs"
    assert found["tokenizer.json"]["reference"] == {
        "revision": "cf967c0a9a04383db6f7b1108d86b2962634b4ac", "size": 2_114_042,
        "sha256": "870f4e2baa6b683221fa52004d5d6f40ab8c9d31961617304b78c910c2c3caf2", "status": "matches"}


def test_a_missing_required_file_shows_reference_absent(replica_listing, replica_listing_spec, tmp_path):
    copy = Path(shutil.copytree(replica_listing["five"], tmp_path / "copy", symlinks=True))
    (copy / "tokenizer_config.json").unlink()
    report = specimen.check_specimen_files(copy, replica_listing_spec)
    row = next(r for r in report["files"] if r["name"] == "tokenizer_config.json")
    assert not report["ok"] and row["reference"]["status"] == "absent"


# --- a wrong weight file is named ---------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict, data_bytes: int = None) -> Path:
    """A file with this header (name -> (dtype, shape, nbytes)) and zero data (sparse), optionally cut short."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + (offset if data_bytes is None else data_bytes))
    return path


def real_layout(reference_dir: Path) -> dict:
    """pythia-14m's tensors (name -> (dtype, shape, nbytes)) from the published header."""
    header = json.loads((reference_dir / "model.safetensors.header").read_bytes())
    return {name: (entry["dtype"], entry["shape"], entry["data_offsets"][1] - entry["data_offsets"][0])
            for name, entry in header.items() if name != "__metadata__"}


@pytest.fixture
def reference_layout():
    from conftest import require_reference_dir

    return real_layout(require_reference_dir())


def older_generation(path: Path, layout: dict) -> Path:
    """The pre-2026-02-27 file: the float16 weights plus six bool [1, 1, 2048, 2048] attention masks (~53.3 MB)."""
    masks = {f"gpt_neox.layers.{i}.attention.bias": ("BOOL", [1, 1, 2048, 2048], 2048 * 2048) for i in range(6)}
    return write_safetensors(path, {**layout, **masks})


def float32_conversion(path: Path, layout: dict) -> Path:
    return write_safetensors(path, {name: ("F32", shape, nbytes * 2) for name, (_, shape, nbytes) in layout.items()})


def truncated_download(path: Path, layout: dict) -> Path:
    return write_safetensors(path, layout, data_bytes=10_000_000)


def cut_inside_the_header(path: Path, layout: dict) -> Path:
    write_safetensors(path, layout)
    with open(path, "r+b") as handle:
        handle.truncate(1000)
    return path


WRONG_COPIES = {
    "older_generation": (older_generation, "pythia-14m-deduped"),
    "float32_conversion": (float32_conversion, "a float32 conversion"),
    "truncated": (truncated_download, "a truncated file: its header needs"),
    "truncated-inside-header": (cut_inside_the_header, "a truncated file: the header needs"),
}


@pytest.mark.parametrize("case", sorted(WRONG_COPIES))
def test_a_recognisable_wrong_weight_file_is_named(standin_copy, reference_layout, case):
    make, evidence = WRONG_COPIES[case]
    spec = specimen.load_spec("pythia-14m")
    (standin_copy / WEIGHTS).unlink()
    make(standin_copy / WEIGHTS, reference_layout)
    outcome = specimen.acquisition_outcome(spec, artifacts_dir=standin_copy)
    row = next(r for r in outcome["verification"]["files"] if r["name"] == WEIGHTS)
    assert outcome["ok"] is False and row["diagnosis"]["case"] == case.removesuffix("-inside-header")
    assert evidence in outcome["error"] and f"Get EleutherAI/pythia-14m at revision {spec.revision}" in outcome["error"]


def test_the_older_generation_is_about_53_mb_like_the_published_one(tmp_path, reference_layout):
    header = weights.read_header(older_generation(tmp_path / "old.safetensors", reference_layout))
    assert round(header["file_bytes"] / 1e6, 1) == 53.3 and header["dtypes"]["BOOL"] == 6


def test_the_published_layout_with_other_values_is_named(replica_listing):
    spec = specimen.load_spec("pythia-14m")  # the real pin: the listing's filler weights fail it
    report = specimen.check_specimen_files(replica_listing["six"], spec)
    row = next(r for r in report["files"] if r["name"] == WEIGHTS)
    assert row["diagnosis"]["case"] == "same_layout_other_values"
    assert row["diagnosis"]["evidence"]["header_sha256"] == spec.reference["weight_header"]["sha256"]


def test_a_header_length_beyond_the_bound_is_not_read(tmp_path):
    path = tmp_path / WEIGHTS
    path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    diagnosis = weights.diagnose(path, repo_id="r/x", revision="0" * 40, pinned_size=1, pinned_sha256="0" * 64)
    assert diagnosis["case"] == "not_safetensors" and "over the 1000000 this check reads" in diagnosis["summary"]


def test_a_local_copy_of_the_five_listed_files_and_the_readme_is_accepted(replica_listing, replica_listing_spec):
    outcome = specimen.acquisition_outcome(replica_listing_spec, artifacts_dir=replica_listing["five"])
    assert outcome["ok"] and outcome["acquisition"] == "reuse:artifacts_dir", outcome["error"]
    verdicts = {entry["path"]: entry["verdict"] for entry in outcome["verification"]["entries"]}
    assert verdicts["README.md"] == "inert" and GENERATION_CONFIG not in verdicts
    # a local copy is not the hub: its missing optional file is absent from the copy, not known absent at the revision
    row = rows(outcome)[GENERATION_CONFIG]
    assert (row["ok"], row["present"], row["absent_at_revision"]) == (True, False, False)
    assert "not checked" in row["absence"]
