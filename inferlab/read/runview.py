"""The one reader of a run's record directory: records, manifest, plan and saved tensors, with every problem met.

RunView.read(DIR) reads the run's files once (a tensor file when a tensor of it is first asked for, and only from
the run's own tensors/ folder); RunView.from_data builds a view of data in memory. Nothing here raises over a
damaged or partial folder: what could not be read is a Problem. verify, the report, compare and grade are
functions over a RunView, which answers how the session ended, which tests write a record kind (the plan says) and
why a record is missing. No reader touches the model or imports torch: tensors are numpy arrays.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from inferlab import protocol
from inferlab.read.parse import (CLAIM_FILE, MANIFEST_FILE, PLAN_FILE, RECORDS_FILE, REQUIRED_ENVELOPE_FIELDS,
                                 Problem, parse_records, read_inside, read_json, read_ledger)
from inferlab.files import tensor_sha256
from inferlab.run.plan import file_of
from inferlab.run.records import RENAME_NOTE, STAMP_FIELD, TENSOR_DIR, claimant_state

ENVELOPE_FIELDS = REQUIRED_ENVELOPE_FIELDS + (STAMP_FIELD,)  # the records of a live session also have the stamp
NOT_PASSING = ("failed", "error", "skipped")
FAILING = ("failed", "error")  # a record whose status says so needs a failing outcome of its test
INTEGRITY, DIAGNOSTIC = "integrity", "diagnostic"
# The report's renderer version recorded in the manifest; a run that records none was rendered by version 1.
RENDERER_VERSION_FIELD = "report_renderer_version"
FIRST_RENDERER_VERSION = 1


def short_test(nodeid: Optional[str]) -> str:
    """The test name with its parameters, without the file ('(session)' for a record of no test)."""
    return (nodeid or "(session)").split("::")[-1]


@dataclass
class Missing:
    """Why records of a kind are missing: evidence (a producer did not pass), ran (it passed), not_reached,
    planned_not_run, deselected (a partial run) or not_planned."""

    kind: str
    reason: str
    producers: list[str]
    evidence: Optional[dict] = None


class TensorFileError(Exception):
    """A tensor file that cannot be used: code is missing, outside (not in tensors/) or unreadable."""

    def __init__(self, file: str, code: str, reason: str):
        super().__init__(f"{file}: {reason}")
        self.file, self.code, self.reason = file, code, reason


def tensor_references(value: Any, path: str = "") -> Iterable[tuple[str, dict]]:
    """Every {file, key, sha256, ...} tensor reference nested anywhere in a record, with its field path. A number
    or a string holds none, so only dicts and lists are walked into (most of a record's values are ids)."""
    if isinstance(value, dict):
        if isinstance(value.get("file"), str) and isinstance(value.get("key"), str) and "sha256" in value:
            yield path or "(record)", value
        for name, inner in value.items():
            if isinstance(inner, (dict, list)):
                yield from tensor_references(inner, f"{path}.{name}" if path else name)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            if isinstance(inner, (dict, list)):
                yield from tensor_references(inner, f"{path}[{index}]")


class SavedTensors:
    """A run's saved tensors: each file of its tensors/ folder read once, when first asked for (or arrays given in
    memory, {file: {key: array}}); nothing outside tensors/ is opened."""

    def __init__(self, directory: Optional[Path], given: Optional[dict] = None):
        self.directory, self.given, self.loaded = directory, given, {}

    def files(self) -> list[str]:
        """Every safetensors file of the folder (or given), as 'tensors/NAME'."""
        if self.given is not None or self.directory is None:
            return sorted(self.given or {})
        return sorted(f"{TENSOR_DIR}/{p.name}" for p in (self.directory / TENSOR_DIR).glob("*.safetensors"))

    def load(self, file: str) -> dict:
        """{key: numpy array} of one file; TensorFileError when it is missing, outside tensors/ or unreadable."""
        if file not in self.loaded:
            try:
                self.loaded[file] = self._read(file)
            except TensorFileError as error:
                self.loaded[file] = error
        if isinstance(self.loaded[file], TensorFileError):
            raise self.loaded[file]
        return self.loaded[file]

    def _read(self, file: str) -> dict:
        if self.given is not None or self.directory is None:
            if (self.given or {}).get(file) is None:
                raise TensorFileError(file, "missing", "missing")
            return self.given[file]
        path = self.directory / file
        if path.resolve().parent != (self.directory / TENSOR_DIR).resolve():
            raise TensorFileError(file, "outside", f"not in {TENSOR_DIR}/, where a run keeps its tensors")
        if not path.is_file():
            raise TensorFileError(file, "missing", "missing")
        from safetensors.numpy import load_file  # a Python without it raises ImportError: no damage to report

        try:
            return load_file(str(path))
        except Exception as error:  # any damaged file is a TensorFileError naming it, never a crash
            raise TensorFileError(file, "unreadable", f"not a readable safetensors file ({type(error).__name__}: "
                                                      f"{error})") from None

    def get(self, reference: Any):
        """The array a {file, key} reference names, or None; its hash is not compared (check does): a page shows
        what the file holds."""
        if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
            return None
        try:
            return self.load(reference["file"]).get(reference.get("key"))
        except TensorFileError:
            return None

    def check(self, reference: dict) -> Optional[str]:
        """What is wrong with a tensor against its reference (its key, shape and SHA-256), None when nothing;
        TensorFileError when its file cannot be used."""
        tensors, file, key = self.load(reference["file"]), reference["file"], reference.get("key")
        if key not in tensors:
            return f"key {key!r} not in {file}"
        if "shape" in reference and list(tensors[key].shape) != list(reference["shape"]):
            return f"{file}[{key}] has shape {list(tensors[key].shape)}, record says {reference['shape']}"
        digest = tensor_sha256(tensors[key])
        if digest != reference.get("sha256"):
            return f"{file}[{key}] sha256 {digest}, record says {reference.get('sha256')}"
        return None

    def verified(self, reference: Any):
        """The array a reference names only if it matches the record's shape and SHA-256; else None (also for what
        is no reference at all)."""
        try:
            return None if self.check(reference) else self.load(reference["file"])[reference["key"]]
        except (TensorFileError, TypeError, KeyError):
            return None


class RunView:
    """One run as read: its records, manifest and plan, its tensors, and the facts
    every reader asks (ending, plan folder, producers of a kind, why a record is missing)."""

    def __init__(self, records: list[dict], manifest: Optional[dict], plan: Optional[dict], *,
                 directory: Optional[Path] = None, problems: Iterable[Problem] = (), tensors: Optional[dict] = None,
                 addenda: Iterable[dict] = (), addenda_problems: Iterable[Problem] = ()):
        self.directory = Path(directory) if directory is not None else None
        # the ledger of what was kept beside the run afterwards (inferlab.read.addenda), apart from the session's files
        self.addenda: list[dict] = list(addenda)
        self.addenda_problems: list[Problem] = list(addenda_problems)
        self.records: list[dict] = list(records)
        self.manifest_found = isinstance(manifest, dict)
        self.manifest: dict = manifest if self.manifest_found else {}
        self.plan: Optional[dict] = plan if isinstance(plan, dict) else None
        self.problems: list[Problem] = list(problems)
        self.by_kind: dict[str, list[dict]] = collections.defaultdict(list)
        for record in self.records:
            self.by_kind[str(record.get("kind"))].append(record)
        self.outcomes = self.kind("test_outcome")
        ends = self.kind("session_end")
        self.session_end: Optional[dict] = ends[-1] if ends else None
        schedule = (self.plan or {}).get("schedule")
        self.planned: list[dict] = [e for e in schedule if isinstance(e, dict)] if isinstance(schedule, list) else []
        self.schedule: list = [e.get("test") for e in self.planned]
        self._outcomes_of: dict = collections.defaultdict(list)  # node id -> its outcome records, in order
        for outcome in self.outcomes:
            self._outcomes_of[outcome.get("test")].append(outcome)
        self._decisive = {nodeid: self.decisive_outcome(nodeid) for nodeid in self._outcomes_of}
        self._entry = {e.get("test"): e for e in self.planned}
        parts = (self.plan or {}).get("parts")
        self._parts = {p.get("file"): p for p in parts if isinstance(p, dict)} if isinstance(parts, list) else {}
        self.claim: Optional[dict] = None  # claim.json, when read from a folder
        self.rename_note: Optional[dict] = None  # inferlab.run.records' rename note, when a run renamed the folder
        self.tensors = SavedTensors(self.directory, tensors)  # what its tensors/ folder holds, read when asked

    @classmethod
    def read(cls, directory: Path) -> "RunView":
        """Read a record directory once; every problem met is in .problems, nothing is raised."""
        directory = Path(directory)
        try:
            records, problems = parse_records(read_inside(directory, RECORDS_FILE))
        except OSError as error:
            records, problems = [], [Problem(RECORDS_FILE, f"not readable ({error})")]
        (manifest, manifest_problem), (plan, plan_problem) = (read_json(directory, name)
                                                               for name in (MANIFEST_FILE, PLAN_FILE))
        problems += [problem for problem in (manifest_problem, plan_problem) if problem]
        entries, ledger_problems = read_ledger(directory)
        view = cls(records, manifest, plan, directory=directory, problems=problems, addenda=entries,
                   addenda_problems=ledger_problems)
        view.claim, view.rename_note = read_json(directory, CLAIM_FILE)[0], read_json(directory, RENAME_NOTE)[0]
        return view

    @classmethod
    def from_data(cls, records: list[dict], manifest: Optional[dict] = None, plan: Optional[dict] = None,
                  tensors: Optional[dict] = None, addenda: Iterable[dict] = ()) -> "RunView":
        """A view of data in memory: tensors maps a file ('tensors/x.safetensors') to {key: numpy array};
        addenda are ledger entries. A manifest or plan given as None counts as a missing file."""
        problems = [Problem(name, "missing", code="missing") for name, data in ((MANIFEST_FILE, manifest),
                                                                               (PLAN_FILE, plan)) if data is None]
        return cls(records, manifest, plan, problems=problems, tensors=dict(tensors or {}), addenda=addenda)

    @property
    def read_problems(self) -> list[str]:
        """What could not be read at all (a line, a file), one line each, as the report states it."""
        return [f"{p.file}:{p.line}: not a JSON object" if p.code == "not_object" and p.line else str(p)
                for p in self.problems if p.lost]

    def kind(self, name: str) -> list[dict]:
        return self.by_kind.get(name, [])

    def first(self, name: str) -> Optional[dict]:
        return next(iter(self.kind(name)), None)

    def check_kind(self, outcome: dict) -> str:
        """'diagnostic' or 'integrity': the outcome's own field, else the plan's entry, else integrity."""
        kind = outcome.get("check_kind") or (self._entry.get(outcome.get("test")) or {}).get("check_kind")
        return DIAGNOSTIC if kind == DIAGNOSTIC else INTEGRITY

    def decisive_outcome(self, nodeid: Optional[str]) -> Optional[dict]:
        """The outcome of one node id that decides it: a non-passing one (setup or teardown) wins."""
        matches = self._outcomes_of.get(nodeid, [])
        failing = [r for r in matches if r.get("outcome") != "passed"]
        return (failing or matches or [None])[0]

    def outcome_of_param(self, test_id: str) -> Optional[dict]:
        """The decisive outcome of the test whose parametrize id is `test_id`."""
        nodeids = dict.fromkeys(r.get("test") for r in self.outcomes if str(r.get("test")).endswith(f"[{test_id}]"))
        outcomes = [self.decisive_outcome(n) for n in nodeids]
        failing = [r for r in outcomes if r and r.get("outcome") != "passed"]
        return (failing or outcomes or [None])[0]

    def tests_by_outcome(self) -> dict[str, dict]:
        """Each node id with an outcome -> its decisive outcome record, in first-seen order (do not change it)."""
        return self._decisive

    def planned_without_outcome(self) -> list[str]:
        return [t for t in self.schedule if t not in self._outcomes_of]

    def non_passing(self, nodeids: Iterable) -> Optional[dict]:
        """The first failed, errored or skipped outcome (in record order) of any of the node ids."""
        wanted = set(nodeids)
        return next((r for r in self.outcomes if r.get("outcome") in NOT_PASSING and r.get("test") in wanted), None)

    @property
    def is_plan_folder(self) -> bool:
        """Whether the folder holds a plan (--plan), not a run: its manifest, session_end or plan record says so."""
        return (self.manifest.get("mode") == "plan" or any(r.get("plan_only") for r in self.kind("session_end"))
                or any(r.get("mode") == "plan" for r in self.kind("plan")))

    @property
    def ending(self) -> str:
        """How the session ended: plan, killed (no session_end record), collect_only, interrupted, stopped_early
        or finished (it reached its end; whether every test passed is another question)."""
        end = self.session_end
        if self.is_plan_folder:
            return "plan"
        if end is None:
            return "killed"
        if end.get("collect_only"):
            return "collect_only"
        if end.get("interrupted"):
            return "interrupted"
        if end.get("stopped_early"):
            return "stopped_early"
        return "finished"

    @property
    def unfinished(self) -> Optional[str]:
        """Why the run did not reach its end, in words; None when it did (or is a plan)."""
        ending = self.ending
        if ending == "killed":
            return "no session_end record: the session never reached its end (it was killed or crashed)"
        if ending == "collect_only":
            return "collect only (--co): no test ran"
        if ending in ("interrupted", "stopped_early"):
            return str(self.session_end.get("stop_reason") or "stopped before its end")
        if ending != "plan" and self.manifest.get("session_end", False) is None:  # the start manifest: a full disk
            return "it wrote its session_end record but not its final manifest, so the folder does not hold its end"
        return None

    @property
    def unreached(self) -> set:
        """Planned tests that never got an outcome because the session stopped first."""
        return set(self.planned_without_outcome()) if self.unfinished else set()

    @property
    def claimant_live(self) -> bool:
        """Whether the session that claimed this folder still runs on this machine (records.claimant_state)."""
        return claimant_state(self.claim) == "live"

    @property
    def final_manifest_written(self) -> bool:
        """Whether manifest.json is the one a session writes last (its file inventory, or its session_end), not
        the one it wrote at its start."""
        return "files" in self.manifest or self.manifest.get("session_end") is not None

    def plan_partial_reasons(self) -> list[str]:
        """Why plan.json is not the complete protocol; a plan older than partial_reasons falls short by its totals."""
        plan = self.plan or {}
        reasons = plan.get("partial_reasons", protocol.shortfalls(plan.get("totals") or {}))
        return [str(reason) for reason in reasons or []]

    def producers(self, *kinds: str) -> list[str]:
        """The planned tests that write a record of any of the kinds, in plan order (the plan's `records`)."""
        return [e.get("test") for e in self.planned if set(kinds) & set(e.get("records") or [])]

    def why_missing(self, *kinds: str) -> Missing:
        """Why no (or not enough) records of the kinds exist, from their producers' outcomes and the ending."""
        return self.missing_from(kinds[0], self.producers(*kinds))

    def missing_from(self, kind: str, producers: list[str]) -> Missing:
        """Why the planned tests `producers` left no record of `kind`."""
        evidence = self.non_passing(producers)
        if evidence is not None:
            return Missing(kind, "evidence", producers, evidence)
        if any(p in self._outcomes_of for p in producers):
            return Missing(kind, "ran", producers)
        if producers:
            unreached = self.unreached
            reason = "not_reached" if unreached and all(p in unreached for p in producers) else "planned_not_run"
            return Missing(kind, reason, producers)
        return Missing(kind, "deselected" if self.plan_partial_reasons() else "not_planned", producers)

    def part_label(self, nodeid: Optional[str]) -> str:
        """The protocol part a test belongs to: its file's part in the plan, titled by the experiment module's
        docstring up to its colon ('Part 4'), else the file's name."""
        if not nodeid:
            return "(session)"
        file = file_of(nodeid)
        title = (self._parts.get(file) or {}).get("title")
        return title.split(":")[0].strip() if isinstance(title, str) and title.strip() else file.split("/")[-1]

    @property
    def renderer_version(self) -> int:
        """The report renderer version that wrote this run's pages (1 when the manifest names none)."""
        version = self.manifest.get(RENDERER_VERSION_FIELD)
        return version if isinstance(version, int) and not isinstance(version, bool) else FIRST_RENDERER_VERSION

    @property
    def synthetic(self) -> bool:
        """Whether the specimen is synthetic, as its spec or any record says."""
        return self.specimen_spec().get("synthetic") is True or any(r.get("synthetic") is True for r in self.records)

    def specimen_spec(self) -> dict:
        """The specimen spec as data: the manifest's, else the specimen record's fields."""
        specimen = self.manifest.get("specimen")
        if isinstance(specimen, dict):
            return specimen
        return {k: v for k, v in (self.first("specimen") or {}).items() if k not in ENVELOPE_FIELDS}

    def command(self) -> tuple[Optional[str], str]:
        """(the command as typed, as the manifest records it), or (None, "not recorded")."""
        typed = self.manifest.get("command")
        return (typed, "as typed") if isinstance(typed, str) and typed else (None, "not recorded")
