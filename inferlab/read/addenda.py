"""What is added to a run after its session: the learner's explanation (`attach`) and a justified revised cache
criterion (`revise`), kept beside the session's files, never over them: each file written once under addenda/
(explanation.md, explanation.2.md, ...) and listed in the ledger addenda.jsonl (docs/records.md), bound to the run
by the SHA-256 of manifest.json. store() is the one writer: it holds an flock on the run folder itself (no lock file
is left in the run), refuses a damaged ledger, writes the copy atomically, then appends the line whole; a failure
undoes both. A revised criterion judges the run's saved matched-prefix logits again (numpy, no model); the declared
criterion and its verdict stay as recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from inferlab import protocol, writing
from inferlab.files import dumps, sha256_bytes, sha256_file, spelled, write_bytes_atomic
from inferlab.run.records import (CLAIM_FILE, MANIFEST_FILE, PLAN_FILE, PREDICTIONS_FILE, RECORDS_FILE, REPORT_FILE,
                                  TENSOR_DIR, utc_now)
from inferlab.read.parse import LEDGER_FILE, not_a_run_reason, parse_ledger
from inferlab.read.runview import RunView

ADDENDA_DIR = "addenda"
LEDGER_SCHEMA = 1
EXPLANATION_KIND, REVISED_KIND = "explanation", "revised_criterion"
SESSION_FILES = (RECORDS_FILE, MANIFEST_FILE, REPORT_FILE, "report-details.md", PLAN_FILE, CLAIM_FILE,
                 PREDICTIONS_FILE)
REVISED_LABEL = ("revised criterion, supplied by the learner with a justification; evaluated beside the declared "
                 "criterion, whose verdict it does not change")
REVISE_TOOL = "inferlab revise"
MIN_WORDS, MIN_DISTINCT_WORDS = 6, 4


class Refused(Exception):
    """Nothing was written; usage=True when the command line named something unusable (exit 2), else 1."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def is_addenda_path(relative: str) -> bool:
    return relative == LEDGER_FILE or relative.startswith(ADDENDA_DIR + "/")


def stored_path_error(file) -> Optional[str]:
    """Why an entry's `file` is not one file directly under addenda/ (None when it is): confinement to the run."""
    parts = file.split("/") if isinstance(file, str) else []
    if len(parts) != 2 or parts[0] != ADDENDA_DIR or parts[1] in ("", ".", "..") or "\\" in file:
        return f"file {file!r}, expected 'addenda/<stored name>' (one file directly under {ADDENDA_DIR}/)"
    return None


def entry_findings(directory: Path, entry: dict, manifest_sha256: Optional[str]) -> list[str]:
    """What is wrong with one ledger entry against the run now (missing file, other size or hash, another
    manifest); [] when the addendum is intact. Nothing outside addenda/ is ever opened."""
    where = f"{LEDGER_FILE} seq {entry.get('seq')}"
    error = stored_path_error(entry.get("file"))
    if error is not None:
        return [f"{where}: {error}"]
    file, path = entry["file"], Path(directory) / entry["file"]
    restore = (f"to repair it, put back the very bytes that were attached ({entry.get('size')} bytes, sha256 "
               f"{entry.get('sha256')}); to keep new text, attach it as a new version")
    findings = []
    if path.is_symlink() or not path.is_file():
        findings.append(f"{file}: missing (or not a regular file); {where} lists it; {restore}")
    else:
        if path.stat().st_size != entry.get("size"):
            findings.append(f"{file}: size {path.stat().st_size} bytes, {where} says {entry.get('size')} (changed "
                            f"after it was attached)")
        if sha256_file(path) != entry.get("sha256"):
            findings.append(f"{file}: sha256 {sha256_file(path)}, {where} says {entry.get('sha256')} (edited after "
                            f"it was attached); {restore}")
    if entry.get("manifest_sha256") != manifest_sha256:
        findings.append(f"{file}: {where} binds it to manifest.json sha256 {entry.get('manifest_sha256')}, and this "
                        f"run's {MANIFEST_FILE} is {manifest_sha256} now (attached to another run, or the manifest "
                        f"changed since)")
    return findings


# --- keeping an addendum -------------------------------------------------------------------------------------


@dataclass
class RunState:
    """A run an addendum may be kept in, and whether its session had finished."""

    directory: Path
    view: RunView
    finished: bool
    state: str


def read_text_file(path: Path, role: str = "FILE") -> bytes:
    try:
        return writing.read(path, role)
    except writing.NotText as error:
        raise Refused(str(error), usage=error.usage) from None


def check_run(directory: Path) -> RunState:
    """The run an addendum is kept in, or Refused: not a run, a plan folder, no manifest to bind to, or a session
    that still runs."""
    directory = Path(directory)
    reason = not_a_run_reason(directory) if directory.is_dir() else f"{directory} is not a folder"
    if reason:
        raise Refused(f"{reason}; expected the folder a run wrote "
                      f"(`{spelled('-m pytest experiments --record-dir DIR', 'python')}`)", usage=True)
    view = RunView.read(directory)
    if view.is_plan_folder:
        raise Refused(f"{directory} is a plan folder (written by --plan): no test ran; expected a run's record dir")
    if not (directory / MANIFEST_FILE).is_file():
        raise Refused(f"{directory} has no {MANIFEST_FILE} to bind an addendum to")
    if view.session_end is not None and view.final_manifest_written:
        return RunState(directory, view, True, "finished")
    if view.claimant_live:
        raise Refused(f"{directory} is still being written by its session (pid {view.claim.get('pid')}): wait for "
                      f"it to end, then run this again", usage=True)
    why = view.unfinished or f"its final writes were abandoned ({MANIFEST_FILE} is the one written at its start)"
    return RunState(directory, view, False, f"unfinished: {why}")


def refuse_run_file(file: Path, directory: Path, role: str = "FILE") -> None:
    """Refused (usage) when FILE is inside the run folder, or a hard or symbolic link to a file there."""
    file, directory, relative = Path(file), Path(directory), None
    with contextlib.suppress(OSError):  # a FILE that does not exist is refused when it is read
        relative = next((p.relative_to(directory).as_posix() for p in directory.rglob("*")
                         if p.is_file() and not p.is_symlink() and p.samefile(file)), None)
    if relative is None:
        return
    if relative in SESSION_FILES or relative.startswith(TENSOR_DIR + "/") or relative.endswith(".png"):
        what = "one of the run's own files, written by its session, not an explanation of it"
    elif is_addenda_path(relative):
        what = "an addendum kept already (to attach a new version, attach it from a copy outside the run folder)"
    else:
        what = "inside the run folder, where verify calls every file the session did not write added after it"
    raise Refused(f"{role} {file} is {directory}/{relative}, {what}; expected a file you wrote after the run, from "
                  f"outside {directory}", usage=True)


def stored_name(original_name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(original_name).name).lstrip("._-") or "addendum"
    return safe if len(safe) <= 100 else safe[:100 - len(Path(safe).suffix[:12])] + Path(safe).suffix[:12]


def _append_whole(path: Path, line: bytes) -> None:
    existed = path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    before = os.fstat(fd).st_size
    try:
        written = 0
        while written < len(line):
            written += os.write(fd, line[written:])
        os.fsync(fd)
    except BaseException:
        os.ftruncate(fd, before)
        if not existed:
            path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def store(run: RunState, data: bytes, original_name: str, kind: str, tool: str, structure: Optional[dict] = None,
          on_wait: Callable[[], None] = lambda: None, clock: Callable[[], str] = utc_now) -> dict:
    """Keep `data` as an addendum of `run`; returns its ledger entry. Refused on a damaged ledger; an OSError is
    raised after undoing what was written."""
    directory = run.directory
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        ledger = directory / LEDGER_FILE
        entries, problems = parse_ledger(ledger.read_bytes() if ledger.exists() else b"")
        if problems:
            raise Refused(f"{ledger} is damaged (line {problems[0].line}: {problems[0].what}; {len(problems)} "
                          f"problem(s)); nothing was added to it: `verify` names every problem")
        used, folder = {entry.get("file") for entry in entries}, directory / ADDENDA_DIR
        stem, suffix = Path(stored_name(original_name)).stem, Path(stored_name(original_name)).suffix
        names = itertools.chain([f"{stem}{suffix}"], (f"{stem}.{n}{suffix}" for n in itertools.count(2)))
        name = next(n for n in names if f"{ADDENDA_DIR}/{n}" not in used and not os.path.lexists(folder / n))
        entry = {"schema": LEDGER_SCHEMA, "seq": len(entries), "kind": kind, "file": f"{ADDENDA_DIR}/{name}",
                 "original_name": original_name, "size": len(data), "sha256": sha256_bytes(data),
                 "attached_utc": clock(), "manifest_sha256": sha256_file(directory / MANIFEST_FILE),
                 "structure": structure, "tool": tool, "run_finished": run.finished, "run_state": run.state}
        made_folder = not folder.exists()
        try:
            write_bytes_atomic(folder / name, data)
            _append_whole(ledger, (dumps(entry) + "\n").encode("ascii"))
        except BaseException:
            (folder / name).unlink(missing_ok=True)
            if made_folder:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
        with contextlib.suppress(OSError):
            os.fsync(fd)
        return entry
    finally:
        os.close(fd)


# --- a revised cache criterion -------------------------------------------------------------------------------


def parse_criterion(text: str) -> protocol.Tolerance:
    """"ATOL,RTOL": two finite numbers >= 0, RTOL below 1 (at 1 a cached vector of zeros passes any reference)."""
    expected = "ATOL,RTOL: two finite numbers >= 0 separated by one comma (for example 1e-4,1e-3)"
    parts = text.split(",")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        values = []
    if len(parts) != 2 or len(values) != 2 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise Refused(f"--cache-criterion: expected {expected}, actual {text!r}", usage=True)
    if values[1] >= 1:
        raise Refused(f"--cache-criterion: expected RTOL below 1, actual {text!r}: with RTOL >= 1 a cached vector of "
                      "zeros passes against any uncached one (|0-b| = |b| <= RTOL*|b|)", usage=True)
    return protocol.Tolerance(atol=values[0], rtol=values[1])


def judge(cached, uncached, tolerance: protocol.Tolerance) -> dict:
    """One prefix's cached logits against the uncached reference, in float64 (NaN fails)."""
    import numpy

    a = numpy.asarray(cached, dtype=numpy.float64).reshape(-1)  # (vocab,)
    b = numpy.asarray(uncached, dtype=numpy.float64).reshape(-1)  # (vocab,)
    with numpy.errstate(invalid="ignore"):
        failing = ~(numpy.abs(a - b) <= tolerance.atol + tolerance.rtol * numpy.abs(b))
    count = int(failing.sum())
    return {"atol": tolerance.atol, "rtol": tolerance.rtol, "fail_count": count, "fail_fraction": count / a.size,
            "passed": bool(numpy.isfinite(a).all() and numpy.isfinite(b).all()) and count == 0}


def vacuous_reason(pairs: list, tolerance: protocol.Tolerance) -> Optional[str]:
    """Why a criterion could not fail on these logits: every cached vector within the range the run's own saved
    logits span would pass at every prefix; None otherwise."""
    import numpy

    lo = min(float(min(a.min(), b.min())) for a, b in pairs)
    hi = max(float(max(a.max(), b.max())) for a, b in pairs)
    for _, b in pairs:
        b = b.astype(numpy.float64)
        if not (numpy.maximum(b - lo, hi - b) <= tolerance.atol + tolerance.rtol * numpy.abs(b)).all():
            return None
    return (f"under {tolerance.describe()} every cached vector within the range of the run's saved logits "
            f"([{lo:.6g}, {hi:.6g}]) would pass at every prefix, so the criterion could not detect any cache fault")


def revision(run: RunState, tolerance: protocol.Tolerance, justification: str, written_utc: str) -> dict:
    """The revised-criterion document: every saved prefix judged under the revised and the declared criterion."""
    # a check of substance, never of whether the reason holds
    words = [w.lower() for w in re.findall(r"[^\W\d_]{2,}", justification) if not writing.is_placeholder(w)]
    if len(words) < MIN_WORDS or len(set(words)) < MIN_DISTINCT_WORDS:
        raise Refused(f"--justification: expected a sentence saying why the criterion is justified, at least "
                      f"{MIN_WORDS} words, {MIN_DISTINCT_WORDS} of them different, actual {justification!r}",
                      usage=True)
    view, prefixes, bad = run.view, [], []  # (record, cached, uncached), each tensor matching its record
    if not view.kind("cache_comparison"):
        raise Refused(f"{view.directory}: no cache_comparison record, so there are no saved logits to judge again")
    for record in view.kind("cache_comparison"):
        tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
        arrays = [view.tensors.verified(tensors.get(p)) for p in ("cached", "uncached")]
        if any(a is None for a in arrays):
            bad.append(f"cache_comparison seq {record.get('seq')}: a tensor is missing or does not match its record")
        else:
            prefixes.append((record, *arrays))
    if bad:
        raise Refused(f"{view.directory}: nothing was judged again: " + "; ".join(bad))
    misaligned = [f"prefix length {r.get('prefix_length')}" for r, _, _ in prefixes
                  if not isinstance(r.get("checks"), dict) or len(r["checks"]) < 2
                  or not all(ok is True for name, ok in r["checks"].items() if name != "within_tolerance")]
    if misaligned:
        raise Refused(f"{run.directory}: the matched-prefix alignment checks did not all pass "
                      f"({', '.join(misaligned)}), so no tolerance can make the two paths comparable; fix the harness "
                      "and run again")
    vacuous = vacuous_reason([(c, u) for _, c, u in prefixes], tolerance)
    if vacuous:
        raise Refused(f"--cache-criterion {tolerance.atol:g},{tolerance.rtol:g}: {vacuous}", usage=True)
    declared = protocol.CACHE_TOLERANCE
    rows = [{"name": r.get("name"), "prefix_length": r.get("prefix_length"), "record_seq": r.get("seq"),
             "tensors": {p: r["tensors"][p] for p in ("cached", "uncached")},
             "declared": {"passed": declared_verdict(r), "recomputed": judge(c, u, declared)},
             "revised": judge(c, u, tolerance)} for r, c, u in prefixes]
    failing = [row["prefix_length"] for row in rows if not row["revised"]["passed"]]
    return {"schema": 1, "kind": REVISED_KIND, "label": REVISED_LABEL, "written_utc": written_utc, "tool": REVISE_TOOL,
            "run_state": run.state, "justification": justification.strip(),
            "declared": {"atol": declared.atol, "rtol": declared.rtol, "rule": declared.describe(),
                         "note": "as the session recorded it; this revision does not change it"},
            "revised": {"atol": tolerance.atol, "rtol": tolerance.rtol, "rule": tolerance.describe()},
            "prefixes": rows, "revised_evaluation": {"all_within_tolerance": not failing,
                                                     "failing_prefix_lengths": failing}}


def declared_verdict(record: dict) -> Optional[bool]:
    """Whether a prefix passed the declared criterion, as the session recorded it."""
    checks = record.get("checks") if isinstance(record.get("checks"), dict) else {}
    value = checks.get("within_tolerance", record.get("passed"))
    return value if isinstance(value, bool) else None


def check_revision(view: RunView, file: str, data: bytes) -> list[str]:
    """A kept revision against the run's tensors now: one line per verdict that the tensors no longer give."""
    try:
        document = json.loads(data.decode("utf-8"))
        tolerance = protocol.Tolerance(atol=document["revised"]["atol"], rtol=document["revised"]["rtol"])
        rows = [row for row in document["prefixes"] if isinstance(row, dict)]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        return [f"{file}: not a revised-criterion document ({type(error).__name__}: {error})"]
    records = {record.get("seq"): record for record in view.kind("cache_comparison")}
    findings = []
    for row in rows:
        record = records.get(row.get("record_seq"))
        saved = {p: (record.get("tensors") or {}).get(p) for p in ("cached", "uncached")} if record else None
        if record is None or row.get("tensors") != saved:
            findings.append(f"{file}: {row.get('name')}: not the tensors cache_comparison seq {row.get('record_seq')} "
                            "holds")
            continue
        arrays = [view.tensors.verified(record["tensors"][p]) for p in ("cached", "uncached")]
        if all(a is not None for a in arrays) and row.get("revised") != judge(*arrays, tolerance):
            findings.append(f"{file}: {row.get('name')}: revised verdict {row.get('revised')}, recomputed from the "
                            f"tensors {judge(*arrays, tolerance)}")
    return findings
