"""A run as it is handed in: `pack` writes one run folder (with its addenda) as a reproducible .tar.gz beside a
small submission.json (who hands it in, which run); `unpacked` reads one back, every entry checked before a byte is
written (plain files and folders under one run folder only, within MAX_ENTRIES and MAX_BYTES), then extracted by
tarfile's "data" filter into a temporary folder. Nothing is ever written into a run folder.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Iterator, Optional

from inferlab.files import OutputPathError, replace_hint, write_bytes_atomic

SUBMISSION_FILE = "submission.json"
SUFFIXES = (".tar.gz", ".tgz")
MAX_ENTRIES = 1_000
MAX_BYTES = 100 * 1024 * 1024
LEARNER_MAX_CHARS = 200


class ArchiveError(ValueError):
    """An archive that cannot be written or read; the message names the file and the entry."""


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """An entry without owners or times, so that one run always packs to the same bytes."""
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def pack(view, target: Path, learner: Optional[str] = None, replace: bool = False) -> dict:
    """Write the archive of the run `view` reads to `target` by the output rule (inferlab.files): a new
    file unless `replace`, a device or FIFO written through. ArchiveError says why nothing was written."""
    run_dir, target = Path(view.directory), Path(target)
    if not target.name.endswith(SUFFIXES) and not target.exists():
        raise ArchiveError(f"{target}: pack writes a gzipped tar; name the file FILE.tar.gz")
    if view.session_end is None and view.claimant_live:
        raise ArchiveError(f"{run_dir} is still being written (its session, pid {view.claim['pid']}, is running); "
                           "wait for it to end")
    if learner is not None:
        learner = learner.strip()
        if not learner or len(learner) > LEARNER_MAX_CHARS or not learner.isprintable():
            raise ArchiveError(f"--learner: expected 1 to {LEARNER_MAX_CHARS} printable characters, got {learner!r}")
    if target.resolve().is_relative_to(run_dir.resolve()):
        raise ArchiveError(f"{target} is inside the run folder; nothing is written into a run folder")
    files = sorted(p for p in run_dir.rglob("*") if p.is_file() or p.is_symlink())
    if any(p.is_symlink() for p in files):
        raise ArchiveError(f"{run_dir}: holds a symbolic link; a run folder holds plain files only")
    if len(files) >= MAX_ENTRIES or sum(p.stat().st_size for p in files) > MAX_BYTES:
        raise ArchiveError(f"{run_dir}: beyond what an archive may hold ({MAX_ENTRIES} entries, {MAX_BYTES} bytes)")
    submission = {"run": run_dir.name, "learner": learner}  # grade reads the learner; the run's own files the rest
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            data = (json.dumps(submission, indent=2, sort_keys=True) + "\n").encode()
            info = tarfile.TarInfo(SUBMISSION_FILE)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            tar.add(run_dir, arcname=run_dir.name, filter=_plain)
    try:
        write_bytes_atomic(target, raw.getvalue(), replace=replace)
    except OutputPathError as error:  # the same hint as grade's (docs/records.md: one output rule)
        raise ArchiveError(replace_hint(error)) from None
    return {"archive": str(target), "bytes": len(raw.getvalue()), "files": len(files), "run": run_dir.name}


def _checked_members(archive: Path, tar: tarfile.TarFile) -> tuple[str, list[tarfile.TarInfo]]:
    """The run folder's name and the members, after every check; ArchiveError naming the first bad entry."""
    members, total, tops = [], 0, set()
    for member in tar:
        if len(members) >= MAX_ENTRIES:
            raise ArchiveError(f"{archive}: more than {MAX_ENTRIES} entries")
        name = member.name
        path = PurePosixPath(name)
        if not name or name.startswith("/") or ".." in path.parts or "\\" in name or "\x00" in name:
            raise ArchiveError(f"{archive}: entry {name!r}: not a plain relative path")
        if not (member.isfile() or member.isdir()):
            raise ArchiveError(f"{archive}: entry {name!r}: not a plain file or folder (a link or a device)")
        total += member.size
        if total > MAX_BYTES:
            raise ArchiveError(f"{archive}: more than {MAX_BYTES} bytes unpacked")
        if name != SUBMISSION_FILE:
            tops.add(path.parts[0])
        members.append(member)
    if len(tops) != 1:
        raise ArchiveError(f"{archive}: expected one run folder (beside {SUBMISSION_FILE}), found {sorted(tops)}")
    return tops.pop(), members


@contextlib.contextmanager
def unpacked(archive: Path) -> Iterator[tuple[Path, dict]]:
    """(the run folder, submission.json's object) of a `pack` archive unpacked into a temporary folder, every entry
    checked first; the folder is removed afterwards. ArchiveError otherwise."""
    with tempfile.TemporaryDirectory(prefix="inferlab-archive-") as folder:
        try:
            with tarfile.open(archive, "r:*") as tar:
                top, members = _checked_members(archive, tar)
                tar.extractall(folder, members=members, filter="data")
        except tarfile.ReadError:
            raise ArchiveError(f"{archive}: expected a .tar.gz made by pack, actual: no tar archive (neither gzip "
                               "nor tar opens it)") from None
        except (tarfile.TarError, OSError, EOFError) as error:
            raise ArchiveError(f"{archive}: expected a .tar.gz made by pack, actual: unreadable ({error})") from None
        file = Path(folder) / SUBMISSION_FILE
        try:
            submission = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
        except ValueError as error:
            raise ArchiveError(f"{archive}: {SUBMISSION_FILE} is not JSON ({error})") from None
        if not isinstance(submission, dict):
            raise ArchiveError(f"{archive}: {SUBMISSION_FILE} is not a JSON object")
        yield Path(folder) / top, submission
