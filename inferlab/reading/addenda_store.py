"""The one writer of a run's addenda (inferlab.reading.addenda has the format): check what is to be kept and where,
then copy it under addenda/ and append its ledger line, one writer at a time.

Before anything is written: read_text_file() takes the learner's file (a regular UTF-8 text file of at most
MAX_BYTES, read once, so the bytes hashed are the bytes kept) and check_run() the run folder (a run's record
dir with a manifest.json, not a plan folder; an unfinished run is allowed and labelled, but not while the
process its claim.json names may still be its session: inferlab.run.live_claim), and refuse_run_file() a FILE
that is one of the run's own files or anything inside the run folder (an addendum is written after the run,
outside it). Each raises Refused naming the path, what was expected and what was found.

store() then holds an exclusive flock on the run folder itself (so no lock file is left in it; two attaches
or revises at once wait for each other) while it
  1. reads the ledger (a damaged ledger is refused: appending to it would make it worse) and manifest.json's
     SHA-256, which binds the addendum to the run as it is now;
  2. chooses a stored name that no file and no entry has used (explanation.md, explanation.2.md, ...);
  3. writes the copy through a temporary sibling, fsynced, and os.replace()s it into place;
  4. appends the ledger line with one write to the ledger opened O_APPEND, fsynced.
If a step fails the copy is removed and the ledger cut back to its length before: nothing partial is left.
No file the session wrote is ever opened for writing. (flock is POSIX; the harness runs on Linux.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from inferlab.reading.addenda import (
    ADDENDA_DIR,
    LEDGER_FILE,
    LEDGER_SCHEMA,
    is_addenda_path,
    parse_ledger,
)
from inferlab.base import learner_text
from inferlab.base.commands import spelled
from inferlab.base.records import (
    CLAIM_FILE,
    MANIFEST_FILE,
    PLAN_FILE,
    PREDICTIONS_FILE,
    RECORDS_FILE,
    REPORT_FILE,
    TENSOR_DIR,
    describe_path,
    dumps,
    sha256_bytes,
    sha256_file,
    utc_now,
    write_bytes_atomic,
)
from inferlab.reading.runview import RunView, not_a_run_reason

MAX_BYTES = learner_text.MAX_BYTES  # an addendum is text a person wrote, not data
EXPECTED_FILE = learner_text.EXPECTED
NAME_LIMIT = 100  # characters of a stored name
MAX_VERSIONS = 999
DETAILS_FILE = "report-details.md"  # inferlab.report.DETAILS_FILE (not imported: the report pulls in the plots)
SESSION_FILES = (RECORDS_FILE, MANIFEST_FILE, REPORT_FILE, DETAILS_FILE, PLAN_FILE, CLAIM_FILE, PREDICTIONS_FILE)


class Refused(Exception):
    """Nothing was written: the message names the path, what was expected and what was found. usage=True when
    the command line named something that cannot be used as named (exit 2), else the content or the run's
    state is what cannot be kept (exit 1)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


@dataclass
class RunState:
    """A run folder an addendum may be kept in: its view, and whether its session had finished."""

    directory: Path
    view: RunView
    finished: bool
    state: str  # "finished", or why not, in words


def read_text_file(path: Path, role: str = "FILE") -> bytes:
    """The bytes of a learner's text file, read once (inferlab.base.learner_text, the one check of such a file);
    Refused otherwise (a missing path, a folder, a FIFO or another special file are usage errors; an empty,
    binary or larger file is refused)."""
    try:
        return learner_text.read(path, role)
    except learner_text.NotText as error:
        raise Refused(str(error), usage=error.usage) from None


def check_run(directory: Path) -> RunState:
    """The run folder an addendum is to be kept in, or Refused: not a folder or not a run's record dir (usage),
    a plan folder, no manifest.json to bind to, or a session inventory that already lists addenda."""
    directory = Path(directory)
    if not directory.is_dir():
        raise Refused(f"RUN_DIR {directory} {describe_path(directory)}; expected a run's record dir", usage=True)
    reason = not_a_run_reason(directory)
    if reason:
        raise Refused(f"{reason}; expected the folder a run wrote "
                      f"(`{spelled('-m pytest experiments --record-dir DIR', 'python')}`)", usage=True)
    view = RunView.read(directory)
    if view.is_plan_folder:
        raise Refused(f"{directory} is a plan folder (written by --plan): no test ran, so nothing there can be "
                      f"explained or re-evaluated; expected a run's record dir")
    if not (directory / MANIFEST_FILE).is_file():
        raise Refused(f"{directory} has no {MANIFEST_FILE}: an addendum is bound to its run by the manifest's "
                      f"SHA-256, so there is nothing to bind it to")
    inventory = view.manifest.get("files") if isinstance(view.manifest.get("files"), dict) else {}
    listed = sorted(name for name in inventory if is_addenda_path(name))
    if listed:
        raise Refused(f"{directory}: the session's inventory in {MANIFEST_FILE} lists {', '.join(listed[:3])} (was "
                      f"something attached while the session ran?); adding to it would change a file the session "
                      f"wrote")
    if view.unfinished:
        return RunState(directory, view, False, f"unfinished: {view.unfinished}{_unless_live(directory, view)}")
    if not view.final_manifest_written:
        return RunState(directory, view, False, f"unfinished: the session's final writes were abandoned "
                                                f"({MANIFEST_FILE} is still the one written at its start)"
                                                f"{_unless_live(directory, view)}")
    return RunState(directory, view, True, "finished")


def _unless_live(directory: Path, view: RunView) -> str:
    """For a run whose session has not ended: Refused (usage) while the process its claim names may still be
    that session (inferlab.run.live_claim), since the session's end would sweep an addendum kept now into its own
    inventory; otherwise the words added to the run's state (empty when the process is gone)."""
    from inferlab.run.live_claim import claimant, read_claim

    found = claimant(read_claim(directory))
    if found.live:
        where = ("it has no session_end record yet" if view.session_end is None else
                 f"it has recorded its end but not yet written its final {MANIFEST_FILE}")
        raise Refused(f"{directory} is still being written by its session: {found.why}, and {where}. An addendum "
                      f"kept now would be swept into the session's own inventory when it ends, and the run would "
                      f"fail verify for good; expected a run whose session has ended: wait for it to end (or stop "
                      f"it), then run this again", usage=True)
    return "" if found.state == "gone" else f" ({found.why})"


def refuse_run_file(file: Path, directory: Path, role: str = "FILE") -> None:
    """Refused (usage) when FILE is one of the run's own files or anything inside the run folder (also through
    a symbolic or a hard link): an addendum is material written after the run, kept beside it, and a file of
    the run would be kept as if a person had written it."""
    file, directory = Path(file), Path(directory)
    relative, through = None, ""
    try:
        relative = file.resolve().relative_to(directory.resolve()).as_posix()
    except (ValueError, OSError):
        pass
    if relative is None:
        try:
            identity = (os.stat(file).st_dev, os.stat(file).st_ino)
        except OSError:
            return  # read_text_file says why it cannot be read
        for path in directory.rglob("*"):
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink() and (path.stat().st_dev, path.stat().st_ino) == identity:
                    relative, through = path.relative_to(directory).as_posix(), " (a hard link to it)"
                    break
    if relative is None:
        return
    if relative in SESSION_FILES or relative.startswith(TENSOR_DIR + "/") or (
            "/" not in relative and relative.endswith(".png")):
        what = "one of the run's own files, written by its session, not an explanation of it"
    elif is_addenda_path(relative):
        what = "an addendum kept already (to attach a new version, attach it from a copy outside the run folder)"
    else:
        what = "inside the run folder, where verify calls every file the session did not write added after it"
    raise Refused(f"{role} {file} is {directory}/{relative}{through}, {what}; expected a file you wrote after the "
                  f"run, from outside {directory} (for an explanation: a filled-in copy of explanation.md)", usage=True)


def stored_name(original_name: str) -> str:
    """A safe name under addenda/ for a file of this name: letters, digits, '.', '_' and '-' only, no leading
    dot (temporary files start with one), at most NAME_LIMIT characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(original_name).name).lstrip("._-") or "addendum"
    if len(safe) > NAME_LIMIT:
        suffix = Path(safe).suffix[:12]
        safe = safe[:NAME_LIMIT - len(suffix)] + suffix
    return safe


def name_versions(name: str):
    """The stored names to try, in order: explanation.md, explanation.2.md, explanation.3.md, ..."""
    stem, suffix = Path(name).stem, Path(name).suffix
    yield name
    for number in range(2, MAX_VERSIONS + 1):
        yield f"{stem}.{number}{suffix}"


@contextlib.contextmanager
def locked(directory: Path, on_wait: Optional[Callable[[], None]] = None):
    """Hold an exclusive flock on the run folder itself (released when the descriptor closes): one writer of
    addenda at a time, and no lock file left behind. on_wait is called once if another writer holds it."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _ledger_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _append_whole(path: Path, line: bytes) -> None:
    """Append one line with O_APPEND, fsynced; on failure cut the ledger back to its length before (and remove
    it if this call created it)."""
    existed = path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    before = os.fstat(fd).st_size
    try:
        written = 0
        while written < len(line):  # one write() normally; a short write is completed, never left torn
            written += os.write(fd, line[written:])
        os.fsync(fd)
    except BaseException:
        os.ftruncate(fd, before)
        if not existed:
            path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def _fsync_directory(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the files themselves were fsynced
        pass


def store(run: RunState, data: bytes, original_name: str, kind: str, tool: str, structure: Optional[dict] = None,
          on_wait: Optional[Callable[[], None]] = None, clock: Callable[[], str] = utc_now) -> dict:
    """Keep `data` as an addendum of `run` (see the module's docstring); returns its ledger entry.
    Refused when the ledger is damaged; an OSError is raised as it is met, after undoing what was written."""
    directory = run.directory
    with locked(directory, on_wait) as directory_fd:
        ledger = directory / LEDGER_FILE
        entries, problems = parse_ledger(_ledger_bytes(ledger))
        if problems:
            line, what = problems[0]
            raise Refused(f"{ledger} is damaged (line {line}: {what}; {len(problems)} problem(s)); expected one "
                          f"complete JSON entry per line. Nothing was added to it: `verify` names every problem")
        used = {entry.get("file") for entry in entries}
        folder = directory / ADDENDA_DIR
        name = next((n for n in name_versions(stored_name(original_name))
                     if f"{ADDENDA_DIR}/{n}" not in used and not os.path.lexists(folder / n)), None)
        if name is None:
            raise Refused(f"{folder}: {MAX_VERSIONS} versions of {stored_name(original_name)} are kept already")
        entry = {"schema": LEDGER_SCHEMA, "seq": len(entries), "kind": kind, "file": f"{ADDENDA_DIR}/{name}",
                 "original_name": original_name, "size": len(data), "sha256": sha256_bytes(data),
                 "attached_utc": clock(), "manifest_sha256": sha256_file(directory / MANIFEST_FILE),
                 "structure": structure, "tool": tool, "run_finished": run.finished, "run_state": run.state}
        line = (dumps(entry) + "\n").encode("ascii")
        made_folder = not folder.exists()
        try:
            write_bytes_atomic(folder / name, data)
            folder_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                _fsync_directory(folder_fd)
            finally:
                os.close(folder_fd)
            _append_whole(ledger, line)
            _fsync_directory(directory_fd)
        except BaseException:
            (folder / name).unlink(missing_ok=True)
            if made_folder:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
    return entry
