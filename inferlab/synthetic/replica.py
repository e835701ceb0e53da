"""The replica specimen: pythia-14m's real small files with constructed weights in the real weight layout.

Built offline from the published small files kept beside the project (`../shared/reference/pythia-14m`,
never copied into the repository):

- config.json, tokenizer.json, tokenizer_config.json and special_tokens_map.json, byte for byte;
- model.safetensors: the real file's exact header (same tensor names, dtypes, shapes and offsets,
  28,143,920 bytes in all) holding weights from inferlab.synthetic.recipe, the stand-in's recipe;
- no generation_config.json: the pinned revision very probably has none, and a replica must meet
  that case the way a learner's run will.

So a replica run meets the real tokenizer (no pad token, 50,277 ids for 50,304 rows, EOS = BOS = 0) and
the real configuration, but its weights are made up: it is synthetic wherever the stand-in is.

Usage: python -m inferlab.replica DIR   (DIR must be new or empty; the reference folder must exist)
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

from inferlab.base.checkout import PROJECT_ROOT
from inferlab.base.commands import spelled
from inferlab.base.records import sha256_file
from inferlab.synthetic import recipe
from inferlab.synthetic.standin import BuildRefused, check_target, command_line, write_files

REFERENCE_ENV = "INFERLAB_PYTHIA_REFERENCE"  # tests point it elsewhere; learners never need it
DEFAULT_REFERENCE_DIR = PROJECT_ROOT.parent / "shared" / "reference" / "pythia-14m"
COPIED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HEADER_FILE = "model.safetensors.header"
WEIGHT_FILE = "model.safetensors"
RECIPE = f"inferlab-replica-pythia-14m-small-files/recipe-{recipe.VERSION}"
SAFETENSORS_DTYPES = {"F16": np.dtype("<f2")}


class ReferenceUnavailable(Exception):
    """The folder of published small files is missing or incomplete: the replica cannot be built."""


def revision() -> str:
    """The replica's pinned revision: sha1 of RECIPE as 40 hex digits (not a hub commit)."""
    return hashlib.sha1(RECIPE.encode("utf-8")).hexdigest()


def reference_dir() -> Path:
    """Where the published small files are expected: $INFERLAB_PYTHIA_REFERENCE, else ../shared/reference/pythia-14m."""
    configured = os.environ.get(REFERENCE_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_REFERENCE_DIR


def require_reference(directory: Path | None = None) -> Path:
    """The reference folder, checked to hold every file the replica copies; ReferenceUnavailable otherwise."""
    directory = Path(directory) if directory is not None else reference_dir()
    needed = (*COPIED_FILES, HEADER_FILE)
    missing = [name for name in needed if not (directory / name).is_file()]
    if missing:
        state = "absent" if not directory.is_dir() else f"lacks {missing}"
        raise ReferenceUnavailable(
            f"the replica specimen is built from pythia-14m's published small files, expected in {directory} "
            f"(the folder ../shared/reference/pythia-14m beside the project, or ${REFERENCE_ENV}); actual: {state}. "
            f"It exists on the course's CI machines, not in a learner's clone: use --specimen standin instead."
        )
    return directory


def header_layout(header: bytes) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """(name, dtype, shape, start, end) of every tensor in a safetensors JSON header, by data offset."""
    entries = json.loads(header)
    layout = []
    for name, entry in entries.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        layout.append((name, entry["dtype"], tuple(entry["shape"]), start, end))
    return sorted(layout, key=lambda item: item[3])


def weight_file_bytes(header: bytes, variant: recipe.Variant = recipe.BASE) -> bytes:
    """The real header, then the recipe's tensors at exactly the header's offsets; ValueError on any mismatch."""
    tensors = recipe.weights(variant)
    layout = header_layout(header)
    if {entry[0] for entry in layout} != set(tensors):
        raise ValueError(f"{HEADER_FILE}: tensor names differ from the recipe's: "
                         f"{sorted({entry[0] for entry in layout} ^ set(tensors))}")
    data = bytearray(layout[-1][4])
    position = 0
    for name, dtype, shape, start, end in layout:
        if start != position:
            raise ValueError(f"{HEADER_FILE}: {name} starts at {start}, expected {position} (no gaps)")
        array = tensors[name]
        if dtype not in SAFETENSORS_DTYPES or array.shape != shape:
            raise ValueError(f"{HEADER_FILE}: {name} is {dtype} {shape}, the recipe gives float16 {array.shape}")
        raw = array.astype(SAFETENSORS_DTYPES[dtype]).tobytes()
        if len(raw) != end - start:
            raise ValueError(f"{HEADER_FILE}: {name} spans {end - start} bytes, the recipe gives {len(raw)}")
        data[start:end] = raw
        position = end
    return struct.pack("<Q", len(header)) + header + bytes(data)


def file_contents(reference: Path | None = None, variant: recipe.Variant = recipe.BASE) -> dict[str, bytes]:
    """The replica's five files' bytes, keyed by name (no generation_config.json)."""
    directory = require_reference(reference)
    contents = {name: (directory / name).read_bytes() for name in COPIED_FILES}
    contents[WEIGHT_FILE] = weight_file_bytes((directory / HEADER_FILE).read_bytes(), variant)
    return contents


def build(directory, reference: Path | None = None, variant: recipe.Variant = recipe.BASE) -> dict:
    """Write the replica into a new or empty directory; return {directory, files: {name: {size, sha256}}, ...}.

    Raises BuildRefused before writing when the directory is a file or not empty, and
    ReferenceUnavailable when the published small files are not there.
    """
    start = time.perf_counter()
    directory = Path(directory)
    check_target(directory)  # before the weights are computed; write_files checks again as it writes
    files = write_files(directory, file_contents(reference, variant))
    used = require_reference(reference)
    return {
        "directory": str(directory),
        "recipe": RECIPE,
        "variant": variant.describe(),
        "revision": revision(),
        "reference": str(used),
        "reference_sha256": {name: sha256_file(used / name) for name in (*COPIED_FILES, HEADER_FILE)},
        "files": files,
        "elapsed_s": time.perf_counter() - start,
    }


def main(argv=None) -> int:
    """Command line: build the replica into a new or empty DIR and print the file sizes and hashes as JSON."""
    return command_line(spelled("-m inferlab.replica", "python"), "the five files", build,
                        (BuildRefused, ReferenceUnavailable), argv)


if __name__ == "__main__":
    sys.exit(main())
