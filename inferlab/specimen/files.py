"""Reading one specimen file safely: only a regular file, hashed once, and refused if it changed meanwhile.

The file is opened non-blocking, so a FIFO swapped in after the listing cannot hang the read, and
its type and identity are checked on the open descriptor before a byte is read. Size, mtime and
identity are compared before and after hashing: a copy still being written is caught.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Optional

CHUNK_BYTES = 1 << 20
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code")


class FileCheckError(Exception):
    """The file could not be read as a stable regular file; the message says why (without the path)."""


def _chunks(handle):
    while True:
        chunk = handle.read(CHUNK_BYTES)
        if not chunk:
            return
        yield chunk


def _identity(status: os.stat_result) -> tuple:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def read_stable(path: Path, keep_bytes: bool = False) -> dict:
    """Hash a regular file: {size, sha256, data}; data holds the bytes when keep_bytes, else None.

    Raises FileCheckError when it is not a regular file once opened, or when its size, mtime or
    identity differ between before and after the read.
    """
    listed = os.stat(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise FileCheckError(f"expected a readable file, actual: {error.strerror}") from error
    with os.fdopen(fd, "rb") as handle:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise FileCheckError("expected a regular file, actual: something else once opened (it was replaced)")
        if (before.st_dev, before.st_ino) != (listed.st_dev, listed.st_ino):
            raise FileCheckError("expected the file that was listed, actual: it was replaced before it was read")
        digest, kept, count = hashlib.sha256(), [], 0
        for chunk in _chunks(handle):
            digest.update(chunk)
            count += len(chunk)
            if keep_bytes:
                kept.append(chunk)
        after = os.fstat(fd)
    try:
        after_path = os.stat(path)
    except OSError as error:
        raise FileCheckError(f"changed while being read: it is gone afterwards ({error.strerror})") from error
    changes = _changes(before, after, after_path, count)
    if changes:
        raise FileCheckError(
            f"changed while being read ({'; '.join(changes)}): another program is writing it. "
            f"Wait until the copy has finished, then run again"
        )
    return {"size": count, "sha256": digest.hexdigest(), "data": b"".join(kept) if keep_bytes else None}


def _changes(before, after, after_path, count: int) -> list[str]:
    changes = []
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        changes.append(f"size {before.st_size} -> {after.st_size} bytes, "
                       f"mtime {before.st_mtime_ns} -> {after.st_mtime_ns} ns")
    if count != before.st_size:
        changes.append(f"{count} bytes read, {before.st_size} listed")
    if _identity(after_path) != _identity(after):
        changes.append("the path now names another file")
    return changes


def json_problems(name: str, data: bytes) -> list[str]:
    """Why bytes are not an acceptable specimen JSON file: not UTF-8 JSON, not an object, too deep, wrong shape."""
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        return [f"expected UTF-8 JSON, actual: undecodable bytes ({error.reason} at byte {error.start})"]
    except ValueError as error:
        return [f"expected readable JSON, actual: {error}"]
    except RecursionError:
        return ["expected readable JSON, actual: nested too deeply to parse (a malformed or hostile file)"]
    if not isinstance(value, dict):
        return [f"expected a JSON object, actual {type(value).__name__}"]
    problems = []
    # auto_map points transformers at repository Python code; the lab allows built-in classes only.
    asks = [key for key in REMOTE_CODE_KEYS if key in value and value[key] not in (None, False, {})]
    if asks:
        problems.append(f"expected no remote-code request, actual keys {asks} ({ {k: value[k] for k in asks} })")
    shape_problem = _shape_problem(name, value)
    if shape_problem:
        problems.append(shape_problem)
    return problems


def _shape_problem(name: str, value: dict) -> Optional[str]:
    # Only what the protocol's loader relies on: the built-in GPT-NeoX classes and a tokenizer model.
    if name == "config.json" and value.get("model_type") != "gpt_neox":
        return f"expected model_type 'gpt_neox' (the built-in GPTNeoXForCausalLM), actual {value.get('model_type')!r}"
    if name == "tokenizer.json" and not isinstance(value.get("model"), dict):
        return f"expected a tokenizer with a 'model' object, actual {type(value.get('model')).__name__}"
    return None
