"""`inferlab pack`: one run folder, with what was attached to it afterwards, as one .tar.gz to submit.

The archive holds the run folder as it is (records, tensors, manifest, plan, report, predictions, and the
addenda ledger with its files) and, beside it, a small submission.json: which run it is, the commit it was
made from, the SHA-256 of its manifest, the manifest's file inventory and the addenda's hashes. `grade`
reads the archive directly (inferlab.submission.archive) and checks submission.json against the run inside.

`pack --learner ID` writes who submits into submission.json (`learner`); it is what the learner says, shown
beside the grade and used by the class view, never a reason for points.

The archive is reproducible: entries in sorted order, no owner names, times set to zero, gzip without a
time stamp, so packing the same folder twice gives the same bytes. Nothing is written into the run folder.
A plan folder (--plan: no test ran) is refused, and so is a run still being written by its session (its claim
names a live process: an archive would hold half a run), and so is a destination that cannot be written, each with
a PackError that says why (the command exits 2).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Optional

from inferlab.base.outputs import ABSENT, OutputPathError, output_kind, write_bytes_atomic
from inferlab.base.records import MANIFEST_FILE, sha256_file
from inferlab.submission.archive import MAX_ENTRIES, MAX_UNPACKED_BYTES, SUBMISSION_FILE
from inferlab.reading.runview import RunView

SUBMISSION_FORMAT = "inferlab-submission"
SUBMISSION_SCHEMA = 1
LEARNER_MAX_CHARS = 200


class PackError(ValueError):
    """A run folder that cannot be packed, or a target that must not be written; the message says why."""


def run_files(run_dir: Path) -> list[Path]:
    """Every file of the run folder, sorted; PackError on a link or anything that is not a plain file."""
    found = []
    for path in sorted(run_dir.rglob("*")):
        if path.is_symlink():
            raise PackError(f"{path}: a symbolic link; a run folder holds plain files only")
        if path.is_file():
            found.append(path)
        elif not path.is_dir():
            raise PackError(f"{path}: not a plain file")
    return found


def checked_learner(value: str) -> str:
    """A learner id as given to --learner: printable text of 1 to LEARNER_MAX_CHARS characters, no line break;
    PackError naming what was given otherwise."""
    text = value.strip()
    if not text or len(text) > LEARNER_MAX_CHARS or not text.isprintable():
        raise PackError(f"--learner {value!r}: expected an id of 1 to {LEARNER_MAX_CHARS} printable characters "
                        "(a student number, a login or an e-mail address)")
    return text


def submission_data(view: RunView, learner: Optional[str] = None) -> dict:
    """submission.json's content for one run: which run, its commit, its manifest's hash and inventory, the
    addenda's hashes, and who submits it (when --learner was given)."""
    run_dir = view.directory
    manifest_path = run_dir / MANIFEST_FILE
    git = view.manifest.get("git") if isinstance(view.manifest.get("git"), dict) else {}
    specimen = view.specimen_spec()
    return {
        "format": SUBMISSION_FORMAT, "schema": SUBMISSION_SCHEMA, "tool": "inferlab pack",
        "run": run_dir.name,
        "specimen": specimen.get("name"), "synthetic": view.synthetic,
        "git_commit": git.get("commit"), "git_dirty": git.get("dirty"),
        "started_utc": view.manifest.get("started_utc"),
        "manifest_sha256": sha256_file(manifest_path) if manifest_path.is_file() else None,
        "inventory": view.manifest.get("files") if isinstance(view.manifest.get("files"), dict) else None,
        "addenda": [{"seq": e.get("seq"), "kind": e.get("kind"), "file": e.get("file"), "size": e.get("size"),
                     "sha256": e.get("sha256")} for e in view.addenda if isinstance(e, dict)],
        **({"learner": learner} if learner is not None else {}),
    }


PACK_LEARNER_FROM = "submission.json (pack --learner)"


def submission_learners(submission: Optional[dict]) -> list[dict]:
    """The learner submission.json names ([{id, name, email, from}], as the class view lists learners), or [] when
    it names none: the one reader of what `pack --learner` wrote, for a single archive and for a class alike."""
    learner = submission.get("learner") if isinstance(submission, dict) else None
    if not isinstance(learner, str) or not learner.strip():
        return []
    return [{"id": learner, "name": None, "email": None, "from": PACK_LEARNER_FROM}]


def submission_problems(submission: dict, view: RunView) -> list[str]:
    """Where submission.json disagrees with the run it came with: each an integrity problem."""
    if submission.get("format") != SUBMISSION_FORMAT:
        return [f"{SUBMISSION_FILE}: format {submission.get('format')!r}, expected {SUBMISSION_FORMAT!r}"]
    found = submission_data(view)
    problems = []
    for name in ("run", "manifest_sha256", "inventory", "addenda"):
        if submission.get(name) != found[name]:
            problems.append(f"{SUBMISSION_FILE}: {name} does not match the run in the archive (the run changed "
                            "after it was packed, or submission.json was edited)")
    return problems


def _info(name: str, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.type, info.mode = (tarfile.DIRTYPE, 0o755) if directory else (tarfile.REGTYPE, 0o644)
    return info


def archive_bytes(view: RunView, learner: Optional[str] = None) -> bytes:
    """The .tar.gz of a run folder and its submission.json, as bytes; PackError beyond the archive limits."""
    run_dir = view.directory
    files = run_files(run_dir)
    total = sum(p.stat().st_size for p in files)
    folders = sorted({p.parent for p in files if p.parent != run_dir} | {run_dir})
    if len(files) + len(folders) + 1 > MAX_ENTRIES or total > MAX_UNPACKED_BYTES:
        raise PackError(f"{run_dir}: {len(files)} files, {total} bytes: beyond what grade accepts "
                        f"({MAX_ENTRIES} entries, {MAX_UNPACKED_BYTES} bytes)")
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            submission = json.dumps(submission_data(view, learner), indent=2, sort_keys=True).encode("utf-8") + b"\n"
            tar.addfile(_info(SUBMISSION_FILE, len(submission)), io.BytesIO(submission))
            for folder in folders:
                tar.addfile(_info((Path(run_dir.name) / folder.relative_to(run_dir)).as_posix(), directory=True))
            for path in files:
                with open(path, "rb") as handle:
                    name = (Path(run_dir.name) / path.relative_to(run_dir)).as_posix()
                    tar.addfile(_info(name, path.stat().st_size), handle)
    return raw.getvalue()


def _writable_folder(target: Path) -> None:
    """PackError when the folder `target` goes into cannot be made or written (checked before any work)."""
    folder = target.parent
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise PackError(f"{target}: {existing} is a file, not a folder; choose another place for the archive")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        what = "the folder" if existing == folder else f"{folder} does not exist and its parent"
        raise PackError(f"{target}: {what} {existing} is not writable; choose a folder you can write to")


def still_being_written(view: RunView) -> Optional[str]:
    """Why a run cannot be packed yet, or None: its session has not ended (no session_end record, or not yet its
    final manifest.json) and the process its claim.json names may still be that session (inferlab.run.live_claim).
    An archive made now would hold a run the session is still writing."""
    from inferlab.run.live_claim import claimant, read_claim

    if view.session_end is not None and view.final_manifest_written:
        return None
    found = claimant(read_claim(view.directory))
    if not found.live:
        return None
    return (f"{view.directory} is still being written by its session: {found.why}, and it has not written its end. "
            f"An archive made now would hold half a run; wait for the session to end (or stop it with Ctrl-C), "
            f"then pack it; nothing was written")


def pack_run(view: RunView, target: Path, learner: Optional[str] = None) -> dict:
    """Write the archive of a run to `target` (a new file outside the run folder, or a device or FIFO written
    through, as inferlab.base.outputs says); returns what was packed. PackError for a plan folder, a target inside
    the run or already there, or a place that cannot be written."""
    target = Path(target)
    run_dir = view.directory.resolve()
    if view.is_plan_folder:
        raise PackError(f"{view.directory} is a plan folder (--plan): no test ran, so there is no run to submit; "
                        "run the experiment without --plan and pack that run folder")
    live = still_being_written(view)
    if live is not None:
        raise PackError(live)
    learner = None if learner is None else checked_learner(learner)
    if target.resolve() == run_dir or run_dir in target.resolve().parents:
        raise PackError(f"{target}: inside the run folder {run_dir}; nothing is written into a run folder")
    try:
        kind, _ = output_kind(target, replace=False)  # before any work: a file there is never replaced
    except OutputPathError as error:
        raise PackError(str(error)) from None
    if kind == ABSENT:
        _writable_folder(target)
    data = archive_bytes(view, learner)
    try:
        write_bytes_atomic(target, data, replace=False)
    except OutputPathError as error:
        raise PackError(str(error)) from None
    return {"archive": str(target), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "run": run_dir.name, "files": len(run_files(run_dir)), "addenda": len(view.addenda)}
