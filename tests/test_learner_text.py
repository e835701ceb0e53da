"""The one check of a learner's text (inferlab.base.learner_text), and the one placeholder list: the run's
--predictions, `attach` and the autograder read a learner's file through it, and the predictions check and
`revise --justification` judge placeholders by the same list."""

from __future__ import annotations

import os
import re

import pytest

from inferlab.base import learner_text
from inferlab.gradescope import autograder
from inferlab.reading import addenda_store
from inferlab.run import predictions


def test_every_entry_point_shares_one_limit_and_one_placeholder_list():
    assert autograder.MAX_TEXT_BYTES == addenda_store.MAX_BYTES == learner_text.MAX_BYTES == 1_000_000
    assert predictions.PLACEHOLDERS is learner_text.PLACEHOLDERS
    assert predictions.words("lorem ipsum dolor amet TODO xxxx") == []


def test_exactly_the_limit_is_text_and_one_byte_more_is_not(tmp_path):
    path = tmp_path / "p.md"
    path.write_bytes(b"a" * learner_text.MAX_BYTES)
    assert len(learner_text.read(path)) == learner_text.MAX_BYTES
    path.write_bytes(b"a" * (learner_text.MAX_BYTES + 1))
    with pytest.raises(learner_text.NotText, match=r"is 1,000,001 bytes, over the limit of 1,000,000") as refused:
        learner_text.read(path)
    assert not refused.value.usage


def test_a_folder_and_a_fifo_are_usage_errors_naming_what_they_are(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    for path, words in ((tmp_path, "is a directory"), (tmp_path / "pipe", "is a FIFO (named pipe)")):
        with pytest.raises(learner_text.NotText, match=re.escape(words)) as refused:
            learner_text.read(path, "FILE")
        assert refused.value.usage and "at most 1,000,000 bytes" in str(refused.value)


def test_the_autograder_refuses_what_attach_refuses(tmp_path):
    source = tmp_path / "predictions.md"
    source.write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(autograder.AutograderError, match=r"is not UTF-8 text \(byte 3"):
        autograder._copy_text(source, tmp_path / "copy.md")
    assert not (tmp_path / "copy.md").exists()
