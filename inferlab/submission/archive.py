"""Reading a submission archive (`inferlab pack`'s .tar.gz) safely: every entry is checked before any byte is
written, and what is written goes only into a new temporary folder.

Refused, with nothing extracted: an absolute path, a '..' part, a link (symbolic or hard), a device, FIFO or
anything else that is not a plain file or folder, two entries of one name, more than MAX_ENTRIES entries,
more than MAX_UNPACKED_BYTES in all, or an archive that does not hold exactly one run folder (beside an
optional submission.json). Files are written by this module itself (never tarfile.extract), each opened
with O_EXCL in a folder it made, so an entry cannot reach outside the temporary folder. read_files() reads a
few of the run's files into memory after the same checks, writing nothing (the class view's second look).
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

MAX_ENTRIES = 1_000
MAX_UNPACKED_BYTES = 100 * 1024 * 1024
SUBMISSION_FILE = "submission.json"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


class UnsafeArchive(ValueError):
    """An archive that was refused; the message names the archive and the entry."""


def is_archive(path: Path) -> bool:
    """Whether a path names a submission archive by its suffix."""
    return Path(path).is_file() and Path(path).name.endswith(ARCHIVE_SUFFIXES)


@dataclass
class Unpacked:
    """An archive unpacked into a temporary folder: the run folder inside it, submission.json as data (or
    None), and the folder to remove afterwards (Unpacked.remove)."""

    archive: Path
    temp_dir: Path
    run_dir: Optional[Path]
    submission: Optional[dict]
    notes: list[str] = field(default_factory=list)

    def remove(self) -> None:
        """Delete the temporary folder and everything in it."""
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _checked_name(archive: Path, member: tarfile.TarInfo) -> PurePosixPath:
    name = member.name
    if not name or "\x00" in name or "\\" in name:
        raise UnsafeArchive(f"{archive}: entry {name!r}: not a plain relative path")
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        raise UnsafeArchive(f"{archive}: entry {name!r}: an absolute path")
    if ".." in path.parts:
        raise UnsafeArchive(f"{archive}: entry {name!r}: a '..' part leads outside the archive's folder")
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts:
        raise UnsafeArchive(f"{archive}: entry {name!r}: names no file")
    return PurePosixPath(*parts)


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return f"not a plain file or folder (type {member.type!r})"


def check_members(archive: Path, handle: tarfile.TarFile) -> list[tuple[PurePosixPath, tarfile.TarInfo]]:
    """Every entry, checked; UnsafeArchive at the first that is refused (reading stops there)."""
    checked, seen, total = [], set(), 0
    while True:
        member = handle.next()
        if member is None:
            break
        if len(checked) >= MAX_ENTRIES:
            raise UnsafeArchive(f"{archive}: more than {MAX_ENTRIES} entries")
        path = _checked_name(archive, member)
        if not (member.isfile() or member.isdir()):
            raise UnsafeArchive(f"{archive}: entry {member.name!r}: {_kind(member)}")
        if path in seen:
            raise UnsafeArchive(f"{archive}: entry {member.name!r} appears twice")
        seen.add(path)
        total += member.size if member.isfile() else 0
        if total > MAX_UNPACKED_BYTES:
            raise UnsafeArchive(f"{archive}: more than {MAX_UNPACKED_BYTES // (1024 * 1024)} MB unpacked")
        checked.append((path, member))
    files = {p for p, m in checked if m.isfile()}
    for path in files:
        if any(parent in files for parent in path.parents):
            raise UnsafeArchive(f"{archive}: entry {path} lies below an entry that is a file")
    return checked


def _run_folder(archive: Path, checked: list) -> str:
    tops = {path.parts[0] for path, _ in checked}
    folders = sorted(t for t in tops if t != SUBMISSION_FILE)
    if len(folders) != 1 or not any(len(p.parts) > 1 for p, _ in checked):
        raise UnsafeArchive(f"{archive}: expected one run folder (and {SUBMISSION_FILE}) at the top, found "
                            f"{', '.join(sorted(tops)) or 'nothing'}")
    return folders[0]


def _write(handle: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    source = handle.extractfile(member)
    if source is None:
        raise UnsafeArchive(f"entry {member.name!r}: cannot be read")
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(descriptor, "wb") as out:
        written = 0
        for chunk in iter(lambda: source.read(1 << 20), b""):
            written += len(chunk)
            if written > member.size:
                raise UnsafeArchive(f"entry {member.name!r}: longer than its header says")
            out.write(chunk)


def read_files(archive: Path, wanted: Callable[[str], bool]) -> tuple[str, dict[str, bytes], Optional[dict]]:
    """(the run folder's name, {path inside it: bytes} for each file where wanted(path), submission.json as data
    or None), read into memory after every entry is checked as unpack checks them; nothing is written anywhere.
    UnsafeArchive when an entry is refused, OSError or tarfile.TarError when the archive cannot be read."""
    archive = Path(archive)
    with tarfile.open(archive, "r:*") as handle:
        checked = check_members(archive, handle)
        folder = _run_folder(archive, checked)
        files, submission = {}, None
        for path, member in checked:
            if not member.isfile():
                continue
            inside = PurePosixPath(*path.parts[1:]).as_posix() if len(path.parts) > 1 else None
            if path.as_posix() == SUBMISSION_FILE or (inside is not None and path.parts[0] == folder
                                                       and wanted(inside)):
                source = handle.extractfile(member)
                data = source.read(member.size + 1) if source is not None else b""
                if len(data) > member.size:
                    raise UnsafeArchive(f"{archive}: entry {member.name!r}: longer than its header says")
                if inside is None:
                    try:
                        submission = json.loads(data.decode("utf-8"))
                    except ValueError:
                        submission = None
                else:
                    files[inside] = data
    return folder, files, submission if isinstance(submission, dict) else None


def unpack(archive: Path) -> Unpacked:
    """Check every entry of `archive`, then write them into a new temporary folder; UnsafeArchive (nothing
    written) when one is refused, OSError or tarfile.TarError when the archive cannot be read."""
    archive = Path(archive)
    with tarfile.open(archive, "r:*") as handle:
        checked = check_members(archive, handle)
    folder = _run_folder(archive, checked)
    temp_dir = Path(tempfile.mkdtemp(prefix="inferlab-submission-"))
    try:
        with tarfile.open(archive, "r:*") as handle:  # a second pass: the first read headers only
            members = {path: member for path, member in check_members(archive, handle)}
            if set(members) != {p for p, _ in checked}:
                raise UnsafeArchive(f"{archive}: its entries changed while it was read")
            for path, member in sorted(members.items(), key=lambda pair: pair[1].offset):  # archive order
                target = temp_dir.joinpath(*path.parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _write(handle, member, target)
        submission, notes = None, []
        if (temp_dir / SUBMISSION_FILE).is_file():
            try:
                submission = json.loads((temp_dir / SUBMISSION_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                notes.append(f"{SUBMISSION_FILE}: not readable JSON ({error})")
        return Unpacked(archive, temp_dir, temp_dir / folder, submission if isinstance(submission, dict) else None,
                        notes)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
