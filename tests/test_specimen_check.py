"""Verification of a specimen folder: every entry judged before anything is opened, one rule for extra files, sizes
capped before reading, each file read once and refused by name, and a wrong copy named for what it is (Lab 05)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import struct
from pathlib import Path

import pytest

from conftest import require_reference_dir
from inferlab import protocol, specimen
from inferlab.specimen import check
from shared_runs import experiment_here, inferlab_command

HANG_GUARD_S = 30  # a verification that opened a FIFO or a device would block here forever
WEIGHTS = "model.safetensors"
REPO_ROOT = Path(__file__).resolve().parents[1]


def row_of(report: dict, name: str) -> dict:
    return next(r for r in report["files"] if r["name"] == name)


def entry_of(report: dict, path: str) -> dict:
    return next(e for e in report["entries"] if e["path"] == path)


# --- what is not a regular file is refused without being opened --------------------------------------------------


def replace_with(name: str, make):
    def damage(directory: Path) -> str:
        (directory / name).unlink(missing_ok=True)
        make(directory / name)
        return name
    return damage


def device_node(path: Path) -> None:
    try:
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 5))  # a char device like /dev/zero
    except OSError as error:
        pytest.skip(f"cannot create a device node here: {error}")


def unix_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))  # the socket's file outlives it


NOT_REGULAR = {  # case: (damage, the entry's type, a piece of its reason)
    "fifo-as-tokenizer": (replace_with("tokenizer.json", os.mkfifo), "fifo", "a fifo, not a regular file"),
    "fifo-beside": (replace_with("pipe", os.mkfifo), "fifo", "a fifo, not a regular file"),
    "device-beside": (replace_with("device", device_node), "char_device", "not a regular file"),
    "socket-beside": (replace_with("sock", unix_socket), "socket", "a socket, not a regular file"),
    "link-to-a-device": (replace_with(WEIGHTS, lambda p: p.symlink_to("/dev/zero")), "symlink",
                         "a symlink to a char_device"),
    "dangling-link": (replace_with("generation_config.json", lambda p: p.symlink_to("nowhere.json")), "symlink",
                      "a symlink to nothing"),
    "link-to-a-folder": (replace_with("extras", lambda p: p.symlink_to(p.parent.parent)), "symlink",
                         "a symlink to a directory"),
}


@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize("case", sorted(NOT_REGULAR))
def test_what_is_not_a_regular_file_is_refused_without_being_opened_or_followed(standin_copy, standin_spec, case):
    damage, kind, reason = NOT_REGULAR[case]
    path = damage(standin_copy)
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    entry = entry_of(report, path)
    assert not report["ok"] and entry["type"] == kind and reason in entry["reason"] and entry["verdict"] == "refused"
    assert (path in report["extra_files"]) is (path not in protocol.ALLOWLISTED_FILES)
    assert len(report["entries"]) <= len(protocol.ALLOWLISTED_FILES) + 1  # nothing behind a link was walked


@pytest.mark.timeout(HANG_GUARD_S)
def test_a_fifo_at_a_listed_files_path_is_refused_once_opened_without_hanging(tmp_path):
    path = tmp_path / "swapped"
    os.mkfifo(path)
    with pytest.raises(check.FileCheckError, match="expected the regular file that was listed"):
        check.read_stable(path)


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


# --- the extra-file rule, exactly as docs/specimens.md states it -------------------------------------------------

EXTRA_ENTRIES = {
    "README.md": "inert", ".gitattributes": "inert", ".DS_Store": "inert", "Thumbs.db": "inert",
    "sub/.DS_Store": "refused", "notes.txt": "refused", "added_tokens.json": "refused",
    "chat_template.jinja": "refused", "model.bf16.safetensors": "refused", "pytorch_model.bin": "refused",
    "optimizer.pt": "refused", "tokenizer.pkl": "refused", "modeling_gpt_neox.py": "refused",
    ".cache/huggingface/.gitignore": "hub_bookkeeping",
    ".cache/huggingface/download/config.json.metadata": "hub_bookkeeping",
    ".cache/huggingface/download/config.json.lock": "hub_bookkeeping",
    ".cache/huggingface/evil.py": "refused", ".cache/huggingface/download/pytorch_model.bin": "refused",
    ".cache/huggingface/download/model.safetensors.incomplete": "refused",
    "sub/README.md": "refused", "sub/config.json": "refused",
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


def test_the_specimens_page_states_the_rule_the_code_applies():
    page = (REPO_ROOT / "docs" / "specimens.md").read_text()
    named = check.INERT_FILES + check.DESKTOP_BOOKKEEPING + sum(check.REFUSED_PATTERNS.values(), ())
    assert [name for name in named if f"`{name}`" not in page] == []
    assert "`.cache/huggingface/`" in page and f"{check.MAX_ENTRIES:,}" in page


@pytest.mark.slow
def test_a_huge_folder_is_not_walked_whole_and_says_so_first(standin_copy, standin_spec):
    crowd = standin_copy / "crowd"
    crowd.mkdir()
    for index in range(check.MAX_ENTRIES + 5):
        (crowd / f"f{index:05d}").touch()
    report = specimen.check_specimen_files(standin_copy, standin_spec)
    assert len(report["entries"]) == check.MAX_ENTRIES and not report["ok"]
    assert report["problems"][0].endswith("is this the right folder?")
    assert len(report["problems"]) == 1 + check.EXTRA_SHOWN + 1 and "more entries" in report["problems"][-1]


# --- read once, unchanged, and only under the cap ------------------------------------------------------------------


def test_a_file_that_changes_while_it_is_hashed_is_refused(standin_copy, standin_spec, monkeypatch):
    real_chunks, target = check._chunks, standin_copy / "tokenizer.json"

    def appending_chunks(handle):
        for index, chunk in enumerate(real_chunks(handle)):
            if index == 0 and os.fstat(handle.fileno()).st_ino == target.stat().st_ino:
                with open(target, "ab") as writer:  # another program appends while it is read
                    writer.write(b" ")
            yield chunk

    monkeypatch.setattr(check, "_chunks", appending_chunks)
    problem = row_of(specimen.check_specimen_files(standin_copy, standin_spec), "tokenizer.json")["problem"]
    assert "changed while being read (size 835500 -> 835501 bytes" in problem


@pytest.mark.parametrize("where", ["artifacts_dir", "project_cache"])
def test_the_bundle_cap_is_one_problem_found_before_any_file_is_read(standin_dir, standin_spec, tmp_path,
                                                                     monkeypatch, where):
    folder = tmp_path / "copy" if where == "artifacts_dir" else specimen.cache_dir(standin_spec, tmp_path)
    shutil.copytree(standin_dir, folder)
    os.truncate(folder / "tokenizer_config.json", 40_000_000)  # sparse: 40 MB on paper, nothing on disk

    def must_not_read(*args, **kwargs):
        raise AssertionError("a file was read although the bundle is over the cap")

    monkeypatch.setattr(check, "read_stable", must_not_read)
    outcome = specimen.acquisition_outcome(standin_spec, cache_root=tmp_path,
                                           artifacts_dir=folder if where == "artifacts_dir" else None)
    verification = outcome["verification"]
    assert outcome["acquisition"] == f"reuse:{where}" and len(verification["problems"]) == 1
    assert "tokenizer_config.json is 40,000,000 bytes" in verification["problems"][0]
    assert f"to total at most {protocol.BUNDLE_CAP_BYTES} bytes (the bundle cap)" in outcome["error"]
    assert all("not read" in row["problem"] for row in verification["files"] if row["present"])
    assert row_of(verification, WEIGHTS)["diagnosis"] is None  # an unread weight file is not accused


MALFORMED = {  # case: (file, its bytes, a piece of the refusal)
    "deeply-nested-tokenizer": ("tokenizer.json", b"[" * 200_000 + b"]" * 200_000,
                                "expected readable JSON, actual: nested too deeply to parse"),
    "not-json": ("config.json", b"{model_type: gpt_neox", "expected readable JSON"),
    "not-utf8": ("tokenizer_config.json", b'{"a": "\xff\xfe"}', "expected UTF-8 JSON"),
    "not-an-object": ("special_tokens_map.json", b"[]", "expected a JSON object, actual list"),
    "other-architecture": ("config.json", b'{"model_type": "llama"}', "expected model_type 'gpt_neox'"),
    "tokenizer-without-model": ("tokenizer.json", b'{"version": "1.0"}', "expected a tokenizer with a 'model' object"),
    "remote-code": ("config.json", b'{"model_type": "gpt_neox", "auto_map": {"AutoModel": "modeling_x.X"}}',
                    "expected no remote-code request, actual keys ['auto_map']"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_file_is_refused_naming_it_even_where_it_is_unpinned(standin_copy, standin_spec, case):
    name, data, evidence = MALFORMED[case]
    (standin_copy / name).write_bytes(data)
    spec = dataclasses.replace(standin_spec, expected={**standin_spec.expected, name: {"size": None, "sha256": None}})
    report = specimen.check_specimen_files(standin_copy, spec)
    assert len(report["problems"]) == 1 and report["problems"][0].startswith(f"{name} in {standin_copy}: ")
    assert evidence in report["problems"][0]


def test_a_copy_differing_from_its_pins_gives_both_hashes_and_unpinned_files_are_still_hashed(standin_copy):
    spec = specimen.load_spec("pythia-14m")
    with open(standin_copy / WEIGHTS, "r+b") as handle:
        handle.seek(-4, os.SEEK_END)
        handle.write(b"\xff\xff\xff\xff")
    report = specimen.check_specimen_files(standin_copy, spec, others=False)
    weights, config = row_of(report, WEIGHTS), row_of(report, "config.json")
    assert spec.expected[WEIGHTS]["sha256"] in weights["problem"] and weights["sha256"] in weights["problem"]
    assert config["ok"] and config["sha256"] == specimen.sha256_file(standin_copy / "config.json")


def test_an_optional_file_pinned_absent_must_be_missing_and_one_pinned_present_must_be_there(standin_copy,
                                                                                            standin_spec):
    optional = "generation_config.json"
    absent = dataclasses.replace(standin_spec, name="absent", expected={**standin_spec.expected, optional: {
        "absent": True}})
    present = row_of(specimen.check_specimen_files(standin_copy, absent, others=False), optional)
    assert not present["ok"] and "the spec pins it absent" in present["problem"]
    (standin_copy / optional).unlink()
    missing = {spec.name: row_of(specimen.check_specimen_files(standin_copy, spec, others=False), optional)
               for spec in (absent, standin_spec)}
    assert (missing["absent"]["ok"], missing["absent"]["absent_at_revision"]) == (True, True)
    assert not missing["standin"]["ok"] and "pins it present" in missing["standin"]["problem"]


# --- the Lab 05 wrong copies, named from the weights' header -------------------------------------------------------


def write_safetensors(path: Path, tensors: dict, data_bytes: int = None) -> None:
    """A file with this header (name -> (dtype, shape, nbytes)) and zero data (sparse), optionally cut short."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + (offset if data_bytes is None else data_bytes))


MASKS = {f"gpt_neox.layers.{i}.attention.bias": ("BOOL", [1, 1, 2048, 2048], 2048 * 2048) for i in range(6)}
WRONG_COPIES = {  # case: (a file made from the published layout, a piece of the summary)
    "older_generation": (lambda path, layout: write_safetensors(path, {**layout, **MASKS}),
                         "now published as EleutherAI/pythia-14m-deduped"),
    "float32_conversion": (lambda path, layout: write_safetensors(path, {n: ("F32", s, b * 2) for n, (_, s, b) in
                                                                        layout.items()}), "a float32 conversion"),
    "truncated": (lambda path, layout: write_safetensors(path, layout, data_bytes=10_000_000),
                  "a truncated file: its header needs"),
    "truncated-inside-header": (lambda path, layout: (write_safetensors(path, layout), os.truncate(path, 1000)),
                                "a truncated file: the header needs"),
}


@pytest.mark.parametrize("case", sorted(WRONG_COPIES))
def test_a_recognisable_wrong_weight_file_is_named(standin_copy, case):
    header = json.loads((require_reference_dir() / "model.safetensors.header").read_bytes())
    layout = {name: (entry["dtype"], entry["shape"], entry["data_offsets"][1] - entry["data_offsets"][0])
              for name, entry in header.items() if name != "__metadata__"}
    make, evidence = WRONG_COPIES[case]
    make(standin_copy / WEIGHTS, layout)
    spec = specimen.load_spec("pythia-14m")
    outcome = specimen.acquisition_outcome(spec, artifacts_dir=standin_copy)
    diagnosis = row_of(outcome["verification"], WEIGHTS)["diagnosis"]
    assert outcome["ok"] is False and diagnosis["case"] == case.removesuffix("-inside-header")
    assert evidence in outcome["error"] and f"Get EleutherAI/pythia-14m at revision {spec.revision}" in outcome["error"]
    if case == "older_generation":
        assert round(diagnosis["evidence"]["file_bytes"] / 1e6, 1) == 53.3  # as the published older file


def test_the_published_layout_with_other_values_is_named(replica_listing):
    spec = specimen.load_spec("pythia-14m")  # the real pin: the replica's constructed weights fail it
    diagnosis = row_of(specimen.check_specimen_files(replica_listing["six"], spec), WEIGHTS)["diagnosis"]
    assert diagnosis["case"] == "same_layout_other_values"
    assert diagnosis["evidence"]["header_sha256"] == spec.reference["weight_header"]["sha256"]


@pytest.mark.parametrize("name", ["pythia-14m", "standin", "replica"])
def test_a_header_beyond_the_bound_is_not_read_and_a_synthetic_copy_is_never_told_to_download(tmp_path, name):
    (tmp_path / WEIGHTS).write_bytes(struct.pack("<Q", 10**12) + b"{}")
    diagnosis = check.diagnose(tmp_path / WEIGHTS, specimen.load_spec(name))
    assert diagnosis["case"] == "not_safetensors" and "over the 1000000 this check reads" in diagnosis["summary"]
    assert ("download" in diagnosis["advice"]) is (name == "pythia-14m")
    assert name == "pythia-14m" or f"python -m inferlab.{name} NEWDIR" in diagnosis["advice"]


# --- a valid copy of another specimen is named as such, the same way by the run and check-artifacts -------------


def test_check_artifacts_names_another_specimens_copy_and_whose_pins_each_file_matches(standin_dir):
    status, printed = inferlab_command("check-artifacts", standin_dir)
    lines = printed.splitlines()
    assert status == 1
    assert lines[-1].startswith(f"check-artifacts: {standin_dir} is NOT a copy of {protocol.PINNED_REPO_ID}")
    assert "a valid copy of the SYNTHETIC standin specimen" in lines[-1]
    assert f"use it with --specimen standin --artifacts {standin_dir}" in lines[-1] and "Delete" not in "".join(lines)
    ends = {line.split()[1].rstrip(":"): line.split(" (as ")[-1] for line in lines[:-1]}
    assert ends[WEIGHTS] == "standin's pin, not pythia-14m's)"
    # pythia-14m pins no small file (issue 54): they match the stand-in's pins alone, not "the pins of both"
    assert ends["config.json"] == "standin's pin; pythia-14m pins none for it)"


@pytest.mark.process
def test_a_run_given_another_specimens_copy_says_so_in_check_artifacts_words(standin_dir, tmp_path):
    words = inferlab_command("check-artifacts", standin_dir)[1].splitlines()[-1].removeprefix("check-artifacts: ")
    made = experiment_here(tmp_path, "--artifacts", str(standin_dir))
    assert made.returncode == 1 and made.stdout.count(words) >= 2  # the run's reason and its first next step
    assert "Delete" not in made.stdout + (made.run / "report.md").read_text()


def test_small_files_are_compared_with_the_published_copies_never_refused(replica_listing, replica_listing_spec,
                                                                         tmp_path):
    copy = Path(shutil.copytree(replica_listing["five"], tmp_path / "copy", symlinks=True))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").unlink()  # a real file in place of the symlink
    (copy / "config.json").write_text(json.dumps({**config, "use_cache": False}))
    (copy / "tokenizer_config.json").unlink()
    report = specimen.check_specimen_files(copy, replica_listing_spec)
    status = {row["name"]: (row["reference"] or {}).get("status") for row in report["files"]}
    assert status == {"config.json": "differs", "tokenizer.json": "matches", "tokenizer_config.json": "absent",
                      "special_tokens_map.json": "matches", "generation_config.json": None, WEIGHTS: None}
    assert report["problems"] == [f"tokenizer_config.json in {copy}: expected a required allowlisted file, actual: "
                                  f"missing"]
    # a local copy is not the hub: its missing optional file is missing from the copy, not known absent at the revision
    row = row_of(report, "generation_config.json")
    assert (row["ok"], row["absent_at_revision"], row["absence"]) == (True, False, check.ABSENT_FROM_COPY)
    assert entry_of(report, "README.md")["verdict"] == "inert"
