"""A run's lifecycle, from claiming its record dir to its final manifest (the pytest-benchmark `session.py` split).

    claim_run()        refuse a used folder, claim it (claim.json, O_EXCL), open records.jsonl and tensors/
    Run.start()        copy the predictions, write the start manifest (complete false)
    Run.emit()         one record through the record hook (the default one appends and fsyncs it)
    Run.write_plan()   plan.json and its plan record
    Run.record_outcome()  a test's outcome: its record, the counts, the prerequisite ledger
    Run.end_session()  the session_end record; Run.finish(): report, close, rename, final manifest

No pytest here: the plugin hands in plain data (node ids, markers as TestFacts, exit codes) and the hooks as
callables. The wall clock and what the manifest says of the machine are injected, so a test writes a
deterministic run through this same code.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from inferlab.base import learner_text
from inferlab.base.commands import spelled
from inferlab.run import session_status
from inferlab.run.checks import CheckLedger, case_checks, first_line
from inferlab.run.interrupts import SignalWatch
from inferlab.run.plan import EXPERIMENTS_DIR, Schedule, TestFacts, forward_budget
from inferlab.run.plan import entry as plan_entry
from inferlab.base.records import (
    MANIFEST_FILE,
    PLAN_FILE,
    PREDICTIONS_FILE,
    RECORDS_FILE,
    TENSOR_DIR,
    JsonlWriter,
    TensorStore,
    claim_new_run_dir,
    claim_record_dir,
    file_inventory,
    rename_with_suffix,
    RecordDirError,
    sha256_file,
    utc_now,
    write_bytes_atomic,
    write_json_atomic,
)
from inferlab.measure import usage as collector
from inferlab.run import options, writers

NO_PREDICTIONS = {"supplied": False, "note": "no predictions were supplied (--predictions FILE)"}


@dataclass(frozen=True)
class Invocation:
    """How the session was started: fixed from the first write to the last."""

    argv: tuple  # sys.argv, as the manifest's `argv`
    command: str  # the command as the learner typed it
    command_how: str  # how `command` was reconstructed
    invocation_dir: str
    root: Path  # the project root: its source is hashed, its predictions template read
    mode: str  # "run", or "plan" with --plan
    specimen: dict  # the spec as data, "synthetic" included
    options: dict = field(default_factory=dict)  # artifacts, offline, plan
    pytest: dict = field(default_factory=dict)  # {version, plugins}
    named_by_plugin: bool = False  # made under --runs-dir: its name may gain a suffix at the end


def invocation_of(config, specimen: dict, offline_from: Optional[str], pytest_version: str) -> Invocation:
    """How this session was started, as plain data, from pytest's config (its invocation parameters, options
    and plugins; read, never kept), the specimen spec and what made the session offline."""
    import sys

    from inferlab.host import environment

    command, command_how = environment.typed_command(getattr(sys, "orig_argv", None), sys.argv,
                                                     config.invocation_params.args, config.invocation_params.dir)
    plugins = {dist.project_name: dist.version for _, dist in config.pluginmanager.list_plugin_distinfo()}
    return Invocation(
        argv=tuple(sys.argv), command=command, command_how=command_how,
        invocation_dir=str(config.invocation_params.dir), root=config.rootpath,
        mode="plan" if config.getoption("inferlab_plan") else "run", specimen=specimen,
        options={"artifacts": config.getoption("inferlab_artifacts"), "offline": config.getoption("inferlab_offline"),
                 "offline_from": offline_from, "plan": config.getoption("inferlab_plan"),
                 "collector_policy": collector.policy_of(bool(config.getoption("inferlab_gc_in_spans")))},
        pytest={"version": pytest_version, "plugins": plugins},
        named_by_plugin=config.getoption("inferlab_runs_dir") is not None)


def answered_questions(text: str, root: Path) -> dict:
    """How many of the six questions the predictions answer, judged when they are copied (inferlab.writing), so
    that a learner hears it before any output exists, while the file can still be fixed."""
    from inferlab import writing

    found = writing.question_answers(text, writing.template(root, writing.PREDICTIONS_TEMPLATE))
    return {"answered": found.answered, "answers": found.summary()}


class Surroundings:
    """What the manifest says of the process and the machine, asked when it is written."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def environment(self) -> dict:
        """Platform, distributions, lock and source hashes (environment.environment_record)."""
        from inferlab.host import environment

        return environment.environment_record(self.root)

    def torch_threads(self, requested: Optional[dict]) -> dict:
        """Requested and effective torch thread counts."""
        from inferlab.host import environment

        return environment.torch_threads(requested)

    def torch_build(self) -> dict:
        """Which torch build is installed."""
        from inferlab.host import environment

        return environment.torch_build()


@dataclass(frozen=True)
class SessionFacts:
    """What pytest says of how the session ended, as plain data."""

    exit_status: int
    exit_code_name: str  # pytest.ExitCode's name, or "exit status N"
    interrupted_status: int  # the exit status an interrupted session ends with
    should_stop: object = False
    should_fail: object = False
    tests_failed: int = 0
    collect_only: bool = False


class RecordLog:
    """records.jsonl and the records of this session in memory, in write order, with their next seq.

    A stop signal (a trial's time limit, SIGALRM; a Ctrl-C) raises wherever Python happens to be, also between a
    record's write and keeping it in memory. The file is what counts, so the memory catches up with it
    (catch_up) before every record made and every reading: a record on disk is always one the session knows, and
    a seq taken by a record that never reached the file is taken again by the next one. Otherwise a record the
    session did not know made a later record derived from its records (the memory test's counted bytes)
    contradict the file: an honest failure read as an integrity problem."""

    def __init__(self, path: Path, parse_records: Callable[[bytes], tuple]):
        self.path = Path(path)
        self.parse_records = parse_records  # inferlab.read.runview's, handed in: records are read above this layer
        self.writer = JsonlWriter(path)
        self.records: list[dict] = []
        self._known_bytes = 0  # the length of the file's lines that are in self.records

    @property
    def next_seq(self) -> int:
        """The seq of the next record made: one after the last one in the file."""
        self.catch_up()
        return self.records[-1]["seq"] + 1 if self.records else 0

    def store(self, record: dict) -> None:
        """Append one record to the file (flushed, fsynced) and keep it."""
        self.catch_up()
        self.writer.append(record)
        self.records.append(record)
        self._known_bytes = self._size()

    def _size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return self._known_bytes

    def catch_up(self) -> None:
        """Keep every whole line of the file beyond what is kept (one whose keeping a stop signal cut short)."""
        try:
            self.writer.flush()
        except (OSError, ValueError):
            return
        size = self._size()
        if size <= self._known_bytes:
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._known_bytes)
                tail = handle.read(size - self._known_bytes)
        except OSError:
            return
        whole = tail[:tail.rfind(b"\n") + 1]
        last = self.records[-1]["seq"] if self.records else -1
        found_records, _not_records = self.parse_records(whole)  # the one reader of records.jsonl's lines
        for found in found_records:
            if isinstance(found.get("seq"), int) and found["seq"] > last:
                self.records.append(found)
                last = found["seq"]
        self._known_bytes += len(whole)

    def records_of(self, kind: str) -> list[dict]:
        """This session's records of one kind, in write order."""
        self.catch_up()
        return [r for r in self.records if r["kind"] == kind]

    @property
    def acquisition_error(self) -> Optional[str]:
        """The full reason acquisition failed, printed once at the end; None when it did not fail."""
        errors = [str(r["error"]) for r in self.records_of("artifact_acquisition") if r.get("error")]
        return errors[-1] if errors else None


@dataclass
class Outcomes:
    """How many tests ended each way, and one line per failure for the terminal."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    failure_lines: list = field(default_factory=list)
    failed_by_check_kind: collections.Counter = field(default_factory=collections.Counter)  # integrity, diagnostic
    specimen_failures: int = 0  # failed tests that check the specimen's acquisition or files


@dataclass
class Ending:
    """How the session ended, once it has: the session_end fields and the folder's rename."""

    session_end: Optional[dict] = None
    rename: Optional[dict] = None  # under --runs-dir: {from, to, suffix, renamed, error}
    environment_changed: list = field(default_factory=list)  # what differs from the start's environment record


def claim_run(invocation: Invocation, *, record_dir: Optional[Path] = None, runs_dir: Optional[Path] = None,
              pid: int, hostname: str, clock: Callable[[], str] = utc_now,
              surroundings: Optional[Surroundings] = None,
              stamp: Callable[[], int] = time.perf_counter_ns,
              reader=None) -> "Run":
    """Claim a new record dir (record_dir, or a new folder under runs_dir) and open the run's files in it.

    The claim is the run's first write; RecordDirError says why a folder cannot be used. reader is
    inferlab.read.runview, handed in by the caller (a run is read above this layer): its parse_records reads the
    lines the session keeps, and under runs_dir its claim_without_end finds the earlier runs killed before their end.
    """
    from inferlab.run import ended

    claim = writers.make_claim(pid=pid, hostname=hostname, claimed_utc=clock(), command=invocation.command)
    if reader is None:
        raise ValueError("claim_run needs reader (inferlab.reading.earlier_runs): records are read through it")
    found_ended = []
    if runs_dir is not None:
        # An earlier run there whose process was killed before its end gets the -incomplete its name lacks.
        found_ended = ended.rename_ended_runs(Path(runs_dir), hostname=hostname, now=clock,
                                              by={"pid": pid, "hostname": hostname, "command": invocation.command},
                                              claim_without_end=reader.claim_without_end)
        name = options.run_dir_name(invocation.specimen["name"], invocation.mode == "plan")
        record_dir = claim_new_run_dir(Path(runs_dir), name, claim)
    else:
        record_dir = Path(record_dir)
        claim_record_dir(record_dir, claim)
    (record_dir / TENSOR_DIR).mkdir(exist_ok=True)
    run = Run(record_dir, invocation, clock=clock, surroundings=surroundings or Surroundings(invocation.root),
              stamp=stamp, parse_records=reader.parse_records)
    run.ended_elsewhere = ended.found_lines(found_ended, runs_dir) if runs_dir is not None else []
    return run


class Run:
    """Everything one session writes or remembers, each part with one job."""

    def __init__(self, record_dir: Path, invocation: Invocation, *, clock: Callable[[], str] = utc_now,
                 surroundings: Optional[Surroundings] = None, monotonic: Callable[[], float] = time.monotonic,
                 stamp: Callable[[], int] = time.perf_counter_ns, parse_records: Callable[[bytes], tuple]):
        self.record_dir = Path(record_dir)
        self.invocation = invocation
        self.clock = clock
        self.stamp = stamp  # each record's perf_counter_ns: the clock of the timing loop's own stamps
        self.surroundings = surroundings or Surroundings(invocation.root)
        self.log = RecordLog(self.record_dir / RECORDS_FILE, parse_records)
        self.tensors = TensorStore(self.record_dir / TENSOR_DIR)
        self.ledger = CheckLedger(monotonic)
        self.schedule = Schedule()
        self.outcomes = Outcomes()
        self.signals = SignalWatch()
        self.signals.on_abandon = self.abandon_note
        self.ending = Ending()
        self.started_utc = clock()
        self.environment: Optional[dict] = None  # as found at the start: the environment the run used
        self.predictions: Optional[dict] = None
        self.thread_request: Optional[dict] = None  # set by the thread controls, before any torch computation
        self.forward_watch = None  # the watch on every forward of the model (forward_mode), once it is loaded
        self.forwards_by_test: dict = {}  # node id -> forwards the watch counted while that test ran
        self.network_guard: Optional[contextlib.ExitStack] = None  # held open for the session with --offline
        self.refused: Optional[str] = None  # why the session was refused after its folder was claimed (its order)
        self.ended_elsewhere: list[str] = []  # earlier runs of --runs-dir found killed before their end (one line each)
        self.publish: Callable[[dict], None] = self.store  # the record hook; its default implementation is store
        self.on_manifest: Callable[[dict], None] = lambda manifest: None  # the manifest hook
        # report.md's writer (inferlab.report.write_report), given by the plugin: the report is a reader of runs, a
        # layer above the run as it is written, so this module does not import it; None writes no report
        self.write_report: Optional[Callable[[Path], None]] = None

    # --- records ---------------------------------------------------------------------------------

    @property
    def records(self) -> list[dict]:
        """This session's records so far, in write order."""
        self.log.catch_up()
        return self.log.records

    def records_of(self, kind: str) -> list[dict]:
        """This session's records of one kind, in write order."""
        return self.log.records_of(kind)

    @property
    def collector_policy(self) -> str:
        """The garbage-collector policy of this run's timed spans (inferlab.measure.collector), from --gc-in-spans."""
        return self.invocation.options.get("collector_policy") or collector.DEFAULT_POLICY

    def emit(self, kind: str, test: Optional[str], fields: dict) -> dict:
        """Make a record (envelope + fields) and hand it to the record hook; returns it."""
        record = writers.make_record(kind, test, self.log.next_seq, self.clock(), fields, self.stamp())
        self.publish(record)
        return record

    def emit_declared(self, facts: TestFacts, kind: str, fields: dict) -> dict:
        """A record a test writes: refused (ValueError) unless the test declares its kind (@pytest.mark.records),
        so that the plan says truthfully which tests produce which records."""
        refused = writers.undeclared_kind(facts.nodeid, kind, facts.records)
        if refused is not None:
            raise ValueError(refused)
        return self.emit(kind, facts.nodeid, fields)

    def store(self, record: dict) -> None:
        """The record hook's default: append the record to records.jsonl and keep it."""
        self.log.store(record)

    # --- start ---------------------------------------------------------------------------------

    def start(self, predictions_source: Optional[str] = None) -> None:
        """Copy the learner's predictions (before any model computation) and write the start manifest."""
        self.predictions = self._copy_predictions(predictions_source)
        self.write_manifest(None)

    def block_network(self) -> None:
        """--offline: hub offline flags on and every connection refused, for the whole session."""
        from inferlab import specimen

        self.network_guard = contextlib.ExitStack()
        self.network_guard.enter_context(specimen.offline_mode())

    def _copy_predictions(self, source: Optional[str]) -> dict:
        """Copy the predictions into the record dir; say so when there are none, and when the file is still
        the blank template (the run goes on either way)."""
        from inferlab.run import predictions

        if source is None:
            return dict(NO_PREDICTIONS)
        source_path = Path(source)
        target = self.record_dir / PREDICTIONS_FILE
        data = learner_text.read(source_path, "--predictions:")  # checked before the claim too (run.options)
        write_bytes_atomic(target, data)
        text = data.decode("utf-8")
        modified = datetime.datetime.fromtimestamp(source_path.stat().st_mtime, datetime.timezone.utc)
        return {
            "supplied": True,
            "source": str(source_path.resolve()),
            "copied_to": PREDICTIONS_FILE,
            "sha256": sha256_file(target),
            "source_mtime_utc": modified.isoformat(),
            "copied_at_utc": self.clock(),
            **predictions.template_status(text, predictions.read_template(self.invocation.root)),
            **answered_questions(text, self.invocation.root),
        }

    # --- the schedule and the tests --------------------------------------------------------------

    def write_plan(self, tests: list[TestFacts], *, parts: list[dict], selection: dict,
                   named_paths: list[str] = (), named_tests: bool = False) -> dict:
        """plan.json for these tests (in run order), then its plan record; returns the plan.

        parts: the experiment files on disk (session_status.experiment_parts); selection: the options that
        shrank the schedule (plan.selection_of); named_paths: experiment paths named instead of the folder.
        """
        written = writers.make_plan(
            mode=self.invocation.mode, entries=[plan_entry(index, facts) for index, facts in enumerate(tests)],
            parts=parts, collected=self.schedule.collected, deselected=self.schedule.deselected,
            selection=selection, named_paths=list(named_paths), named_tests=named_tests,
            collector_policy=self.collector_policy)
        self.schedule.adopt(written)
        self.schedule.declared = session_status.experiment_checks(self.invocation.root, EXPERIMENTS_DIR)
        self.schedule.declared += case_checks(self.schedule.collected_facts, self.schedule.declared)
        write_json_atomic(self.record_dir / PLAN_FILE, written)
        self.emit("plan", None, writers.make_plan_record(written))
        return written

    def refusal(self, facts: TestFacts) -> Optional[str]:
        """Why this test must not start (checks.CheckLedger.refusal), naming any prerequisite test that is not in
        this session's schedule and how to include it."""
        from inferlab.run.checks import absent_prerequisite, missing_tests

        selection = (self.schedule.plan or {}).get("selection") or {}
        not_run = [name for name in facts.requires if self.ledger.status_of(name) is None]
        for test in missing_tests(not_run, self.schedule.declared, self.schedule.planned):
            self.schedule.missing.setdefault(test.get("nodeid") or test["function"], test)
        return self.ledger.refusal(facts.nodeid, facts.requires, absent=lambda name: absent_prerequisite(
            name, self.schedule.declared, self.schedule.planned, selection, also=not_run))

    def record_outcome(self, facts: TestFacts, *, outcome: str, phase: str, duration: float,
                       longrepr: Optional[str], skip_reason: Optional[str]) -> dict:
        """One test's outcome: its test_outcome record, the counts, a failure line, the checks it provides."""
        self.outcomes.counts[outcome] += 1
        record = self.emit("test_outcome", facts.nodeid, writers.make_test_outcome(
            outcome=outcome, phase=phase, duration=duration, longrepr=longrepr, skip_reason=skip_reason,
            check_kind=facts.check_kind))
        if outcome in ("failed", "error"):
            self.outcomes.failed_by_check_kind[facts.check_kind] += 1
            self.outcomes.specimen_failures += bool(set(facts.provides) & set(session_status.SPECIMEN_CHECKS))
            self.outcomes.failure_lines.append(
                f"{outcome.upper()} {facts.nodeid} (full text: {RECORDS_FILE} seq {record['seq']})")
        reason = skip_reason if outcome == "skipped" else first_line(longrepr)
        self.ledger.update(facts.nodeid, facts.provides, outcome, phase, reason)
        return record

    def forwards_counted(self) -> int:
        """Every forward of the model so far (0 before it is loaded)."""
        return self.forward_watch.forwards if self.forward_watch is not None else 0

    def forward_reconciliation(self, collect_only: bool) -> Optional[dict]:
        """Every forward of the session against the plan's forward totals; None for a plan or a collection."""
        if self.invocation.mode == "plan" or collect_only:
            return None
        entries = (self.schedule.plan or {}).get("schedule") or []
        return session_status.reconcile_forwards(self.forwards_counted(), dict(self.forwards_by_test),
                                                 forward_budget(entries))

    # --- the end -------------------------------------------------------------------------------

    def end_session(self, facts: SessionFacts) -> dict:
        """The session_end record (written before the report, which reads it): how the session ended."""
        signals = list(self.signals.received)
        code_name = "INTERRUPTED" if signals else facts.exit_code_name
        # Before the report and the terminal, which say so: a source file edited or a package installed mid-run.
        self.ending.environment_changed = self.environment_changes()
        reason = session_status.stop_reason(
            exit_code_name=code_name, signals=signals, should_stop=facts.should_stop,
            should_fail=facts.should_fail, tests_failed=facts.tests_failed,
            session_limit_skips=self.ledger.session_limit_skips, refused=self.refused)
        end = writers.make_session_end(
            exit_status=facts.interrupted_status if signals else facts.exit_status, exit_code_name=code_name,
            signals=signals, collect_only=facts.collect_only, plan_only=self.invocation.mode == "plan",
            stopped_reason=reason, planned=self.schedule.planned,
            with_outcome={r["test"] for r in self.records_of("test_outcome")},
            partial_reasons=self.schedule.partial_reasons(),
            optional_notes=self.schedule.status.get("optional_left_out", []),
            outcome_counts=self.outcomes.counts, failures_by_check_kind=dict(self.outcomes.failed_by_check_kind),
            environment_changed=self.ending.environment_changed,
            forward_reconciliation=self.forward_reconciliation(facts.collect_only),
            acquisition_failure=self.acquisition_failure())
        self.ending.session_end = end
        self.emit("session_end", None, end)
        return end

    def acquisition_failure(self) -> Optional[dict]:
        """{cause, failed_tests} when the acquisition check failed (the specimen could not be acquired), else None."""
        from inferlab.specimen import acquisition_cause

        check = self.ledger.checks.get(session_status.SPECIMEN_CHECKS[0]) or {}
        if check.get("status") not in ("failed", "error"):
            return None
        record = (self.records_of("artifact_acquisition") or [{}])[-1]
        return {"cause": acquisition_cause(record, bool(self.invocation.options.get("offline"))),
                "failed_tests": self.outcomes.specimen_failures}

    def finish(self) -> None:
        """After session_end: the report (not for a plan), close the records, rename, the final manifest."""
        end = self.ending.session_end
        if self.invocation.mode != "plan":
            self._write_report()
        self.log.writer.close()
        if self.invocation.named_by_plugin:
            self._add_outcome_suffix(end)
        self.write_manifest(end)

    def _write_report(self) -> None:
        """The report is evidence too: a failure to write it is recorded, not raised over the outcome."""
        if self.write_report is None:
            return
        try:
            self.write_report(self.record_dir)
        except Exception as error:  # the run's records must survive a broken report
            self.emit("report_error", None, {"error": f"{type(error).__name__}: {error}"})

    def _add_outcome_suffix(self, end: dict) -> None:
        """Rename a run made under --runs-dir so its name says how it ended; when that fails, say so."""
        suffix = session_status.outcome_suffix(end, self.outcomes.counts)
        if suffix is None:
            return
        old_name = self.record_dir.name
        try:
            self.record_dir = rename_with_suffix(self.record_dir, suffix)
        except RecordDirError as error:
            # The folder keeps a name that does not say how the run ended: the manifest and the terminal say so.
            self.ending.rename = writers.make_rename(old_name=old_name, new_name=None, suffix=suffix, error=str(error))
            return
        self.ending.rename = writers.make_rename(old_name=old_name, new_name=self.record_dir.name, suffix=suffix,
                                                 error=None)

    def write_manifest(self, end: Optional[dict]) -> None:
        """manifest.json: at the start with complete false; at the end with how the session ended and every file."""
        # The environment is recorded as it was at the start, when the code that ran was read; anything found
        # different at the end (a source file edited mid-run, a package installed) is listed, not swapped in.
        if self.environment is None:
            self.environment = self.surroundings.environment()
        changed = (self.ending.environment_changed if self.ending.session_end is not None
                   else self.environment_changes()) if end else []
        manifest = writers.make_manifest(
            invocation=self.invocation, started_utc=self.started_utc, ended_utc=self.clock() if end else None,
            end=end, signals_during_finish=self.signals.during_finish, outcome_counts=self.outcomes.counts,
            record_dir=str(self.record_dir), rename=self.ending.rename, predictions=self.predictions,
            network_blocked=self.network_guard is not None,
            torch_threads=self.surroundings.torch_threads(self.thread_request),
            torch_build=self.surroundings.torch_build(), environment=self.environment,
            environment_changed=changed, checks=self.ledger.checks)
        self.on_manifest(manifest)
        if end is not None:
            manifest["files"] = file_inventory(self.record_dir, exclude=(MANIFEST_FILE,))
        write_json_atomic(self.record_dir / MANIFEST_FILE, manifest)

    def environment_changes(self) -> list[str]:
        """What differs now from the environment recorded at the start, one line per changed field."""
        from inferlab.host import environment

        if self.environment is None:
            return []
        return environment.changes(self.environment, self.surroundings.environment())

    def abandon_note(self) -> str:
        """Where an abandoned run stands, for the one line printed when its final records are abandoned."""
        try:
            self.log.writer.flush()  # a record line already handed to the writer is kept whole
        except (OSError, ValueError):
            pass
        try:
            final = json.loads((self.record_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("session_end")
        except (OSError, ValueError, AttributeError):
            final = None
        if final is not None:
            return (f"Its final records were already written in {self.record_dir}; only the terminal summary is "
                    f"cut short.")
        renamed = ""
        if self.invocation.named_by_plugin:  # its name must not look like a good run's until a later run renames it
            from inferlab.run import ended

            folder = ended.rename_abandoned(self.record_dir, now=self.clock,
                                            by={"pid": os.getpid(), "command": self.invocation.command})
            if folder is not None:
                renamed, self.record_dir = f"It is renamed {folder.name} now ({ended.RENAME_NOTE} says why). ", folder
        return (f"{renamed}{self.record_dir} keeps the manifest written when the run began (complete: false), so it "
                f"reads as unfinished; `{spelled(f'verify {self.record_dir}')}` lists what it holds.")

    def close(self) -> None:
        """Release what the session held: the network block, the signal handlers."""
        if self.network_guard is not None:
            self.network_guard.close()
        self.signals.restore()
