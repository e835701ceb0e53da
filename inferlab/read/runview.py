"""The one reader of a run's record directory: records, manifest, plan and tensors, with every problem met.

RunView.read(DIR) reads records.jsonl, manifest.json and plan.json once; a tensor file is read when a tensor of it
is first asked for (only from the run's own tensors/ folder), and a tensor is
checked against the SHA-256 its record holds. Nothing here raises over a damaged or partial directory:
what could not be read, or was not written as the writers write it, is a Problem (file, line, what).
RunView.from_data(records, manifest, plan, tensors) builds one from data in memory, without a disk.

verify, the report, compare (and every later reader of a finished run) are functions over a RunView. It
answers how the session ended, whether the folder is a plan, which tests produce a record kind (the
plan says) and why a record is missing. Readers never touch the
model and never import torch: tensors are numpy arrays.
"""

from __future__ import annotations

import collections
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from inferlab.read.tensors import TensorCheck, TensorFileError, tensor_references, tensor_sha256  # noqa: F401
from inferlab.run.records import CLAIM_FILE, MANIFEST_FILE, PLAN_FILE, RECORDS_FILE, STAMP_FIELD, TENSOR_DIR

LEDGER_FILE = "addenda.jsonl"  # what is kept beside the run afterwards (inferlab.read.addenda writes it)
ENTRY_FIELDS = ("schema", "seq", "kind", "file", "original_name", "size", "sha256", "attached_utc",
                "manifest_sha256", "structure", "tool")
REQUIRED_ENVELOPE_FIELDS = ("kind", "test", "seq", "wall_time")  # every record has them
ENVELOPE_FIELDS = REQUIRED_ENVELOPE_FIELDS + (STAMP_FIELD,)  # the records of a live session also have the stamp
NOT_PASSING = ("failed", "error", "skipped")
FAILING = ("failed", "error")  # a record whose status says so needs a failing outcome of its test
INTEGRITY, DIAGNOSTIC = "integrity", "diagnostic"
# The report's renderer version recorded in the manifest; a run that records none was rendered by version 1.
RENDERER_VERSION_FIELD = "report_renderer_version"
FIRST_RENDERER_VERSION = 1


def unparametrized(nodeid) -> str:
    """A node id without its parametrize id: every parametrization of one test function."""
    text = str(nodeid or "")
    return text[:text.index("[")] if text.endswith("]") and "[" in text else text


PART_LABELS = (("test_10", "Part 2: specimen, files and loading"), ("test_20", "Part 3: inputs"),
               ("test_30", "Part 3: the generation trials and their checks"),
               ("test_40", "Part 4: the matched-prefix cache test"), ("test_50", "Part 5: timing"),
               ("test_60", "Part 6: memory"), ("test_70", "optional batching extension"))


def part_label(file: str, part: Optional[dict] = None) -> str:
    """The label of one experiment file's part: the plan part's own label, the lab's part for the file's number,
    else its title, else the file's name."""
    if isinstance(part, dict) and isinstance(part.get("label"), str) and part["label"]:
        return part["label"]
    name = file.rsplit("/", 1)[-1]
    known = next((label for prefix, label in PART_LABELS if name.startswith(prefix)), None)
    if known is None and isinstance(part, dict) and isinstance(part.get("title"), str) and part["title"]:
        return part["title"]
    return known or name


def bracket_id(nodeid: Optional[str]) -> Optional[str]:
    """The parametrize id of a node id, 'P1-S2-seed23' from 'x.py::test_g[P1-S2-seed23]'; None without one."""
    if not nodeid or not nodeid.endswith("]") or "[" not in nodeid:
        return None
    return nodeid[nodeid.index("[") + 1:-1]


def short_test(nodeid: Optional[str]) -> str:
    """The test name with its parameters, without the file ('(session)' for a record of no test)."""
    return (nodeid or "(session)").split("::")[-1]


def function_name(nodeid: Optional[str]) -> str:
    """The test function's name in a node id, without file or parameters."""
    return short_test(nodeid).split("[")[0]


def file_of(nodeid: Optional[str]) -> str:
    """The file part of a node id ('experiments/x.py' of 'experiments/x.py::test_y[z]')."""
    return str(nodeid or "").split("::")[0]


@dataclass(frozen=True)
class Problem:
    """One thing met while reading: the file, the line (records.jsonl), what; lost=False when the content was
    still read (not ASCII, an envelope field missing) and only its form is wrong."""

    file: str
    what: str
    line: Optional[int] = None
    code: str = "unreadable"  # missing, unreadable, not_json, not_object, not_ascii, missing_fields
    lost: bool = True

    def __str__(self) -> str:
        return f"{self.file}{'' if self.line is None else f':{self.line}'}: {self.what}"


@dataclass
class Missing:
    """Why records of a kind are missing: evidence (a producer did not pass), ran (it passed), not_reached,
    planned_not_run, deselected (a partial run) or not_planned."""

    kind: str
    reason: str
    producers: list[str]
    evidence: Optional[dict] = None


def parse_records(raw: bytes) -> tuple[list[dict], list[Problem]]:
    """The records of records.jsonl's bytes, in write order, and one Problem per line that is not a record."""
    problems = []
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as error:
        problems.append(Problem(RECORDS_FILE, f"not ASCII as written ({error})", code="not_ascii", lost=False))
        text = raw.decode("ascii", errors="replace")
    pieces = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # lines as a text file reads them
    lines = [piece + "\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError as error:
            problems.append(Problem(RECORDS_FILE, f"not a JSON object ({error})", line=number, code="not_json"))
            continue
        if not isinstance(record, dict):
            problems.append(Problem(RECORDS_FILE, f"a {type(record).__name__}, expected a JSON object", line=number,
                                    code="not_object"))
            continue
        absent = [name for name in REQUIRED_ENVELOPE_FIELDS if name not in record]
        if absent:
            problems.append(Problem(RECORDS_FILE, f"missing field(s) {', '.join(absent)}", line=number,
                                    code="missing_fields", lost=False))
        records.append(record)
    return records, problems


def _read_json(directory: Path, name: str) -> tuple[Optional[dict], Optional[Problem]]:
    path = directory / name
    if not path.exists():
        return None, Problem(name, "missing", code="missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return None, Problem(name, f"not readable JSON ({error})")
    if not isinstance(data, dict):
        return None, Problem(name, f"a {type(data).__name__}, expected a JSON object", code="not_object")
    return data, None


def parse_ledger(raw: bytes) -> tuple[list[dict], list[tuple[int, str]]]:
    """The ledger's entries, and (line number, what is wrong) for every line that is not one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return [], [(0, f"not UTF-8 ({error})")]
    entries, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            entry = json.loads(line)
        except ValueError as error:
            problems.append((number, f"not a JSON object ({error})"))
            continue
        if not isinstance(entry, dict):
            problems.append((number, f"a {type(entry).__name__}, expected a JSON object"))
            continue
        absent = [name for name in ENTRY_FIELDS if name not in entry]
        if absent:
            problems.append((number, f"missing field(s) {', '.join(absent)}"))
        entries.append(entry)
    if text and not text.endswith("\n"):
        problems.append((len(text.splitlines()), "the last line is not complete (no newline): a torn write"))
    return entries, problems


def _read_ledger(directory: Path) -> tuple[list[dict], list[Problem]]:
    """The addenda ledger's entries and problems; a run with nothing attached has no ledger, which is no problem."""
    path = directory / LEDGER_FILE
    if not path.exists():
        return [], []
    try:
        raw = path.read_bytes()
    except OSError as error:
        return [], [Problem(LEDGER_FILE, f"not readable ({error})")]
    entries, problems = parse_ledger(raw)
    return entries, [Problem(LEDGER_FILE, what, line=line or None, code="ledger") for line, what in problems]


def not_a_run_reason(path: Path) -> Optional[str]:
    """Why `path` is not a run's record dir (None when it is one), from its first record and manifest alone.

    A run claims its folder (CLAIM_FILE) and opens RECORDS_FILE and MANIFEST_FILE before any test, so
    a folder with none of them, or with files of those names that are not a run's, was never a run.
    """
    path = Path(path)
    if (path / CLAIM_FILE).is_file():
        return None
    try:
        with open(path / RECORDS_FILE, encoding="ascii", errors="replace") as handle:
            first = handle.readline()
        record = json.loads(first) if first.strip() else None
        if isinstance(record, dict) and {"kind", "seq"} <= set(record):
            return None
    except (OSError, ValueError):
        pass
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
        if isinstance(manifest, dict) and manifest.get("mode") in ("run", "plan") and "protocol" in manifest:
            return None
    except (OSError, ValueError):
        pass
    present = [name for name in (RECORDS_FILE, MANIFEST_FILE) if (path / name).exists()]
    if not present:
        return f"{path} is not a run's record dir: it has no {RECORDS_FILE}, {MANIFEST_FILE} or {CLAIM_FILE}"
    return (f"{path} is not a run's record dir: its {' and '.join(present)} "
            f"{'is' if len(present) == 1 else 'are'} not a run's (no record with kind and seq, no run manifest)")



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
        self.with_outcome: set = set(self._outcomes_of)
        self._decisive: Optional[dict] = None
        self._entry = {e.get("test"): e for e in self.planned}
        parts = (self.plan or {}).get("parts")
        self._parts = {p.get("file"): p for p in parts if isinstance(p, dict)} if isinstance(parts, list) else {}
        self.claim: Optional[dict] = None  # claim.json, when read from a folder
        self.rename_note: Optional[dict] = None  # inferlab.run.records' rename note, when a run renamed the folder
        self._given_tensors = tensors
        self._tensor_files: dict[str, tuple[Optional[dict], Optional[TensorFileError]]] = {}
        self._tensor_problems: dict[str, str] = {}
        self._first_reference: dict[str, int] = {}
        for record in self.records:
            for _, reference in tensor_references(record):
                self._first_reference.setdefault(reference["file"], len(self._first_reference))

    @classmethod
    def read(cls, directory: Path) -> "RunView":
        """Read a record directory once; every problem met is in .problems, nothing is raised."""
        directory = Path(directory)
        problems = []
        try:
            records, line_problems = parse_records((directory / RECORDS_FILE).read_bytes())
            problems += line_problems
        except OSError as error:
            records = []
            problems.append(Problem(RECORDS_FILE, f"not readable ({error})"))
        manifest, problem = _read_json(directory, MANIFEST_FILE)
        problems += [problem] if problem else []
        plan, problem = _read_json(directory, PLAN_FILE)
        problems += [problem] if problem else []
        entries, ledger_problems = _read_ledger(directory)
        view = cls(records, manifest, plan, directory=directory, problems=problems, addenda=entries,
                   addenda_problems=ledger_problems)
        from inferlab.run.records import RENAME_NOTE  # who claimed it, and a later run's note: how it ended

        view.claim, view.rename_note = _read_json(directory, CLAIM_FILE)[0], _read_json(directory, RENAME_NOTE)[0]
        return view

    @classmethod
    def from_data(cls, records: list[dict], manifest: Optional[dict] = None, plan: Optional[dict] = None,
                  tensors: Optional[dict] = None, addenda: Iterable[dict] = ()) -> "RunView":
        """A view of data in memory: tensors maps a file ('tensors/x.safetensors') to {key: numpy array};
        addenda are ledger entries. A manifest or plan given as None counts as a missing file."""
        problems = [Problem(name, "missing", code="missing") for name, data in ((MANIFEST_FILE, manifest),
                                                                               (PLAN_FILE, plan)) if data is None]
        return cls(records, manifest, plan, problems=problems, tensors=dict(tensors or {}), addenda=addenda)

    def problems_of(self, file: str) -> list[Problem]:
        return [p for p in self.problems if p.file == file]

    @property
    def read_problems(self) -> list[str]:
        """What could not be read at all (a line, a file), one line each, as the report states it."""
        return [f"{p.file}:{p.line}: not a JSON object" if p.code == "not_object" and p.line else str(p)
                for p in self.problems if p.lost]

    def tensor_read_problems(self) -> list[str]:
        """The tensor files asked for so far that could not be read, in the order the records refer to them."""
        order = self._first_reference
        return [self._tensor_problems[f] for f in sorted(self._tensor_problems, key=lambda f: order.get(f, len(order)))]

    def kind(self, name: str) -> list[dict]:
        return self.by_kind.get(name, [])

    def first(self, name: str) -> Optional[dict]:
        records = self.kind(name)
        return records[0] if records else None

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
        nodeids = list(dict.fromkeys(r.get("test") for r in self.outcomes if bracket_id(r.get("test")) == test_id))
        outcomes = [self.decisive_outcome(n) for n in nodeids]
        failing = [r for r in outcomes if r and r.get("outcome") != "passed"]
        return (failing or outcomes or [None])[0]

    def tests_by_outcome(self) -> dict[str, dict]:
        """Each node id with an outcome -> its decisive outcome record, in first-seen order (do not change it)."""
        if self._decisive is None:
            self._decisive = {nodeid: self.decisive_outcome(nodeid) for nodeid in self._outcomes_of}
        return self._decisive

    def planned_without_outcome(self) -> list[str]:
        return [t for t in self.schedule if t not in self.with_outcome]

    def non_passing(self, nodeids: Iterable) -> Optional[dict]:
        """The first failed, errored or skipped outcome (in record order) of any of the node ids."""
        wanted = set(nodeids)
        return next((r for r in self.outcomes if r.get("outcome") in NOT_PASSING and r.get("test") in wanted), None)

    def non_passing_param(self, test_id: str) -> Optional[dict]:
        """The first non-passing outcome of a test whose parametrize id is `test_id`."""
        return next((r for r in self.outcomes if r.get("outcome") in NOT_PASSING
                     and bracket_id(r.get("test")) == test_id), None)

    @property
    def is_plan_folder(self) -> bool:
        """Whether the folder holds a plan (--plan), not a run: its manifest, session_end or plan record says so."""
        options = self.manifest.get("options") if isinstance(self.manifest.get("options"), dict) else {}
        return (self.manifest.get("mode") == "plan" or options.get("plan") is True
                or any(r.get("plan_only") for r in self.kind("session_end"))
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
        return None

    @property
    def unreached(self) -> set:
        """Planned tests that never got an outcome because the session stopped first."""
        return set(self.planned_without_outcome()) if self.unfinished else set()

    @property
    def final_manifest_written(self) -> bool:
        """Whether manifest.json is the one a session writes last (its file inventory, or its session_end), not
        the one it wrote at its start."""
        return "files" in self.manifest or self.manifest.get("session_end") is not None

    def plan_partial_reasons(self) -> list[str]:
        """Why plan.json is not the complete protocol; a plan older than partial_reasons falls short by its totals."""
        from inferlab import protocol

        plan = self.plan or {}
        if "partial_reasons" in plan:
            reasons = plan["partial_reasons"]
        else:
            reasons = protocol.shortfalls(plan.get("totals") or {})
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
        if any(p in self.with_outcome for p in producers):
            return Missing(kind, "ran", producers)
        if producers:
            unreached = self.unreached
            reason = "not_reached" if unreached and all(p in unreached for p in producers) else "planned_not_run"
            return Missing(kind, reason, producers)
        return Missing(kind, "deselected" if self.plan_partial_reasons() else "not_planned", producers)

    def part_label(self, nodeid: Optional[str]) -> str:
        """The protocol part a test belongs to, as the plan's part for its file is labelled."""
        if not nodeid:
            return "(session)"
        file = file_of(nodeid)
        return part_label(file, self._parts.get(file))

    @property
    def renderer_version(self) -> int:
        """The report renderer version that wrote this run's pages (1 when the manifest names none)."""
        version = self.manifest.get(RENDERER_VERSION_FIELD)
        return version if isinstance(version, int) and not isinstance(version, bool) else FIRST_RENDERER_VERSION

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
            return {k: v for k, v in record.items() if k not in ENVELOPE_FIELDS}
        return {"name": specimen} if isinstance(specimen, str) else {}

    def command(self) -> tuple[Optional[str], str]:
        """(the command as typed, where it came from): manifest `command`, else argv joined; (None, why)."""
        typed = self.manifest.get("command")
        if isinstance(typed, str) and typed:
            return typed, "as typed"
        argv = self.manifest.get("argv")
        if isinstance(argv, list) and argv:
            return " ".join(shlex.quote(str(a)) for a in argv), "sys.argv (the typed command was not recorded)"
        return None, "not recorded"

    def tensor_files(self) -> list[str]:
        """Every safetensors file in the run's tensors/ folder (or given to from_data), as 'tensors/NAME'."""
        if self._given_tensors is not None:
            return sorted(self._given_tensors)
        folder = self.directory / TENSOR_DIR if self.directory is not None else None
        if folder is None or not folder.is_dir():
            return []
        return sorted(p.relative_to(self.directory).as_posix() for p in folder.glob("*.safetensors"))

    def tensor_file(self, file: str) -> dict:
        """{key: numpy array} of one tensor file, read once; TensorFileError when missing, outside tensors/ or
        unreadable."""
        if file not in self._tensor_files:
            self._tensor_files[file] = self._load_tensor_file(file)
        tensors, error = self._tensor_files[file]
        if error is not None:
            raise error
        return tensors

    def _load_tensor_file(self, file: str) -> tuple[Optional[dict], Optional[TensorFileError]]:
        if self._given_tensors is not None:
            if file in self._given_tensors:
                return self._given_tensors[file], None
            return None, TensorFileError(file, "missing", "missing")
        if self.directory is None:
            return None, TensorFileError(file, "missing", "missing")
        path = self.directory / file
        if path.resolve().parent != (self.directory / TENSOR_DIR).resolve():
            return None, TensorFileError(file, "outside", f"not in {TENSOR_DIR}/")
        if not path.is_file():
            return None, TensorFileError(file, "missing", "missing")
        # A Python without safetensors or numpy cannot judge any tensor file: that is not damage, so it is raised
        # (ImportError) rather than reported as an unreadable file.
        from safetensors.numpy import load_file

        try:
            return load_file(str(path)), None
        except Exception as error:  # any damaged file is a TensorFileError naming it, never a crash
            return None, TensorFileError(file, "unreadable", f"{type(error).__name__}: {error}")

    def tensor(self, reference: Any):
        """The numpy array a {file, key} reference names, or None (missing, unreadable or outside tensors/).
        Its hash is not compared here (check_tensor does): the report shows what the file holds."""
        if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
            return None
        try:
            tensors = self.tensor_file(reference["file"])
        except TensorFileError as error:
            if error.code == "unreadable":
                self._tensor_problems.setdefault(error.file, f"{error.file}: not readable ({error.reason})")
            return None
        return tensors.get(reference.get("key"))

    def check_tensor(self, reference: dict) -> TensorCheck:
        """A tensor reference against the tensor: the file, the key, the shape and the SHA-256 the record holds."""
        try:
            tensors = self.tensor_file(reference["file"])
        except TensorFileError as error:
            return TensorCheck(file_error=error)
        if reference.get("key") not in tensors:
            return TensorCheck(key_missing=True)
        array = tensors[reference["key"]]
        check = TensorCheck(array=array)
        if "shape" in reference and list(array.shape) != list(reference["shape"]):
            check.shape = list(array.shape)
        digest = tensor_sha256(array)
        if digest != reference.get("sha256"):
            check.sha256 = digest
        return check

    def verified_tensor(self, reference: dict):
        """The tensor a reference names, only if it matches the record's shape and SHA-256; else None."""
        check = self.check_tensor(reference)
        return check.array if check.ok else None


def claim_without_end(folder: Path) -> Optional[dict]:
    """The claim of a run folder that has no session_end (neither a session_end record nor a final manifest), or
    None: not a run's folder, or it reached its end (how a new session finds an earlier run killed before its end)."""
    claim, _ = _read_json(Path(folder), CLAIM_FILE)
    manifest, _ = _read_json(Path(folder), MANIFEST_FILE)
    if not isinstance(claim, dict) or (manifest or {}).get("session_end") is not None or "files" in (manifest or {}):
        return None
    try:
        raw = (Path(folder) / RECORDS_FILE).read_bytes()
    except OSError:
        raw = b""
    records, _ = parse_records(raw)  # a torn or unreadable line is no session_end
    return None if any(record.get("kind") == "session_end" for record in records) else claim
