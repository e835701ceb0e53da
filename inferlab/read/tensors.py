"""The tensors a run saved: references in its records ({file, key, shape, dtype, sha256}) and what each holds."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Optional


class TensorFileError(Exception):
    """A tensor file that cannot be used: code is missing, outside (not in tensors/) or unreadable."""

    def __init__(self, file: str, code: str, reason: str):
        super().__init__(f"{file}: {reason}")
        self.file, self.code, self.reason = file, code, reason


@dataclass
class TensorCheck:
    """One tensor reference against the tensor itself: what was found, and each way it disagrees."""

    array: Any = None
    file_error: Optional[TensorFileError] = None
    key_missing: bool = False
    shape: Optional[list] = None  # the actual shape when the record names a different one
    sha256: Optional[str] = None  # the actual digest when it differs from the record's

    @property
    def ok(self) -> bool:
        """Whether the tensor exists and matches its record's shape and SHA-256."""
        return self.array is not None and self.shape is None and self.sha256 is None


def tensor_references(value: Any, path: str = "") -> Iterable[tuple[str, dict]]:
    """Every {file, key, sha256, ...} tensor reference nested anywhere in a record, with its field path. A number
    or a string holds none, so only dicts and lists are walked into (most of a record's values are ids)."""
    if isinstance(value, dict):
        if isinstance(value.get("file"), str) and isinstance(value.get("key"), str) and "sha256" in value:
            yield path or "(record)", value
        for name, inner in value.items():
            if isinstance(inner, (dict, list)):
                yield from tensor_references(inner, f"{path}.{name}" if path else name)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            if isinstance(inner, (dict, list)):
                yield from tensor_references(inner, f"{path}[{index}]")


def tensor_sha256(array) -> str:
    """SHA-256 of a tensor's raw little-endian bytes, as inferlab.run.records.TensorStore hashes them."""
    import numpy

    data = numpy.ascontiguousarray(array)
    if data.dtype.byteorder == ">":
        data = data.byteswap().view(data.dtype.newbyteorder("<"))
    return hashlib.sha256(data.tobytes()).hexdigest()
