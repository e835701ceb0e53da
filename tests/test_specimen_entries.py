"""What verification reads, and when: entries judged before anything is opened, one rule for extra files,
sizes capped before reading, files that change or are malformed refused by name."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

import inner_session
from inferlab import protocol, specimen
from inferlab.specimen import entries, files

HANG_GUARD_S = 30  # a verification that opened a FIFO would block here forever
WEIGHTS = "model.safetensors"
REPO_ROOT = Path(__file__).resolve().parents[1]

inner_session.preload("torch", "transformers")  # the in-process experiment below loads the model


def row_of(report: dict, name: str) -> dict:
    return next(r for r in report["files"] if r["name"] == name)


def entry_of(report: dict, path: str) -> dict:
    return next(e for e in report["entries"] if e["path"] == path)


# --- non-regular files are refused without being opened --------------------------------------------------


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_fifo_in_place_of_an_allowlisted_file_is_refused_without_hanging(standin_copy, standin_spec):
    (standin_copy / "tokenizer.json").unlink()
    os.mkfifo(standin_copy / "tokenizer.json")
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    row = row_of(report, "tokenizer.json")
    assert not report["ok"] and row["present"] and "a fifo, not a regular file" in row["problem"]
    assert entry_of(report, "tokenizer.json")["type"] == "fifo"


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_fifo_beside_the_specimen_is_refused_and_recorded(standin_copy, standin_spec):
    os.mkfifo(standin_copy / "pipe")
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert report["extra_files"] == ["pipe"] and entry_of(report, "pipe")["verdict"] == "refused"


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_symlink_to_a_device_is_refused_without_reading_it(standin_copy, standin_spec):
    (standin_copy / WEIGHTS).unlink()
    (standin_copy / WEIGHTS).symlink_to("/dev/zero")  # reading it would never end
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert "a symlink to a char_device" in row_of(report, WEIGHTS)["problem"]
    assert entry_of(report, WEIGHTS)["target"] == "/dev/zero"


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_device_node_is_refused(standin_copy, standin_spec):
    try:
        os.mknod(standin_copy / "device", 0o600 | 0o020000, os.makedev(1, 5))  # a char device like /dev/zero
    except (PermissionError, OSError) as error:
        pytest.skip(f"cannot create a device node here: {error}")
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert entry_of(report, "device")["type"] == "char_device" and report["extra_files"] == ["device"]


def test_a_socket_file_is_refused(standin_copy, standin_spec):
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(standin_copy / "sock"))
        report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert entry_of(report, "sock")["type"] == "socket" and not report["ok"]


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_fifo_swapped_in_after_the_listing_is_refused_once_opened(standin_copy, tmp_path):
    path = tmp_path / "swapped"
    path.write_bytes(b"{}")
    listed = os.stat(path)
    path.unlink()
    os.mkfifo(path)
    os.utime(path)  # the listing is stale: read_stable must judge what it actually opened
    with pytest.raises(files.FileCheckError, match="expected a regular file|replaced"):
        files.read_stable(path)
    assert listed.st_size == 2


# --- one symlink rule ------------------------------------------------------------------------------------


def test_a_hub_cache_snapshot_of_symlinks_to_blobs_is_accepted(standin_dir, standin_spec, tmp_path):
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for path in standin_dir.iterdir():
        shutil.copyfile(path, blobs / f"blob-{path.name}")
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", f"blob-{path.name}"))
    report = specimen.check_specimen_files(snapshot, standin_spec)
    assert report["ok"], report["problems"]
    assert row_of(report, WEIGHTS)["link_target"] == f"../../blobs/blob-{WEIGHTS}"


def test_a_symlinked_folder_is_refused_and_recorded_not_followed(standin_copy, standin_spec, tmp_path):
    code = tmp_path / "elsewhere"
    code.mkdir()
    (code / "modeling_evil.py").write_text("import os\n")
    (standin_copy / "extras").symlink_to(code)
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    extras = entry_of(report, "extras")
    assert (extras["type"], extras["target_type"], extras["verdict"]) == ("symlink", "directory", "refused")
    assert report["extra_files"] == ["extras"] and not any("modeling_evil" in e["path"] for e in report["entries"])


def test_a_dangling_symlink_is_refused(standin_copy, standin_spec):
    (standin_copy / "generation_config.json").unlink()
    (standin_copy / "generation_config.json").symlink_to("nowhere.json")
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert "a symlink to nothing" in row_of(report, "generation_config.json")["problem"]


# --- the extra-file rule, exactly as docs/specimens.md states it -------------------------------------------

EXTRA_ENTRIES = {
    # relative path: expected verdict
    "README.md": "inert",
    ".gitattributes": "inert",
    ".DS_Store": "inert",
    "Thumbs.db": "inert",
    "sub/.DS_Store": "refused",
    "notes.txt": "refused",
    "added_tokens.json": "refused",
    "chat_template.jinja": "refused",
    "model.bf16.safetensors": "refused",
    "pytorch_model.bin": "refused",
    "optimizer.pt": "refused",
    "tokenizer.pkl": "refused",
    "modeling_gpt_neox.py": "refused",
    ".cache/huggingface/.gitignore": "hub_bookkeeping",
    ".cache/huggingface/download/config.json.metadata": "hub_bookkeeping",
    ".cache/huggingface/download/config.json.lock": "hub_bookkeeping",
    ".cache/huggingface/evil.py": "refused",
    ".cache/huggingface/download/pytorch_model.bin": "refused",
    ".cache/huggingface/download/model.safetensors.incomplete": "refused",
    "sub/README.md": "refused",
    "sub/config.json": "refused",
}


@pytest.mark.slow
@pytest.mark.parametrize("relative", sorted(EXTRA_ENTRIES))
def test_each_extra_entry_gets_the_documented_verdict(standin_copy, standin_spec, relative):
    path = standin_copy / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert entry_of(report, relative)["verdict"] == EXTRA_ENTRIES[relative]
    assert report["ok"] is (EXTRA_ENTRIES[relative] != "refused")
    assert (relative in report["extra_files"]) is (EXTRA_ENTRIES[relative] == "refused")


def test_every_entry_seen_is_recorded_with_its_verdict(standin_copy, standin_spec):
    (standin_copy / "README.md").write_text("card\n")
    (standin_copy / "empty").mkdir()
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    recorded = {entry["path"]: entry["verdict"] for entry in report["entries"]}
    assert recorded == {**{name: "allowlisted" for name in protocol.ALLOWLISTED_FILES},
                        "README.md": "inert", "empty": "directory"}
    assert all(entry["reason"] for entry in report["entries"])


def test_the_specimens_page_states_the_rule_the_code_applies():
    page = (REPO_ROOT / "docs" / "specimens.md").read_text()
    for inert in entries.INERT_FILES + entries.DESKTOP_BOOKKEEPING:
        assert f"`{inert}`" in page
    for patterns in entries.REFUSED_PATTERNS.values():
        for pattern in patterns:
            assert f"`{pattern}`" in page, pattern
    assert "`.cache/huggingface/`" in page and f"{entries.MAX_ENTRIES:,}" in page


@pytest.mark.slow
def test_a_huge_folder_is_not_walked_whole(standin_copy, standin_spec):
    crowd = standin_copy / "crowd"
    crowd.mkdir()
    for index in range(entries.MAX_ENTRIES + 5):
        (crowd / f"f{index:05d}").touch()
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert len(report["entries"]) == entries.MAX_ENTRIES and not report["ok"]
    assert any(f"more than {entries.MAX_ENTRIES} entries" in problem for problem in report["problems"])


# --- read once, unchanged, and only under the cap ---------------------------------------------------------


def test_a_file_that_changes_while_it_is_hashed_is_refused(standin_copy, standin_spec, monkeypatch):
    real_chunks = files._chunks
    target = standin_copy / "tokenizer.json"

    def appending_chunks(handle):
        for index, chunk in enumerate(real_chunks(handle)):
            if index == 0 and os.fstat(handle.fileno()).st_ino == target.stat().st_ino:
                with open(target, "ab") as writer:  # another program appends while we read
                    writer.write(b" ")
            yield chunk

    monkeypatch.setattr(files, "_chunks", appending_chunks)
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    problem = row_of(report, "tokenizer.json")["problem"]
    assert "changed while being read" in problem and "size 835500 -> 835501 bytes" in problem


def test_the_bundle_cap_is_checked_on_reuse_before_any_file_is_read(standin_copy, standin_spec, monkeypatch):
    with open(standin_copy / "tokenizer.json", "r+b") as handle:
        handle.truncate(50_000_000)  # sparse: 50 MB on paper, nothing on disk

    def must_not_read(*args, **kwargs):
        raise AssertionError("a file was read although the bundle is over the cap")

    monkeypatch.setattr("inferlab.specimen.verification.read_stable", must_not_read)
    outcome = specimen.acquisition_outcome(standin_spec, artifacts_dir=standin_copy, cache_root=standin_copy / "c")
    assert outcome["ok"] is False and outcome["verification"]["bundle_bytes"] > protocol.BUNDLE_CAP_BYTES
    assert f"to total at most {protocol.BUNDLE_CAP_BYTES} bytes (the bundle cap)" in outcome["error"]
    assert row_of(outcome["verification"], WEIGHTS)["diagnosis"] is None  # an unread weight is not accused


def test_the_bundle_cap_is_checked_on_the_project_cache_too(standin_dir, standin_spec, tmp_path):
    cached = specimen.cache_dir(standin_spec, tmp_path)
    shutil.copytree(standin_dir, cached)
    with open(cached / "tokenizer.json", "r+b") as handle:
        handle.truncate(50_000_000)
    outcome = specimen.acquisition_outcome(standin_spec, cache_root=tmp_path)
    assert outcome["acquisition"] == "reuse:project_cache" and "(the bundle cap)" in outcome["error"]


# --- malformed files are refused by name ----------------------------------------------------------------

MALFORMED = {
    "deeply-nested-tokenizer": ("tokenizer.json", b"[" * 200_000 + b"]" * 200_000,
                                "expected readable JSON, actual: nested too deeply to parse"),
    "not-json": ("config.json", b"{model_type: gpt_neox", "expected readable JSON"),
    "not-utf8": ("tokenizer_config.json", b'{"a": "\xff\xfe"}', "expected UTF-8 JSON"),
    "not-an-object": ("special_tokens_map.json", b"[]", "expected a JSON object, actual list"),
    "other-architecture": ("config.json", b'{"model_type": "llama"}', "expected model_type 'gpt_neox'"),
    "tokenizer-without-model": ("tokenizer.json", b'{"version": "1.0"}', "expected a tokenizer with a 'model' object"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_file_is_refused_naming_it(standin_copy, standin_spec, case):
    name, data, evidence = MALFORMED[case]
    (standin_copy / name).write_bytes(data)
    unpinned = {**standin_spec.expected, name: {"size": None, "sha256": None}}
    spec = standin_spec.__class__(**{**standin_spec.__dict__, "expected": unpinned})
    outcome = specimen.acquisition_outcome(spec, artifacts_dir=standin_copy)
    assert outcome["ok"] is False and f"{name} in {standin_copy}: {evidence}" in outcome["error"]


def test_tilde_in_artifacts_is_the_home_folder(standin_dir, standin_spec, tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(standin_dir, home / "pythia")
    monkeypatch.setenv("HOME", str(home))
    outcome = specimen.acquisition_outcome(standin_spec, artifacts_dir="~/pythia")
    assert outcome["ok"] and outcome["directory"] == str(home / "pythia")


# --- the experiment keeps its acquisition record whatever the file holds -------------------------------------


@pytest.fixture
def project(pytester, monkeypatch):
    """A scratch copy of the experiment files, so a run writes no cache inside the repository."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    shutil.copytree(REPO_ROOT / "experiments", pytester.path / "experiments",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "artifacts", pytester.path / "artifacts", ignore=shutil.ignore_patterns("cache"))
    for name in ("conftest.py", "pytest.ini"):
        shutil.copy(REPO_ROOT / name, pytester.path / name)
    return pytester


def test_a_nested_tokenizer_through_the_experiment_is_refused_with_its_record(project, standin_copy):
    # In process: no signal or exit status of a real interpreter is asked about (see inner_session.preload above).
    (standin_copy / "tokenizer.json").write_bytes(b"[" * 200_000 + b"]" * 200_000)
    result = project.runpytest("experiments/test_10_specimen.py", "--specimen", "standin",
                               "--artifacts", str(standin_copy), "--record-dir", "run")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    records = [json.loads(line) for line in (project.path / "run" / "records.jsonl").read_text().splitlines()]
    acquisition = next(r for r in records if r["kind"] == "artifact_acquisition")
    assert acquisition["ok"] is False and "tokenizer.json" in acquisition["error"]
    assert "nested too deeply" in acquisition["error"] and acquisition["deadline_s"] == protocol.ACQUISITION_DEADLINE_S
    tokenizer = next(r for r in records if r["kind"] == "artifact_file" and r["name"] == "tokenizer.json")
    assert tokenizer["ok"] is False
    errored = [r for r in records if r["kind"] == "test_outcome" and r["outcome"] == "error"]
    assert errored == []  # refusals are failures with evidence, never crashes
