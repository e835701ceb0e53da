"""The synthetic stand-in: deterministic bytes equal to its pins, pythia-14m's layout, a round-tripping tokenizer."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open

from inferlab import protocol, specimen
from inferlab.synthetic import standin


def test_build_matches_every_pin(standin_build, standin_spec):
    assert standin_build["files"] == standin_spec.expected


@pytest.mark.slow
def test_second_build_gives_identical_bytes(standin_build, tmp_path):
    assert standin.build(tmp_path / "second")["files"] == standin_build["files"]


@pytest.mark.process
def test_command_line_builds_the_pinned_files(tmp_path, standin_spec):
    result = subprocess.run(
        [sys.executable, "-m", "inferlab.standin", str(tmp_path / "out")], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout)["files"] == standin_spec.expected


def test_revision_is_sha1_of_the_recipe(standin_spec):
    assert standin_spec.revision == hashlib.sha1(standin.RECIPE.encode()).hexdigest() == standin.revision()


def test_weight_file_has_the_real_checkpoint_size(standin_dir):
    real = specimen.load_spec("pythia-14m").expected["model.safetensors"]["size"]
    assert (standin_dir / "model.safetensors").stat().st_size == real


def test_weight_tensors_follow_pythia_names_shapes_and_float16(standin_dir):
    with safe_open(standin_dir / "model.safetensors", framework="numpy") as handle:
        slices = {name: handle.get_slice(name) for name in handle.keys()}
        found = {name: (tuple(piece.get_shape()), piece.get_dtype()) for name, piece in slices.items()}
        metadata = handle.metadata()
    assert found == {name: (shape, "F16") for name, shape in standin.tensor_shapes().items()}
    assert metadata == {"format": "pt"}


@pytest.mark.slow
def test_weights_are_the_recipes(standin_dir):
    """The stand-in stores inferlab.synthetic.recipe's tensors, bit for bit, under the real names."""
    from inferlab.synthetic import recipe

    expected = recipe.weights()
    with safe_open(standin_dir / "model.safetensors", framework="numpy") as handle:
        for name in ("gpt_neox.embed_in.weight", "gpt_neox.layers.0.attention.query_key_value.bias", "embed_out.weight"):
            assert np.array_equal(handle.get_tensor(name), expected[name]), name


def test_command_line_refuses_a_non_empty_directory_and_touches_nothing(tmp_path, capsys):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"a learner's own weights")
    (target / "config.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    assert standin.main([str(target)]) == 2  # the command's main, in process (its -m entry: the test above)
    err = capsys.readouterr().err
    assert "expected a new or empty directory" in err and str(target) in err
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before


def test_command_line_refuses_a_file_path(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    assert standin.main([str(target)]) == 2 and "an existing file" in capsys.readouterr().err
    assert target.read_text() == "keep me"


@pytest.mark.slow
def test_build_into_an_empty_directory_is_allowed(tmp_path, standin_build):
    assert standin.build(tmp_path)["files"] == standin_build["files"]


def test_config_is_pythia_architecture_and_marked_synthetic(standin_dir):
    config = json.loads((standin_dir / "config.json").read_text())
    tokenizer_config = json.loads((standin_dir / "tokenizer_config.json").read_text())
    architecture = {
        "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 50304, "hidden_size": 128, "num_hidden_layers": 6,
        "num_attention_heads": 4, "intermediate_size": 512, "rotary_pct": 0.25, "rotary_emb_base": 10000,
        "use_parallel_residual": True, "tie_word_embeddings": False, "max_position_embeddings": 2048,
        "bos_token_id": 0, "eos_token_id": 0, "layer_norm_eps": 1e-5, "hidden_act": "gelu", "torch_dtype": "float16",
    }
    assert {key: config[key] for key in architecture} == architecture
    assert config["inferlab_synthetic"] is True and tokenizer_config["inferlab_synthetic"] is True


@pytest.fixture(scope="module")
def tokenizer(standin_dir):
    from transformers import GPTNeoXTokenizerFast

    return GPTNeoXTokenizerFast.from_pretrained(standin_dir, local_files_only=True)


def test_endoftext_is_id_zero_within_the_model_vocabulary(tokenizer):
    assert (tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.eos_token_id) == (0, 0)
    assert tokenizer.is_fast and len(tokenizer) <= standin.CONFIG["vocab_size"]


@pytest.mark.parametrize("prompt_id", sorted(protocol.PROMPTS))
def test_prompt_round_trips_exactly(tokenizer, prompt_id):
    text = protocol.PROMPTS[prompt_id]
    ids = tokenizer(text, add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
    assert tokenizer.decode(ids) == text and 0 not in ids


@pytest.mark.slow
def test_every_model_id_decodes_to_something(tokenizer):
    """The model can select any of the 50304 ids; all but the two special ones decode to visible text."""
    vocab_size = standin.CONFIG["vocab_size"]
    assert len(tokenizer) == vocab_size
    decoded = tokenizer.batch_decode([[token_id] for token_id in range(vocab_size)], skip_special_tokens=True)
    assert [token_id for token_id, text in enumerate(decoded) if text == ""] == [0, 1]


def test_filler_words_are_never_produced_by_encoding(tokenizer, standin_dir):
    """Filler tokens have no merges: text made of filler words still splits into trained pieces."""
    trained = json.loads((standin_dir / "tokenizer.json").read_text())["model"]["merges"]
    assert trained, "the trained BPE has merges"
    word = standin.filler_token(12345)
    ids = tokenizer(word.replace("\u0120", " "), add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_tokens_to_ids(word) not in ids


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_command_line_reports_a_target_it_cannot_create_without_a_traceback(tmp_path, where, capsys):
    (tmp_path / "a-file").write_text("x")
    target = tmp_path / "a-file" / "sub" if where == "under-a-file" else "/proc/inferlab-cannot-be-here"
    # in process: an error main() did not turn into its message would fail this test with its traceback
    status = standin.main([str(target)])
    err = capsys.readouterr().err
    assert status == 2 and "could not write" in err and "Traceback" not in err


def test_a_refusal_counts_its_entries_in_good_grammar(tmp_path):
    """Issue 26 B10: it said 'holds 1 entries'."""
    from inferlab.synthetic import standin

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "x").write_text("x")
    with pytest.raises(standin.BuildRefused, match=r"it holds 1 entry \(x\)"):
        standin.check_target(tmp_path / "one")
    (tmp_path / "one" / "y").write_text("y")
    with pytest.raises(standin.BuildRefused, match=r"it holds 2 entries \(x, y\)"):
        standin.check_target(tmp_path / "one")
