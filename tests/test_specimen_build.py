"""The offline builds: the stand-in's and the replica's bytes are exactly their pins, their commands build or refuse
cleanly, and each meets the tokenizer and layout it promises (the replica's tests skip without its reference folder)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from conftest import require_reference_dir
from inferlab import protocol, specimen
from inferlab.specimen import build, recipe

REPO_ROOT = Path(__file__).resolve().parents[1]
REPLICA_IDS = 50277  # ids 0..50276 have a token; the model has 50304 rows


@pytest.fixture(scope="module")
def replica_dir(replica_listing):
    return replica_listing["six"]  # REPLICA.build's folder (beside it, two files the hub lists that it does not make)


@functools.cache
def tokenizer_of(directory: Path):
    from transformers import GPTNeoXTokenizerFast

    return GPTNeoXTokenizerFast.from_pretrained(directory, local_files_only=True)


def pins(name: str) -> dict:
    return {file: pin for file, pin in specimen.load_spec(name).expected.items() if not pin.get("absent")}


@pytest.mark.process
@pytest.mark.parametrize("name", ["standin", "replica"])
def test_the_command_builds_exactly_the_pinned_bytes(tmp_path, name):
    if name == "replica":
        require_reference_dir()  # a skip naming the folder where it is absent
    (tmp_path / "out").mkdir()  # an empty folder is as good as a new one
    done = subprocess.run([sys.executable, "-m", f"inferlab.{name}", str(tmp_path / "out")], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    built = json.loads(done.stdout)
    assert built["files"] == pins(name) and built["revision"] == specimen.load_spec(name).revision
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(pins(name))  # the replica: no generation
    assert specimen.local_builder(specimen.load_spec(name)) is getattr(build, name.upper())  # known by its revision


@pytest.mark.parametrize("case, message", [("non-empty", "it holds 1 entry (model.safetensors)"),
                                           ("a-file", "actual: an existing file"),
                                           ("under-a-file", "could not write"), ("proc", "could not write")])
def test_the_command_refuses_a_target_it_must_not_or_cannot_write_in_one_line(tmp_path, capsys, case, message):
    (tmp_path / "a-file").write_text("keep me")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "model.safetensors").write_bytes(b"a learner's own weights")
    target = {"non-empty": tmp_path / "mine", "a-file": tmp_path / "a-file",
              "under-a-file": tmp_path / "a-file" / "sub", "proc": Path("/proc/inferlab-cannot-be-here")}[case]
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
    quick = dataclasses.replace(build.STANDIN, contents=lambda variant: {"config.json": b"{}"})  # its refusals alone
    assert quick.main([str(target)]) == 2  # in process: an unhandled error would fail with its traceback
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()) == before


@pytest.mark.process
@pytest.mark.parametrize("case", ["without-the-projects-packages", "replica-without-its-reference"])
def test_the_command_refuses_cleanly_where_it_cannot_build(tmp_path, case):
    """Issue 54: outside the project's environment, one line naming the Python to use and exit 2, not a traceback."""
    name, flags = ("standin", ["-S"]) if case.startswith("without") else ("replica", [])
    env = {**os.environ, build.REFERENCE_ENV: str(tmp_path / "absent")}
    done = subprocess.run([sys.executable, *flags, "-m", f"inferlab.{name}", str(tmp_path / "out")], cwd=REPO_ROOT,
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    expected = f"Use {REPO_ROOT / '.venv' / 'bin' / 'python'}" if flags else f"{tmp_path / 'absent'}"
    assert expected in done.stderr and "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_a_builders_own_error_is_a_recorded_refusal(monkeypatch, tmp_path):
    """A reference header that no longer fits the recipe: the build raises, the acquisition records why."""
    def broken(header, variant=None):
        raise ValueError("model.safetensors.header: a tensor the recipe does not know")

    monkeypatch.setattr(build, "weight_file_bytes", broken)
    monkeypatch.setattr(build, "require_reference", lambda: tmp_path)
    for name in (*build.COPIED_FILES, build.HEADER_FILE):
        (tmp_path / name).write_bytes(b"{}")
    outcome = specimen.acquisition_outcome(specimen.load_spec("replica"), cache_root=tmp_path / "cache")
    assert (outcome["ok"], outcome["acquisition"]) == (False, "built_offline")
    assert "building it offline failed: ValueError: model.safetensors.header: a tensor" in outcome["error"]
    assert not list((tmp_path / "cache").glob("replica/*/*"))


# --- the files each one promises ------------------------------------------------------------------------------


def test_the_standin_has_pythias_layout_the_recipes_weights_and_says_it_is_synthetic(standin_dir):
    assert (standin_dir / "model.safetensors").stat().st_size == pins("pythia-14m")["model.safetensors"]["size"]
    expected = recipe.weights()
    with safe_open(standin_dir / "model.safetensors", framework="numpy") as handle:
        assert {name: (tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype())
                for name in handle.keys()} == {name: (shape, "F16") for name, shape in recipe.expected_shapes().items()}
        assert handle.metadata() == {"format": "pt"}
        assert all(np.array_equal(handle.get_tensor(name), expected[name]) for name in expected)
    config = json.loads((standin_dir / "config.json").read_text())
    assert {key: config[key] for key in specimen.load_spec("pythia-14m").architecture} == \
        specimen.load_spec("pythia-14m").architecture
    assert config["inferlab_synthetic"] is True and "Not EleutherAI/pythia-14m" in config["inferlab_note"]
    assert json.loads((standin_dir / "tokenizer_config.json").read_text())["inferlab_synthetic"] is True


def test_the_replica_is_the_published_small_files_and_header_with_the_standins_weights(replica_dir, standin_dir):
    reference = build.reference_dir()
    assert all((replica_dir / n).read_bytes() == (reference / n).read_bytes() for n in build.COPIED_FILES)
    data, header = (replica_dir / "model.safetensors").read_bytes(), (reference / build.HEADER_FILE).read_bytes()
    assert struct.unpack("<Q", data[:8])[0] == len(header) and data[8:8 + len(header)] == header
    assert data == (standin_dir / "model.safetensors").read_bytes()  # one recipe, laid out by the real header


@pytest.mark.parametrize("name", ["standin", "replica"])
def test_eos_is_id_zero_and_every_prompt_round_trips(request, name):
    tokenizer = tokenizer_of(request.getfixturevalue(f"{name}_dir"))
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) == (0, 0, None)
    assert tokenizer.is_fast and len(tokenizer) == {"standin": recipe.VOCAB, "replica": REPLICA_IDS}[name]
    for text in {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}.values():
        ids = tokenizer(text, add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
        assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text and 0 not in ids


@pytest.mark.slow
def test_every_standin_id_decodes_to_something_and_filler_words_are_never_produced(standin_dir):
    """The filler tokens that make every id but the two special ones visible have no merges."""
    tokenizer = tokenizer_of(standin_dir)
    decoded = tokenizer.batch_decode([[i] for i in range(recipe.VOCAB)], skip_special_tokens=True)
    assert [i for i, text in enumerate(decoded) if text == ""] == [0, 1]
    word = build.filler_token(12345)
    assert tokenizer.convert_tokens_to_ids(word) not in tokenizer(word.replace("\u0120", " "))["input_ids"]


def test_the_replica_meets_the_real_tokenizers_facts(replica_dir):
    """The published ids of a text, and no token for the model's last 27 rows."""
    replica_tokenizer = tokenizer_of(replica_dir)
    assert replica_tokenizer("The cat sat", add_special_tokens=False)["input_ids"] == [510, 5798, 2206]
    extra = list(range(REPLICA_IDS, recipe.VOCAB))
    assert replica_tokenizer.convert_ids_to_tokens(extra) == [None] * len(extra)
