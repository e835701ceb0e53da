"""Writers for a run's record directory: JSON Lines as they happen, whole files atomically. What goes into
the files (each record, plan.json, manifest.json, the claim) is made by inferlab.run.writers.

Layout of a record directory:
    claim.json           written first, with O_EXCL: this run owns the directory (who, when, the command)
    records.jsonl        one JSON object per line, appended, flushed and fsynced per record
    manifest.json        environment and file hashes, rewritten atomically at start and end
    plan.json            the ordered schedule (with --plan, and in every run)
    predictions.md       the learner's predictions, copied before any model computation
    tensors/*.safetensors  logit vectors; each record that refers to one holds its SHA-256
    report.md, *.png     written at session end from the records alone
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Callable, Optional

# The one atomic writer (and its rule for what is already at a path) lives in outputs.py; the record writers
# here use it, and so may every module that imported it from here.
from inferlab.base.outputs import kind_in_words, write_bytes_atomic, write_text_atomic  # noqa: F401

CLAIM_FILE = "claim.json"
RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"
PLAN_FILE = "plan.json"
PREDICTIONS_FILE = "predictions.md"
REPORT_FILE = "report.md"
TENSOR_DIR = "tensors"
# The record envelope's monotonic stamp: time.perf_counter_ns() when a live session made the record, the clock the
# timing loop's own stamps read. Runs written before records had it lack it: a reader says that is not checkable.
STAMP_FIELD = "perf_counter_ns"
# The layout of a run's records, named in manifest.json and plan.json. 1: the runs written before a run said
# which schema it used (no "schema" field); 2: plan entries declare the record kinds each test produces.
RECORD_SCHEMA = 2
# The version of the text the report renderer (inferlab.report) writes, named in manifest.json as
# report_renderer_version; a run that names none was rendered by version 1. Raise it with any change of the pages.
REPORT_RENDERER_VERSION = 7  # 2: the pages of issues 23 to 27 (commands spelled as typed, the after-run
# page, findings apart from failures); 3: issue 33 (contended timing samples marked, the A/A noise, the cache
# verdict, the CPU share plot); 4: issue 34 (a run that measured nothing says why its tests did not run);
# 5: issue 44 (effects and noise as intervals, collections and faults ringed on the CPU share plot); 6: issue 44's
# rule (the collector's time and major faults judged; contended trials 'did not have their spans to themselves');
# 7: issue 56 (report.md holds the evidence and answers no question; report-details.md is no longer written)


class RecordDirError(Exception):
    """The record directory cannot be used: it has content, is claimed, is not a directory, or cannot be made."""


def utc_now() -> str:
    """The current UTC time as ISO-8601 with microseconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def describe_path(path) -> str:
    """What is at `path`, as the rest of a sentence that starts with the path: 'does not exist', 'is a
    regular file', 'is a dangling symbolic link to X', 'is a FIFO (named pipe)', 'cannot be examined: ...'."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as error:
        return f"cannot be examined: {os_error_words(error)}"
    link = ""
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        try:
            info = os.stat(path)
        except OSError:
            return f"is a dangling symbolic link to {target} (nothing is there)"
        link = f"is a symbolic link to {target}, which "
    return f"{link}is {kind_in_words(info.st_mode)}"


def os_error_words(error: OSError) -> str:
    """An OSError in words with its errno name: 'File name too long (ENAMETOOLONG)'."""
    name = errno.errorcode.get(error.errno, "") if error.errno is not None else ""
    return f"{error.strerror or error}" + (f" ({name})" if name else "")


def check_record_dir(path: Path) -> None:
    """Refuse a path that is a file or a non-empty directory; an existing run is never overwritten.

    Whatever the OS says while looking (a name too long, no permission) is a RecordDirError naming the path.
    """
    try:
        if path.is_symlink() and not path.exists():
            raise RecordDirError(f"record dir {path} {describe_path(path)}: choose a new directory")
        if path.exists() and not path.is_dir():
            raise RecordDirError(f"record dir {path} {describe_path(path)}, not a directory")
        if path.is_dir() and any(path.iterdir()):
            raise RecordDirError(
                f"record dir {path} already exists and is not empty; an earlier run is never "
                f"overwritten: choose a new directory"
            )
    except OSError as error:
        raise RecordDirError(f"record dir {path} cannot be used: {_os_reason(error, path)}") from None


def _os_reason(error: OSError, path: Path) -> str:
    """Why the OS refused, in words: the path itself, or an ancestor, that is not a directory, else the error."""
    try:
        if os.path.lexists(path) and not path.is_dir():
            return f"{path} {describe_path(path)}, not a directory"
        for ancestor in path.parents:
            if os.path.lexists(ancestor):
                if not ancestor.is_dir():
                    return f"{ancestor} {describe_path(ancestor)}, not a directory"
                break
    except OSError:  # the path cannot even be examined (too long, no permission): the error says why
        pass
    return os_error_words(error)


def claim_record_dir(path: Path, claim: dict) -> Path:
    """Make `path` this run's record dir: refuse a non-empty one, then create CLAIM_FILE with O_EXCL.

    The claim is the first thing a run writes there. Of two runs started together into one new
    directory, exactly one creates the claim; the other is refused before it writes anything.
    Returns the path of the claim file. Raises RecordDirError naming the path and the reason.
    """
    path = Path(path)
    check_record_dir(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordDirError(f"record dir {path} cannot be created: {_os_reason(error, path)}") from None
    claim_path = path / CLAIM_FILE
    try:
        fd = os.open(claim_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise RecordDirError(f"record dir {path} is already claimed by another run ({_claim_owner(claim_path)}); "
                             f"an earlier run is never overwritten: choose a new directory") from None
    except OSError as error:
        raise RecordDirError(f"record dir {path} cannot be written: {_os_reason(error, path)}") from None
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(json.dumps(jsonable(claim), ensure_ascii=True, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    others = sorted(name for name in os.listdir(path) if name != CLAIM_FILE)
    if others:  # something else wrote here between the emptiness check and the claim
        claim_path.unlink()
        raise RecordDirError(f"record dir {path} gained other files while this run claimed it ({others[:3]}); "
                             f"choose a new directory")
    return claim_path


def _claim_owner(claim_path: Path) -> str:
    try:
        owner = json.loads(claim_path.read_text(encoding="ascii"))
        return f"pid {owner.get('pid')} on {owner.get('hostname')}, claimed at {owner.get('claimed_utc')}"
    except (OSError, ValueError, AttributeError):
        return f"{claim_path.name} exists"


def claim_new_run_dir(parent: Path, base_name: str, claim: dict) -> Path:
    """Create and claim a new directory parent/base_name, or base_name-2, -3, ... if that name is taken.

    mkdir is atomic, so two runs started in the same second still get two directories.
    """
    parent = Path(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordDirError(f"runs dir {parent} cannot be created: {_os_reason(error, parent)}") from None
    for number in range(1, 1000):
        candidate = parent / (base_name if number == 1 else f"{base_name}-{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError as error:
            raise RecordDirError(f"record dir {candidate} cannot be created: {_os_reason(error, candidate)}") from None
        claim_record_dir(candidate, claim)
        return candidate
    raise RecordDirError(f"runs dir {parent}: names {base_name} to {base_name}-999 are all taken")


def rename_with_suffix(path: Path, suffix: str) -> Path:
    """Rename a finished run's dir to its name + suffix, or + suffix-2, -3, ... when that name is taken.

    The new name is claimed with mkdir (atomic) and the run's dir then replaces that empty folder, so a
    name another run holds is never taken over. Returns the new path; RecordDirError names the reason
    when no rename was possible (the dir then keeps its old name).
    """
    path = Path(path)
    for number in range(1, 1000):
        target = path.with_name(path.name + suffix + ("" if number == 1 else f"-{number}"))
        try:
            target.mkdir()
        except FileExistsError:
            continue
        except OSError as error:
            raise RecordDirError(f"{target.name} cannot be created: {_os_reason(error, target)}") from None
        try:
            os.rename(path, target)
        except OSError as error:
            with_reason = _os_reason(error, target)
            try:
                target.rmdir()
            except OSError:
                pass
            raise RecordDirError(f"renaming {path.name} to {target.name} failed: {with_reason}") from None
        return target
    raise RecordDirError(f"names {path.name}{suffix} to {path.name}{suffix}-999 are all taken")


def jsonable(value: Any, on_unserialisable: Optional[Callable[[str], None]] = None) -> Any:
    """Turn a value into strict JSON data: non-finite floats become strings, unknown objects their repr."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # 'nan', 'inf', '-inf'
    if isinstance(value, dict):
        return {str(k): jsonable(v, on_unserialisable) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, on_unserialisable) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return jsonable(value.tolist(), on_unserialisable)
    if on_unserialisable is not None:
        on_unserialisable(f"{type(value).__name__} is not JSON data; recorded as its repr")
    return repr(value)


def dumps(value: Any) -> str:
    """Strict, ASCII-only JSON: newlines and unusual whitespace stay visible as escapes."""
    return json.dumps(value, ensure_ascii=True, allow_nan=False)


def write_json_atomic(path: Path, data: Any, replace: bool = True) -> None:
    """Write a whole JSON file atomically, indented for reading (write_text_atomic's rule and `replace`)."""
    write_text_atomic(path, json.dumps(jsonable(data), ensure_ascii=True, allow_nan=False, indent=2) + "\n", replace)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_sha256(tensor) -> str:
    """SHA-256 of a CPU tensor's raw bytes (little-endian on every CPU torch runs on)."""
    return sha256_bytes(tensor.detach().cpu().contiguous().numpy().tobytes())


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_inventory(directory: Path, exclude: tuple[str, ...] = ()) -> dict:
    """Size and SHA-256 of every file below a directory, keyed by relative POSIX path."""
    inventory = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        if relative in exclude or path.name.startswith(".") and path.name.endswith(".tmp"):
            continue
        inventory[relative] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return inventory


class JsonlWriter:
    """Appends one JSON object per line; each line is written whole, unbuffered, and fsynced before returning.

    The file only ever holds whole lines: a line the system could not take whole (a full disk, a signal that
    raised in the middle of the write) is cut off again before the error goes on, so a run that stopped for want
    of space reads as unfinished, never as a torn record (a contradiction)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def append(self, record: dict) -> None:
        line = (dumps(record) + "\n").encode("ascii")
        before = os.fstat(self._fd).st_size
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except BaseException:
            if len(view) < len(line):  # part of the line reached the file: take it back
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, before)
            raise
        os.fsync(self._fd)

    def flush(self) -> None:
        """Nothing to push: every line is written to the file when it is appended (kept for the log's readers)."""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class TensorStore:
    """Named tensors grouped in safetensors files under DIR/tensors/.

    Each put rewrites its file atomically with every tensor stored so far, so a crash
    leaves the previous complete file. The returned reference (file, key, shape, dtype,
    sha256 of the tensor's raw little-endian bytes) goes into the record that uses it.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self._files: dict[str, dict] = {}

    def get(self, file_stem: str, key: str):
        """A tensor stored earlier in this run; KeyError names the file and key when it is absent."""
        try:
            return self._files[file_stem][key]
        except KeyError:
            raise KeyError(f"no tensor {key!r} in {TENSOR_DIR}/{file_stem}.safetensors (was its trial run?)") from None

    def put(self, file_stem: str, key: str, tensor) -> dict:
        from safetensors.torch import save  # imported here: the plan and the verifier never need torch

        tensor = tensor.detach().to("cpu").contiguous().clone()
        tensors = self._files.setdefault(file_stem, {})
        if key in tensors:
            raise KeyError(f"tensor {key!r} already stored in {file_stem}.safetensors; records are never overwritten")
        tensors[key] = tensor
        path = self.directory / f"{file_stem}.safetensors"
        write_bytes_atomic(path, save(tensors))
        return {
            "file": f"{TENSOR_DIR}/{path.name}",
            "key": key,
            "shape": list(tensor.shape),
            "dtype": str(tensor.dtype).replace("torch.", ""),
            "sha256": tensor_sha256(tensor),
        }
