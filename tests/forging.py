"""What a learner writes to forge a run: edit its records as plain JSON, then re-hash the manifest's inventory so
that every file verifies again (the forgery tests, tests/test_forgeries.py and tests/test_replay.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path


def rehash(directory: Path) -> None:
    """Make the manifest's inventory agree with the files again, as anyone can."""
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            manifest["files"][path.relative_to(directory).as_posix()] = {
                "size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    manifest_path.write_text(json.dumps(manifest, indent=2))


def forge(source: Path, target: Path, edit) -> Path:
    """A copy of a run whose records `edit` changed in place, written back and re-hashed."""
    shutil.copytree(source, target)
    records = [json.loads(line) for line in (target / "records.jsonl").read_text().splitlines()]
    edit(records)
    (target / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rehash(target)
    return target


def find(records: list[dict], kind: str, **fields) -> dict:
    """The first record of a kind whose fields have the given values."""
    return next(r for r in records if r["kind"] == kind and all(r.get(k) == v for k, v in fields.items()))
