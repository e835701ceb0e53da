"""inferlab.measure.inputs: tokenization records for Part 3, on a small trained byte-level BPE tokenizer."""

from __future__ import annotations

import json

import pytest
from tokenizers import normalizers

from inferlab import protocol
from inferlab.measure.inputs import choose_pad_token, encode_prompt
from inferlab.specimen.build import ENDOFTEXT, tiny_tokenizer

@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.mark.parametrize("prompt_id", list(protocol.PROMPTS))
def test_protocol_prompt_round_trips(tokenizer, prompt_id):
    source = protocol.PROMPTS[prompt_id]
    record, input_ids, attention_mask = encode_prompt(tokenizer, prompt_id, source)
    assert record["serialized"] == source
    assert record["serialized_matches_source"] is True
    assert bytes.fromhex(record["source_utf8_hex"]).decode("utf-8") == source
    assert record["token_ids"] == input_ids[0].tolist()
    assert record["length"] == input_ids.shape[1] == len(record["token_pieces"]) == len(record["token_pieces_decoded"])
    assert "".join(record["token_pieces_decoded"]) == source  # ASCII prompts: pieces decode independently


def test_no_special_tokens_are_added(tokenizer):
    source = protocol.PROMPTS["P1"]
    record, _, _ = encode_prompt(tokenizer, "P1", source)
    assert record["add_special_tokens"] is False
    assert tokenizer.eos_token_id not in record["token_ids"]
    assert record["token_ids"] == tokenizer(source, add_special_tokens=False)["input_ids"]


def test_attention_mask_is_full_and_recorded(tokenizer):
    record, input_ids, attention_mask = encode_prompt(tokenizer, "P2", protocol.PROMPTS["P2"])
    assert attention_mask.shape == input_ids.shape
    assert record["attention_mask"] == [1] * record["length"]
    assert record["attention_mask_all_ones"] is True


def test_special_token_facts_are_recorded(tokenizer):
    record, _, _ = encode_prompt(tokenizer, "P1", protocol.PROMPTS["P1"])
    assert record["special_tokens_map"] == {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
    assert record["eos_token_id"] == 0
    assert record["pad_token_id"] == 0
    assert record["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert record["tokenizer_is_fast"] is True


def test_whitespace_and_non_ascii_stay_unambiguous_in_json(tokenizer):
    source = "Tabs\tand\nnewlines, caf\u00e9s  end "
    record, _, _ = encode_prompt(tokenizer, "W", source)
    text = json.dumps(record, ensure_ascii=True)
    assert text.isascii()
    assert '"source": "Tabs\\tand\\nnewlines, caf\\u00e9s  end "' in text
    assert json.loads(text)["source"] == source
    assert record["serialized_matches_source"] is True


def test_mismatch_between_source_and_serialized_is_detected():
    # A lowercasing normalizer makes decode(encode(s)) differ from s; the record must say so.
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.normalizer = normalizers.Lowercase()
    record, _, _ = encode_prompt(tokenizer, "P1", protocol.PROMPTS["P1"])
    assert record["serialized"] == protocol.PROMPTS["P1"].lower()
    assert record["serialized_matches_source"] is False


def test_pad_reuses_eos_without_growing_the_vocabulary(tokenizer):
    size_before = len(tokenizer)
    pad_id, reason = choose_pad_token(tokenizer)
    assert pad_id == tokenizer.eos_token_id
    assert reason == (
        f"no pad token in checkpoint; reuse existing EOS id {pad_id}, vocabulary not resized; "
        "with batch size 1 and a full attention mask no padding occurs"
    )
    assert len(tokenizer) == size_before
    assert tokenizer.pad_token is None


def test_pad_prefers_the_checkpoint_pad_token():
    tokenizer = tiny_tokenizer()
    existing = tokenizer.convert_ids_to_tokens(5)
    tokenizer.pad_token = existing  # an existing entry, so nothing is added
    pad_id, reason = choose_pad_token(tokenizer)
    assert pad_id == 5
    assert "defines pad token" in reason


def test_pad_without_eos_or_pad_is_an_error():
    tokenizer = tiny_tokenizer()
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        choose_pad_token(tokenizer)


def test_eos_cross_check_reads_a_present_generation_config_and_flags_disagreement(tmp_path, tokenizer):
    from types import SimpleNamespace

    from inferlab.measure.inputs import eos_cross_check

    config = SimpleNamespace(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                             pad_token_id=None)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id}))
    agreeing = eos_cross_check(tmp_path, tokenizer, config)
    assert agreeing["agree"] and agreeing["checkpoint_generation_config"] == {"eos_token_id": tokenizer.eos_token_id}
    assert set(agreeing["eos_token_id_by_source"]) == {"tokenizer", "config.json", "generation_config.json"}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert eos_cross_check(tmp_path, tokenizer, config)["agree"] is False
