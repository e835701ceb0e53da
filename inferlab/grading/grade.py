"""Grading one run (a record folder or a submission archive): the seven checklist items with their checks and
points, the run's integrity apart from them, the findings, and the exit status.

Integrity is what `verify` finds (inferlab.verify.verify_run, called, never restated), a submission.json
that disagrees with the run beside it, a summary flag of the manifest or the ledger that disagrees with what it
summarises (inferlab.grading.recompute), a harness that is not the grader's copy (inferlab.grading.harness;
under a rubric whose grader_source is "integrity", the default), and whatever the run contradicts in an
instructor's reference (inferlab.grading.reference). Every decision is made from the files and the grader's own
copy (every recorded id is decoded again with the grader's own tokenizer: inferlab.grading.decoded); what could
not be established is collected in `not_checked`, never passed over in silence. verify's one
line for a partial or unfinished run is not an integrity problem: it is why items fail (a partial run fails the
items it lacks). A failed protocol diagnostic is a finding shown with its evidence, never a failed item.

With a GraderCopy (inferlab.grading.replayed: grade --replay), the run's deterministic parts are also
re-executed on the grader's own copy of the specimen, and an output that contradicts its replay is an integrity
problem.

Exit status of one run: 0 every required item passes (manual items do not block), 1 an item fails, 2 the
source is not a run (or an archive was refused), 3 an integrity problem. Over several runs, the worst.
Grading reads files only (no model is loaded unless a replay is asked for) and nothing is written into a run
folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Union

from inferlab.base.commands import spelled
from inferlab.base.records import RECORDS_FILE
from inferlab.grading import items as checklist
from inferlab.grading.evidence import FAIL, MANUAL, PASS, Check, Evidence
from inferlab.grading.measures import key_measurements, prompt_lengths
from inferlab.grading.rubric import Rubric, RubricItem
from inferlab.reading.runview import RunView, not_a_run_reason, short_test
from inferlab.report.fmt import message_lines

GRADE_FORMAT = "inferlab-grade"
GRADE_SCHEMA = 1
EXIT_PASSED, EXIT_ITEM_FAILED, EXIT_NOT_A_RUN, EXIT_INTEGRITY = 0, 1, 2, 3


@dataclass
class ItemGrade:
    """One checklist item's verdict: its status, points and the checks behind it."""

    rubric: RubricItem
    status: str
    checks: list[Check]

    @property
    def number(self) -> int:
        return self.rubric.number

    @property
    def points(self) -> float:
        """The automatic points earned: all of them unless the item fails."""
        return self.rubric.points if self.status in (PASS, MANUAL) else 0.0

    @property
    def to_fix(self) -> list[str]:
        """What to do, one line per check that fails or asks for more."""
        return [f"{c.name}: {c.fix}" for c in self.checks if c.fix and c.status in (FAIL, MANUAL)]

    def message(self) -> str:
        """One line a learner can act on: the failing checks' findings and fixes."""
        failing = [c for c in self.checks if c.status == FAIL]
        return "; ".join(f"{c.detail}. To fix: {c.fix}" if c.fix else c.detail for c in failing)

    def as_dict(self) -> dict:
        """Plain data (the JSON format's item)."""
        return {"number": self.number, "title": self.rubric.title, "status": self.status,
                "required": self.rubric.required, "points": self.points, "max_points": self.rubric.points,
                "manual_points": self.rubric.manual_points, "checks": [c.as_dict() for c in self.checks],
                "to_fix": self.to_fix}


@dataclass
class RunGrade:
    """Everything grade says about one source: items, integrity, findings, measurements, score, exit status."""

    source: str
    label: str
    error: Optional[str] = None  # why the source is not a run, or was refused: exit 2
    items: list[ItemGrade] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)
    completeness: list[str] = field(default_factory=list)
    reference: Optional[dict] = None
    findings: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    measurements: dict = field(default_factory=dict)
    rubric: Optional[Rubric] = None
    not_checked: list[str] = field(default_factory=list)  # what the grade could not establish, one reason each

    @property
    def integrity_problems(self) -> list[str]:
        """verify's problems, then the reference's contradictions."""
        return list(self.integrity) + list((self.reference or {}).get("contradictions") or [])

    @property
    def exit_status(self) -> int:
        if self.error is not None:
            return EXIT_NOT_A_RUN
        if self.integrity_problems:
            return EXIT_INTEGRITY
        if any(i.status == FAIL and i.rubric.required for i in self.items):
            return EXIT_ITEM_FAILED
        return EXIT_PASSED

    @property
    def max_score(self) -> float:
        return self.rubric.max_score if self.rubric else 0.0

    @property
    def score(self) -> float:
        """The automatic points; 0 when the rubric says an integrity problem forfeits them."""
        if self.error is not None or (self.integrity_problems and self.rubric and
                                      self.rubric.zero_score_on_integrity_problem):
            return 0.0
        return sum(i.points for i in self.items)

    @property
    def verdict(self) -> str:
        """A word for the run: passed, failed, not_a_run or integrity."""
        return {EXIT_PASSED: "passed", EXIT_ITEM_FAILED: "failed", EXIT_NOT_A_RUN: "not_a_run",
                EXIT_INTEGRITY: "integrity"}[self.exit_status]

    def item(self, number: int) -> Optional[ItemGrade]:
        """One item by its number."""
        return next((i for i in self.items if i.number == number), None)


# --- what verify says, split --------------------------------------------------------------------------


def split_verify(result: dict) -> tuple[list[str], list[str]]:
    """(integrity problems, completeness lines) of verify's result: its completeness lines (the one line for an
    unfinished run and the one for a partial plan, as verify states them) say why items fail, every other line is
    an integrity problem."""
    completeness = list(result.get("completeness") or [])
    integrity = list(result.get("problems") or [])
    for line in completeness:
        integrity.remove(line)
    return integrity, completeness


def findings_of(view: RunView, kinds_of: dict) -> list[dict]:
    """What the run found or declared that a grader should see, none of it an item failure."""
    found = []
    for outcome in checklist.diagnostic_failures(view):
        message = " ".join(message_lines(outcome.get("longrepr")))[:400]
        found.append({"kind": "diagnostic_failed",
                      "what": f"protocol diagnostic {short_test(outcome.get('test'))} failed" +
                              (f": {message}" if message else ""),
                      "meaning": "a finding about the computation, kept with its evidence; explain it in the "
                                 "write-up. It costs no points.",
                      "evidence": [Evidence(RECORDS_FILE, "test_outcome", outcome.get("seq")).as_dict()]})
    for outcome in checklist.unattributed_failures(view, kinds_of):
        found.append({"kind": "check_outside_items",
                      "what": f"{short_test(outcome.get('test'))} {outcome.get('outcome')} (a harness check of a "
                              "part no checklist item asks for, such as the optional batching extension)",
                      "meaning": "shown for the grader; it costs no points.",
                      "evidence": [Evidence(RECORDS_FILE, "test_outcome", outcome.get("seq")).as_dict()]})
    for record in view.kind("cache_criterion_revised"):
        found.append({"kind": "revised_criterion", "what": f"a revised cache criterion was declared: "
                      f"{record.get('rule')} ({record.get('justification')})",
                      "meaning": "kept apart from the declared one, which still decides the diagnostic.",
                      "evidence": [Evidence(RECORDS_FILE, "cache_criterion_revised", record.get("seq")).as_dict()]})
    for entry in view.addenda:
        if isinstance(entry, dict) and entry.get("kind") not in (checklist.EXPLANATION_KIND, None):
            found.append({"kind": f"addendum_{entry.get('kind')}", "what": f"attached after the run: "
                          f"{entry.get('file')} ({entry.get('kind')}, {entry.get('tool')})",
                          "meaning": "material written after the session, kept beside it.",
                          "evidence": [Evidence("addenda.jsonl", entry.get("kind"), entry.get("seq")).as_dict()]})
    git = view.manifest.get("git") if isinstance(view.manifest.get("git"), dict) else {}
    if git.get("dirty"):
        found.append({"kind": "source_changed", "what": f"the source had uncommitted changes (git.dirty) against "
                      f"commit {git.get('commit')}", "meaning": "the manifest's source hashes say what ran.",
                      "evidence": [Evidence("manifest.json", field="git").as_dict()]})
    return found


def run_facts(view: RunView, complete: bool) -> dict:
    """Which run this is: its id, specimen, whether it is synthetic and complete (verify's one definition, read
    from its result, never decided here), its schema."""
    git = view.manifest.get("git") if isinstance(view.manifest.get("git"), dict) else {}
    return {"run_id": view.directory.name if view.directory is not None else None,
            "specimen": view.specimen_spec().get("name"), "synthetic": view.synthetic,
            "complete": complete,
            "schema": view.schema, "started_utc": view.manifest.get("started_utc"),
            "git_commit": git.get("commit"), "ending": view.ending, "prompt_lengths": prompt_lengths(view)}


def grade_view(view: RunView, rubric: Rubric, reference: Optional[Union[dict, list]] = None, source: str = "",
               label: Optional[str] = None, extra_integrity: Iterable[str] = (),
               rename: Optional[tuple[str, str]] = None, reference_file: Optional[str] = None,
               replay: Optional[object] = None) -> RunGrade:
    """Grade one run's view against a rubric (and a reference, and a replay: a replayed.GraderCopy re-executes the
    run on the grader's copy and folds the result in; None when no replay was asked for); rename replaces a
    temporary folder's path by the archive's name in every line shown."""
    from inferlab.grading import replayed
    from inferlab.grading.harness import compare_harness, grader_root
    from inferlab.grading.recompute import check_flags, lock_conformance
    from inferlab.grading.reference import ReferenceMismatch, choose_reference, compare_reference
    from inferlab.grading.decoded import PREFIX as DECODED_PREFIX, decode_check
    from inferlab.grading.requirements import requirement_checks
    from inferlab.grading.stale_report import stale_report_problems
    from inferlab.host.environment import describe_kernels
    from inferlab.verify import verify_run

    verified = verify_run(view)
    integrity, completeness = split_verify(verified)
    root = grader_root()
    harness = compare_harness(view, root)
    lock = lock_conformance(view, root)
    flags = check_flags(view, harness, root, lock)
    integrity += flags.integrity + (harness.lines() if rubric.grader_source == "integrity" else [])
    integrity += stale_report_problems(view)  # report --check: a page the records do not say is integrity
    decoded = decode_check(view, getattr(replay, "artifacts", None))  # the grader's own tokenizer
    # a line verify already stated with the run's own tokenizer (the run made on this machine) is said once
    integrity += [line for line in decoded.problems if line.removeprefix(f"{DECODED_PREFIX}: ") not in integrity]
    if rename:
        integrity = [line.replace(*rename) for line in integrity]
        completeness = [line.replace(*rename) for line in completeness]
    kinds_of = checklist.test_kinds(view)
    added = requirement_checks(view, rubric, harness, lock, root, replay)
    items = []
    for number, rubric_item in rubric.items.items():
        checks = checklist.item_checks(view, number, rubric_item.sections, kinds_of,
                                       required_answers=rubric.require_answered_predictions)
        if added.get(number):  # before the integrity tests behind the item, which come last
            at = len(checks) - 1 if number in checklist.ITEM_KINDS else len(checks)
            checks[at:at] = added[number]
        items.append(ItemGrade(rubric_item, checklist.item_status(checks), checks))
    notes = [f"the run was written in schema {view.schema} and read through the schema upgrade: {note}"
             for note in view.notes]
    if view.synthetic:
        notes.append(f"SYNTHETIC specimen ({view.specimen_spec().get('name')}): not Pythia; its outputs say nothing "
                     "about the real model")
    if decoded.copy and not decoded.problems:
        notes.append(f"every recorded id decoded with the grader's copy of the tokenizer ({decoded.copy}) gives "
                     "the texts the run recorded")
    if harness.version_line and harness.same:
        notes.append(harness.version_line)
    notes.append(f"CPU kernels: {describe_kernels((view.manifest.get('torch_build') or {}).get('cpu_kernels'))}")
    compared = None
    if reference is not None:  # one reference, or [(file, reference)] of one per specimen
        references = reference if isinstance(reference, list) else [(reference_file, reference)]
        extra_integrity = list(extra_integrity)  # read twice below
        try:
            reference_file, reference = choose_reference(view, references)
        except ReferenceMismatch as error:
            # A wrong reference is the grader's usage error (exit 2), unless the run already has an integrity
            # problem: then it stays exit 3 (a run cannot escape it by recording another specimen or protocol).
            if not integrity and not extra_integrity:
                return RunGrade(source=source or str(view.directory), label=label or source, rubric=rubric,
                                error=f"the reference does not apply to this run: {error}")
            notes.append(f"the reference does not apply to this run, so it was not compared: {error}")
            reference = None
        if reference is not None:
            compared = compare_reference(view, reference).as_dict()
            compared["file"] = reference_file
    findings = findings_of(view, kinds_of) + requirement_findings(rubric, harness, lock)
    grade = RunGrade(source=source or str(view.directory), label=label or (view.directory.name if view.directory
                                                                           else source),
                     items=items, integrity=integrity + list(extra_integrity), completeness=completeness,
                     reference=compared, findings=findings, notes=notes,
                     facts=unless_malformed(run_facts, view, verified.get("complete") is True),
                     measurements=unless_malformed(key_measurements, view), rubric=rubric,
                     not_checked=not_established(verified, harness, flags, compared, replay, rename,
                                                 decoded.not_checked))
    replayed.fold(grade, view, replay, rename)
    return grade


def requirement_findings(rubric: Rubric, harness, lock) -> list[dict]:
    """What the rubric does not hold against the run but a grader should see: a harness that differs (under
    grader_source = "finding") and distributions that differ from the grader's lock (when not required)."""
    found = []
    if rubric.grader_source == "finding" and not harness.same:
        found.append({"kind": "source_differs", "what": "the run's harness is not the grader's copy: " +
                      "; ".join(line.removeprefix("source: ") for line in harness.lines()),
                      "meaning": "this rubric shows it and does not hold it against the run (grader_source).",
                      "evidence": [Evidence("manifest.json", field="source_sha256").as_dict()]})
    if not rubric.require_lock_conformance and lock.differences:
        found.append({"kind": "lock_differs", "what": f"{len(lock.differences)} distribution(s) not as the grader's "
                      f"requirements.lock pins them: {lock.difference_text()}",
                      "meaning": "this rubric does not require lock conformance (require_lock_conformance).",
                      "evidence": [Evidence("manifest.json", field="distributions").as_dict()]})
    return found


def not_established(verified: dict, harness, flags, compared: Optional[dict], replay: Optional[object],
                    rename: Optional[tuple[str, str]] = None, decoded: Iterable[str] = ()) -> list[str]:
    """Every reason something was not checked: verify's, the grader's tokenizer's (decoded), the harness's, the
    flags', the reference's notes of what it did not compare, and no replay or no reference when none was given."""
    lines = [f"verify: {line}" for line in verified.get("not_checked") or []] + list(decoded)
    lines += harness.not_checked + flags.not_checked
    if compared is None:
        lines.append("reference: none given, so the run's deterministic outputs were not compared with an "
                     f"instructor's run ({spelled('grade RUN --reference REF.json')})")
    else:
        lines += [f"reference: {note}" for note in compared.get("notes") or [] if "not compared" in note]
    if replay is None:
        lines.append("replay: none made, so the run's deterministic outputs were not re-executed on the grader's "
                     f"copy of the specimen ({spelled('grade RUN --replay')})")
    if rename:
        lines = [line.replace(*rename) for line in lines]
    return list(dict.fromkeys(lines))


def unless_malformed(read, *args) -> dict:
    """What read(*args) gives, or, for records of a shape no writer makes (which verify has already named as
    an integrity problem), a dict that says the facts could not be read: the grade never crashes on them."""
    try:
        return read(*args)
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as error:
        return {"unreadable": f"malformed records ({type(error).__name__}: {error})"}


def refused(source: Path, why: str, rubric: Rubric) -> RunGrade:
    """The grade of a source that is not a run, or was refused (exit 2)."""
    return RunGrade(source=str(source), label=Path(source).name, error=why, rubric=rubric)


def grade_source(source: Path, rubric: Rubric, reference: Optional[Union[dict, list]] = None,
                 reference_file: Optional[str] = None, replay: Optional[object] = None) -> RunGrade:
    """Grade a record folder or a submission archive (unpacked into a temporary folder, removed afterwards);
    replay: the grader's copy to re-execute the run on (replayed.GraderCopy), or None."""
    import tarfile

    from inferlab.submission.archive import UnsafeArchive, is_archive, unpack
    from inferlab.submission.pack import submission_learners, submission_problems

    source = Path(source)
    if is_archive(source):
        try:
            unpacked = unpack(source)
        except UnsafeArchive as error:
            return refused(source, f"refused: {error}; nothing was extracted outside a temporary folder", rubric)
        except (OSError, tarfile.TarError, EOFError) as error:
            lines = str(error).splitlines()  # tarfile's "r:*" lists each method it tried, one line each
            why = lines[0] if len(lines) == 1 else "it is no tar archive: neither gzip, bz2, xz nor plain tar opens it"
            return refused(source, f"{source}: not a readable archive ({why})", rubric)
        try:
            reason = not_a_run_reason(unpacked.run_dir)
            if reason:
                return refused(source, f"{source}: its folder {unpacked.run_dir.name}/ is not a run", rubric)
            view = RunView.read(unpacked.run_dir)
            if view.is_plan_folder:
                return refused(source, f"{source}: its folder is a plan (--plan): nothing to grade", rubric)
            extra = submission_problems(unpacked.submission, view) if unpacked.submission is not None else []
            grade = grade_view(view, rubric, reference, source=str(source), label=source.name,
                               extra_integrity=extra, rename=(str(unpacked.temp_dir), str(source)),
                               reference_file=reference_file, replay=replay)
            grade.facts["archive"] = str(source)
            grade.facts["learners"] = submission_learners(unpacked.submission)
            grade.notes += unpacked.notes + ([] if unpacked.submission is not None else
                                             ["the archive holds no submission.json (it was not made by pack)"])
            return grade
        finally:
            unpacked.remove()
    if not source.exists():
        return refused(source, f"{source}: no such file or folder", rubric)
    if not source.is_dir():
        return refused(source, f"{source}: neither a run folder nor a submission archive (.tar.gz)", rubric)
    reason = not_a_run_reason(source)
    if reason:
        return refused(source, reason, rubric)
    view = RunView.read(source)
    if view.is_plan_folder:
        return refused(source, f"{source} is a plan folder (--plan): no test ran, so there is nothing to grade", rubric)
    return grade_view(view, rubric, reference, source=str(source), reference_file=reference_file, replay=replay)


def submissions_in(folder: Path) -> Optional[list[Path]]:
    """The submissions of a class folder (each subfolder or archive one learner), sorted; None when `folder` is
    a run itself, holds no subfolder or archive, or is no class by what its folders hold: a class is a folder
    most of whose entries are submissions (holds_a_submission), so a project folder (docs/, tests/, ...) is none,
    while a class keeps every entry, one that holds no run too (that learner's grade says so)."""
    from inferlab.submission.archive import ARCHIVE_SUFFIXES

    folder = Path(folder)
    if not folder.is_dir() or not_a_run_reason(folder) is None:
        return None
    found = sorted(p for p in folder.iterdir() if not p.name.startswith(".") and (
        p.is_dir() or (p.is_file() and p.name.endswith(ARCHIVE_SUFFIXES))))
    holding = sum(1 for p in found if holds_a_submission(p))
    return found if found and 2 * holding > len(found) else None


def holds_a_submission(path: Path) -> bool:
    """Whether an entry of a folder is a learner's submission: a `pack` archive, a run's folder, or a folder
    holding one of those at its top (a learner's folder, Gradescope's layout)."""
    from inferlab.submission.archive import ARCHIVE_SUFFIXES

    def is_one(entry: Path) -> bool:
        if entry.is_file():
            return entry.name.endswith(ARCHIVE_SUFFIXES)
        return entry.is_dir() and not_a_run_reason(entry) is None

    if is_one(path):
        return True
    try:
        return path.is_dir() and any(is_one(entry) for entry in path.iterdir() if not entry.name.startswith("."))
    except OSError:
        return False


def worst(statuses: Iterable[int]) -> int:
    """The worst exit status of several runs (integrity 3 > not a run 2 > an item failed 1 > passed 0)."""
    return max(statuses, default=EXIT_PASSED)
