"""Material written after a session, kept beside its records: the ledger's format, reading it, and the
structure check of an explanation against the template.

Layout inside a run folder (nothing the session wrote is ever changed):
    addenda.jsonl          the ledger: one JSON object per line, appended, flushed and fsynced whole
    addenda/<stored name>  each attached file, copied once and never overwritten

A ledger line (LEDGER_SCHEMA 1) holds at least: schema, seq (0, 1, 2 ... in ledger order), kind
('explanation', 'revised_criterion', or another), file ('addenda/<stored name>'), original_name, size,
sha256, attached_utc, manifest_sha256 (of manifest.json when it was attached, which binds it to this run),
structure (None, or the structure check of an explanation) and tool (the command that wrote it).
The one reader (RunView) reads the ledger; verify checks every entry against its file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

LEDGER_FILE = "addenda.jsonl"
ADDENDA_DIR = "addenda"
LEDGER_SCHEMA = 1
EXPLANATION_TEMPLATE = "explanation.md"  # at the repository root, beside predictions.md
ENTRY_FIELDS = ("schema", "seq", "kind", "file", "original_name", "size", "sha256", "attached_utc",
                "manifest_sha256", "structure", "tool")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def parse_ledger(raw: bytes) -> tuple[list[dict], list[tuple[int, str]]]:
    """The ledger's entries in order, and (line number, what is wrong) for every line that is not an entry."""
    entries, problems = [], []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return [], [(0, f"not UTF-8 ({error})")]
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            entry = json.loads(line)
        except ValueError as error:
            problems.append((number, f"not a JSON object ({error})"))
            continue
        if not isinstance(entry, dict):
            problems.append((number, f"a {type(entry).__name__}, expected a JSON object"))
            continue
        absent = [name for name in ENTRY_FIELDS if name not in entry]
        if absent:
            problems.append((number, f"missing field(s) {', '.join(absent)}"))
        entries.append(entry)
    if text and not text.endswith("\n"):
        problems.append((len(text.splitlines()), "the last line is not complete (no newline): a torn write"))
    return entries, problems


def sections(text: str) -> list[tuple[int, str, list[str]]]:
    """(level, heading text, the lines under it up to the next heading) for every Markdown heading, in order."""
    found: list[tuple[int, str, list[str]]] = []
    for line in text.splitlines():
        match = HEADING.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2).strip(), []))
        elif found:
            found[-1][2].append(line)
    return found


def _key(heading: str) -> str:
    return " ".join(heading.lower().split())


def structure_of(text: str, template_text: Optional[str]) -> dict:
    """The explanation's structure against the template: which of its headings are present, which are missing,
    which sections hold nothing but the template's own guidance; ok when none is missing or empty. A heading
    that only groups deeper ones (Limitations) needs no text of its own. It judges the form only: whether the
    content is right is for a person to say."""
    if template_text is None:
        return {"template": EXPLANATION_TEMPLATE, "ok": None, "headings_present": [], "headings_missing": [],
                "empty_sections": [], "note": f"the template {EXPLANATION_TEMPLATE} was not found; not checked"}
    template = sections(template_text)[1:]  # the first heading is the page's title
    written = {_key(heading): body for _, heading, body in sections(text)}
    present, missing, empty = [], [], []
    for index, (level, heading, guidance) in enumerate(template):
        body = written.get(_key(heading))
        if body is None:
            missing.append(heading)
            continue
        present.append(heading)
        groups = index + 1 < len(template) and template[index + 1][0] > level
        own = {line.strip() for line in guidance if line.strip()}
        if not groups and not [line for line in body if line.strip() and line.strip() not in own]:
            empty.append(heading)
    return {"template": EXPLANATION_TEMPLATE, "ok": not missing and not empty, "headings_present": present,
            "headings_missing": missing, "empty_sections": empty}


def read_template(root: Path) -> Optional[str]:
    """The explanation template's text, or None when the repository has none."""
    try:
        return (Path(root) / EXPLANATION_TEMPLATE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
