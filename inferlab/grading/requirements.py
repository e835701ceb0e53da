"""The rubric's requirements (inferlab.grading.rubric REQUIREMENT_DEFAULTS) as checks of the items they belong
to: the grader's source and lock conformance (item 2), the specimen (item 3), a replay (item 4). Item 1's
number of answered predictions is item 1's own check (inferlab.grading.items). Each check is decided from the
run's files and the grader's own copy (its source, its lock, its specimen pins), never from a flag the run
carries; each failing one says what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from inferlab.base.commands import spelled
from inferlab.grading.evidence import Check, Evidence, failed, manifest_evidence, passed
from inferlab.grading.harness import HARNESS_PARTS, HarnessComparison
from inferlab.grading.recompute import LockConformance
from inferlab.grading.rubric import Rubric
from inferlab.reading.runview import RunView

HARNESS_FIX = ("make the run with the course's harness unchanged (a fresh clone at the course's commit, set up "
               "with make) and submit that run")


def grader_source_check(harness: HarnessComparison) -> Check:
    """Item 2: the run's harness is the grader's copy, file by file."""
    parts = ", ".join(HARNESS_PARTS)
    if harness.same:
        return passed("grader_source", f"the run's harness ({parts}) is the grader's copy, file by file "
                      f"({harness.compared} files; {harness.grader_root})", extra=[manifest_evidence("source_sha256")])
    return failed("grader_source", f"the run's harness is not the grader's copy: {len(harness.differs)} difference(s); "
                  + "; ".join(line.removeprefix("source: ") for line in harness.lines()[:4]), HARNESS_FIX,
                  extra=[manifest_evidence("source_sha256")])


def lock_check(lock: LockConformance) -> Check:
    """Item 2 (a rubric that requires it): every distribution the run recorded as the grader's lock pins it."""
    evidence = [manifest_evidence("distributions"), manifest_evidence("requirements_lock_sha256")]
    if lock.recomputed is None:
        return failed("lock_conformance", f"lock conformance cannot be established: {lock.why_not}",
                      "run the experiment in an environment made from requirements.lock (make)", extra=evidence)
    other = "" if lock.same_lock else f" (the run was made under another {Path(lock.grader_lock).name}, sha256 " \
        f"{lock.run_sha256})"
    if lock.differences:
        return failed("lock_conformance", f"{len(lock.differences)} distribution(s) not as the grader's "
                      f"{Path(lock.grader_lock).name} pins them: {lock.difference_text()}{other}",
                      "set up .venv from the course's requirements.lock (make) and run again", extra=evidence)
    return passed("lock_conformance", f"every distribution and Python as the grader's lock pins them{other}",
                  extra=evidence)


def _specimen_identity(view: RunView, name: str, root: Path) -> tuple[Optional[object], Optional[str]]:
    """(the grader's spec of `name`, None) when the run's recorded files are that specimen's pins, else (spec or
    None, why not)."""
    from inferlab.specimen.spec import SpecimenError, load_spec

    try:
        spec = load_spec(name, root / "artifacts")
    except SpecimenError as error:
        return None, f"the grader's copy does not know specimen {name!r} ({error})"
    record = view.first("specimen") or {}
    for key in ("repo_id", "revision"):
        if record.get(key) != getattr(spec, key):
            return spec, (f"its specimen record's {key} is {record.get(key)!r}, the grader's pin is "
                          f"{getattr(spec, key)!r}")
    files = {r.get("name"): r for r in view.kind("artifact_file")}
    for file_name, pin in sorted((spec.expected or {}).items()):
        if not isinstance(pin, dict) or pin.get("sha256") is None:
            continue
        have = files.get(file_name)
        if have is None:
            if file_name in spec.optional_files:
                continue
            return spec, f"it records no {file_name}"
        if have.get("sha256") != pin.get("sha256"):
            return spec, (f"its {file_name} has sha256 {have.get('sha256')}, the grader's pin of {name} is "
                          f"{pin.get('sha256')}")
    return spec, None


def specimen_check(view: RunView, rubric: Rubric, root: Path) -> Optional[Check]:
    """Item 3 (a rubric that requires a specimen, or no synthetic one): the run's specimen, identified by its
    files' hashes against the grader's own pins (artifacts/<name>.json), never by its label alone."""
    if not rubric.require_specimen and rubric.allow_synthetic_specimen:
        return None
    name = view.specimen_spec().get("name")
    evidence = [manifest_evidence("specimen")] + [Evidence("records.jsonl", "artifact_file", r.get("seq"))
                                                  for r in view.kind("artifact_file")[:3]]
    wanted = " or ".join(rubric.require_specimen)
    fix = f"run the experiment with --specimen {rubric.require_specimen[0]}" if rubric.require_specimen else \
        "run the experiment on the real model (--specimen pythia-14m)"
    if rubric.require_specimen and name not in rubric.require_specimen:
        return failed("required_specimen", f"the run's specimen is {name}" + (" (synthetic)" if view.synthetic else "")
                      + f"; this rubric requires {wanted}", fix, extra=evidence)
    if view.synthetic and not rubric.allow_synthetic_specimen:
        return failed("required_specimen", f"the run's specimen {name} is synthetic; this rubric accepts no synthetic "
                      "specimen", fix, extra=evidence)
    spec, why = _specimen_identity(view, str(name), root)
    if why is not None:
        return failed("required_specimen", f"the run is labelled {name}, but {why}", fix, extra=evidence)
    synthetic = view.synthetic or bool(getattr(spec, "synthetic", False))
    if synthetic and not rubric.allow_synthetic_specimen:
        return failed("required_specimen", f"the run's specimen {name} is synthetic; this rubric accepts no synthetic "
                      "specimen", fix, extra=evidence)
    return passed("required_specimen", f"the run's files are {name}'s pins in the grader's copy"
                  + (f" (required: {wanted})" if wanted else "") + ("" if synthetic else "; not synthetic"),
                  extra=evidence)


def replay_check(replay: Optional[object]) -> Check:
    """Item 4 (a rubric with require_replay): a replay result was given to grade."""
    if replay is None:
        return failed("replay", "this rubric requires a replay of the run's deterministic outputs on the grader's copy "
                      "of the specimen, and none was given", f"run {spelled('grade RUN --replay')}")
    words = getattr(replay, "requirement_words", None)  # what the course's run (or its comparison) did instead
    return passed("replay", words or "the run's deterministic outputs were replayed on the grader's copy (an "
                  "output that contradicts its replay is an integrity problem)")


def requirement_checks(view: RunView, rubric: Rubric, harness: HarnessComparison, lock: LockConformance,
                       root: Path, replay: Optional[object] = None) -> dict[int, list[Check]]:
    """Item number -> the requirement checks added to it under this rubric."""
    added: dict[int, list[Check]] = {2: [], 3: [], 4: []}
    if rubric.grader_source != "finding":
        added[2].append(grader_source_check(harness))
    if rubric.require_lock_conformance:
        added[2].append(lock_check(lock))
    specimen = specimen_check(view, rubric, root)
    if specimen is not None:
        added[3].append(specimen)
    if rubric.require_replay:
        added[4].append(replay_check(replay))
    return {number: checks for number, checks in added.items() if checks}
