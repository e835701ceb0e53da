"""Whether the session that claimed a run folder may still be running here: so that nothing is added to a run
(attach, revise) while its session can still write its end and sweep the addition into its own inventory.

A run's claim.json names the process that claimed the folder: its pid and hostname, the time of the claim,
and, since this module exists, its start (`process_start`: the kernel's boot id and the process's start time
in clock ticks since boot, field 22 of /proc/<pid>/stat). A pid alone is not enough: once the session is
gone the kernel may give its pid to another process. So claimant() decides:

  - another hostname: the process cannot be looked at from here ("elsewhere");
  - no process with that pid, or a zombie: the session is over ("gone");
  - the claim records its process's start: live only when the boot id and the start ticks are those of the
    process that has the pid now (another start is a reused pid, "gone");
  - an older claim without process_start: the process with that pid is the claimant only if it started before
    the claim was written. One that started more than START_MARGIN_S after the claimed time is another
    process ("gone"); otherwise it may be the session, and it is taken as live (conservative: a wrong
    refusal only means waiting, a wrong addendum would spoil the run for good).
Without /proc (not Linux) a pid that exists is taken as live, for the same reason.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from inferlab.base.records import CLAIM_FILE

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
START_MARGIN_S = 1.0  # /proc/stat's boot time is in whole seconds; a process this close to the claim may be it
PROC = Path("/proc")


@dataclass(frozen=True)
class Claimant:
    """What is known of a claim's process now: state is live, gone, elsewhere or unknown, and why in words."""

    state: str
    why: str
    pid: Optional[int] = None

    @property
    def live(self) -> bool:
        return self.state == "live"


def boot_id() -> Optional[str]:
    """This boot's id (Linux), or None."""
    try:
        return BOOT_ID_FILE.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def _stat_fields(pid: int) -> Optional[list[str]]:
    """/proc/<pid>/stat's fields from the third (state) on; None when there is no such process (or no /proc).
    The command name (field 2) is in parentheses and may hold spaces: the fields start after its last ')'."""
    try:
        text = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 1:].split()


def start_identity(pid: int) -> Optional[dict]:
    """{boot_id, start_ticks} of a running process (what a claim records), or None where /proc cannot say."""
    fields = _stat_fields(pid)
    identity = boot_id()
    if fields is None or identity is None or len(fields) < 20:
        return None
    try:
        return {"boot_id": identity, "start_ticks": int(fields[19])}  # field 22: starttime, in clock ticks
    except ValueError:
        return None


def _started_utc(start_ticks: int) -> Optional[_dt.datetime]:
    """When a process that started start_ticks after boot started, by the wall clock (None without /proc)."""
    try:
        boot = next(int(line.split()[1]) for line in (PROC / "stat").read_text(encoding="ascii").splitlines()
                    if line.startswith("btime "))
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return _dt.datetime.fromtimestamp(boot + start_ticks / ticks, _dt.timezone.utc)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    except OSError:
        return False
    return True


def read_claim(directory: Path) -> Optional[dict]:
    """The run folder's claim.json as a dict, or None when it is missing or not a JSON object."""
    try:
        claim = json.loads((Path(directory) / CLAIM_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return claim if isinstance(claim, dict) else None


def claimant(claim: Optional[dict], hostname: Optional[str] = None) -> Claimant:
    """Whether the process a claim names may still be the session (see the module's docstring)."""
    if not claim or not isinstance(claim.get("pid"), int) or isinstance(claim.get("pid"), bool):
        return Claimant("unknown", f"{CLAIM_FILE} names no process id")
    pid, host = claim["pid"], claim.get("hostname")
    here = hostname if hostname is not None else socket.gethostname()
    if host != here:
        return Claimant("elsewhere", f"{CLAIM_FILE} names pid {pid} on host {host!r}, and this is {here!r}: "
                                     f"whether that session still runs cannot be checked from here", pid)
    fields = _stat_fields(pid)
    if fields is None:
        if not _exists(pid):
            return Claimant("gone", f"no process has pid {pid} now", pid)
        return Claimant("live", f"pid {pid} exists, and without /proc its start cannot be compared with the "
                                f"claim's, so it is taken for the session", pid)
    if fields and fields[0] in ("Z", "X"):
        return Claimant("gone", f"pid {pid} has exited (a zombie, not yet reaped)", pid)
    recorded = claim.get("process_start")
    now = start_identity(pid)
    if isinstance(recorded, dict) and recorded.get("start_ticks") is not None:
        if now is None:
            return Claimant("live", f"pid {pid} is running, and its start cannot be read to compare with the claim's, "
                                    f"so it is taken for the session", pid)
        if now == {"boot_id": recorded.get("boot_id"), "start_ticks": recorded.get("start_ticks")}:
            return Claimant("live", f"pid {pid} is running, and it is the process that claimed the folder (its start, "
                                    f"boot {now['boot_id'][:8]}... tick {now['start_ticks']}, is the claim's)", pid)
        return Claimant("gone", f"pid {pid} is running but is another process than the claim's (another start "
                                f"than {CLAIM_FILE} records: the pid was reused)", pid)
    started = _started_utc(now["start_ticks"]) if now is not None else None
    try:
        claimed = _dt.datetime.fromisoformat(str(claim.get("claimed_utc")))
        claimed = claimed if claimed.tzinfo else claimed.replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        claimed = None
    if started is not None and claimed is not None and (started - claimed).total_seconds() > START_MARGIN_S:
        return Claimant("gone", f"pid {pid} is running but started at {started.isoformat(timespec='seconds')}, after "
                                f"the claim ({claim.get('claimed_utc')}): another process was given the pid", pid)
    return Claimant("live", f"pid {pid} is running; {CLAIM_FILE} does not record its process's start (an older "
                            f"run), and this process started before the claim, so it is taken for the session", pid)
