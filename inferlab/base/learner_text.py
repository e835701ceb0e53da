"""The one check of a text a learner wrote (a predictions file, an explanation, notes), wherever it enters: the
run's --predictions, `attach`, the autograder; and the one list of words that stand in for an answer without
being one (the predictions check and `revise --justification` both use it).

A learner's text is a regular file (not a folder, a FIFO or a device), at most MAX_BYTES (the autograder's cap),
not empty, with no NUL byte, UTF-8. read() returns its bytes, read once, so the bytes checked are the bytes kept;
anything else raises NotText, whose message names the file, the limit and what was found.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from inferlab.base.records import describe_path, os_error_words

MAX_BYTES = 1_000_000  # 1 MB: a text a person wrote, not data (the autograder's cap)
EXPECTED = f"a regular UTF-8 text file of at most {MAX_BYTES:,} bytes (1 MB)"
# Words that stand in for an answer or a reason without being one (compared lowercased; also any run of x's).
PLACEHOLDERS = frozenset({"todo", "tbd", "tba", "tbc", "lol", "n/a", "na", "xxx", "fixme", "placeholder",
                          "idk", "asdf", "blah", "lorem", "ipsum", "dolor", "amet", "consectetur", "adipiscing",
                          "elit", "foo", "baz", "qwerty"})


class NotText(ValueError):
    """The file is not a learner's text. usage=True when the path cannot be used as named (missing, a folder, a
    FIFO or another special file), else its content is what is refused (empty, too large, binary, not UTF-8)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def is_placeholder(word: str) -> bool:
    """Whether a word stands in for text without being any (TODO, lorem, xxxx ...)."""
    return word.lower() in PLACEHOLDERS or re.fullmatch(r"[xX]{2,}", word) is not None


def read(path, role: str = "FILE") -> bytes:
    """The bytes of a learner's text file at `path`, read once; NotText otherwise. role names the file in the
    message (FILE, --predictions, predictions.md)."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError:
        raise NotText(f"{role} {path} {describe_path(path)}; expected {EXPECTED}", usage=True) from None
    if not stat.S_ISREG(info.st_mode):
        raise NotText(f"{role} {path} {describe_path(path)}; expected {EXPECTED}", usage=True)
    if info.st_size > MAX_BYTES:
        raise NotText(f"{role} {path} is {info.st_size:,} bytes, over the limit of {MAX_BYTES:,}; expected {EXPECTED}")
    try:
        # O_NONBLOCK: should the path have become a FIFO since stat(), opening it does not wait for a writer.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise NotText(f"{role} {path} changed while it was opened and is no longer a regular file; expected "
                              f"{EXPECTED}", usage=True)
            data = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise NotText(f"{role} {path} cannot be read ({os_error_words(error)}); expected {EXPECTED}",
                      usage=True) from None
    if len(data) > MAX_BYTES:
        raise NotText(f"{role} {path} holds more than {MAX_BYTES:,} bytes (it grew while it was read); expected "
                      f"{EXPECTED}")
    if not data:
        raise NotText(f"{role} {path} is empty (0 bytes); expected the text you wrote, {EXPECTED}")
    nul = data.find(b"\0")
    if nul >= 0:
        raise NotText(f"{role} {path} is binary (a NUL byte at offset {nul}); expected {EXPECTED}")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotText(f"{role} {path} is not UTF-8 text (byte {error.start}: {error.reason}); expected "
                      f"{EXPECTED}") from None
    return data
