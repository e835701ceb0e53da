"""One acquisition of a specimen's project cache at a time: an advisory lock file beside the cache folder.

fcntl.flock belongs to the open file, so the kernel releases it when the holder exits, even
after SIGKILL: a stale lock file never blocks anyone. POSIX only, like the rest of the lab's runner.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from inferlab.specimen.deadline import Deadline
from inferlab.specimen.spec import SpecimenError

POLL_S = 0.1


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def lock_path(cache_directory: Path) -> Path:
    """The lock file of a cache folder: <cache_root>/<name>/<revision>.lock."""
    return cache_directory.with_name(cache_directory.name + ".lock")


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "another process"


@contextlib.contextmanager
def held(cache_directory: Path, deadline: Deadline):
    """Hold the cache folder's lock for the block, waiting for it at most until the deadline.

    Yields {path, contended, waited_s}; raises DeadlineExpired naming the lock and its holder
    when another acquisition keeps it past the deadline.
    """
    try:
        import fcntl
    except ImportError:  # Windows: the lab's runner supports Linux and macOS only
        raise SpecimenError(f"{cache_directory}: the project cache needs a POSIX file lock (fcntl), which this "
                            f"platform lacks; pass --artifacts DIR with a verified copy instead") from None
    path = lock_path(cache_directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start, contended = time.monotonic(), False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                contended = True
                if deadline.expired():
                    raise deadline.error(
                        f"waiting for {_holder(fd)}, which holds {path} while it acquires the same specimen "
                        f"into {cache_directory}"
                    ) from None
                _pause(min(POLL_S, max(deadline.remaining(), 0.001)))
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
        try:
            yield {"path": str(path), "contended": contended, "waited_s": time.monotonic() - start}
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock
