"""The replica specimen: pythia-14m's published small files byte for byte, its exact weight layout, the
stand-in's constructed weights, and the real tokenizer's facts. Skipped where ../shared is absent."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from inferlab import protocol, specimen
from inferlab.synthetic import replica, standin

REFERENCE = replica.reference_dir()
pytestmark = pytest.mark.skipif(
    not (REFERENCE / replica.HEADER_FILE).is_file(),
    reason=f"the replica needs pythia-14m's published small files in {REFERENCE} (../shared beside the project), "
           f"present on the course's CI machines but not in a learner's clone",
)
TOKENIZER_IDS = 50277  # ids 0..50276 have a token; the model has 50304 rows
PUBLISHED_IDS = {"The cat sat": [510, 5798, 2206]}
PROMPT_LENGTHS = {"P1": 8, "P2": 7, "P1x8": 64}


@pytest.fixture(scope="module")
def replica_build(tmp_path_factory):
    return replica.build(tmp_path_factory.mktemp("replica") / "built")


@pytest.fixture(scope="module")
def replica_dir(replica_build):
    from pathlib import Path

    return Path(replica_build["directory"])


@pytest.fixture(scope="module")
def tokenizer(replica_dir):
    from transformers import GPTNeoXTokenizerFast

    return GPTNeoXTokenizerFast.from_pretrained(replica_dir, local_files_only=True)


def test_build_matches_every_pin_and_has_no_generation_config(replica_build):
    spec = specimen.load_spec("replica")
    assert spec.synthetic is True
    present = {name: pin for name, pin in spec.expected.items() if not pin.get("absent")}
    assert replica_build["files"] == present
    assert spec.expected["generation_config.json"] == {"absent": True}
    assert "generation_config.json" in spec.optional_files


def test_small_files_are_the_published_bytes(replica_dir):
    for name in replica.COPIED_FILES:
        assert (replica_dir / name).read_bytes() == (REFERENCE / name).read_bytes(), name


def test_weight_file_has_the_real_header_and_size(replica_dir):
    data = (replica_dir / "model.safetensors").read_bytes()
    header = (REFERENCE / replica.HEADER_FILE).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert length == len(header) and data[8:8 + length] == header
    assert len(data) == specimen.load_spec("pythia-14m").expected["model.safetensors"]["size"] == 28_143_920


def test_one_recipe_serves_both_offline_specimens(replica_dir, standin_dir):
    """The replica's weights are the stand-in's recipe, laid out by the real header: the same bytes here."""
    assert (replica_dir / "model.safetensors").read_bytes() == (standin_dir / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_second_build_gives_identical_bytes(replica_build, tmp_path):
    assert replica.build(tmp_path / "again")["files"] == replica_build["files"]


@pytest.mark.slow
def test_the_real_configuration_loads_as_float32(replica_dir):
    from inferlab.measure import loading

    loaded = loading.load_specimen(replica_dir, specimen.load_spec("replica"))
    config = loaded["model"].config
    assert (config.attention_bias, config.vocab_size, config.hidden_size) == (True, 50304, 128)
    assert {str(p.dtype) for p in loaded["model"].parameters()} == {"torch.float32"}


def test_tokenizer_has_no_pad_and_eos_equals_bos_zero(tokenizer):
    assert tokenizer.pad_token is None and tokenizer.pad_token_id is None
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == 0
    assert len(tokenizer) == TOKENIZER_IDS


def test_model_rows_without_a_token_decode_to_nothing(tokenizer):
    extra = list(range(TOKENIZER_IDS, 50304))
    assert tokenizer.convert_ids_to_tokens(extra) == [None] * len(extra)
    assert [tokenizer.decode([i]) for i in extra] == [""] * len(extra)


@pytest.mark.parametrize("prompt_id", sorted(PROMPT_LENGTHS))
def test_prompts_have_the_real_lengths_and_round_trip(tokenizer, prompt_id):
    text = {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}[prompt_id]
    ids = tokenizer(text, add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
    assert len(ids) == PROMPT_LENGTHS[prompt_id]
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text


def test_published_ids(tokenizer):
    for text, ids in PUBLISHED_IDS.items():
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids


@pytest.mark.process
def test_command_line_refuses_without_the_reference_folder(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-reference"
    env = {**__import__("os").environ, replica.REFERENCE_ENV: str(missing)}
    result = subprocess.run([sys.executable, "-m", "inferlab.replica", str(tmp_path / "out")],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert str(missing) in result.stderr and "--specimen standin" in result.stderr
    assert not (tmp_path / "out").exists()


def test_command_line_refuses_a_non_empty_directory(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    # the command's main in process (its -m entry in a new Python: the test above)
    assert replica.main([str(tmp_path)]) == 2 and "expected a new or empty directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_revision_is_sha1_of_its_recipe_and_differs_from_the_standins():
    spec = specimen.load_spec("replica")
    assert spec.revision == replica.revision() != standin.revision()
    assert specimen.local_builder(spec) is replica


def test_replica_without_its_reference_is_a_usage_error(pytester, monkeypatch, tmp_path):
    """`--specimen replica` where ../shared is absent says where the folder is expected, and writes nothing."""
    import os
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv(replica.REFERENCE_ENV, str(tmp_path / "absent"))
    shutil.copytree(root / "experiments", pytester.path / "experiments")
    shutil.copytree(root / "artifacts", pytester.path / "artifacts", ignore=shutil.ignore_patterns("cache"))
    shutil.copy(root / "conftest.py", pytester.path / "conftest.py")
    result = pytester.runpytest_subprocess("experiments", "--specimen", "replica", "--record-dir", "run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--specimen replica*{tmp_path / 'absent'}*"])
    assert not (pytester.path / "run").exists()


def test_pieces_of_rows_without_a_token_are_null_with_a_note(tokenizer):
    from inferlab.measure.inputs import NO_TOKEN_NOTE, token_pieces

    pieces = token_pieces(tokenizer, [510, 50290, 0])
    assert pieces["pieces"] == ["The", None, "<|endoftext|>"]
    assert pieces["decoded"] == ["The", "", "<|endoftext|>"]
    assert pieces["ids_without_token"] == [50290] and pieces["note"] == NO_TOKEN_NOTE
    assert json.loads(json.dumps(pieces)) == pieces  # plain JSON data, null included


def test_eos_ids_agree_and_the_missing_generation_config_is_recorded(tokenizer, replica_dir):
    from transformers import AutoConfig

    from inferlab.measure.inputs import eos_cross_check

    check = eos_cross_check(replica_dir, tokenizer, AutoConfig.from_pretrained(replica_dir, local_files_only=True))
    assert check["eos_token_id_by_source"] == {"tokenizer": 0, "config.json": 0}
    assert check["agree"] is True and check["checkpoint_generation_config"] is None
    assert check["checkpoint_generation_config_present"] is False
    assert check["pad_token_id_by_source"] == {"tokenizer": None, "config.json": None}


def test_a_builder_error_is_a_recorded_refusal_not_an_escaping_exception(monkeypatch, tmp_path):
    """A reference header that no longer fits the recipe raises ValueError inside the builder: the acquisition
    still returns its record, with the reason, instead of erroring the test that asked for it."""
    def broken(header, variant=None):
        raise ValueError("model.safetensors.header: a tensor the recipe does not know")

    monkeypatch.setattr(replica, "weight_file_bytes", broken)
    outcome = specimen.acquisition_outcome(specimen.load_spec("replica"), cache_root=tmp_path)
    assert outcome["ok"] is False and outcome["acquisition"] == "built_offline"
    assert "building it offline failed: ValueError" in outcome["error"] and "a tensor the recipe" in outcome["error"]
    assert not list((tmp_path / "replica").glob("*/*"))  # nothing published into the cache
