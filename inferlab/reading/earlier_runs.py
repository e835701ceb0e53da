"""Whether an earlier run's folder reached its end, read as every run is read: its claim and manifest, and its
records.jsonl through the one parser (inferlab.reading.runview.parse_records). inferlab.run.ended renames such a
folder; a new session hands this module, its reader, to inferlab.run.lifecycle.claim_run, whose record log keeps
the run's own lines through the same parse_records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from inferlab.base.records import CLAIM_FILE, MANIFEST_FILE, RECORDS_FILE
from inferlab.reading.runview import parse_records

__all__ = ["claim_without_end", "parse_records"]  # the reader a session is handed (parse_records: runview's)


def _json_object(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def claim_without_end(folder: Path) -> Optional[dict]:
    """The claim of a run folder that has no session_end (neither a session_end record nor a final manifest), or
    None: not a run's folder, or it reached its end."""
    claim = _json_object(Path(folder) / CLAIM_FILE)
    if claim is None:
        return None
    manifest = _json_object(Path(folder) / MANIFEST_FILE) or {}
    if manifest.get("session_end") is not None or "files" in manifest:
        return None
    try:
        raw = (Path(folder) / RECORDS_FILE).read_bytes()
    except OSError:
        raw = b""
    records, _ = parse_records(raw)  # a torn or unreadable line is no session_end
    return None if any(record.get("kind") == "session_end" for record in records) else claim
