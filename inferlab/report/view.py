"""A finished (or unfinished) run as the report sees it: records, plan, the stable manifest fields, tensors.

Nothing here raises over a damaged or partial directory: problems are collected in read_problems
and the pages show them. Only manifest fields that are the same in the manifest written at
session start and the one rewritten at session end are read, because the session renders the
report between the two and `report --check` must give the same text afterwards. The one exception,
manifest_finalised(), is asked only when the report is made after the session (after_session).
"""

from __future__ import annotations

import collections
import json
import shlex
from pathlib import Path
from typing import Any, Optional

from inferlab.records import MANIFEST_FILE, PLAN_FILE, RECORDS_FILE, TENSOR_DIR

INTEGRITY, DIAGNOSTIC = "integrity", "diagnostic"
BASE_FIELDS = ("kind", "test", "seq", "wall_time")
NOT_PASSING = ("failed", "error", "skipped")
FAILING = ("failed", "error")


def bracket_id(nodeid: Optional[str]) -> Optional[str]:
    """The parametrize id of a node id ('P1-S2-seed23'), or None."""
    if not nodeid or not nodeid.endswith("]") or "[" not in nodeid:
        return None
    return nodeid[nodeid.index("[") + 1:-1]


def short_test(nodeid: Optional[str]) -> str:
    """The test name with its parameters, without the file."""
    return (nodeid or "(session)").split("::")[-1]


def skip_text(record: dict) -> str:
    """A skipped test's reason, from skip_reason or else its longrepr's last line."""
    from inferlab.report.fmt import first_message

    return record.get("skip_reason") or first_message(record.get("longrepr")) or "(no reason recorded)"


class RunView:
    """Records, plan and the stable part of the manifest of one record directory."""

    def __init__(self, record_dir: Path):
        self.dir = Path(record_dir)
        self.records: list[dict] = []
        self.read_problems: list[str] = []
        self._read_records()
        self.manifest: dict = self._json(MANIFEST_FILE) or {}
        self.plan: Optional[dict] = self._json(PLAN_FILE)
        self.by_kind: dict[str, list[dict]] = collections.defaultdict(list)
        for record in self.records:
            self.by_kind[str(record.get("kind"))].append(record)
        self.outcomes = self.kind("test_outcome")
        ends = self.kind("session_end")
        self.session_end: Optional[dict] = ends[-1] if ends else None
        schedule = (self.plan or {}).get("schedule")
        self.planned: list[dict] = [e for e in schedule if isinstance(e, dict)] if isinstance(schedule, list) else []
        self._planned_kind = {e.get("test"): e.get("check_kind") for e in self.planned}
        self._tensor_files: dict[str, Any] = {}

    # --- reading --------------------------------------------------------------------------

    def _read_records(self) -> None:
        try:
            with open(self.dir / RECORDS_FILE, encoding="ascii", errors="replace") as handle:
                for number, line in enumerate(handle, start=1):
                    try:
                        record = json.loads(line)
                    except ValueError as error:
                        self.read_problems.append(f"{RECORDS_FILE}:{number}: not a JSON object ({error})")
                        continue
                    if isinstance(record, dict):
                        self.records.append(record)
                    else:
                        self.read_problems.append(f"{RECORDS_FILE}:{number}: not a JSON object")
        except OSError as error:
            self.read_problems.append(f"{RECORDS_FILE}: not readable ({error})")

    def _json(self, name: str) -> Optional[dict]:
        path = self.dir / name
        if not path.exists():
            self.read_problems.append(f"{name}: missing")
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            self.read_problems.append(f"{name}: not readable JSON ({error})")
            return None
        return data if isinstance(data, dict) else None

    def kind(self, name: str) -> list[dict]:
        """The records of one kind, in write order."""
        return self.by_kind.get(name, [])

    def first(self, name: str) -> Optional[dict]:
        """The first record of a kind, or None."""
        records = self.kind(name)
        return records[0] if records else None

    # --- outcomes -------------------------------------------------------------------------

    def check_kind(self, outcome: dict) -> str:
        """'diagnostic' or 'integrity': the outcome's own field, else the plan's entry, else integrity."""
        kind = outcome.get("check_kind") or self._planned_kind.get(outcome.get("test"))
        return DIAGNOSTIC if kind == DIAGNOSTIC else INTEGRITY

    def decisive_outcome(self, nodeid: Optional[str]) -> Optional[dict]:
        """The outcome of one node id that decides it: a non-passing one (setup or teardown) wins."""
        matches = [r for r in self.outcomes if r.get("test") == nodeid]
        failing = [r for r in matches if r.get("outcome") != "passed"]
        return (failing or matches or [None])[0]

    def outcome_of_param(self, test_id: str) -> Optional[dict]:
        """The decisive outcome of the test whose parametrize id is `test_id`."""
        nodeids = list(dict.fromkeys(r.get("test") for r in self.outcomes if bracket_id(r.get("test")) == test_id))
        outcomes = [self.decisive_outcome(n) for n in nodeids]
        failing = [r for r in outcomes if r and r.get("outcome") != "passed"]
        return (failing or outcomes or [None])[0]

    def tests_by_outcome(self) -> dict[str, dict]:
        """Each node id with an outcome -> its decisive outcome record, in first-seen order."""
        return {nodeid: self.decisive_outcome(nodeid)
                for nodeid in dict.fromkeys(r.get("test") for r in self.outcomes)}

    def planned_without_outcome(self) -> list[str]:
        """Planned node ids that have no test_outcome record."""
        with_outcome = {r.get("test") for r in self.outcomes}
        return [e.get("test") for e in self.planned if e.get("test") not in with_outcome]

    # --- run facts ------------------------------------------------------------------------

    def manifest_finalised(self) -> bool:
        """Whether manifest.json is the one a session writes last: it lists the files with their hashes and its
        status no longer says 'started'. Meaningful only after the session: the report is rendered before it."""
        status = str(self.manifest.get("status") or "")
        return isinstance(self.manifest.get("files"), dict) and not status.startswith("started")

    @property
    def synthetic(self) -> bool:
        """Whether any record or the manifest's specimen says the specimen is synthetic."""
        if any(r.get("synthetic") is True for r in self.records):
            return True
        specimen = self.manifest.get("specimen")
        return specimen == "standin" or (isinstance(specimen, dict) and specimen.get("synthetic") is True)

    def specimen_spec(self) -> dict:
        """The specimen spec as data: the manifest's, else the specimen record's fields."""
        specimen = self.manifest.get("specimen")
        if isinstance(specimen, dict):
            return specimen
        record = self.first("specimen")
        if record is not None:
            return {k: v for k, v in record.items() if k not in BASE_FIELDS}
        return {"name": specimen} if isinstance(specimen, str) else {}

    def command(self) -> tuple[Optional[str], str]:
        """(the command as typed, where it came from): manifest `command`, else argv joined; (None, why)."""
        typed = self.manifest.get("command")
        if isinstance(typed, str) and typed:
            return typed, "as typed"
        argv = self.manifest.get("command_line")
        if isinstance(argv, list) and argv:
            return " ".join(shlex.quote(str(a)) for a in argv), "sys.argv (the typed command was not recorded)"
        return None, "not recorded"

    # --- tensors --------------------------------------------------------------------------

    def tensor(self, reference: Any):
        """The numpy array a {file, key} reference names, or None (missing, unreadable or outside tensors/)."""
        if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
            return None
        name = reference["file"]
        if name not in self._tensor_files:
            self._tensor_files[name] = self._load_tensor_file(name)
        tensors = self._tensor_files[name]
        return None if tensors is None else tensors.get(reference.get("key"))

    def _load_tensor_file(self, name: str):
        path = (self.dir / name).resolve()
        if path.parent != (self.dir / TENSOR_DIR).resolve() or not path.is_file():
            return None
        try:
            from safetensors.numpy import load_file

            return load_file(str(path))
        except Exception as error:  # a damaged tensor file is shown as missing, with the reason kept
            self.read_problems.append(f"{name}: not readable ({type(error).__name__}: {error})")
            return None
