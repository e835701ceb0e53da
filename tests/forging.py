"""What a learner writes to forge a run: edit its records as plain JSON, then re-hash the manifest's inventory so
that every file verifies again."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path


def forge(source: Path, target: Path, edit) -> Path:
    """A copy of a run whose records `edit` changed in place, written back and re-hashed."""
    shutil.copytree(source, target)
    records = [json.loads(line) for line in (target / "records.jsonl").read_text().splitlines()]
    edit(records)
    (target / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rebind(target)
    return target


def find(records: list[dict], kind: str, **fields) -> dict:
    """The first record of a kind whose fields have the given values."""
    return next(r for r in records if r["kind"] == kind and all(r.get(k) == v for k, v in fields.items()))


def rebind(run: Path) -> None:
    """The manifest's inventory re-hashed (the files it held, and only those: the addenda come after the session),
    and the addenda ledger, when there is one, bound to the new manifest's hash."""
    manifest_path = run / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for name in manifest["files"]:
        data = (run / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_path.write_text(json.dumps(manifest, indent=2))
    digest = hashlib.sha256(manifest_path.read_bytes()).hexdigest()
    ledger = run / "addenda.jsonl"
    if ledger.is_file():
        entries = [json.loads(line) for line in ledger.read_text().splitlines()]
        ledger.write_text("".join(json.dumps({**entry, "manifest_sha256": digest}) + "\n" for entry in entries))
