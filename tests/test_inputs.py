"""inferlab.measure.inputs: what the model receives for each prompt, on a small trained byte-level BPE tokenizer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tokenizers import normalizers

from inferlab import protocol
from inferlab.measure.inputs import choose_pad_token, encode_prompt, eos_cross_check
from inferlab.specimen.build import ENDOFTEXT
from tiny_specimen import tiny_tokenizer


@pytest.mark.parametrize("prompt_id", list(protocol.PROMPTS))
def test_a_protocol_prompt_is_recorded_exactly_and_round_trips(tokenizer, prompt_id):
    source = protocol.PROMPTS[prompt_id]
    record, input_ids, attention_mask = encode_prompt(tokenizer, prompt_id, source)
    assert record["serialized"] == source and record["serialized_matches_source"] is True
    assert bytes.fromhex(record["source_utf8_hex"]).decode("utf-8") == source
    assert record["token_ids"] == input_ids[0].tolist() == tokenizer(source, add_special_tokens=False)["input_ids"]
    assert record["add_special_tokens"] is False and tokenizer.eos_token_id not in record["token_ids"]
    assert record["length"] == input_ids.shape[1] == len(record["token_pieces"]) == len(record["token_pieces_decoded"])
    assert "".join(record["token_pieces_decoded"]) == source  # ASCII prompts: pieces decode independently
    assert attention_mask.shape == input_ids.shape and record["attention_mask"] == [1] * record["length"]
    assert record["special_tokens_map"] == {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
    assert (record["eos_token_id"], record["pad_token_id"], record["tokenizer_is_fast"]) == (0, 0, True)


def test_whitespace_and_non_ascii_stay_unambiguous_in_json_and_a_mismatch_is_detected(tokenizer):
    source = "Tabs\tand\nnewlines, caf\u00e9s  end "
    record, _, _ = encode_prompt(tokenizer, "W", source)
    text = json.dumps(record, ensure_ascii=True)
    assert text.isascii() and '"source": "Tabs\\tand\\nnewlines, caf\\u00e9s  end "' in text
    assert json.loads(text)["source"] == source and record["serialized_matches_source"] is True
    lowering = tiny_tokenizer()  # decode(encode(s)) differs from s: the record must say so
    lowering.backend_tokenizer.normalizer = normalizers.Lowercase()
    record, _, _ = encode_prompt(lowering, "P1", protocol.PROMPTS["P1"])
    assert record["serialized"] == protocol.PROMPTS["P1"].lower() and record["serialized_matches_source"] is False


def test_the_pad_token_is_an_existing_one_never_a_new_one_and_the_eos_sources_are_cross_checked(tmp_path, tokenizer):
    size_before = len(tokenizer)
    pad_id, reason = choose_pad_token(tokenizer)
    assert pad_id == tokenizer.eos_token_id and reason.startswith("no pad token in checkpoint; reuse existing EOS id")
    assert len(tokenizer) == size_before and tokenizer.pad_token is None
    own = tiny_tokenizer()
    own.pad_token = own.convert_ids_to_tokens(5)  # an existing entry, so nothing is added
    assert choose_pad_token(own)[0] == 5 and "defines pad token" in choose_pad_token(own)[1]
    own.pad_token, own.eos_token = None, None
    with pytest.raises(ValueError, match="neither a pad token nor an EOS token"):
        choose_pad_token(own)
    # the EOS cross-check reads a present generation config and flags a disagreement
    config = SimpleNamespace(eos_token_id=tokenizer.eos_token_id)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id}))
    agreeing = eos_cross_check(tmp_path, tokenizer, config)
    assert agreeing["agree"] and agreeing["checkpoint_generation_config"] == {"eos_token_id": tokenizer.eos_token_id}
    assert set(agreeing["eos_token_id_by_source"]) == {"tokenizer", "config.json", "generation_config.json"}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert eos_cross_check(tmp_path, tokenizer, config)["agree"] is False
