"""What `grade` decides, recomputed from the run's files by the code that wrote each summary, on the grader's
side; and every summary flag the run carries checked against what it summarises.

A learner can write any field of manifest.json or addenda.jsonl and re-hash the inventory. So the grade never
rests on a flag:
- the predictions: which of the six questions predictions.md answers (inferlab.run.predictions.question_answers of
  the run's own copy, with the grader's template);
- the explanation's structure: inferlab.reading.addenda.structure_of of the attached file, with the grader's template;
- lock conformance: inferlab.host.environment.lock_check of the run's recorded `distributions` and Python against
  the grader's requirements.lock. When the run's lock (its `requirements_lock_sha256`) is the grader's, the
  run's own `lock_check` must be exactly that; when it is another lock, that is said, and conformance is
  judged against the grader's lock.

Each flag (`predictions.template_unanswered`, `predictions.sha256`, an explanation entry's `structure`,
`lock_check`, `torch_build.version` against `distributions.torch`, the final manifest's `session_end` and its
copies `complete`, `status`, `exit_status`, `exit_code_name` against the session_end record, the prerequisite
ledger `checks` against the outcomes of the tests it names) that disagrees with its recomputation is an
integrity problem naming the flag, what the run says and what its file says. `outcome_counts`, the inventory
and the ledger's sizes and hashes are verify's (inferlab.verify), which grade calls. A flag written by code
that is not the grader's (HarnessComparison.same_files) is not compared, and that is said under not checked:
the grader's own recomputation still decides.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from inferlab.base.records import MANIFEST_FILE, PREDICTIONS_FILE
from inferlab.grading.harness import HarnessComparison, grader_root
from inferlab.reading import addenda
from inferlab.reading.runview import RunView
from inferlab.run import predictions

LOCK_FILE = "requirements.lock"
STRUCTURE_FIELDS = ("ok", "headings_present", "headings_missing", "empty_sections")


def _sha256(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def run_file_text(view: RunView, relative: str) -> tuple[Optional[str], Optional[str]]:
    """(text, None) of a file inside the run folder, or (None, why it cannot be read)."""
    if view.directory is None:
        return None, f"{relative}: the run is not a folder on disk here, so its file cannot be read"
    path = view.directory / relative
    if path.is_symlink() or not path.is_file():
        return None, f"{relative}: not in the run folder"
    try:
        return path.read_bytes().decode("utf-8", errors="replace"), None
    except OSError as error:
        return None, f"{relative}: cannot be read ({error.strerror or error})"


# --- the predictions -------------------------------------------------------------------------------------


def predictions_answers(view: RunView, root: Optional[Path] = None) -> tuple[Optional[predictions.QuestionAnswers],
                                                                             Optional[str]]:
    """Which questions the run's predictions.md answers (the grader's rule and template), or why it cannot be
    said."""
    text, why = run_file_text(view, PREDICTIONS_FILE)
    if text is None:
        return None, why
    return predictions.question_answers(text, predictions.read_template(root or grader_root())), None


# --- the explanation -------------------------------------------------------------------------------------


def explanation_structure(view: RunView, entry: dict, root: Optional[Path] = None) -> tuple[Optional[dict],
                                                                                          Optional[str]]:
    """The structure of an attached explanation, recomputed from its file with the grader's template, or why
    it cannot be."""
    error = addenda.stored_path_error(entry.get("file"))
    if error is not None:
        return None, error
    text, why = run_file_text(view, entry["file"])
    if text is None:
        return None, why
    return addenda.structure_of(text, addenda.read_template(root or grader_root())), None


# --- the lock --------------------------------------------------------------------------------------------


@dataclass
class LockConformance:
    """The run's recorded distributions against the grader's requirements.lock."""

    grader_lock: str
    grader_sha256: Optional[str]
    run_sha256: Optional[str]
    recomputed: Optional[dict] = None  # inferlab.host.environment.lock_check over the run's distributions
    why_not: Optional[str] = None  # why conformance cannot be judged

    @property
    def same_lock(self) -> bool:
        return self.grader_sha256 is not None and self.run_sha256 == self.grader_sha256

    @property
    def differences(self) -> list[dict]:
        return list((self.recomputed or {}).get("differences") or [])

    def difference_text(self, limit: int = 6) -> str:
        """'torch locked 2.13.0, installed 2.14.0; numpy ...': other versions first, then missing or extra ones."""
        ordered = sorted(self.differences, key=lambda d: (d.get("locked") is None or d.get("installed") is None))
        shown = [f"{d.get('name')} locked {d.get('locked')}, installed {d.get('installed')}" for d in ordered[:limit]]
        more = len(self.differences) - limit
        return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def lock_conformance(view: RunView, root: Optional[Path] = None) -> LockConformance:
    """The run's distributions and Python (manifest.json distributions, platform.python_version) against the
    grader's requirements.lock, with inferlab.host.environment.lock_check (the function that wrote the run's own)."""
    from inferlab.host.environment import lock_check

    lock = Path(root or grader_root()) / LOCK_FILE
    result = LockConformance(str(lock), _sha256(lock), view.manifest.get("requirements_lock_sha256"))
    distributions = view.manifest.get("distributions")
    platform = view.manifest.get("platform") if isinstance(view.manifest.get("platform"), dict) else {}
    if result.grader_sha256 is None:
        result.why_not = f"the grader's copy has no {LOCK_FILE} ({lock})"
    elif not isinstance(distributions, dict) or not distributions:
        result.why_not = f"{MANIFEST_FILE} records no distributions"
    else:
        result.recomputed = lock_check(lock, distributions, str(platform.get("python_version")))
    return result


def _comparable_lock_check(check: dict) -> dict:
    differences = sorted((str(d.get("name")), str(d.get("locked")), str(d.get("installed")))
                         for d in check.get("differences") or [] if isinstance(d, dict))
    return {"found": check.get("found"), "pins": check.get("pins"), "python_locked": check.get("python_locked"),
            "python_running": check.get("python_running"), "differences": differences}


# --- the flags, checked ----------------------------------------------------------------------------------


@dataclass
class FlagCheck:
    """Integrity problems (a flag that disagrees with its recomputation) and what could not be compared."""

    integrity: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)


def _check_predictions(view: RunView, harness: HarnessComparison, root: Path, found: FlagCheck) -> None:
    recorded = view.manifest.get("predictions") if isinstance(view.manifest.get("predictions"), dict) else {}
    if not recorded.get("supplied"):
        return
    text, why = run_file_text(view, PREDICTIONS_FILE)
    if text is None:
        found.not_checked.append(f"{MANIFEST_FILE} predictions.template_unanswered: {why}")
        return
    digest = _sha256(view.directory / PREDICTIONS_FILE)
    if "sha256" in recorded and recorded.get("sha256") != digest:
        found.integrity.append(f"{MANIFEST_FILE} predictions.sha256: the manifest says {recorded.get('sha256')}, "
                               f"the file {PREDICTIONS_FILE} is {digest}")
    if "template_unanswered" not in recorded:
        return
    if not harness.same_files("inferlab/run/predictions.py"):
        found.not_checked.append(f"{MANIFEST_FILE} predictions.template_unanswered against {PREDICTIONS_FILE}: the "
                                 "run's inferlab/run/predictions.py is not the grader's (the grade judged the answers "
                                 "with the grader's own)")
        return
    status = predictions.template_status(text, predictions.read_template(root))
    if bool(recorded.get("template_unanswered")) != status["template_unanswered"]:
        found.integrity.append(
            f"{MANIFEST_FILE} predictions.template_unanswered: the manifest says "
            f"{str(bool(recorded.get('template_unanswered'))).lower()}, {PREDICTIONS_FILE} says "
            f"{str(status['template_unanswered']).lower()} ({status['template_check']})")


def _check_explanations(view: RunView, harness: HarnessComparison, root: Path, found: FlagCheck) -> None:
    same_code = harness.same_files("inferlab/reading/addenda.py")
    for entry in view.addenda:
        if not isinstance(entry, dict) or entry.get("kind") != addenda.EXPLANATION_KIND:
            continue
        recorded = entry.get("structure")
        where = f"{addenda.LEDGER_FILE} seq {entry.get('seq')} structure"
        structure, why = explanation_structure(view, entry, root)
        if structure is None:
            found.not_checked.append(f"{where}: {why}")
            continue
        if not isinstance(recorded, dict):
            continue  # no structure recorded: the grade uses its own recomputation, nothing to contradict
        if not same_code:
            found.not_checked.append(f"{where} against {entry.get('file')}: the run's inferlab/reading/addenda.py is "
                                     "not the grader's (the grade judged the structure with the grader's own)")
            continue
        if recorded.get("ok") is None and structure.get("ok") is not None and recorded.get("note"):
            continue  # attach had no template at hand; the grader has one, and its recomputation decides
        for name in STRUCTURE_FIELDS:
            if recorded.get(name) != structure.get(name):
                found.integrity.append(f"{where}.{name}: the ledger says {recorded.get(name)!r}, the file "
                                       f"{entry.get('file')} says {structure.get(name)!r}")


def _check_lock(view: RunView, harness: HarnessComparison, lock: LockConformance, found: FlagCheck) -> None:
    recorded = view.manifest.get("lock_check")
    if lock.recomputed is None:
        found.not_checked.append(f"lock conformance: {lock.why_not}")
        return
    if lock.run_sha256 is None:
        found.not_checked.append(f"{MANIFEST_FILE} lock_check against the run's lock: the run records no "
                                 "requirements_lock_sha256; conformance is judged against the grader's lock")
        return
    if not lock.same_lock:
        found.not_checked.append(
            f"{MANIFEST_FILE} lock_check against the run's lock: the run was made under another {LOCK_FILE} "
            f"(sha256 {lock.run_sha256}; the grader's is {lock.grader_sha256}); conformance is judged against the "
            "grader's lock")
        return
    if not isinstance(recorded, dict):
        found.not_checked.append(f"{MANIFEST_FILE} lock_check: not recorded (an older run); conformance is judged "
                                 "against the grader's lock from the recorded distributions")
        return
    if not harness.same_files("inferlab/host/environment.py", "inferlab/host/installation.py"):
        found.not_checked.append(f"{MANIFEST_FILE} lock_check against distributions: the run's "
                                 "inferlab/host/environment.py or installation.py is not the grader's")
        return
    ours, theirs = _comparable_lock_check(lock.recomputed), _comparable_lock_check(recorded)
    for name in ours:
        if ours[name] != theirs[name]:
            said = "none" if name == "differences" and not theirs[name] else theirs[name]
            computed = lock.difference_text() if name == "differences" else ours[name]
            found.integrity.append(f"{MANIFEST_FILE} lock_check.{name}: the manifest says {said}; recomputed from "
                                   f"its distributions against {LOCK_FILE} (the same lock): {computed or 'none'}")


def _check_torch(view: RunView, found: FlagCheck) -> None:
    distributions = view.manifest.get("distributions") if isinstance(view.manifest.get("distributions"), dict) else {}
    build = view.manifest.get("torch_build") if isinstance(view.manifest.get("torch_build"), dict) else {}
    recorded, built = distributions.get("torch"), build.get("version")
    if recorded is None or built is None:
        return
    if str(recorded).split("+", 1)[0] != str(built).split("+", 1)[0]:
        found.integrity.append(f"{MANIFEST_FILE} distributions.torch: the manifest says {recorded}, and its own "
                               f"torch_build.version (what the installed torch said of itself) is {built}")


SESSION_END_COPIES = ("complete", "status", "exit_status", "exit_code_name")  # the manifest's own copies


def _check_session_end(view: RunView, found: FlagCheck) -> None:
    """The final manifest's session_end (and its top-level copies) against the session_end record it copies."""
    from inferlab.reading.runview import ENVELOPE_FIELDS

    summary = view.manifest.get("session_end")
    ends = view.kind("session_end")
    if not isinstance(summary, dict) or len(ends) != 1:
        return  # no final manifest, or a records file verify already finds wrong
    record = {k: v for k, v in ends[0].items() if k not in ENVELOPE_FIELDS}
    for name in sorted(set(summary) | set(record)):
        if summary.get(name) != record.get(name):
            found.integrity.append(f"{MANIFEST_FILE} session_end.{name}: the manifest says {summary.get(name)!r}, the "
                                   f"session_end record (seq {ends[0].get('seq')}) says {record.get(name)!r}")
    for name in SESSION_END_COPIES:
        if name in view.manifest and name in record and view.manifest.get(name) != record.get(name):
            found.integrity.append(f"{MANIFEST_FILE} {name}: the manifest says {view.manifest.get(name)!r}, the "
                                   f"session_end record (seq {ends[0].get('seq')}) says {record.get(name)!r}")


def _check_prerequisites(view: RunView, found: FlagCheck) -> None:
    """The manifest's prerequisite ledger (`checks`): each status against the outcome of the test it names."""
    ledger = view.manifest.get("checks")
    if not isinstance(ledger, dict):
        return
    for name, entry in sorted(ledger.items()):
        if not isinstance(entry, dict) or not entry.get("by"):
            continue
        outcome = view.decisive_outcome(entry["by"])
        if outcome is None:
            continue  # a test stopped inside it has no outcome: the ending says so
        said = {"skipped": "did not run"}.get(outcome.get("outcome"), outcome.get("outcome"))
        if entry.get("status") != said:
            found.integrity.append(f"{MANIFEST_FILE} checks.{name}.status: the manifest says {entry.get('status')!r}, "
                                   f"the outcome of {entry['by']} (records.jsonl seq {outcome.get('seq')}) is "
                                   f"{outcome.get('outcome')!r}")


def check_flags(view: RunView, harness: HarnessComparison, root: Optional[Path] = None,
                lock: Optional[LockConformance] = None) -> FlagCheck:
    """Every summary flag of the run against its recomputation from the files (see the module docstring)."""
    root = Path(root or grader_root())
    found = FlagCheck()
    _check_predictions(view, harness, root, found)
    _check_explanations(view, harness, root, found)
    _check_lock(view, harness, lock or lock_conformance(view, root), found)
    _check_torch(view, found)
    _check_session_end(view, found)
    _check_prerequisites(view, found)
    return found


def established_versions(view: RunView, root: Optional[Path] = None) -> dict:
    """The torch and transformers versions that decide whether the run's seeded sampling ids are comparable with
    another run's, from the same check as lock conformance: {torch, transformers, established, how}. They are
    established when the run's lock is the grader's and its recorded lock_check is what its distributions give
    (and torch_build agrees with distributions.torch); otherwise `how` says why they are the run's word only."""
    distributions = view.manifest.get("distributions") if isinstance(view.manifest.get("distributions"), dict) else {}
    lock = lock_conformance(view, root)
    found = FlagCheck()
    _check_torch(view, found)
    recorded = view.manifest.get("lock_check")
    agrees = lock.recomputed is not None and isinstance(recorded, dict) and \
        _comparable_lock_check(recorded) == _comparable_lock_check(lock.recomputed)
    if not lock.same_lock:
        how = f"the run was made under another {LOCK_FILE}: its distributions are its own word"
    elif not agrees:
        how = f"{MANIFEST_FILE} lock_check does not agree with the recorded distributions"
    elif found.integrity:
        how = found.integrity[0]
    else:
        how = f"the recorded distributions agree with lock_check under the grader's {LOCK_FILE} and with torch_build"
    return {"torch": distributions.get("torch"), "transformers": distributions.get("transformers"),
            "established": lock.same_lock and agrees and not found.integrity, "how": how}
