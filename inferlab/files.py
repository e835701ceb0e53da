"""Files: the checkout, how a printed command reads, and how every whole file inferlab writes is written (the
output rule, docs/records.md "Output paths": write_bytes_atomic and output_kind). Standard library only, and no
other module of inferlab: every layer uses it."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import json
import math
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout: inferlab/, pytest.ini, artifacts/, the templates
PROG, VENV_BIN = "inferlab", ".venv/bin"  # the console script `make` installs, and where `make` puts it
NEEDED = ("numpy", "safetensors", "torch", "transformers", "tokenizers", "huggingface_hub", "filelock", "matplotlib")


def spelled(args: str, program: str = PROG) -> str:
    """A command as inferlab prints it for a reader to type: `.venv/bin/inferlab verify DIR`; typed in the project
    folder it runs this project's environment whatever is first on PATH, and it reads the same on every machine."""
    return f"{VENV_BIN}/{program} {args}"


def require_environment(program: str) -> None:
    """Refuse, before anything is read or written, a Python without the project's packages (looked up, not
    imported): one line naming the Python to use, exit status 2."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return
    venv = PROJECT_ROOT / ".venv" / "bin" / "python"
    use = f"{venv}" if venv.exists() else f"{venv} (`make` in {PROJECT_ROOT} creates it)"
    print(f"{program}: this Python ({sys.executable}) lacks {', '.join(missing)}; nothing was read or written. "
          f"Use {use}", file=sys.stderr)
    raise SystemExit(2)


def import_hint(nodeid: str, failure: str, executable: str) -> Optional[str]:
    """For a test file this Python could not import for want of the project's environment: one line naming this
    interpreter and the one to use; None for any other failure (left as it is)."""
    found = re.search(r"No module named '([A-Za-z0-9_.]+)'", failure)
    if found is None or found.group(1).split(".")[0] not in (*NEEDED, "pytest_timeout"):
        return None
    return (f"{nodeid}: this Python ({executable}) cannot import {found.group(1)}: it is not the project's "
            f"environment. Run the tests with {spelled(f'-m pytest {nodeid.split(chr(47))[0]}', 'python')} (`make` "
            f"builds .venv)")


def jsonable(value: Any, on_unserialisable: Optional[Callable[[str], None]] = None) -> Any:
    """A value as strict JSON data: non-finite floats become strings, arrays lists, unknown objects their repr."""
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
    """Strict, ASCII-only JSON on one line: newlines and unusual whitespace stay visible as escapes."""
    return json.dumps(value, ensure_ascii=True, allow_nan=False)


def write_json_atomic(path, data: Any, replace: bool = True) -> None:
    """A whole JSON file, indented for reading, by the output rule."""
    write_text_atomic(path, json.dumps(jsonable(data), ensure_ascii=True, allow_nan=False, indent=2) + "\n", replace)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path) -> str:
    """SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tensor_sha256(tensor) -> str:
    """SHA-256 of a tensor's raw little-endian bytes: a torch tensor as saved, or the numpy array read back."""
    import numpy

    data = tensor.detach().cpu().contiguous().numpy() if hasattr(tensor, "detach") else numpy.ascontiguousarray(tensor)
    if data.dtype.byteorder == ">":
        data = data.byteswap().view(data.dtype.newbyteorder("<"))
    return sha256_bytes(data.tobytes())


def os_error_words(error: OSError) -> str:
    """An OSError in words with its errno name: 'File name too long (ENAMETOOLONG)'; for a refusal raised over the
    system's error (OutputPathError), the system's."""
    error = error.__context__ if error.strerror is None and isinstance(error.__context__, OSError) else error
    name = errno.errorcode.get(error.errno, "") if error.errno is not None else ""
    return f"{error.strerror or error}" + (f" ({name})" if name else "")


def describe_path(path) -> str:
    """What is at `path`, as the rest of a sentence that starts with the path: 'does not exist', 'is a regular
    file', 'is a dangling symbolic link to X', 'is a FIFO (named pipe)', 'cannot be examined: ...'."""
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


# What a path can be, in words that finish "PATH is ...".
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
# A link such as these names an open file descriptor, not a file of its own (Linux's /proc/PID/fd/N, the /dev/fd/N
# of Linux and macOS): what it leads to is written through, never replaced.
_DESCRIPTOR = re.compile(r"^/(?:proc/([^/]+)/fd|dev/fd)/(\d+)$")
_MAX_LINKS = 40  # as the kernel's own limit on symbolic links followed in one lookup

ABSENT, REGULAR, STREAM = "absent", "regular", "stream"


class OutputPathError(OSError):
    """A path named for output that is refused (a directory, a disk, a socket, an existing file where only new ones
    are written, a link to nowhere) or that could not be written; the message names the path and what it is. An
    OSError, so that a caller that handles a failed write (`except OSError`) handles these too."""


class OutputExistsError(OutputPathError):
    """The refusal of an existing regular file where only a new one is written: the one that --replace lifts."""


def replace_hint(error: OutputPathError) -> str:
    """The refusal's text, for a command with --replace: the flag is named where it would lift the refusal."""
    return f"{error} (or give --replace)" if isinstance(error, OutputExistsError) else str(error)


def kind_in_words(mode: int) -> str:
    """'a regular file', 'a FIFO (named pipe)', 'a character device', ... for an st_mode."""
    return next((words for test, words in _KINDS if test(mode)), "an unusual file")


def _link_chain(path: str) -> tuple[list[str], bool]:
    """The absolute paths a chain of symbolic links passes through, starting with `path` itself, and whether the
    chain ends (False: more than _MAX_LINKS links, a loop)."""
    chain = [os.path.abspath(path)]
    for _ in range(_MAX_LINKS):
        current = chain[-1]
        if not os.path.islink(current):
            return chain, True
        chain.append(os.path.abspath(os.path.join(os.path.dirname(current), os.readlink(current))))
    return chain, False


def output_kind(path, replace: bool = True) -> tuple[str, Path]:
    """How write_bytes_atomic would write `path`: (ABSENT, path) for a new file, (REGULAR, the file a link leads
    to, else path) for a file replaced whole, (STREAM, path) for one written through. OutputPathError for a path
    the rule refuses; with replace=False an existing regular file is refused too."""
    path = Path(path)
    try:
        chain, ends = _link_chain(str(path))
        if not ends:
            raise OutputPathError(f"{path}: a chain of more than {_MAX_LINKS} symbolic links (a loop?); nothing was "
                                  "written")
        if any(_DESCRIPTOR.match(hop) for hop in chain):  # its link names no path (pipe:[N]): the kernel follows it
            return _descriptor_kind(path)
        if len(chain) > 1 and not os.path.lexists(chain[-1]):
            raise OutputPathError(f"{path}: a symbolic link to {os.readlink(path)}, where nothing is; it is not "
                                  "followed to make a file there: name the file itself")
        if not os.path.lexists(chain[-1]):
            return ABSENT, path
        mode = os.stat(chain[-1]).st_mode
    except OutputPathError:
        raise
    except OSError as error:
        raise OutputPathError(f"{path}: cannot be examined ({error.strerror or error}); nothing was written") from None
    what = kind_in_words(mode) + (f" (through the link {path})" if len(chain) > 1 else "")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return STREAM, path
    if stat.S_ISREG(mode):
        if not replace:
            raise OutputExistsError(f"{path}: already exists ({what}); it is never replaced: choose a new file name")
        return REGULAR, Path(chain[-1])
    advice = "name a file inside it" if stat.S_ISDIR(mode) else "name a regular file, a FIFO or a character device"
    raise OutputPathError(f"{path} is {what}: nothing is written there; {advice}")


def _descriptor_kind(path: Path) -> tuple[str, Path]:
    """(STREAM, path) for a descriptor link (/dev/stdout, /dev/fd/N, /proc/self/fd/N) open on a pipe, a terminal, a
    device or a regular file: written through, whatever the shell pointed it at. OutputPathError for a closed
    descriptor, a directory or a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise OutputPathError(f"{path}: names a file descriptor that is not open for writing here "
                              f"({error.strerror or error}); nothing was written") from None
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return STREAM, path
    raise OutputPathError(f"{path} is {kind_in_words(mode)} (an open descriptor's): nothing is written there; name a "
                          "regular file, a FIFO or a character device")


def write_bytes_atomic(path, data: bytes, replace: bool = True) -> None:
    """Write `data` as the whole file at `path` by the module's rule: a new or regular file through a temporary
    sibling, fsynced, then moved into place; a device or a FIFO written through. With replace=False an existing
    file is refused, even one that appears while writing. OutputPathError when refused or not writable."""
    kind, target = output_kind(path, replace)
    if kind == STREAM:
        _write_through(Path(path), data)
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = os.stat(target).st_mode & 0o7777 if kind == REGULAR else 0o666 & ~_current_umask()
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:
        raise OutputPathError(f"{path}: cannot be written ({error.strerror or error}); nothing was written: choose "
                              "a folder you can write to") from None
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600: a new file is as readable as any, a replaced one keeps its mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(temporary, target)
        else:
            _link_new(temporary, target, path)
    except OutputPathError:
        raise
    except OSError as error:
        raise OutputPathError(f"{path}: cannot be written ({error.strerror or error}); nothing was left there: "
                              "choose a folder you can write to") from None
    finally:
        Path(temporary).unlink(missing_ok=True)


def write_text_atomic(path, text: str, replace: bool = True) -> None:
    """write_bytes_atomic of UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"), replace)


def _link_new(temporary: str, target: Path, named) -> None:
    """Put the finished temporary file at `target` only if nothing is there by then."""
    try:
        os.link(temporary, target)  # fails if anything appeared at target meanwhile: never replaces it
    except FileExistsError:
        raise OutputExistsError(f"{named}: already exists; it is never replaced: choose a new file name") from None
    except OSError:  # a file system without hard links: a narrower window, still never over what is there
        if os.path.lexists(target):
            raise OutputExistsError(f"{named}: already exists; it is never replaced: choose a new file name") from None
        os.replace(temporary, target)


def _own_descriptor(path: Path) -> Optional[int]:
    """The number N when `path` is, or leads through, a link to one of this process's own descriptors
    (/dev/stdout, /dev/fd/N, /proc/self/fd/N): written through that descriptor itself, so the bytes share its
    offset with whatever else the process writes there (the shell's `> file` opens it without O_APPEND)."""
    chain, _ = _link_chain(str(path))
    for hop in chain:
        found = _DESCRIPTOR.match(hop)
        if found and found.group(1) in ("self", str(os.getpid()), None):
            return int(found.group(2))
    return None


def _write_through(path: Path, data: bytes) -> None:
    """Write to what is already at `path` (a device, a FIFO, a descriptor): through this process's own descriptor
    when the path names one, else opened for appending; never created or truncated. A FIFO's open waits for its
    reader, as a shell's redirection does."""
    fd = _own_descriptor(path)
    owned = fd is None
    if owned:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOCTTY", 0))
        except OSError as error:
            raise OutputPathError(f"{path}: cannot be opened for writing ({error.strerror or error}); nothing was "
                                  "written") from None
    else:
        for stream in (sys.stdout, sys.stderr):  # what Python still holds for that descriptor goes first
            with contextlib.suppress(Exception):
                if stream.fileno() == fd:
                    stream.flush()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as error:
        raise OutputPathError(f"{path}: writing stopped ({error.strerror or error}) after "
                              f"{len(data) - len(view)} of {len(data)} bytes") from None
    finally:
        if owned:
            os.close(fd)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
