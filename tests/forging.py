"""What a learner writes to forge a run: edit its records as plain JSON, then re-hash the manifest's inventory so
that every file verifies again (the forgery tests, tests/test_forgeries.py and tests/test_replay.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Optional


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


def nudge_first_step_logits(source: Path, target: Path, trial_id: str, by: Optional[float] = None) -> dict:
    """A copy of a run whose saved first-step logits of `trial_id` have one element (the smallest, never a top id)
    moved by one unit in the last place, far inside any tolerance (or up by `by`, beyond it). A careful forger keeps every figure derived from
    it true: the same element is moved in every saved tensor that held the same value there (the prompt's other
    conditions' raw logits, greedy's scores, which the checks compare with it bit for bit), every record's hash of
    a moved tensor is redone, the report rendered again, the inventory re-hashed and the ledger rebound.
    {run, file, key, element, moved: [file[key]]}."""
    import numpy
    from safetensors.numpy import load_file, save_file

    from inferlab import report

    shutil.copytree(source, target)
    records = [json.loads(line) for line in (target / "records.jsonl").read_text().splitlines()]
    reference = dict(find(records, "generation", trial_id=trial_id)["first_step_logits"])
    original = load_file(str(target / reference["file"]))[reference["key"]]
    element = int(numpy.argmin(original))
    value = original[element].copy()
    digests = {}
    for path in sorted((target / "tensors").glob("*.safetensors")):
        tensors = load_file(str(path))
        moved = [key for key, array in tensors.items() if array.shape == original.shape
                 and array[element].tobytes() == value.tobytes()]
        for key in moved:
            tensors[key][element] = (numpy.nextafter(value, numpy.float32(numpy.inf), dtype=numpy.float32)
                                     if by is None else numpy.float32(value + by))
            digests[(path.relative_to(target).as_posix(), key)] = hashlib.sha256(
                numpy.ascontiguousarray(tensors[key]).astype("<f4").tobytes()).hexdigest()
        if moved:
            save_file(tensors, str(path))
    for record in records:
        for name, found in [*record.items(), *(record.get("tensors") or {}).items()]:
            if isinstance(found, dict) and (found.get("file"), found.get("key")) in digests:
                found["sha256"] = digests[(found["file"], found["key"])]
                if isinstance(record.get(f"{name}_sha256"), str):
                    record[f"{name}_sha256"] = found["sha256"]
    (target / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # the report rendered again, as grade compares it
    (target / report.REPORT_FILE).write_text(report.render_report(target), encoding="utf-8")
    rebind(target)
    return {"run": target, "file": reference["file"], "key": reference["key"], "element": element,
            "moved": [f"{file}[{key}]" for file, key in digests]}
