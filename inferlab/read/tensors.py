"""The tensors a run saved: references in its records ({file, key, shape, dtype, sha256}) and what each holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from inferlab.files import tensor_sha256
from inferlab.run.records import TENSOR_DIR


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


class SavedTensors:
    """A run's saved tensors: each file of its tensors/ folder read once, when first asked for (or arrays given in
    memory, {file: {key: array}}); nothing outside tensors/ is opened."""

    def __init__(self, directory: Optional[Path], given: Optional[dict] = None):
        self.directory, self.given, self.loaded = directory, given, {}

    def files(self) -> list[str]:
        """Every safetensors file of the folder (or given), as 'tensors/NAME'."""
        if self.given is not None:
            return sorted(self.given)
        folder = self.directory / TENSOR_DIR if self.directory is not None else None
        if folder is None or not folder.is_dir():
            return []
        return sorted(p.relative_to(self.directory).as_posix() for p in folder.glob("*.safetensors"))

    def load(self, file: str) -> dict:
        """{key: numpy array} of one file; TensorFileError when it is missing, outside tensors/ or unreadable."""
        if file not in self.loaded:
            self.loaded[file] = self._load(file)
        tensors, error = self.loaded[file]
        if error is not None:
            raise error
        return tensors

    def _load(self, file: str) -> tuple[Optional[dict], Optional[TensorFileError]]:
        if self.given is not None or self.directory is None:
            found = (self.given or {}).get(file)
            return (found, None) if found is not None else (None, TensorFileError(file, "missing", "missing"))
        path = self.directory / file
        if path.resolve().parent != (self.directory / TENSOR_DIR).resolve():
            return None, TensorFileError(file, "outside", f"not in {TENSOR_DIR}/")
        if not path.is_file():
            return None, TensorFileError(file, "missing", "missing")
        from safetensors.numpy import load_file  # a Python without it raises ImportError: no damage to report

        try:
            return load_file(str(path)), None
        except Exception as error:  # any damaged file is a TensorFileError naming it, never a crash
            return None, TensorFileError(file, "unreadable", f"{type(error).__name__}: {error}")

    def get(self, reference: Any):
        """The array a {file, key} reference names, or None; its hash is not compared (check does): a page shows
        what the file holds."""
        if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
            return None
        try:
            return self.load(reference["file"]).get(reference.get("key"))
        except TensorFileError:
            return None

    def check(self, reference: dict) -> TensorCheck:
        """A reference against its tensor: the file, the key, the shape and the SHA-256 the record holds."""
        try:
            tensors = self.load(reference["file"])
        except TensorFileError as error:
            return TensorCheck(file_error=error)
        if reference.get("key") not in tensors:
            return TensorCheck(key_missing=True)
        array = tensors[reference["key"]]
        check = TensorCheck(array=array)
        if "shape" in reference and list(array.shape) != list(reference["shape"]):
            check.shape = list(array.shape)
        digest = tensor_sha256(array)
        if digest != reference.get("sha256"):
            check.sha256 = digest
        return check

    def verified(self, reference: dict):
        """The array a reference names only if it matches the record's shape and SHA-256; else None."""
        check = self.check(reference)
        return check.array if check.ok else None
