"""Consistency of the texts a run decoded: every prompt's ids from its text, and every decoded text and token
piece from its ids, with the run's own tokenizer file where it is at hand.

The run records the specimen folder it verified (artifact_acquisition, artifact_file). Its tokenizer.json is
used only when its SHA-256 is the one the run recorded for it; it is read with the `tokenizers` library
directly, which is what the run's fast tokenizer calls (decode without the clean-up of spaces, tokens by id),
so no transformers code is needed to check it. Without that file each decoded field is said to be not checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from inferlab.base.records import sha256_file
from inferlab.verify.consistency_shared import Recheck

TOKENIZER_FILE = "tokenizer.json"
WHAT = "decoded texts and token pieces against their ids"


def _directory(recheck: Recheck) -> Optional[str]:
    for kind in ("artifact_acquisition", "artifact_file", "model_load"):
        for record in recheck.view.kind(kind):
            if isinstance(record.get("directory"), str):
                return record["directory"]
    return None


def load_tokenizer(recheck: Recheck):
    """The run's tokenizer from its specimen folder, or None with the reason said as not checked."""
    directory = _directory(recheck)
    pinned = next((r.get("sha256") for r in recheck.view.kind("artifact_file") if r.get("name") == TOKENIZER_FILE),
                  None)
    if directory is None:
        recheck.not_checked(WHAT, "the run records no specimen folder")
        return None
    path = Path(directory) / TOKENIZER_FILE
    if recheck.view.directory is not None and not path.is_absolute():
        path = Path(recheck.view.manifest.get("invocation_dir") or ".") / path
    if not path.is_file():
        recheck.not_checked(WHAT, f"tokenizer files not at hand ({path} is not there)")
        return None
    if not isinstance(pinned, str) or sha256_file(path) != pinned:
        recheck.not_checked(WHAT, f"tokenizer files not at hand: {path} is not the file the run used (its sha256 is "
                                  f"not the {pinned or 'unrecorded'} the run's artifact_file record holds)")
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))
    except Exception as error:  # any unreadable tokenizer is a reason not to check, said, never a crash
        recheck.not_checked(WHAT, f"{path} could not be read by tokenizers ({type(error).__name__}: {error})")
        return None


def has_texts(recheck: Recheck) -> bool:
    """Whether the run holds any record whose texts are decoded from ids (input, generation, timing trial)."""
    return bool(recheck.view.kind("input") + recheck.completed("generation") + recheck.completed("timing_trial"))


def check(recheck: Recheck) -> None:
    """Each input, generation and timing record's texts and pieces from its ids, with the run's own tokenizer."""
    if not has_texts(recheck):
        return
    tokenizer = load_tokenizer(recheck)
    if tokenizer is None:
        return
    check_with(recheck, tokenizer)


def check_with(recheck: Recheck, tokenizer) -> None:
    """Each input, generation and timing record's texts and pieces from its ids, decoded by `tokenizer` (a
    tokenizers.Tokenizer: the run's own here, the grader's own copy in inferlab.grading.decoded)."""

    def decode(ids, skip_special):
        return tokenizer.decode(ids, skip_special_tokens=skip_special)

    def pieces(ids) -> dict:
        found = [tokenizer.id_to_token(i) for i in ids]
        return {"pieces": found, "decoded": [decode([i], False) for i in ids],
                "ids_without_token": [i for i, piece in zip(ids, found) if piece is None]}

    for record in recheck.view.kind("input"):
        ids, source = record.get("token_ids"), record.get("source")
        if isinstance(source, str):
            recheck.expect(record, "token_ids", tokenizer.encode(source, add_special_tokens=False).ids,
                           "the source text, tokenized without special tokens")
        if isinstance(ids, list):
            recheck.expect(record, "serialized", decode(ids, False), "token_ids, decoded")
            found = pieces(ids)
            recheck.expect(record, "token_pieces", found["pieces"], "token_ids, each id's token")
            recheck.expect(record, "token_pieces_decoded", found["decoded"], "token_ids, each decoded alone")
    for record in recheck.completed("generation"):
        ids = record.get("generated_ids")
        if isinstance(ids, list):
            recheck.expect(record, "text", decode(ids, True), "generated_ids, decoded without special tokens")
            recheck.expect(record, "text_with_special", decode(ids, False), "generated_ids, decoded")
            if isinstance(record.get("generated_pieces"), dict):
                recheck.expect_fields(record, {"generated_pieces": pieces(ids)}, "generated_ids, id by id")
    for record in recheck.completed("timing_trial"):
        ids = record.get("generated_ids")
        if isinstance(ids, list):
            recheck.expect(record, "profiling_text_not_a_response", decode(ids, False), "generated_ids, decoded")
            if isinstance(record.get("profiling_pieces"), dict):
                recheck.expect_fields(record, {"profiling_pieces": pieces(ids)}, "generated_ids, id by id")
