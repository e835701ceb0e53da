"""verify: is a run folder as its session wrote it, and what does it hold? From its files alone (no model, no torch).

One line per problem: reading problems; how the session ended (its `completeness`: one `unfinished:` and one
`partial:` line); every file against the manifest's inventory; the addenda; every failure with its evidence; the
plan against the protocol; session_end against the records; every expected record kind, or what explains its
absence; every tensor against its record's SHA-256; the recorded protocol against this checkout's. Whether the
numbers are what the computation gives is `grade --against COURSE_RUN`'s question (inferlab.grade.against).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from inferlab import protocol
from inferlab.files import sha256_file
from inferlab.run.records import MANIFEST_FILE, PLAN_FILE, PREDICTIONS_FILE, RECORDS_FILE, REPORT_FILE, killed_detail
from inferlab.read import addenda, parse
from inferlab.read.runview import (DIAGNOSTIC, FAILING, INTEGRITY, NOT_PASSING, RunView, TensorFileError,
                                   tensor_references)

# The record kinds a complete run holds, and how many (never a test's name: the plan says which test writes one).
EXPECTED = {
    "specimen": 1, "artifact_acquisition": 1, "artifact_file": len(protocol.ALLOWLISTED_FILES), "model_load": 1,
    "model_inspection": 1, "thread_controls": 1, "input": len({**protocol.PROMPTS, **protocol.TIMING_PROMPTS}),
    "generation": len(protocol.generation_trials()), "first_step_logits_check": 1, "sampling_summary": 1,
    "cache_criterion": 1, "cache_inspection": 1, "cache_summary": 1, "cache_comparison": 1,
    "timing_trial": len(protocol.timing_schedule()), "timing_summary": 2 * len(protocol.TIMING_PROMPTS),
    "cache_divergence": 1, "loop_vs_generate": 1, "memory": 1,
}
PROSE = ("timing_stopping_rule", "cache_tolerance.rule", "contention_rule.rule", "near_tie_rule", "cache_verdict.rule")


def differences(recorded: Any, expected: Any, path: str = "") -> Iterable[tuple[str, Any, Any]]:
    """(path, recorded, expected) for every leaf where two JSON values differ."""
    if isinstance(recorded, dict) and isinstance(expected, dict):
        for key in sorted(set(recorded) | set(expected)):
            yield from differences(recorded.get(key), expected.get(key), f"{path}.{key}" if path else key)
    elif recorded != expected and not (isinstance(expected, tuple) and recorded == list(expected)):
        yield path, recorded, expected


class Verify:
    """The problems found while walking one run."""

    def __init__(self, view: RunView):
        self.view, self.problems, self.notes, self.not_checked = view, [], [], []
        self.files_checked = 0
        self.unfinished = view.unfinished
        self.partial = view.plan_partial_reasons()
        self.final_missing = bool(self.unfinished and view.manifest_found and not view.final_manifest_written)

    def problem(self, line: str) -> None:
        self.problems.append(line)

    def ending(self) -> list[str]:
        view, lines = self.view, []
        if self.unfinished:
            live = view.ending == "killed" and view.claimant_live
            if live:
                self.unfinished = ("no session_end record yet: the run is LIVE, its session still running, so these "
                                   "are not its final records; verify it again once the session has ended")
            line = f"unfinished: {self.unfinished}"
            if view.ending == "killed" and not live:
                line += killed_detail(view.claim, view.rename_note)
            if view.schedule and not (view.session_end or {}).get("collect_only"):
                first = next((n for n in view.schedule if n in view.unreached), None)
                line += f"; {len(view.unreached)} of {len(view.schedule)} planned tests have no outcome" + \
                    (f" (the first: {first})" if first else "")
            if self.final_missing:
                line += ("; its manifest is the one written when the run began (no file inventory), so no file hash "
                         "can be checked")
            lines.append(line)
        if self.partial:
            more = f" (and {len(self.partial) - 1} more shortfall(s): {PLAN_FILE} partial_reasons)" \
                if len(self.partial) > 1 else ""
            lines.append(f"partial: {self.partial[0]}{more}")
        return lines

    def files(self) -> None:
        view, manifest = self.view, self.view.manifest
        if not view.manifest_found or self.final_missing or view.directory is None:
            return
        listed = manifest.get("files")
        if not isinstance(listed, dict):
            self.problem(f"{MANIFEST_FILE}: no 'files' inventory (it is written at session end), so no file hash can "
                         "be checked")
            return
        for relative, expected in sorted(listed.items()):
            if (why := parse.outside(view.directory, relative)) is not None:  # never opened: integrity, not a hash
                self.problem(f"{MANIFEST_FILE} files: {why}; not opened")
                continue
            target = view.directory / relative
            if not target.is_file():
                self.problem(f"{relative}: listed in the manifest but missing")
                continue
            self.files_checked += 1
            expected = expected if isinstance(expected, dict) else {}
            if sha256_file(target) != expected.get("sha256"):  # a changed size changes the hash: one line
                self.problem(f"{relative}: sha256 {sha256_file(target)} ({target.stat().st_size} bytes), manifest "
                             f"says {expected.get('sha256')} ({expected.get('size')} bytes) (file changed)")
        for path in sorted(p for p in view.directory.rglob("*") if p.is_file()):
            relative = path.relative_to(view.directory).as_posix()
            if relative != MANIFEST_FILE and relative not in listed and not addenda.is_addenda_path(relative):
                self.problem(f"{relative}: present but not listed in the manifest (added after the session)")
        predictions = manifest.get("predictions")
        copied = predictions.get("copied_to") if isinstance(predictions, dict) else None
        if copied not in (None, PREDICTIONS_FILE):  # the copy is always read from its fixed name, never from here
            self.problem(f"{MANIFEST_FILE} predictions.copied_to: {copied!r}, expected {PREDICTIONS_FILE!r}; not opened")
        for record in view.kind("report_error"):
            self.problem(f"{REPORT_FILE}: the session could not write it (seq {record.get('seq')}): "
                         f"{record.get('error')}")

    def addenda(self) -> None:
        view = self.view
        for problem in view.addenda_problems:
            self.problem(str(problem))
        if view.directory is None:
            return
        now = manifest_sha256(view)
        listed = set()
        for index, entry in enumerate(view.addenda):
            if entry.get("seq") != index:
                self.problem(f"{addenda.LEDGER_FILE}: entry {index + 1} has seq {entry.get('seq')!r}, expected {index}")
            found = addenda.entry_findings(view.directory, entry, now)
            self.problems += found
            listed.add(entry.get("file"))
            if not found and entry.get("kind") == addenda.REVISED_KIND:
                self.problems += addenda.check_revision(view, entry["file"],
                                                        (view.directory / entry["file"]).read_bytes())
        folder = view.directory / addenda.ADDENDA_DIR
        for path in sorted(folder.rglob("*") if folder.is_dir() else []):
            relative = path.relative_to(view.directory).as_posix()
            if path.is_file() and relative not in listed:
                what = "a temporary file left by a stopped attach" if path.name.startswith(".") else "kept by no entry"
                self.problem(f"{relative}: under {addenda.ADDENDA_DIR}/ but no entry of {addenda.LEDGER_FILE} lists "
                             f"it ({what})")

    def outcomes(self) -> None:
        view = self.view
        for record in view.kind("test_outcome"):
            outcome, test, seq = record.get("outcome"), record.get("test"), record.get("seq")
            if outcome in FAILING and not str(record.get("longrepr") or "").strip():
                self.problem(f"{RECORDS_FILE} seq {seq}: {test} {outcome} with no longrepr (no evidence)")
            if outcome == "skipped" and not str(record.get("skip_reason") or "").strip():
                self.problem(f"{RECORDS_FILE} seq {seq}: {test} skipped with no reason")
        counted = dict(collections.Counter(r.get("outcome") for r in view.kind("test_outcome")))
        recorded = view.manifest.get("outcome_counts")
        if isinstance(recorded, dict) and not self.final_missing and counted != recorded:
            self.problem(f"{MANIFEST_FILE}: outcome_counts {recorded} but {RECORDS_FILE} holds {counted}")
        for record in view.records:
            if record.get("kind") != "test_outcome" and record.get("status") in FAILING \
                    and not view.non_passing([record.get("test")]) and record.get("test") not in view.unreached:
                self.problem(f"{RECORDS_FILE} seq {record.get('seq')}: {record.get('kind')} has status "
                             f"{record.get('status')!r} but no failed or errored test outcome for its test "
                             f"{record.get('test')}")

    def plan(self) -> None:
        view = self.view
        if len(view.kind("plan")) != 1:
            self.problem(f"{RECORDS_FILE}: {len(view.kind('plan'))} plan record(s), expected exactly 1")
        if view.plan is None:
            return
        totals = view.plan.get("totals") or {}
        self.problems += [f"{PLAN_FILE}: {v}" for v in protocol.cap_violations(totals)]
        self.problems += [f"{PLAN_FILE}: not the complete protocol: {reason}, and its partial_reasons do not say so"
                          for reason in protocol.shortfalls(totals) if reason not in self.partial]
        for test in view.planned_without_outcome():
            if test not in view.unreached:
                self.problem(f"{PLAN_FILE}: planned test {test} has no recorded outcome")
        index = {entry.get("test"): i for i, entry in enumerate(view.planned)}
        ran = list(dict.fromkeys(index[r["test"]] for r in view.kind("test_outcome") if r.get("test") in index))
        if ran != sorted(ran):
            self.problem(f"{RECORDS_FILE}: tests did not run in the order of {PLAN_FILE}")

    def session_end(self) -> None:
        view, ends = self.view, self.view.kind("session_end")
        if not ends:
            return
        end = ends[-1]
        if len(ends) > 1:
            self.problem(f"{RECORDS_FILE}: {len(ends)} session_end records, expected exactly 1")
        if end.get("exit_code_name") not in ("OK", "TESTS_FAILED", "INTERRUPTED"):
            self.problem(f"session_end: exit status {end.get('exit_status')} ({end.get('exit_code_name')})")
        if set(end.get("tests_without_outcome") or []) != set(view.planned_without_outcome()) and view.plan:
            self.problem("session_end: tests_without_outcome does not match the planned tests without an outcome")
        changed = end.get("environment_changed_during_run") or []
        if changed:
            self.problem(f"session_end: the environment changed during the run ({'; '.join(map(str, changed))}): the "
                         f"source hashes and versions in {MANIFEST_FILE} were taken at its start")
        forwards = end.get("forward_reconciliation")
        if isinstance(forwards, dict):
            self.problems += [f"session_end: harness integrity failed: {line}"
                              for line in forwards.get("problems") or []]
        elif not end.get("collect_only"):
            self.not_checked.append("the session's forward count: session_end has no forward_reconciliation")
        if view.manifest_found and not self.final_missing and view.manifest.get("complete") != end.get("complete"):
            self.problem(f"{MANIFEST_FILE}: complete is {view.manifest.get('complete')!r} but session_end says "
                         f"{end.get('complete')!r}")

    def kinds(self) -> None:
        """Each expected kind in its count, or the outcome, the ending or the deselection that explains the gap;
        the trials one record each, in protocol order, within the budget; the criterion before the comparisons."""
        view = self.view
        for kind, count in EXPECTED.items():
            found = view.kind(kind)
            if len(found) >= count or kind in ("generation", "timing_trial"):
                continue
            missing = view.why_missing(kind)
            what = f"no {kind} record" if not found else f"{kind}: {len(found)} record(s), expected {count}"
            if missing.reason == "evidence":
                self.notes.append(f"{what}: explained by {missing.evidence.get('test')}")
            elif missing.reason == "ran" and view.plan_partial_reasons() and {r.get("test") for r in found} >= set(
                    missing.producers):
                self.notes.append(f"{what}: the selection planned {len(missing.producers)} of its producing tests")
            elif missing.reason not in ("not_reached", "deselected"):
                names = ", ".join(dict.fromkeys(str(p).split("::")[-1].split("[")[0] for p in missing.producers))
                self.problem(f"{what}, and " + (f"none of its producing tests ({names}) has a failed, error or skipped "
                                                f"outcome" if missing.producers else
                                                "no planned test declares that it writes it"))
        trials = {"generation": ("trial_id", "trial_index", ("prompt_id", "condition", "seed"), {
                      t.test_id: (t.prompt_id, t.condition, t.seed) for t in protocol.generation_trials()}),
                  "timing_trial": ("schedule_id", "schedule_index", ("prompt_id", "use_cache", "warmup"), {
                      t.test_id: (t.prompt_id, t.use_cache, t.warmup) for t in protocol.timing_schedule()})}
        for kind, (key, order, fields, expected) in trials.items():
            found = view.kind(kind)
            for record in found:
                shape = tuple(record.get(name) for name in fields)
                if record.get(key) in expected and shape != expected[record.get(key)]:
                    self.problem(f"{kind} {record.get(key)}: ({', '.join(fields)}) = {list(shape)}, the protocol "
                                 f"says {list(expected[record.get(key)])}")
            counts = collections.Counter(r.get(key) for r in found)
            indices = [r.get(order) for r in found]
            if indices != sorted(indices, key=lambda i: (i is None, i)):
                self.problem(f"{kind} records are not in protocol order: {indices}")
            for test_id in expected:  # in protocol order
                if counts[test_id] > 1:
                    self.problem(f"{kind} {test_id}: {counts[test_id]} records, expected 1 (no trial is regenerated)")
                elif not counts[test_id] and (view.outcome_of_param(test_id) or {}).get("outcome") not in NOT_PASSING:
                    missing = view.missing_from(kind, [n for n in view.schedule if str(n).endswith(f"[{test_id}]")])
                    if missing.reason not in ("not_reached", "deselected", "evidence"):
                        self.problem(f"{kind} {test_id}: no record and no failed, error or skipped outcome for a test "
                                     f"with id [{test_id}]")
        over = [r.get("trial_id") for r in view.kind("generation")
                if len(r.get("generated_ids") or []) > protocol.MAX_NEW_TOKENS]
        if over:
            self.problem(f"generation {over[0]}: more new tokens than the budget of {protocol.MAX_NEW_TOKENS} per "
                         "trial")
        criteria, comparisons = view.kind("cache_criterion"), view.kind("cache_comparison")
        if criteria and comparisons and criteria[0].get("seq", 0) > comparisons[0].get("seq", 0):
            self.problem("cache_criterion was recorded after the first cache_comparison; it must be declared first")

    def tensors(self) -> None:
        unreadable = set()  # a damaged file is said once, not once per record that names it
        for record in self.view.records:
            for field_path, reference in tensor_references(record):
                where = f"{record.get('kind')} seq {record.get('seq')} {field_path}"
                try:
                    problem = self.view.tensors.check(reference)
                except TensorFileError as error:
                    if error.code == "unreadable" and error.file not in unreadable:
                        unreadable.add(error.file)
                        self.problem(str(error))
                    elif error.code != "unreadable":
                        self.problem(f"{where}: tensor file {error}")
                    continue
                if problem is not None:
                    self.problem(f"{where}: {problem}")

    def protocol(self) -> None:
        for file, data in ((MANIFEST_FILE, self.view.manifest), (PLAN_FILE, self.view.plan or {})):
            recorded = data.get("protocol")
            if not isinstance(recorded, dict):
                self.problem(f"protocol: {file} records no protocol")
                continue
            self.problems += [f"protocol: {file} {path}: recorded {found!r}, this checkout's inferlab.protocol has "
                              f"{wanted!r}" for path, found, wanted in differences(recorded, protocol.as_dict())
                              if path not in PROSE]

    def plan_folder(self) -> None:
        view = self.view
        ran = [r for r in view.records if r.get("kind") not in ("plan", "session_end")]
        if ran:
            self.problem(f"{RECORDS_FILE}: a plan folder holds {len(ran)} record(s) besides the plan, e.g. "
                         f"{ran[0].get('kind')!r} (seq {ran[0].get('seq')})")
        if view.plan is not None:
            self.problems += [f"{PLAN_FILE}: {v}" for v in protocol.cap_violations(view.plan.get("totals") or {})]


def verify_run(run: Union[Path, str, RunView]) -> dict:
    """Check a run folder (or a view of one): {plan_folder, ok, problems, completeness, complete, explained_gaps,
    not_checked, records, files_checked, outcome_counts, all_tests_passed, addenda, failures_by_check_kind,
    acquisition_failure}."""
    view = run if isinstance(run, RunView) else RunView.read(Path(run))
    checker = Verify(view)
    checker.problems += view.read_problems
    seqs = [r.get("seq") for r in view.records]
    if seqs != list(range(len(seqs))):
        first = next(i for i, s in enumerate(seqs) if s != i)
        checker.problem(f"{RECORDS_FILE}: seq is not 0..{len(seqs) - 1} in order; record {first + 1} has seq "
                        f"{seqs[first]!r}, expected {first}")
    completeness = [] if view.is_plan_folder else checker.ending()
    checker.problems = completeness + checker.problems
    steps = (checker.files, checker.addenda, checker.plan_folder) if view.is_plan_folder else (
        checker.files, checker.addenda, checker.outcomes, checker.plan, checker.session_end, checker.kinds,
        checker.tensors, checker.protocol)
    for step in steps:
        try:
            step()
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as error:
            checker.problem(f"malformed records: verify's {step.__name__} check could not read them "
                            f"({type(error).__name__}: {error}); what it checks is not established")
    outcomes = collections.Counter(r.get("outcome") for r in view.kind("test_outcome"))
    failing = collections.Counter(view.check_kind(o) for o in view.tests_by_outcome().values()
                                  if o.get("outcome") in FAILING)
    complete = bool(view.session_end and not checker.unfinished and not checker.partial and view.planned
                    and not view.planned_without_outcome() and view.session_end.get("complete") is True
                    and view.manifest.get("complete") is True)
    acquisition = (view.session_end or {}).get("acquisition_failure")
    failed = next((r for r in view.kind("artifact_acquisition") if r.get("ok") is False), None)
    if not isinstance(acquisition, dict) and failed is not None:
        from inferlab.specimen import acquisition_cause

        acquisition = {"cause": acquisition_cause(failed), "failed_tests": failing.get(INTEGRITY, 0)}
    return {"plan_folder": view.is_plan_folder, "ok": not checker.problems, "problems": checker.problems,
            "completeness": completeness, "complete": complete, "explained_gaps": checker.notes,
            "not_checked": checker.not_checked, "records": len(view.records),
            "files_checked": checker.files_checked, "outcome_counts": dict(sorted(outcomes.items())),
            "all_tests_passed": bool(outcomes) and set(outcomes) == {"passed"}, "addenda": len(view.addenda),
            "failures_by_check_kind": {kind: failing.get(kind, 0) for kind in (INTEGRITY, DIAGNOSTIC)},
            "acquisition_failure": acquisition if isinstance(acquisition, dict) else None}


def integrity_problems(result: dict) -> list[str]:
    """verify's problems but the lines that only say the run is unfinished or partial (its completeness)."""
    completeness = set(result.get("completeness") or [])
    return [line for line in result.get("problems") or [] if line not in completeness]


def manifest_sha256(view: RunView) -> Optional[str]:
    """SHA-256 of the run's manifest.json as it is now (None without one): what an addendum is bound to."""
    path = view.directory / MANIFEST_FILE if view.directory is not None else None
    return sha256_file(path) if path is not None and path.is_file() else None


def addenda_problems(view: RunView) -> list[str]:
    """verify's problems of the addenda alone (the after-run page shows them)."""
    checker = Verify(view)
    checker.addenda()
    return checker.problems
