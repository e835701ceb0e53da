"""Specimen specs and verified reuse: every damaged directory is refused with evidence, and nothing is loaded."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest

from inferlab import protocol, specimen
from inferlab.measure import loading
from inferlab.specimen import SpecimenError

PINS_FILE = "model.safetensors"


# --- specs -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pythia-14m", "standin"])
def test_shipped_spec_allowlist_is_the_protocol_allowlist(name):
    spec = specimen.load_spec(name)
    assert spec.files == protocol.ALLOWLISTED_FILES and spec.bundle_cap_bytes == protocol.BUNDLE_CAP_BYTES


def test_pythia_spec_pins_the_publisher_weights():
    spec = specimen.load_spec("pythia-14m")
    assert (spec.repo_id, spec.revision, spec.synthetic) == (protocol.PINNED_REPO_ID, protocol.PINNED_REVISION, False)
    assert spec.expected[PINS_FILE] == {
        "size": 28_143_920,
        "sha256": "116a02532db461f91386a5b20f942ff2c8d4de7341e21b55caafc3d7b25f49a1",
    }


def _write_spec(root, name, **changes):
    data = json.loads((specimen.DEFAULT_ARTIFACTS_ROOT / "standin.json").read_text())
    data.update(changes)
    (root / f"{name}.json").write_text(json.dumps(data))
    return root / f"{name}.json"


def test_a_third_specimen_needs_only_a_json_file(tmp_path):
    _write_spec(tmp_path, "third", description="another specimen")
    spec = specimen.load_spec("third", tmp_path)
    assert (spec.name, spec.description) == ("third", "another specimen")


def test_unknown_specimen_names_the_file(tmp_path):
    with pytest.raises(SpecimenError, match=r"nowhere\.json.*missing"):
        specimen.load_spec("nowhere", tmp_path)


def test_bad_json_names_the_file(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(SpecimenError, match=r"broken\.json.*unreadable"):
        specimen.load_spec("broken", tmp_path)


def test_missing_field_is_named(tmp_path):
    data = json.loads((specimen.DEFAULT_ARTIFACTS_ROOT / "standin.json").read_text())
    del data["expected"]
    (tmp_path / "partial.json").write_text(json.dumps(data))
    with pytest.raises(SpecimenError, match=r"partial\.json.*missing \['expected'\]"):
        specimen.load_spec("partial", tmp_path)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"revision": "main"}, "revision: expected a 40-hex commit hash, actual 'main'"),
        ({"files": list(protocol.ALLOWLISTED_FILES[:-1]) + ["pytorch_model.bin"]}, "files: expected the allowlist"),
        ({"bundle_cap_bytes": protocol.BUNDLE_CAP_BYTES + 1}, "bundle_cap_bytes: expected an int"),
    ],
    ids=["branch-revision", "allowlist-differs", "cap-above-protocol"],
)
def test_spec_departing_from_the_protocol_is_refused(tmp_path, changes, message):
    _write_spec(tmp_path, "bad", **changes)
    with pytest.raises(SpecimenError, match="bad.json") as error:
        specimen.load_spec("bad", tmp_path)
    assert message in str(error.value)


def test_every_shipped_spec_says_which_files_are_optional():
    for path in sorted(specimen.DEFAULT_ARTIFACTS_ROOT.glob("*.json")):
        spec = specimen.load_spec(path.stem)
        assert spec.optional_files == ("generation_config.json",), path
        assert spec.required_files == tuple(n for n in protocol.ALLOWLISTED_FILES if n != "generation_config.json")


def test_pythia_spec_carries_the_published_small_file_hashes_as_reference_only():
    spec = specimen.load_spec("pythia-14m")
    assert spec.reference["revision"] == "cf967c0a9a04383db6f7b1108d86b2962634b4ac"
    assert spec.reference["files"]["tokenizer.json"] == {
        "size": 2_114_042, "sha256": "870f4e2baa6b683221fa52004d5d6f40ab8c9d31961617304b78c910c2c3caf2"}
    assert sorted(spec.reference["files"]) == sorted(
        ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"])
    # informational: the pins themselves stay null, so a differing small file is never refused
    assert all(spec.expected[name] == {"size": None, "sha256": None} for name in spec.reference["files"])


def _standin_data():
    return json.loads((specimen.DEFAULT_ARTIFACTS_ROOT / "standin.json").read_text())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("optional_files"), "missing ['optional_files']"),
        (lambda d: d.update(optional_files=["config.json"]), "optional_files: expected a list drawn from"),
        (lambda d: d["expected"].update({"config.json": {"absent": True}}),
         "expected[config.json]: pinned absent, but config.json is required"),
        (lambda d: d["expected"].update({"generation_config.json": {"absent": False}}),
         "expected[generation_config.json].absent: expected true"),
        (lambda d: d["expected"].update({"model.safetensors": {"size": 1, "sha256": None}}),
         "expected[model.safetensors]: expected a pinned size and sha256"),
        (lambda d: d.update(reference={"revision": "main", "note": "", "files": {}}),
         "reference.revision: expected a 40-hex commit hash"),
        (lambda d: d.update(reference={"revision": "0" * 40, "note": "", "files": {"README.md": {}}}),
         "reference.files: expected allowlisted names"),
        (lambda d: d.update(mirror="https://example.org"), "actual extra ['mirror']"),
    ],
    ids=["no-optional-list", "required-file-listed-optional", "required-file-pinned-absent", "absent-false",
         "weights-unpinned", "reference-branch", "reference-unknown-file", "unknown-key"],
)
def test_spec_format_problems_are_refused(tmp_path, change, message):
    data = _standin_data()
    change(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(SpecimenError, match="bad.json") as error:
        specimen.load_spec("bad", tmp_path)
    assert message in str(error.value)


def test_an_optional_file_pinned_absent_is_accepted_when_missing_and_refused_when_present(standin_copy, tmp_path):
    data = _standin_data()
    data["expected"]["generation_config.json"] = {"absent": True}
    (tmp_path / "absent.json").write_text(json.dumps(data))
    spec = specimen.load_spec("absent", tmp_path)
    present = specimen.check_specimen_files(standin_copy, spec)
    row = next(r for r in present["files"] if r["name"] == "generation_config.json")
    assert not row["ok"] and "pins it absent" in row["problem"] and row["expected_absent"] is True
    (standin_copy / "generation_config.json").unlink()
    missing = specimen.check_specimen_files(standin_copy, spec)
    row = next(r for r in missing["files"] if r["name"] == "generation_config.json")
    assert missing["ok"] and (row["ok"], row["present"], row["absent_at_revision"]) == (True, False, True)


def test_an_optional_file_pinned_present_is_refused_when_missing(standin_copy, standin_spec):
    (standin_copy / "generation_config.json").unlink()
    rows = specimen.check_specimen_files(standin_copy, standin_spec)["files"]
    row = next(r for r in rows if r["name"] == "generation_config.json")
    assert not row["ok"] and "pins it present" in row["problem"] and row["absent_at_revision"] is False


# --- reuse of an explicit directory --------------------------------------------------------


def test_intact_artifacts_dir_is_reused(standin_dir, standin_spec, tmp_path):
    result = specimen.acquire(standin_spec, artifacts_dir=standin_dir, cache_root=tmp_path / "cache")
    assert (result["acquisition"], result["verification"]["ok"]) == ("reuse:artifacts_dir", True)
    assert not (tmp_path / "cache").exists()


def flip_byte(directory):
    path = directory / PINS_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return [PINS_FILE, "sha256 expected"]


def truncate_weights(directory):
    path = directory / PINS_FILE
    path.write_bytes(path.read_bytes()[:1000])
    return [PINS_FILE, "size expected 28143920 bytes, actual 1000 bytes"]


def remove_tokenizer(directory):
    (directory / "tokenizer.json").unlink()
    return ["tokenizer.json", "actual: missing"]


def add_pickle_weights(directory):
    (directory / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    return ["pytorch_model.bin", "weights (name matches a refused pattern)"]


def add_tokens_file(directory):
    # Not weights or code, but a tokenizer loader would read it and grow the vocabulary.
    (directory / "added_tokens.json").write_text('{"<|boat|>": 50304}')
    return ["added_tokens.json", "not part of the specimen: a loader reads files by name from this folder"]


def ask_for_remote_code(directory):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomModel"}
    path.write_text(json.dumps(config))
    return ["config.json", "auto_map"]


DAMAGES = [flip_byte, truncate_weights, remove_tokenizer, add_pickle_weights, add_tokens_file, ask_for_remote_code]


@pytest.fixture
def refuse_model_load(monkeypatch):
    """Make any attempt to build the model fail loudly: a refused directory must never reach it."""
    from transformers import GPTNeoXForCausalLM, GPTNeoXTokenizerFast

    def forbidden(*args, **kwargs):
        raise AssertionError("from_pretrained was called on an unverified directory")

    monkeypatch.setattr(GPTNeoXForCausalLM, "from_pretrained", forbidden)
    monkeypatch.setattr(GPTNeoXTokenizerFast, "from_pretrained", forbidden)


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__.replace("_", "-"))
def test_damaged_artifacts_dir_is_refused(standin_copy, standin_spec, tmp_path, damage):
    evidence = damage(standin_copy)
    with pytest.raises(SpecimenError) as error:
        specimen.acquire(standin_spec, artifacts_dir=standin_copy, cache_root=tmp_path / "cache")
    assert all(part in str(error.value) for part in evidence), str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__.replace("_", "-"))
def test_damaged_directory_is_never_loaded(standin_copy, standin_spec, refuse_model_load, damage):
    damage(standin_copy)
    with pytest.raises(SpecimenError, match=re.escape(str(standin_copy))):
        loading.load_specimen(standin_copy, standin_spec)


def test_remote_code_request_is_refused_even_when_config_is_unpinned(standin_copy, standin_spec):
    # pythia-14m pins only the weights: auto_map must be caught on its own, not by a hash.
    unpinned = dict(standin_spec.expected, **{"config.json": {"size": None, "sha256": None}})
    spec = dataclasses.replace(standin_spec, expected=unpinned)
    ask_for_remote_code(standin_copy)
    problems = specimen.check_specimen_files(standin_copy, spec)["problems"]
    assert len(problems) == 1 and "config.json" in problems[0] and "auto_map" in problems[0]


def test_flipped_byte_message_gives_expected_and_actual_hashes(standin_copy, standin_spec):
    flip_byte(standin_copy)
    actual = specimen.sha256_file(standin_copy / PINS_FILE)
    row = next(r for r in specimen.check_specimen_files(standin_copy, standin_spec)["files"] if r["name"] == PINS_FILE)
    assert (row["ok"], row["sha256"]) == (False, actual)
    assert standin_spec.expected[PINS_FILE]["sha256"] in row["problem"] and actual in row["problem"]


def test_unpinned_files_are_hashed_and_recorded(standin_dir):
    spec = specimen.load_spec("pythia-14m")
    rows = {r["name"]: r for r in specimen.check_specimen_files(standin_dir, spec)["files"]}
    assert rows["config.json"]["sha256"] == specimen.sha256_file(standin_dir / "config.json")
    assert rows["config.json"]["expected_sha256"] is None and rows["config.json"]["ok"]


# --- the project cache -----------------------------------------------------------------------


@pytest.mark.slow
def test_synthetic_specimen_builds_offline_then_reuses_the_project_cache(standin_spec, tmp_path):
    first = specimen.acquire(standin_spec, cache_root=tmp_path, offline=True)
    second = specimen.acquire(standin_spec, cache_root=tmp_path, offline=True)
    assert (first["acquisition"], second["acquisition"]) == ("built_offline", "reuse:project_cache")
    assert first["directory"] == second["directory"] == str(specimen.cache_dir(standin_spec, tmp_path))


def test_corrupt_project_cache_is_refused_not_rebuilt(standin_dir, standin_spec, tmp_path):
    cached = specimen.cache_dir(standin_spec, tmp_path)
    shutil.copytree(standin_dir, cached)
    truncate_weights(cached)
    with pytest.raises(SpecimenError, match="size expected 28143920 bytes, actual 1000 bytes") as error:
        specimen.acquire(standin_spec, cache_root=tmp_path, offline=True)
    assert (cached / PINS_FILE).stat().st_size == 1000  # nothing repaired silently
    message = str(error.value)
    assert f"the project cache {cached} failed verification" in message and f"{PINS_FILE} in {cached}" in message
    assert f"delete that folder (rm -r '{cached}') and run again" in message


def test_damaged_project_cache_outcome_keeps_its_per_file_evidence(standin_dir, standin_spec, tmp_path):
    cached = specimen.cache_dir(standin_spec, tmp_path)
    shutil.copytree(standin_dir, cached)
    (cached / "tokenizer_config.json").write_text("{}")
    outcome = specimen.acquisition_outcome(standin_spec, cache_root=tmp_path, offline=True)
    assert (outcome["ok"], outcome["acquisition"], outcome["directory"]) == (False, "reuse:project_cache", str(cached))
    failed = [row["name"] for row in outcome["verification"]["files"] if not row["ok"]]
    assert failed == ["tokenizer_config.json"] and "rm -r" in outcome["error"]


def test_hub_download_metadata_is_not_an_extra_file(standin_copy, standin_spec):
    """huggingface_hub's local_dir bookkeeping (.cache/huggingface/) is tolerated and recorded; it is never loaded."""
    metadata = standin_copy / ".cache" / "huggingface" / "download"
    metadata.mkdir(parents=True)
    (metadata / "model.safetensors.metadata").write_text("commit\netag\n")
    (metadata / "model.safetensors.lock").write_text("")
    (standin_copy / ".cache" / "huggingface" / ".gitignore").write_text("*\n")
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    verdicts = {entry["path"]: entry["verdict"] for entry in report["entries"]}
    assert report["ok"] and verdicts[".cache/huggingface/download/model.safetensors.metadata"] == "hub_bookkeeping"
    assert verdicts[".cache/huggingface/.gitignore"] == "hub_bookkeeping" and verdicts[".cache"] == "directory"
