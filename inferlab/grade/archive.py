"""A run as it is handed in: `pack` writes one run folder (with what was attached to it) as a .tar.gz beside a small
submission.json (who hands it in, which run); `open_archive` reads one back.

Unpacking: every entry is checked before a byte is written (only plain files and folders under one run folder,
no absolute path, no '..', no link or device, at most MAX_ENTRIES entries and MAX_BYTES in all), then the standard
library extracts it with tarfile's "data" filter into a new temporary folder. The archive is reproducible (sorted
entries, no owners, zero times, gzip without a time stamp). Nothing is ever written into a run folder.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import socket
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

from inferlab.files import OutputPathError, sha256_file, write_bytes_atomic

SUBMISSION_FILE = "submission.json"
SUBMISSION_FORMAT = "inferlab-submission"
SUFFIXES = (".tar.gz", ".tgz")
MAX_ENTRIES = 1_000
MAX_BYTES = 100 * 1024 * 1024
LEARNER_MAX_CHARS = 200


class ArchiveError(ValueError):
    """An archive that cannot be written or read; the message names the file and the entry."""


def is_archive(path: Path) -> bool:
    return Path(path).is_file() and Path(path).name.endswith(SUFFIXES)


def _live_session(run_dir: Path) -> Optional[str]:
    """Why the run may still be written by its session (its claim names a running process on this host)."""
    try:
        claim = json.loads((run_dir / "claim.json").read_text(encoding="utf-8"))
        pid, host = int(claim["pid"]), claim.get("hostname")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return f"its session (pid {pid}) is still running"


def _info(name: str, size: int = 0, folder: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.type, info.mode = (tarfile.DIRTYPE, 0o755) if folder else (tarfile.REGTYPE, 0o644)
    return info


def pack(view, target: Path, learner: Optional[str] = None, replace: bool = False) -> dict:
    """Write the archive of the run `view` reads to `target` by the output rule (inferlab.files): a new
    file unless `replace`, a device or FIFO written through. ArchiveError says why nothing was written."""
    run_dir, target = Path(view.directory), Path(target)
    if not target.name.endswith(SUFFIXES) and not target.exists():
        raise ArchiveError(f"{target}: pack writes a gzipped tar; name the file FILE.tar.gz")
    if view.is_plan_folder:
        raise ArchiveError(f"{run_dir} is a plan folder (--plan): no test ran, so there is no run to hand in")
    if view.session_end is None and _live_session(run_dir):
        raise ArchiveError(f"{run_dir} is still being written ({_live_session(run_dir)}); wait for it to end")
    if learner is not None:
        learner = learner.strip()
        if not learner or len(learner) > LEARNER_MAX_CHARS or not learner.isprintable():
            raise ArchiveError(f"--learner: expected 1 to {LEARNER_MAX_CHARS} printable characters, got {learner!r}")
    resolved = target.resolve()
    if resolved == run_dir.resolve() or run_dir.resolve() in resolved.parents:
        raise ArchiveError(f"{target} is inside the run folder; nothing is written into a run folder")
    files = sorted(p for p in run_dir.rglob("*") if p.is_file() or p.is_symlink())
    if any(p.is_symlink() for p in files):
        raise ArchiveError(f"{run_dir}: holds a symbolic link; a run folder holds plain files only")
    if len(files) >= MAX_ENTRIES or sum(p.stat().st_size for p in files) > MAX_BYTES:
        raise ArchiveError(f"{run_dir}: beyond what an archive may hold ({MAX_ENTRIES} entries, {MAX_BYTES} bytes)")
    submission = {"format": SUBMISSION_FORMAT, "run": run_dir.name, "learner": learner,
                  "manifest_sha256": sha256_file(run_dir / "manifest.json") if (run_dir / "manifest.json").is_file()
                  else None}
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            data = (json.dumps(submission, indent=2, sort_keys=True) + "\n").encode()
            tar.addfile(_info(SUBMISSION_FILE, len(data)), io.BytesIO(data))
            for folder in sorted({p.parent for p in files} | {run_dir}):
                tar.addfile(_info((PurePosixPath(run_dir.name) / folder.relative_to(run_dir)).as_posix(), folder=True))
            for path in files:
                with open(path, "rb") as handle:
                    name = (PurePosixPath(run_dir.name) / path.relative_to(run_dir).as_posix()).as_posix()
                    tar.addfile(_info(name, path.stat().st_size), handle)
    try:
        write_bytes_atomic(target, raw.getvalue(), replace=replace)
    except OutputPathError as error:
        raise ArchiveError(str(error)) from None
    return {"archive": str(target), "bytes": len(raw.getvalue()), "files": len(files), "run": run_dir.name}


@dataclass
class Unpacked:
    """An archive unpacked into a new temporary folder; remove() deletes it."""

    archive: Path
    folder: Path
    run_dir: Path
    submission: dict

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _checked_members(archive: Path, tar: tarfile.TarFile) -> tuple[str, list[tarfile.TarInfo]]:
    """The run folder's name and the members, after every check; ArchiveError naming the first bad entry."""
    members, names, total, tops = [], set(), 0, set()
    for member in tar:
        if len(members) >= MAX_ENTRIES:
            raise ArchiveError(f"{archive}: more than {MAX_ENTRIES} entries")
        name = member.name
        path = PurePosixPath(name)
        if not name or name.startswith("/") or ".." in path.parts or "\\" in name or "\x00" in name:
            raise ArchiveError(f"{archive}: entry {name!r}: not a plain relative path")
        if not (member.isfile() or member.isdir()):
            raise ArchiveError(f"{archive}: entry {name!r}: not a plain file or folder (a link or a device)")
        if name.rstrip("/") in names:
            raise ArchiveError(f"{archive}: entry {name!r} appears twice")
        names.add(name.rstrip("/"))
        total += member.size
        if total > MAX_BYTES:
            raise ArchiveError(f"{archive}: more than {MAX_BYTES} bytes unpacked")
        if name != SUBMISSION_FILE:
            tops.add(path.parts[0])
        members.append(member)
    if len(tops) != 1:
        raise ArchiveError(f"{archive}: expected one run folder (beside {SUBMISSION_FILE}), found {sorted(tops)}")
    return tops.pop(), members


def open_archive(archive: Path) -> Unpacked:
    """Unpack a `pack` archive into a new temporary folder, every entry checked first; ArchiveError otherwise."""
    archive = Path(archive)
    folder = Path(tempfile.mkdtemp(prefix="inferlab-archive-"))
    try:
        with tarfile.open(archive, "r:*") as tar:
            top, members = _checked_members(archive, tar)
            tar.extractall(folder, members=members, filter="data")
        submission = {}
        if (folder / SUBMISSION_FILE).is_file():
            try:
                submission = json.loads((folder / SUBMISSION_FILE).read_text(encoding="utf-8"))
            except ValueError as error:
                raise ArchiveError(f"{archive}: {SUBMISSION_FILE} is not JSON ({error})") from None
        if not isinstance(submission, dict):
            raise ArchiveError(f"{archive}: {SUBMISSION_FILE} is not a JSON object")
        return Unpacked(archive, folder, folder / top, submission)
    except tarfile.ReadError:
        shutil.rmtree(folder, ignore_errors=True)
        raise ArchiveError(f"{archive}: expected a .tar.gz made by pack, actual: no tar archive (neither gzip nor "
                           "tar opens it)") from None
    except (tarfile.TarError, OSError, EOFError) as error:
        shutil.rmtree(folder, ignore_errors=True)
        raise ArchiveError(f"{archive}: expected a .tar.gz made by pack, actual: unreadable ({error})") from None
    except ArchiveError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
