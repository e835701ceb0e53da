"""The one writer of a run's folder (its layout: docs/records.md): the claim (written first, with O_EXCL),
records.jsonl (one line per record, appended and fsynced as it is made), the tensors, the folder's name and its
inventory. Whole files follow inferlab.files' rule; an existing run's folder is never written into."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import socket
from pathlib import Path
from typing import Callable, Optional

from inferlab import writing
from inferlab.files import describe_path, dumps, jsonable, os_error_words, sha256_file, spelled, tensor_sha256
from inferlab.files import write_bytes_atomic, write_json_atomic

CLAIM_FILE, RECORDS_FILE, MANIFEST_FILE, PLAN_FILE = "claim.json", "records.jsonl", "manifest.json", "plan.json"
PREDICTIONS_FILE, REPORT_FILE, TENSOR_DIR = "predictions.md", "report.md", "tensors"
# The envelope's monotonic stamp: time.perf_counter_ns() when the record was made, the timing loop's own clock.
STAMP_FIELD = "perf_counter_ns"
RESERVED_FIELDS = frozenset({"kind", "test", "seq", "wall_time", STAMP_FIELD})
HARNESS_KINDS = frozenset({"plan", "test_outcome", "session_end", "report_error"})  # written by the session itself
# The layout of a run's records, named in manifest.json and plan.json (2: plan entries declare their record kinds).
RECORD_SCHEMA = 2
# The version of the text inferlab.report renders, named in manifest.json; raise it with any change of the pages
# (7: issue 56, report.md holds the evidence and answers no question; report-details.md is no longer written).
REPORT_RENDERER_VERSION = 7
RENAME_NOTE = "renamed-incomplete.json"  # beside the session's files, by whoever renamed the folder -incomplete
SPECIMEN_FILES = ("config.json", "model.safetensors")  # a folder holding both is a specimen's copy
ENDED_NAME = re.compile(r"-(incomplete|failed|findings|partial|partial-failed|partial-findings)(-\d+)?$")


class RecordDirError(Exception):
    """The record directory cannot be used: it has content, is claimed, is not a directory, or cannot be made."""


def utc_now() -> str:
    """The current UTC time as ISO-8601 with microseconds."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


def make_record(kind: str, test: Optional[str], seq: int, wall_time: str, fields: dict,
                perf_counter_ns: Optional[int] = None) -> dict:
    """A record: its envelope (kind, test, seq, wall_time, and perf_counter_ns from a live session), then its fields
    as strict JSON data. A field that is not JSON data is kept as its repr and named in `serialisation_warnings`; a
    field that would overwrite the envelope is refused (ValueError)."""
    clashing = RESERVED_FIELDS & set(fields)
    if clashing:
        raise ValueError(f"record {kind!r}: fields {sorted(clashing)} are reserved for the record envelope")
    warnings_seen: list[str] = []
    record = {"kind": kind, "test": test, "seq": seq, "wall_time": wall_time}
    if perf_counter_ns is not None:
        record[STAMP_FIELD] = perf_counter_ns
    record.update(jsonable(fields, warnings_seen.append))
    return {**record, "serialisation_warnings": warnings_seen} if warnings_seen else record


def _os_reason(error: OSError, path: Path) -> str:
    """Why the OS refused, in words: the path itself, or an ancestor, that is not a directory, else the error."""
    with contextlib.suppress(OSError):  # a path that cannot even be examined: the error says why
        for candidate in (path, *path.parents):
            if os.path.lexists(candidate):
                if not candidate.is_dir():
                    return f"{candidate} {describe_path(candidate)}, not a directory"
                break
    return os_error_words(error)


def claim_record_dir(path: Path, claim: dict) -> Path:
    """Make `path` this run's record dir: refuse a file or a non-empty folder, then create CLAIM_FILE with O_EXCL.
    Of two runs started together into one new folder, exactly one creates the claim; the other is refused before
    it writes anything. RecordDirError names the path and the reason."""
    path = Path(path)
    try:
        if os.path.lexists(path) and not path.exists():
            raise RecordDirError(f"record dir {path} {describe_path(path)}: choose a new directory")
        if path.exists() and not path.is_dir():
            raise RecordDirError(f"record dir {path} {describe_path(path)}, not a directory")
        if path.is_dir() and any(path.iterdir()):
            raise RecordDirError(f"record dir {path} already exists and is not empty; an earlier run is never "
                                 f"overwritten: choose a new directory")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordDirError(f"record dir {path} cannot be created: {_os_reason(error, path)}") from None
    try:
        fd = os.open(path / CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        try:
            owner = json.loads((path / CLAIM_FILE).read_text(encoding="ascii"))
            owner = f"pid {owner.get('pid')} on {owner.get('hostname')}, claimed at {owner.get('claimed_utc')}"
        except (OSError, ValueError, AttributeError):
            owner = f"{CLAIM_FILE} exists"
        raise RecordDirError(f"record dir {path} is already claimed by another run ({owner}); an earlier run is "
                             f"never overwritten: choose a new directory") from None
    except OSError as error:
        raise RecordDirError(f"record dir {path} cannot be written: {_os_reason(error, path)}") from None
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(json.dumps(jsonable(claim), ensure_ascii=True, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path / CLAIM_FILE


def _new_folder(parent: Path, name: str) -> Path:
    """mkdir parent/name, or name-2, -3, ... when it is taken: mkdir is atomic, so two runs never get one folder."""
    for number in range(1, 1000):
        candidate = parent / (name if number == 1 else f"{name}-{number}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
        except OSError as error:
            raise RecordDirError(f"record dir {candidate} cannot be created: {_os_reason(error, candidate)}") from None
    raise RecordDirError(f"{parent}: names {name} to {name}-999 are all taken")


def claim_new_run_dir(parent: Path, base_name: str, claim: dict) -> Path:
    """Create and claim a new folder parent/base_name (numbered when the name is taken)."""
    try:
        Path(parent).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordDirError(f"runs dir {parent} cannot be created: {_os_reason(error, Path(parent))}") from None
    folder = _new_folder(Path(parent), base_name)
    claim_record_dir(folder, claim)
    return folder


def rename_with_suffix(path: Path, suffix: str) -> Path:
    """Rename a run's folder to its name + suffix (numbered when taken): the new name is claimed with mkdir first, so
    a name another run holds is never taken over. RecordDirError when no rename was possible."""
    path = Path(path)
    target = _new_folder(path.parent, path.name + suffix)
    try:
        os.rename(path, target)
    except OSError as error:
        reason = _os_reason(error, target)
        with contextlib.suppress(OSError):
            target.rmdir()
        raise RecordDirError(f"renaming {path.name} to {target.name} failed: {reason}") from None
    return target


def file_inventory(directory: Path, exclude: tuple = ()) -> dict:
    """Size and SHA-256 of every file below a directory, keyed by relative POSIX path."""
    inventory = {}
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        if relative not in exclude and not (path.name.startswith(".") and path.name.endswith(".tmp")):
            inventory[relative] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return inventory


def check_paths(paths: dict, cache_root: Optional[Path] = None) -> None:
    """Refuse (ValueError naming the option, the path and what is there) every path option that cannot work, before
    anything is written: an empty path (the current folder), --artifacts that is no folder, a run inside --artifacts,
    the project's specimen cache or any folder that holds a specimen's files, --predictions that is no learner's
    text (inferlab.writing.read). paths maps --record-dir, --runs-dir, --artifacts, --predictions to values or None."""
    for option, value in paths.items():
        if value is not None and not value.strip():
            raise ValueError(f"{option}: the path is empty ({value!r}), which would mean the current folder")
    artifacts = paths.get("--artifacts") and Path(os.path.expanduser(paths["--artifacts"]))
    if artifacts and not os.path.isdir(artifacts):
        raise ValueError(f"--artifacts: {artifacts} {describe_path(artifacts)}; expected a directory that holds the "
                         f"specimen's files (check it first: {spelled('check-artifacts DIR')})")
    for option in ("--record-dir", "--runs-dir"):
        if paths.get(option) is None:
            continue
        target, inside = Path(os.path.expanduser(paths[option])), None
        with contextlib.suppress(OSError, RuntimeError):  # a path that cannot be examined is refused at its claim
            resolved = target.resolve()
            inside = next((folder for folder in (resolved, *resolved.parents)
                           if all(os.path.isfile(folder / name) for name in SPECIMEN_FILES)), None)
            if artifacts and resolved.is_relative_to(artifacts.resolve()):
                inside = f"the --artifacts folder {artifacts}"
            elif cache_root is not None and resolved.is_relative_to(Path(cache_root).resolve()):
                inside = (f"the project's specimen cache {cache_root}, which would then fail verification for this "
                          "run and every later one")
            elif inside is not None:
                inside = f"{inside}, which holds a specimen's files ({', '.join(SPECIMEN_FILES)})"
        if inside:
            raise ValueError(f"{option}: {target} is inside {inside}: the run would be written into it; choose a "
                             "folder outside it, e.g. --runs-dir runs")
    predictions = paths.get("--predictions") and os.path.expanduser(paths["--predictions"])
    if predictions and not os.path.isfile(predictions):
        what = describe_path(predictions)
        what += ", not a regular file" if what.startswith("is ") else ""
        raise ValueError(f"--predictions: {predictions} {what}; expected your copy of predictions.md")
    if predictions:
        try:  # the check `attach` and the autograder make of a learner's text
            writing.read(predictions, "--predictions:")
        except writing.NotText as error:
            raise ValueError(f"{error} (your copy of predictions.md)") from None


def run_dir_name(specimen: str, plan: bool) -> str:
    """<UTC time>-<specimen>, and -plan for a plan: `ls runs` tells specimens and plans apart."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{specimen}" + \
        ("-plan" if plan else "")


class RecordLog:
    """records.jsonl, and the session's records in memory in write order: the file is what counts.

    The file only ever holds whole lines: a line the system could not take whole (a full disk, a signal in the
    middle of the write) is cut off again before the error goes on, so a run that stopped for want of space reads
    as unfinished, never as a torn record. A stop signal (a trial's time limit, a Ctrl-C) may also strike between a
    line's write and its keeping: the record waits as pending, and the next use keeps it when its line is in the
    file, so the memory (and the next seq) always matches the file."""

    def __init__(self, path: Path):
        self.records: list[dict] = []
        self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._size = 0  # the length of the lines in self.records
        self._pending: Optional[tuple] = None  # (record, the file's length with its line)

    def settle(self) -> list[dict]:
        """The records, with a pending one kept when its line reached the file; safe to cut short and call again."""
        if self._pending is not None:
            record, end = self._pending
            if self._fd is not None and os.fstat(self._fd).st_size >= end:
                if not self.records or self.records[-1] is not record:
                    self.records.append(record)
                self._size = end
            self._pending = None
        return self.records

    def append(self, record: dict) -> None:
        """Write one record as one line, fsynced before returning, and keep it."""
        self.settle()
        line = (dumps(record) + "\n").encode("ascii")
        self._pending = (record, self._size + len(line))
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except BaseException:
            with contextlib.suppress(OSError):
                if os.fstat(self._fd).st_size < self._pending[1]:  # part of the line reached the file: take it back
                    os.ftruncate(self._fd, self._size)
            raise
        self.settle()

    def close(self) -> None:
        self.settle()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class TensorStore:
    """Named tensors grouped in safetensors files under the record dir's tensors/. Each put rewrites its file
    atomically with every tensor stored so far, so a crash leaves the previous whole file; the reference it returns
    (file, key, shape, dtype, SHA-256 of the raw little-endian bytes) goes into the record that uses it."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._files: dict[str, dict] = {}
        self.failure: Optional[str] = None  # the first file that could not be written (a full disk), and why

    def get(self, file_stem: str, key: str):
        """A tensor stored earlier in this run; KeyError names the file and key when it is absent."""
        try:
            return self._files[file_stem][key]
        except KeyError:
            raise KeyError(f"no tensor {key!r} in {TENSOR_DIR}/{file_stem}.safetensors (was its trial run?)") from None

    def put(self, file_stem: str, key: str, tensor) -> dict:
        from safetensors.torch import save  # imported here: the plan and the readers never need torch

        tensor = tensor.detach().to("cpu").contiguous().clone()
        tensors = self._files.setdefault(file_stem, {})
        if key in tensors:
            raise KeyError(f"tensor {key!r} already stored in {file_stem}.safetensors; records are never overwritten")
        tensors[key] = tensor
        try:
            write_bytes_atomic(self.directory / f"{file_stem}.safetensors", save(tensors))
        except OSError as error:
            self.failure = self.failure or f"{TENSOR_DIR}/{file_stem}.safetensors: {os_error_words(error)}"
            raise
        return {"file": f"{TENSOR_DIR}/{file_stem}.safetensors", "key": key, "shape": list(tensor.shape),
                "dtype": str(tensor.dtype).replace("torch.", ""), "sha256": tensor_sha256(tensor)}


# --- runs killed before their end: found by their claim, renamed -incomplete -------------------------------------


def claimant_state(claim, hostname: Optional[str] = None) -> str:
    """Whether the process a claim names runs here now: live, gone, elsewhere (another host) or unknown (no claim).
    A pid the kernel gave to a later process reads as live: the folder is then never wrongly renamed."""
    if not isinstance(claim, dict) or not isinstance(claim.get("pid"), int):
        return "unknown"
    if claim.get("hostname") != (hostname or socket.gethostname()):
        return "elsewhere"
    try:
        os.kill(claim["pid"], 0)
    except ProcessLookupError:
        return "gone"
    except OSError:
        pass
    return "live"


def rename_incomplete(folder: Path, why: str, by: dict, now: str, claim) -> Path:
    """Rename a run's folder to end in -incomplete and write RENAME_NOTE beside the session's files, which stay as
    they were; unrecorded, the rename is undone. RecordDirError when it keeps its name."""
    renamed = rename_with_suffix(folder, "-incomplete")
    try:
        write_json_atomic(renamed / RENAME_NOTE, {"renamed_from": folder.name, "renamed_to": renamed.name,
                                                  "renamed_utc": now, "by": by, "why": why, "claim": claim})
    except OSError as error:
        os.rename(renamed, folder)
        raise RecordDirError(f"its note could not be written ({error}), so it keeps its name") from None
    return renamed


def rename_ended_runs(runs_dir: Path, *, hostname: str, now: str, by: dict,
                      claim_without_end: Callable[[Path], Optional[dict]]) -> list[str]:
    """Rename every run folder of runs_dir whose session ended without a session_end (SIGKILL, a crash): its name
    says no ending yet, claim_without_end(folder) (the one reader's) gives its claim, and that claim names a process
    of this host that no longer runs. One line per folder found, for the terminal."""
    lines = []
    try:
        folders = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return lines
    for folder in folders:
        claim = None if ENDED_NAME.search(folder.name) else claim_without_end(folder)
        if claim is None or claimant_state(claim, hostname) != "gone":
            continue
        head = (f"earlier run {folder}: its session (pid {claim.get('pid')} on {claim.get('hostname')}) ended "
                f"without its final records (killed or crashed)")
        why = (f"the session that claimed this folder (pid {claim.get('pid')} on {claim.get('hostname')}, claimed "
               f"{claim.get('claimed_utc')}) is no longer running and wrote no session_end: it was killed or crashed "
               f"before its end")
        try:
            renamed = rename_incomplete(folder, why, by, now, claim)
            lines.append(f"{head}; renamed {renamed.name} ({RENAME_NOTE} in it says so)")
        except (RecordDirError, OSError) as error:
            lines.append(f"{head}; NOT renamed: {error}")
    return lines


def killed_detail(claim: Optional[dict], note: Optional[dict]) -> str:
    """What the claim says of a run without a session_end whose process does not run here (verify says a live one is
    live): its process ended (and who renamed the folder), or ran elsewhere; empty without a claim."""
    if not isinstance(claim, dict):
        return ""
    who, renamed = f"pid {claim.get('pid')} on {claim.get('hostname')}", ""
    if isinstance(note, dict):
        by = note.get("by") if isinstance(note.get("by"), dict) else {}
        renamer = "by its own session" if by.get("pid") == claim.get("pid") else "by a later run"
        renamed = (f"; renamed from {note.get('renamed_from')} to {note.get('renamed_to')} {renamer} at "
                   f"{note.get('renamed_utc')}: {note.get('why')} (its note: {RENAME_NOTE})")
    state = claimant_state(claim)
    if state == "gone":
        return f"; its process ({who}) is no longer running{renamed}"
    if state == "elsewhere":
        return f"; its process ({who}) runs on another machine, so whether it still runs is not known here{renamed}"
    return renamed
