"""The pieces of a grade: a check with its status and evidence, and the helpers that state what a missing
record means (asked of the plan through RunView.why_missing, never guessed).

Evidence points at where a grader can look: a file, and for records.jsonl or addenda.jsonl the record kind
and seq; for manifest.json the field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional

from inferlab.base.records import MANIFEST_FILE, RECORDS_FILE
from inferlab.reading.runview import RunView, function_name

PASS, FAIL, MANUAL = "pass", "fail", "manual"
EVIDENCE_SHOWN = 8  # a check lists at most this many records; the count says how many there are


@dataclass(frozen=True)
class Evidence:
    """Where a check looked: a file, and the record's kind and seq, or the manifest's field."""

    file: str
    kind: Optional[str] = None
    seq: Optional[int] = None
    field: Optional[str] = None

    def text(self) -> str:
        """'records.jsonl seq 40 (generation)', 'manifest.json source_sha256'."""
        if self.seq is not None:
            return f"{self.file} seq {self.seq}" + (f" ({self.kind})" if self.kind else "")
        if self.field is not None:
            return f"{self.file} {self.field}"
        return self.file + (f" ({self.kind})" if self.kind else "")

    def as_dict(self) -> dict:
        """Only the fields that are set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Check:
    """One concrete check of an item: pass, fail or manual; what was found; what to do when it fails."""

    name: str
    status: str
    detail: str
    fix: Optional[str] = None
    evidence: list[Evidence] = field(default_factory=list)
    count: Optional[int] = None  # how many records the evidence stands for, when more than are listed

    def as_dict(self) -> dict:
        """The check as plain data."""
        data = {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix,
                "evidence": [e.as_dict() for e in self.evidence]}
        if self.count is not None:
            data["evidence_count"] = self.count
        return data


def record_evidence(records: Iterable[dict], file: str = RECORDS_FILE) -> tuple[list[Evidence], int]:
    """Evidence for records (at most EVIDENCE_SHOWN of them) and how many there are."""
    records = list(records)
    shown = [Evidence(file, r.get("kind"), r.get("seq") if isinstance(r.get("seq"), int) else None)
             for r in records[:EVIDENCE_SHOWN]]
    return shown, len(records)


def manifest_evidence(name: str) -> Evidence:
    """Evidence naming one manifest field."""
    return Evidence(MANIFEST_FILE, field=name)


def passed(name: str, detail: str, records: Iterable[dict] = (), extra: Iterable[Evidence] = ()) -> Check:
    """A passing check, with the records it rests on."""
    evidence, count = record_evidence(records)
    return Check(name, PASS, detail, evidence=list(extra) + evidence,
                 count=count if count > EVIDENCE_SHOWN else None)


def failed(name: str, detail: str, fix: str, records: Iterable[dict] = (), extra: Iterable[Evidence] = ()) -> Check:
    """A failing check, with what to fix and the records that show it."""
    evidence, count = record_evidence(records)
    return Check(name, FAIL, detail, fix, list(extra) + evidence, count if count > EVIDENCE_SHOWN else None)


RERUN = "run the complete protocol again (no -k, -m or single file) and submit that run"


def missing_check(view: RunView, name: str, what: str, kind: str) -> Check:
    """A failing check for records of `kind` that are missing, saying why as far as the run's files tell."""
    missing = view.why_missing(kind)
    producers = ", ".join(dict.fromkeys(function_name(p) for p in missing.producers)) or "no planned test"
    if missing.reason == "evidence":
        outcome = missing.evidence or {}
        return failed(name, f"{what}: not recorded, because {function_name(outcome.get('test'))} "
                            f"{outcome.get('outcome')}", "read that test's message (records.jsonl seq "
                      f"{outcome.get('seq')}), fix its cause and run again", records=[outcome])
    if missing.reason == "deselected":
        return failed(name, f"{what}: not recorded: this run left out the tests that write it ({producers}); it is "
                            "a partial run", RERUN)
    if missing.reason == "not_reached":
        return failed(name, f"{what}: not recorded: the run stopped before {producers} ({view.unfinished})",
                      "run the experiment again to its end")
    return failed(name, f"{what}: missing, and nothing in the run explains it (producers: {producers})",
                  RERUN + "; a record that is missing without evidence cannot be graded")


def kinds_present(view: RunView, name: str, what: str, kind: str, at_least: int = 1) -> Optional[Check]:
    """None when at least `at_least` records of `kind` exist; else the failing check saying why not."""
    found = view.kind(kind)
    if len(found) >= at_least:
        return None
    if found:
        return failed(name, f"{what}: {len(found)} of {at_least} {kind} records", RERUN, records=found)
    return missing_check(view, name, what, kind)
