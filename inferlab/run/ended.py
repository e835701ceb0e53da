"""Earlier runs in a --runs-dir whose process ended without writing its final records (SIGKILL, a crash, the
machine stopping): found when a new run starts there, and renamed to end in -incomplete, so that `ls runs` no
longer shows them with the plain name of a good run.

A folder is renamed only when all of these hold: it is a run's folder (claim.json) whose name carries no ending
suffix yet, it has no session_end (neither in records.jsonl nor in manifest.json), its claim names this host, and
the process the claim names is not running (claimant_state: no such pid, or a zombie). A pid the kernel gave to a
later process still reads as the session: the folder then keeps its name until that process ends, never wrongly
renamed. Nothing the session wrote is changed: the folder is renamed, and a note beside the session's
files (RENAME_NOTE) says when, by which process and why. A folder that cannot be renamed keeps its name.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable, Optional

from inferlab.base.records import CLAIM_FILE, RecordDirError, rename_with_suffix, write_json_atomic

RENAME_NOTE = "renamed-incomplete.json"  # written by the later run that renamed the folder, never by the session
SUFFIX = "-incomplete"
# A name that already says how the run ended (session_status.outcome_suffix), with an optional -N after it.
ENDED_NAME = re.compile(r"-(incomplete|failed|findings|partial|partial-failed|partial-findings)(-\d+)?$")


def claimant_state(claim, hostname: Optional[str] = None) -> str:
    """Whether the process a claim names runs here now: live, gone (no such pid, or a zombie), elsewhere (another
    host: it cannot be looked at) or unknown (no claim)."""
    import socket

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
    try:
        state = Path(f"/proc/{claim['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = ""
    return "gone" if state == "Z" else "live"


def claimant_alive(claim) -> bool:
    """Whether the session that claimed a folder may still be running here (a reused pid reads as alive)."""
    return claimant_state(claim) == "live"


def rename_ended_runs(runs_dir: Path, *, hostname: str, now: Callable[[], str], by: dict,
                      claim_without_end: Callable[[Path], Optional[dict]]) -> list[dict]:
    """Rename every run folder of runs_dir whose process ended without a session_end; one entry per folder found:
    {from, to, pid, hostname, note, error} (to None and error set when it could not be renamed).
    claim_without_end(folder) reads a folder (inferlab.reading.earlier_runs): its claim when it has no session_end,
    else None; the records are read there, by the one reader, never here."""
    runs_dir = Path(runs_dir)
    found = []
    try:
        folders = sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return found
    for folder in folders:
        if ENDED_NAME.search(folder.name):
            continue
        claim = claim_without_end(folder)
        if claim is None or claimant_state(claim, hostname) != "gone":
            continue
        entry = {"from": folder.name, "to": None, "pid": claim.get("pid"), "hostname": claim.get("hostname"),
                 "note": None, "error": None}
        try:
            renamed = rename_with_suffix(folder, SUFFIX)
        except RecordDirError as error:
            found.append({**entry, "error": str(error)})
            continue
        note = {"renamed_from": folder.name, "renamed_to": renamed.name, "renamed_utc": now(), "by": by,
                "why": (f"the session that claimed this folder (pid {claim.get('pid')} on {claim.get('hostname')}, "
                        f"claimed {claim.get('claimed_utc')}) is no longer running and wrote no session_end: it was "
                        f"killed or crashed before its end"),
                "claim": claim}
        try:
            write_json_atomic(renamed / RENAME_NOTE, note)
        except OSError as error:
            try:
                os.rename(renamed, folder)  # unrecorded, the rename is undone
                found.append({**entry, "error": f"its note could not be written ({error}), so it keeps its name"})
            except OSError:
                found.append({**entry, "to": renamed.name, "error": f"its note could not be written ({error})"})
            continue
        found.append({**entry, "to": renamed.name, "note": RENAME_NOTE})
    return found


def _claim_of(folder: Path) -> Optional[dict]:
    """The folder's claim.json as data (a JSON file of its own: records.jsonl is read only by inferlab.reading)."""
    try:
        claim = json.loads((folder / CLAIM_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return claim if isinstance(claim, dict) else None


def rename_abandoned(folder: Path, *, now: Callable[[], str], by: dict) -> Optional[Path]:
    """The folder of a run whose own session abandoned its final records (a stop signal again while they were
    written), renamed to end in -incomplete at once, with the note saying why; None when its name already says how
    it ended or it cannot be renamed (it then keeps its name, as a killed run's folder does until a later run)."""
    folder = Path(folder)
    if ENDED_NAME.search(folder.name):
        return None
    try:
        renamed = rename_with_suffix(folder, SUFFIX)
    except RecordDirError:
        return None
    note = {"renamed_from": folder.name, "renamed_to": renamed.name, "renamed_utc": now(), "by": by,
            "why": "its own session abandoned its final records (a stop signal received again while they were "
                   "written), so the run did not finish",
            "claim": _claim_of(renamed)}
    try:
        write_json_atomic(renamed / RENAME_NOTE, note)
    except OSError:
        try:
            os.rename(renamed, folder)  # unrecorded, the rename is undone
            return None
        except OSError:
            pass
    return renamed


def found_lines(found: list[dict], runs_dir) -> list[str]:
    """One line per folder found, for the terminal."""
    lines = []
    for entry in found:
        head = (f"earlier run {Path(runs_dir) / entry['from']}: its session (pid {entry['pid']} on "
                f"{entry['hostname']}) ended without its final records (killed or crashed)")
        if entry["to"] and not entry["error"]:
            lines.append(f"{head}; renamed {entry['to']} ({entry['note']} in it says so)")
        else:
            lines.append(f"{head}; NOT renamed: {entry['error']}")
    return lines


def killed_detail(claim: Optional[dict], note: Optional[dict], hostname: Optional[str] = None) -> str:
    """What the claim says of a run without a session_end: its process has ended (and a later run renamed the
    folder), or is still running, so the session may not be over; empty when there is no claim to ask."""
    import socket

    if not isinstance(claim, dict):
        return ""
    who = f"pid {claim.get('pid')} on {claim.get('hostname')}"
    renamed = ""
    if isinstance(note, dict):
        by = note.get("by") if isinstance(note.get("by"), dict) else {}
        who_renamed = "by its own session" if by.get("pid") == claim.get("pid") else "by a later run"
        renamed = (f"; renamed from {note.get('renamed_from')} to {note.get('renamed_to')} {who_renamed} at "
                   f"{note.get('renamed_utc')}: {note.get('why')} (its note: {RENAME_NOTE})")
    state = claimant_state(claim, hostname or socket.gethostname())
    if state == "gone":
        return f"; its process ({who}) is no longer running{renamed}"
    if state == "live":
        return (f"; its process ({who}) is STILL RUNNING: the session may not have ended yet, so these are not its "
                f"final records{renamed}")
    if state == "elsewhere":
        return f"; its process ({who}) runs on another machine, so whether it still runs is not known here{renamed}"
    return renamed
