"""Part 3's inputs: what the model actually receives for one plain-text prompt, recorded exactly.

Records are written with json.dumps(..., ensure_ascii=True), which escapes every newline, tab and non-ASCII character
(\\n, \\t, \\u00e9), so whitespace stays visible and unambiguous; source_utf8_hex gives the exact bytes besides.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from inferlab import protocol

NO_TOKEN_NOTE = ("null: the model has a row for this id but the tokenizer has no token for it "
                 "(convert_ids_to_tokens gives None and decode gives an empty string)")


def choose_pad_token(tokenizer) -> tuple[int, str]:
    """The pad id to hand to generate(), from the existing vocabulary, and why. Never adds a token or resizes the
    embeddings: a new pad row would be an untrained vector that exists only to silence a warning."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id), (f"checkpoint tokenizer defines pad token {tokenizer.pad_token!r} id "
                                             f"{tokenizer.pad_token_id}")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad token nor an EOS token; expected at "
                         "least an EOS id to reuse as pad")
    eos_id = int(tokenizer.eos_token_id)
    return eos_id, (f"no pad token in checkpoint; reuse existing EOS id {eos_id}, vocabulary not resized; "
                    "with batch size 1 and a full attention mask no padding occurs")


def token_pieces(tokenizer, ids: list[int]) -> dict:
    """Each id's token piece and its text decoded alone; null where the id has no token, with a note. A checkpoint
    can have more model rows than tokens (pythia-14m: 50,304 rows, 50,277 tokens) and a model may select any row,
    so a missing piece is data to record, not an error."""
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    missing = [token_id for token_id, piece in zip(ids, pieces) if piece is None]
    # each id decoded alone: a byte-level piece holding part of a UTF-8 character decodes to U+FFFD
    decoded = [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    return {"pieces": pieces, "decoded": decoded, "ids_without_token": missing,
            "note": NO_TOKEN_NOTE if missing else None}


def eos_cross_check(directory, tokenizer, model_config) -> dict:
    """The EOS id as the tokenizer, config.json and generation_config.json (if the checkpoint has one) give it, and
    the checkpoint's own generation config as found, recorded beside the config the trials pass (never merged)."""
    path = Path(directory) / "generation_config.json"
    checkpoint_config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    sources = {"tokenizer": tokenizer.eos_token_id, "config.json": getattr(model_config, "eos_token_id", None)}
    if checkpoint_config is not None:
        sources["generation_config.json"] = checkpoint_config.get("eos_token_id")
    return {
        "eos_token_id_by_source": sources, "agree": len({json.dumps(value) for value in sources.values()}) == 1,
        "checkpoint_generation_config": checkpoint_config,
        "checkpoint_generation_config_present": checkpoint_config is not None,
        "checkpoint_generation_config_note": (
            "the checkpoint's own generation_config.json, as found; generation trials build their config from "
            "the protocol and never merge it (use_model_defaults=False)" if checkpoint_config is not None
            else "the checkpoint has no generation_config.json: nothing to merge; the trials' config comes from "
                 "the protocol alone"),
    }


def encode_prompt(tokenizer, prompt_id: str, source: str) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Tokenize one prompt (no chat template, no special tokens added) and describe the result: (record, input_ids
    (1, T) int64, attention_mask (1, T) int64). serialized_matches_source is measured by decoding back, not assumed."""
    start = time.perf_counter()
    encoded = tokenizer(source, add_special_tokens=protocol.ADD_SPECIAL_TOKENS, return_tensors="pt")
    tokenization_s = time.perf_counter() - start  # the tokenizer call alone
    input_ids, attention_mask = encoded["input_ids"].to(torch.long), encoded["attention_mask"].to(torch.long)
    token_ids = input_ids[0].tolist()
    # clean_up_tokenization_spaces=False: the cleanup would rewrite " ." to "." and hide a mismatch
    serialized = tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    pad_id, pad_reason = choose_pad_token(tokenizer)
    pieces = token_pieces(tokenizer, token_ids)
    record = {
        "prompt_id": prompt_id, "tokenization_s": tokenization_s, "source": source,
        "source_utf8_hex": source.encode("utf-8").hex(), "source_char_count": len(source), "serialized": serialized,
        "serialized_utf8_hex": serialized.encode("utf-8").hex(), "serialized_matches_source": serialized == source,
        "token_ids": token_ids, "token_pieces": pieces["pieces"], "token_pieces_decoded": pieces["decoded"],
        "token_pieces_note": pieces["note"], "length": len(token_ids), "attention_mask": attention_mask[0].tolist(),
        "attention_mask_all_ones": bool(attention_mask.eq(1).all()), "add_special_tokens": protocol.ADD_SPECIAL_TOKENS,
        "chat_template_applied": False, "special_tokens_map": dict(tokenizer.special_tokens_map),
        "all_special_ids": list(tokenizer.all_special_ids), "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id, "pad_token_id": pad_id, "pad_reason": pad_reason,
        "tokenizer_class": type(tokenizer).__name__, "tokenizer_is_fast": bool(getattr(tokenizer, "is_fast", False)),
        "tokenizer_vocab_size_with_added": len(tokenizer),
    }
    return record, input_ids, attention_mask


def encode_prompts(tokenizer, prompts: dict) -> dict:
    """Every prompt tokenized once: {prompt_id: {record, input_ids (1, T), attention_mask (1, T)}}."""
    return {prompt_id: dict(zip(("record", "input_ids", "attention_mask"), encode_prompt(tokenizer, prompt_id, source)))
            for prompt_id, source in prompts.items()}
