"""verify's check of what was attached after the session (inferlab.reading.addenda): the ledger as written, every
entry against its file (present, size, SHA-256) and against the run (its manifest_sha256 is the manifest's
now), a kept revised criterion against the tensors it judged, and no file under addenda/ that no entry lists.

The addenda are not the session's files: they are reported apart from its inventory (verify's OK line
counts them separately), and every problem names the addendum's file or the ledger's line.
"""

from __future__ import annotations

from typing import Optional

from inferlab.base.records import MANIFEST_FILE
from inferlab.reading.addenda import (ADDENDA_DIR, LEDGER_FILE, REVISED_KIND, entry_findings, sha256_of_file,
                                     stored_path_error)
from inferlab.reading.runview import RunView


def manifest_sha256(view: RunView) -> Optional[str]:
    """SHA-256 of the run's manifest.json as it is now (None without a file to hash)."""
    if view.directory is None or not (view.directory / MANIFEST_FILE).is_file():
        return None
    return sha256_of_file(view.directory / MANIFEST_FILE)


def ledger_problems(view: RunView) -> list[str]:
    """The ledger as written: lines that are not entries, seq out of ledger order, a file that is not under
    addenda/, a stored file that two entries list."""
    problems = [str(problem) for problem in view.addenda_problems]
    first_listing: dict = {}
    for index, entry in enumerate(view.addenda):
        if entry.get("seq") != index:
            problems.append(f"{LEDGER_FILE}: entry {index + 1} has seq {entry.get('seq')!r}, expected {index} "
                            f"(entries are numbered in ledger order)")
        file = entry.get("file")
        if stored_path_error(file) is None and file in first_listing:
            problems.append(f"{LEDGER_FILE} seq {entry.get('seq')}: lists {file}, which seq {first_listing[file]} "
                            f"lists too (a stored file is never reused)")
        first_listing.setdefault(file, entry.get("seq"))
    return problems


def entry_problems(view: RunView) -> list[str]:
    """Every entry against its file and the run's manifest; a revised criterion also against its tensors."""
    if view.directory is None:  # a view built from data has no files to check
        return []
    from inferlab.recheck.revise import check_revision

    now = manifest_sha256(view)
    problems = []
    for entry in view.addenda:
        findings = entry_findings(view.directory, entry, now)
        problems += findings
        if not findings and entry.get("kind") == REVISED_KIND:
            problems += check_revision(view, entry["file"], (view.directory / entry["file"]).read_bytes())
    return problems


def unlisted_files(view: RunView) -> list[str]:
    """Files under addenda/ that no ledger entry lists (a leftover temporary file of an attach that was
    stopped, or a file put there by hand)."""
    if view.directory is None or not (view.directory / ADDENDA_DIR).is_dir():
        return []
    listed = {entry.get("file") for entry in view.addenda}
    problems = []
    for path in sorted((view.directory / ADDENDA_DIR).rglob("*")):
        relative = path.relative_to(view.directory).as_posix()
        if path.is_dir() or relative in listed:
            continue
        what = ("a temporary file left by an attach or revise that was stopped" if path.name.startswith(".")
                else "not kept by attach or revise")
        problems.append(f"{relative}: under {ADDENDA_DIR}/ but no entry of {LEDGER_FILE} lists it ({what})")
    return problems


def addenda_problems(view: RunView) -> list[str]:
    """Every problem of the addenda, one line each, in the order verify states them."""
    return ledger_problems(view) + entry_problems(view) + unlisted_files(view)


def check_addenda(checker) -> None:
    """verify's addenda check over the Checker (inferlab.verify.checker)."""
    for line in addenda_problems(checker.view):
        checker.problem(line)


def described(count: int) -> str:
    """How verify's OK line counts the addenda: '1 addendum added after the session, intact'."""
    return f"{count} {'addendum' if count == 1 else 'addenda'} added after the session, intact"
