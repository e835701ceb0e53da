"""Material written after a session, kept beside its records: the ledger's format, reading it, and the
structure check of an explanation against the template.

Layout inside a run folder (nothing the session wrote is ever changed):
    addenda.jsonl          the ledger: one JSON object per line, appended, flushed and fsynced whole
    addenda/<stored name>  each attached file, copied once and never overwritten

A ledger line (LEDGER_SCHEMA 1) holds at least: schema, seq (0, 1, 2 ... in ledger order), kind
('explanation', 'revised_criterion', or another), file ('addenda/<stored name>'), original_name, size,
sha256, attached_utc, manifest_sha256 (of manifest.json when it was attached, which binds it to this run),
structure (None, or the structure check of an explanation) and tool (the command that wrote it).
Since inferlab attach and revise exist it also holds run_finished (whether the session had reached its end
and written its final manifest when the addendum was attached) and run_state (that in words: "finished",
or why not). A line is written once, whole, by inferlab.reading.addenda_store (the one writer of addenda); the one
reader (RunView) reads the ledger; verify (inferlab.verify.addenda) checks every entry against its file.

Nothing here proves who wrote an addendum or when beyond what the files say: the ledger binds an addendum
to the manifest it was attached beside, and its size and SHA-256 show whether it changed since.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

from inferlab.base.checkout import PROJECT_ROOT
from inferlab.base.records import MANIFEST_FILE, sha256_file

LEDGER_FILE = "addenda.jsonl"
ADDENDA_DIR = "addenda"
LEDGER_SCHEMA = 1
EXPLANATION_TEMPLATE = "explanation.md"  # at the repository root, beside predictions.md
ENTRY_FIELDS = ("schema", "seq", "kind", "file", "original_name", "size", "sha256", "attached_utc",
                "manifest_sha256", "structure", "tool")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLANATION_KIND, REVISED_KIND = "explanation", "revised_criterion"


def is_addenda_path(relative: str) -> bool:
    """Whether a path under the run folder belongs to the addenda (the ledger, or a file under addenda/)."""
    return relative == LEDGER_FILE or relative.startswith(ADDENDA_DIR + "/")


def sha256_of_file(path: Path) -> Optional[str]:
    """SHA-256 of a file's bytes, or None when it cannot be read."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def stored_path_error(file) -> Optional[str]:
    """Why an entry's `file` is not a path under addenda/ (None when it is one): absolute, '..', or elsewhere."""
    if not isinstance(file, str) or not file:
        return f"file {file!r}, expected 'addenda/<stored name>'"
    parts = file.split("/")
    if len(parts) != 2 or parts[0] != ADDENDA_DIR or parts[1] in ("", ".", "..") or "\\" in file:
        return f"file {file!r}, expected 'addenda/<stored name>' (one file directly under {ADDENDA_DIR}/)"
    return None


def entry_findings(directory: Path, entry: dict, manifest_sha256: Optional[str]) -> list[str]:
    """What is wrong with one ledger entry against the run folder now: its file missing, or of another size or
    SHA-256 than the entry says, or the entry bound to another manifest than the run's (manifest_sha256, None
    when the run has no manifest.json). Each line names the file; an empty list means the addendum is intact."""
    seq = entry.get("seq")
    where = f"{LEDGER_FILE} seq {seq}"
    error = stored_path_error(entry.get("file"))
    if error is not None:
        return [f"{where}: {error}"]
    file = entry["file"]
    path = Path(directory) / file
    findings = []
    if path.is_symlink() or not path.is_file():
        findings.append(f"{file}: missing (or not a regular file); {where} lists it (removed after it was attached?)"
                        f"; {restore_words(directory, entry)}")
    else:
        size = path.stat().st_size
        if size != entry.get("size"):
            findings.append(f"{file}: size {size} bytes, {where} says {entry.get('size')} (changed after it was "
                            f"attached)")
        digest = sha256_of_file(path)
        if digest != entry.get("sha256"):
            findings.append(f"{file}: sha256 {digest}, {where} says {entry.get('sha256')} (edited after it was "
                            f"attached); {restore_words(directory, entry)}")
    if manifest_sha256 is None:
        findings.append(f"{file}: {where} binds it to manifest.json sha256 {entry.get('manifest_sha256')}, and the "
                        f"run has no {MANIFEST_FILE} now")
    elif entry.get("manifest_sha256") != manifest_sha256:
        findings.append(f"{file}: {where} binds it to manifest.json sha256 {entry.get('manifest_sha256')}, and this "
                        f"run's {MANIFEST_FILE} is {manifest_sha256} now (attached to another run, or the manifest "
                        f"changed since)")
    return findings


def restore_words(directory: Path, entry: dict) -> str:
    """How to repair an addendum that was edited in place or removed: put back the bytes that were attached (the
    size and SHA-256 the ledger holds, from the learner's own file), and keep any new text as a new version."""
    import shlex

    from inferlab.base.commands import spelled

    where = shlex.quote(str(directory))
    if entry.get("kind") == REVISED_KIND:
        source = "a backup of it"
        command = spelled(f"revise {where} --cache-criterion ATOL,RTOL --justification TEXT")
        again = f"to have a revision kept, run `{command}` again: it is kept beside this one"
    else:
        source = f"your file {entry.get('original_name')!r} as it was then, or a backup"
        again = (f"to keep new text, attach it as a new version beside it (`{spelled(f'attach {where} FILE')}`: every "
                 f"version is kept)")
    return (f"to repair it, put back the very bytes that were attached ({entry.get('size')} bytes, sha256 "
            f"{entry.get('sha256')}: {source}), since the ledger and the kept copies are never rewritten; {again}")


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


def read_template(root: Path = PROJECT_ROOT) -> Optional[str]:
    """The explanation template's text, or None when the repository has none."""
    try:
        return (Path(root) / EXPLANATION_TEMPLATE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
