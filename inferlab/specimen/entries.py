"""What may sit in a specimen folder: every entry is listed from its metadata alone and given a verdict.

Nothing here opens a file. The rule, entry by entry (docs/specimens.md says the same):

- An allowlisted name at the top level is the specimen file itself ("allowlisted").
- README.md and .gitattributes at the top level are inert documentation ("inert"); the hub lists both.
- Under .cache/huggingface/, the bookkeeping huggingface_hub writes for a --local-dir download
  (.gitignore, *.metadata, *.lock) is allowed ("hub_bookkeeping").
- Folders are walked ("directory"); an empty one is harmless.
- Every other file, at any depth and under .cache/huggingface/ too, is refused: weight files,
  pickles and code by name, and anything else because a loader reads files by name from this folder
  (added_tokens.json, vocab.json, chat_template.jinja, ...).
- A symlink is resolved once and judged by what it points to: to a regular file it counts as that
  file (a huggingface_hub cache snapshot links every file to a blob); to a folder, to nothing, or to
  a FIFO, device or socket, it is refused and never followed.
- A FIFO, device or socket is refused without being opened, so it cannot hang the check.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

INERT_FILES = ("README.md", ".gitattributes")
# Desktop bookkeeping a file manager leaves in any folder it opens (macOS Finder, Windows Explorer).
DESKTOP_BOOKKEEPING = (".DS_Store", "Thumbs.db", "desktop.ini")
HUB_BOOKKEEPING_DIR = (".cache", "huggingface")
HUB_BOOKKEEPING_NAMES = (".gitignore",)
HUB_BOOKKEEPING_SUFFIXES = (".metadata", ".lock")
REFUSED_PATTERNS = {
    "weights": ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf",
                "*.ot", "*.tflite", "*.npz", "*.npy"),
    "a pickle": ("*.pkl", "*.pickle", "*.joblib", "*.dill"),
    "code": ("*.py", "*.pyc", "*.pyo", "*.pyd", "*.so", "*.dylib", "*.dll", "*.sh", "*.ipynb"),
}
MAX_ENTRIES = 1000  # a specimen folder holds a handful; a mistaken --artifacts ~ is not walked whole


def kind_of(mode: int) -> str:
    """A file type name from st_mode."""
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "char_device"), (stat.S_ISBLK, "block_device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "unknown"


def refused_class(name: str):
    """'weights', 'a pickle' or 'code' when a file name matches a refused pattern, else None."""
    lowered = name.lower()
    for label, patterns in REFUSED_PATTERNS.items():
        if any(fnmatch.fnmatchcase(lowered, pattern) for pattern in patterns):
            return label
    return None


def _file_verdict(parts: tuple, allowlist) -> tuple[str, str]:
    name = parts[-1]
    label = refused_class(name)
    if len(parts) == 1 and name in allowlist:
        return "allowlisted", "a specimen file; checked against its pin"
    if label is not None:
        return "refused", f"{label} (name matches a refused pattern): never accepted beside the specimen"
    if len(parts) == 1 and name in INERT_FILES:
        return "inert", "documentation the hub lists; no loader reads it"
    if len(parts) == 1 and name in DESKTOP_BOOKKEEPING:
        return "inert", "a file manager's bookkeeping (opening the folder leaves it); no loader reads it"
    if (parts[:2] == HUB_BOOKKEEPING_DIR and len(parts) > 2
            and (name in HUB_BOOKKEEPING_NAMES or name.endswith(HUB_BOOKKEEPING_SUFFIXES))):
        return "hub_bookkeeping", "huggingface_hub's record of a --local-dir download; no loader reads it"
    return "refused", ("not part of the specimen: a loader reads files by name from this folder, "
                       "so only the allowlisted files, README.md, .gitattributes and a file manager's "
                       ".DS_Store, Thumbs.db or desktop.ini may sit here")


def scan(directory: Path, allowlist) -> dict:
    """Every entry under directory with its verdict: {entries, refused, truncated}.

    Each entry: {path (relative, POSIX), type, size, target, target_type, verdict, reason}.
    `target`/`target_type` describe a symlink's destination (None otherwise); `size` is the
    byte count of a regular file (through a symlink, of its target). Stops after MAX_ENTRIES.
    """
    entries, truncated = [], False
    pending = [(directory, ())]
    while pending:
        folder, prefix = pending.pop(0)
        try:
            with os.scandir(folder) as listing:
                children = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            entries.append({"path": "/".join(prefix) or ".", "type": "directory", "size": None, "target": None,
                            "target_type": None, "verdict": "refused", "reason": f"cannot be listed: {error}"})
            continue
        for child in children:
            if len(entries) >= MAX_ENTRIES:
                truncated = True
                break
            parts = prefix + (child.name,)
            entry = _judge(Path(child.path), parts, allowlist)
            entries.append(entry)
            if entry["type"] == "directory" and entry["verdict"] == "directory":
                pending.append((Path(child.path), parts))
        if truncated:
            break
    return {"entries": entries, "refused": [e["path"] for e in entries if e["verdict"] == "refused"],
            "truncated": truncated}


def _judge(path: Path, parts: tuple, allowlist) -> dict:
    entry = {"path": "/".join(parts), "type": None, "size": None, "target": None, "target_type": None,
             "verdict": "refused", "reason": None}
    try:
        own = os.lstat(path)
    except OSError as error:
        entry.update(type="unknown", reason=f"cannot be examined: {error}")
        return entry
    entry["type"] = kind_of(own.st_mode)
    if entry["type"] == "symlink":
        entry["target"] = os.readlink(path)
        try:
            resolved = os.stat(path)  # stat follows the link without opening what it points to
        except OSError as error:
            entry.update(target_type="missing", reason=f"a symlink to nothing ({error.strerror})")
            return entry
        entry["target_type"] = kind_of(resolved.st_mode)
        if entry["target_type"] != "file":
            entry["reason"] = (f"a symlink to a {entry['target_type']}: only a symlink to a regular file is "
                               f"accepted, and it is judged as that file")
            return entry
        entry["size"] = resolved.st_size
        verdict, reason = _file_verdict(parts, allowlist)
        entry.update(verdict=verdict, reason=f"symlink to a regular file; {reason}")
        return entry
    if entry["type"] == "directory":
        entry.update(verdict="directory", reason="walked; each entry inside is judged")
        return entry
    if entry["type"] != "file":
        entry["reason"] = f"a {entry['type']}, not a regular file: refused without being opened"
        return entry
    entry["size"] = own.st_size
    entry["verdict"], entry["reason"] = _file_verdict(parts, allowlist)
    return entry
