"""The bytes of a run folder's files, parsed: records.jsonl, the JSON files and the addenda ledger, with every
problem met (nothing raised over a damaged or partial folder); and what makes a folder a run's at all."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from inferlab.run.records import CLAIM_FILE, MANIFEST_FILE, PLAN_FILE, RECORDS_FILE  # noqa: F401 (for runview)

LEDGER_FILE = "addenda.jsonl"  # what is kept beside the run afterwards (inferlab.read.addenda writes it)
ENTRY_FIELDS = ("schema", "seq", "kind", "file", "original_name", "size", "sha256", "attached_utc",
                "manifest_sha256", "structure", "tool")
REQUIRED_ENVELOPE_FIELDS = ("kind", "test", "seq", "wall_time")  # every record has them


@dataclass(frozen=True)
class Problem:
    """One thing met while reading: the file, the line (records.jsonl), what; lost=False when the content was
    still read (not ASCII, an envelope field missing) and only its form is wrong."""

    file: str
    what: str
    line: Optional[int] = None
    code: str = "unreadable"  # missing, unreadable, not_json, not_object, not_ascii, missing_fields
    lost: bool = True

    def __str__(self) -> str:
        return f"{self.file}{'' if self.line is None else f':{self.line}'}: {self.what}"


def _json_lines(file: str, text: str, required: tuple) -> tuple[list[dict], list[Problem]]:
    """The JSON objects of a JSON Lines text, and a Problem for each line that is not one; an object that lacks a
    required field is kept, with a problem that loses nothing (its form is wrong, its content still read)."""
    pieces = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # lines as a text file reads them
    found, problems = [], []
    for number, line in enumerate(pieces[:-1] + ([pieces[-1]] if pieces[-1] else []), start=1):
        try:
            value = json.loads(line)
        except ValueError as error:
            problems.append(Problem(file, f"not a JSON object ({error})", number, "not_json"))
            continue
        if not isinstance(value, dict):
            problems.append(Problem(file, f"a {type(value).__name__}, expected a JSON object", number, "not_object"))
            continue
        absent = [name for name in required if name not in value]
        if absent:
            problems.append(Problem(file, f"missing field(s) {', '.join(absent)}", number, "missing_fields",
                                    lost=False))
        found.append(value)
    return found, problems


def parse_records(raw: bytes) -> tuple[list[dict], list[Problem]]:
    """The records of records.jsonl's bytes, in write order, and one Problem per line that is not a record."""
    problems = []
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as error:
        problems.append(Problem(RECORDS_FILE, f"not ASCII as written ({error})", code="not_ascii", lost=False))
        text = raw.decode("ascii", errors="replace")
    records, found = _json_lines(RECORDS_FILE, text, REQUIRED_ENVELOPE_FIELDS)
    return records, problems + found


def outside(directory: Path, relative: object) -> Optional[str]:
    """Why a path that a run's own file names is not a file inside the run folder (None when it is): absolute, a
    step up, or a link that leads out. Nothing outside a run is opened because a file in it names it."""
    if not isinstance(relative, str) or not relative or Path(relative).is_absolute() or ".." in Path(relative).parts:
        return f"{relative!r} is not a path inside the run folder"
    if not (Path(directory) / relative).resolve().is_relative_to(Path(directory).resolve()):
        return f"{relative!r} is a link that leads out of the run folder"
    return None


def read_inside(directory: Path, name: str) -> bytes:
    """A run file's bytes, refused (OSError) when a link leads it out of the run folder."""
    why = outside(directory, name)
    if why is not None:
        raise OSError(f"{why}; not opened")
    return (Path(directory) / name).read_bytes()


def read_json(directory: Path, name: str) -> tuple[Optional[dict], Optional[Problem]]:
    path = directory / name
    if not path.exists():
        return None, Problem(name, "missing", code="missing")
    try:
        data = json.loads(read_inside(directory, name).decode("utf-8"))
    except (OSError, ValueError) as error:
        return None, Problem(name, f"not readable JSON ({error})")
    if not isinstance(data, dict):
        return None, Problem(name, f"a {type(data).__name__}, expected a JSON object", code="not_object")
    return data, None


def parse_ledger(raw: bytes) -> tuple[list[dict], list[Problem]]:
    """The ledger's entries, and a Problem for every line that is not one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return [], [Problem(LEDGER_FILE, f"not UTF-8 ({error})")]
    entries, problems = _json_lines(LEDGER_FILE, text, ENTRY_FIELDS)
    if text and not text.endswith("\n"):
        problems.append(Problem(LEDGER_FILE, "the last line is not complete (no newline): a torn write",
                                line=len(text.splitlines())))
    return entries, problems


def read_ledger(directory: Path) -> tuple[list[dict], list[Problem]]:
    """The addenda ledger's entries and problems; a run with nothing attached has no ledger, which is no problem."""
    path = directory / LEDGER_FILE
    if not path.exists():
        return [], []
    try:
        return parse_ledger(read_inside(directory, LEDGER_FILE))
    except OSError as error:
        return [], [Problem(LEDGER_FILE, f"not readable ({error})")]


def not_a_run_reason(path: Path) -> Optional[str]:
    """Why `path` is not a run's record dir (None when it is one), from its first record and manifest alone.

    A run claims its folder (CLAIM_FILE) and opens RECORDS_FILE and MANIFEST_FILE before any test, so
    a folder with none of them, or with files of those names that are not a run's, was never a run.
    """
    path = Path(path)
    if (path / CLAIM_FILE).is_file():
        return None
    try:
        with open(path / RECORDS_FILE, encoding="ascii", errors="replace") as handle:
            first = handle.readline()
        record = json.loads(first) if first.strip() else None
        if isinstance(record, dict) and {"kind", "seq"} <= set(record):
            return None
    except (OSError, ValueError):
        pass
    manifest = read_json(path, MANIFEST_FILE)[0] or {}
    if manifest.get("mode") in ("run", "plan") and "protocol" in manifest:
        return None
    present = [name for name in (RECORDS_FILE, MANIFEST_FILE) if (path / name).exists()]
    if not present:
        return f"{path} is not a run's record dir: it has no {RECORDS_FILE}, {MANIFEST_FILE} or {CLAIM_FILE}"
    return (f"{path} is not a run's record dir: its {' and '.join(present)} "
            f"{'is' if len(present) == 1 else 'are'} not a run's (no record with kind and seq, no run manifest)")


def claim_without_end(folder: Path) -> Optional[dict]:
    """The claim of a run folder that has no session_end (neither a session_end record nor a final manifest), or
    None: not a run's folder, or it reached its end (how a new session finds an earlier run killed before its end)."""
    claim, _ = read_json(Path(folder), CLAIM_FILE)
    manifest, _ = read_json(Path(folder), MANIFEST_FILE)
    if not isinstance(claim, dict) or (manifest or {}).get("session_end") is not None or "files" in (manifest or {}):
        return None
    try:
        raw = (Path(folder) / RECORDS_FILE).read_bytes()
    except OSError:
        raw = b""
    records, _ = parse_records(raw)  # a torn or unreadable line is no session_end
    return None if any(record.get("kind") == "session_end" for record in records) else claim
