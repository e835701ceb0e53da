"""The tensors a run saved: references in its records ({file, key, shape, dtype, sha256}) and what each holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from inferlab.files import tensor_sha256
from inferlab.run.records import TENSOR_DIR


class TensorFileError(Exception):
    """A tensor file that cannot be used: code is missing, outside (not in tensors/) or unreadable."""

    def __init__(self, file: str, code: str, reason: str):
        super().__init__(f"{file}: {reason}")
        self.file, self.code, self.reason = file, code, reason


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
            try:
                self.loaded[file] = self._read(file)
            except TensorFileError as error:
                self.loaded[file] = error
        if isinstance(self.loaded[file], TensorFileError):
            raise self.loaded[file]
        return self.loaded[file]

    def _read(self, file: str) -> dict:
        if self.given is not None or self.directory is None:
            if (self.given or {}).get(file) is None:
                raise TensorFileError(file, "missing", "missing")
            return self.given[file]
        path = self.directory / file
        if path.resolve().parent != (self.directory / TENSOR_DIR).resolve():
            raise TensorFileError(file, "outside", f"not in {TENSOR_DIR}/, where a run keeps its tensors")
        if not path.is_file():
            raise TensorFileError(file, "missing", "missing")
        from safetensors.numpy import load_file  # a Python without it raises ImportError: no damage to report

        try:
            return load_file(str(path))
        except Exception as error:  # any damaged file is a TensorFileError naming it, never a crash
            raise TensorFileError(file, "unreadable", f"not a readable safetensors file ({type(error).__name__}: "
                                                      f"{error})") from None

    def get(self, reference: Any):
        """The array a {file, key} reference names, or None; its hash is not compared (check does): a page shows
        what the file holds."""
        if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
            return None
        try:
            return self.load(reference["file"]).get(reference.get("key"))
        except TensorFileError:
            return None

    def check(self, reference: dict) -> Optional[str]:
        """What is wrong with a tensor against its reference (its key, shape and SHA-256), None when nothing;
        TensorFileError when its file cannot be used."""
        tensors, file, key = self.load(reference["file"]), reference["file"], reference.get("key")
        if key not in tensors:
            return f"key {key!r} not in {file}"
        if "shape" in reference and list(tensors[key].shape) != list(reference["shape"]):
            return f"{file}[{key}] has shape {list(tensors[key].shape)}, record says {reference['shape']}"
        digest = tensor_sha256(tensors[key])
        if digest != reference.get("sha256"):
            return f"{file}[{key}] sha256 {digest}, record says {reference.get('sha256')}"
        return None

    def verified(self, reference: dict):
        """The array a reference names only if it matches the record's shape and SHA-256; else None."""
        try:
            return None if self.check(reference) else self.load(reference["file"])[reference["key"]]
        except TensorFileError:
            return None
