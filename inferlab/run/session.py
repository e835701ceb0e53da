"""One session's run, from its folder's claim to its final manifest (pytest-benchmark's session.py): claim_run(),
then Run.start() (the predictions, the start manifest), emit() (one record), write_plan(), record_outcome(),
end_session() and finish() (the report, the rename, the final manifest). No pytest here: the plugin hands in plain
data and the hooks as callables; the clock and the host's facts are injected, so a test writes a run the same way."""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from inferlab import protocol, writing
from inferlab.files import os_error_words, sha256_file, write_bytes_atomic, write_json_atomic
from inferlab.measure import usage as collector
from inferlab.run import endings
from inferlab.run.endings import first_line
from inferlab.run.plan import (LAST_FAILED_SPECIMEN_KEY, Ledger, TestFacts, absent_prerequisite, case_checks,
                               experiment_files, forward_budget, make_plan, missing_tests)
from inferlab.run.records import (CLAIM_FILE, MANIFEST_FILE, PLAN_FILE, PREDICTIONS_FILE, RECORD_SCHEMA, RECORDS_FILE,
                                  REPORT_RENDERER_VERSION, TENSOR_DIR, RecordDirError, RecordLog, TensorStore,
                                  claim_new_run_dir, claim_record_dir, file_inventory, make_record, rename_ended_runs,
                                  rename_with_suffix, run_dir_name, utc_now)

STARTED_STATUS = ("started: this is the manifest written when the run began; if it still says so, the session "
                  "never reached its end (killed, or crashed)")
OPTIONS = {  # pytest's addoption settings per flag; each help text says its default
    "--record-dir": dict(dest="inferlab_record_dir", metavar="DIR", help="directory for this run's records; must be "
                         "new or empty (required with experiments unless --runs-dir is given; no default)"),
    "--runs-dir": dict(dest="inferlab_runs_dir", metavar="DIR", help="make a new record dir under this directory, "
                       "named <UTC time>-<specimen> (and -plan with --plan); at the end a suffix says how the run "
                       "ended: -failed, -findings, -partial, -partial-failed, -partial-findings or -incomplete "
                       "(docs/options.md; default: none)"),
    "--specimen": dict(dest="inferlab_specimen", metavar="NAME", default=protocol.DEFAULT_SPECIMEN,
                       help=f"specimen to run: a name with a spec in artifacts/<name>.json (default: "
                            f"{protocol.DEFAULT_SPECIMEN}; 'standin' is the synthetic, non-Pythia checkpoint)"),
    "--artifacts": dict(dest="inferlab_artifacts", metavar="DIR", help="reuse the six specimen files from this "
                        "directory after verifying them (default: none; the project cache under artifacts/cache/ is "
                        "tried, then a bounded download)"),
    "--offline": dict(dest="inferlab_offline", action="store_true", help="never open a network connection; missing "
                      "files are an error (default: off; HF_HUB_OFFLINE=1 also turns it on; the records say which)"),
    "--plan": dict(dest="inferlab_plan", action="store_true",
                   help="write plan.json and print the ordered schedule without loading a model (default: off)"),
    "--predictions": dict(dest="inferlab_predictions", metavar="FILE", help="copy this predictions file into the "
                          "record dir before any model computation (default: none)"),
    "--gc-in-spans": dict(dest="inferlab_gc_in_spans", action="store_true", help="leave Python's cyclic garbage "
                          "collector on inside the timed spans, to measure what it costs (default: off: the collector "
                          "off inside each timed block, as timeit does, after one full collection before the first "
                          "trial)"),
}


def given_options(config) -> list[str]:
    """The experiment's options this command gave, spelled as typed (a flag with its value)."""
    given = [(flag, config.getoption(settings["dest"]), settings.get("default")) for flag, settings in OPTIONS.items()]
    return [flag if value is True else f"{flag} {shlex.quote(str(value))}" for flag, value, default in given
            if value not in (default, None, False)]


@dataclass(frozen=True)
class Invocation:
    """How the session was started (the command as typed and how that is known; root: the project folder; mode: run
    or plan; named_by_plugin: under --runs-dir, where its name gains a suffix at the end)."""

    argv: tuple
    command: str
    command_how: str
    invocation_dir: str
    root: Path
    mode: str
    specimen: dict
    options: dict = field(default_factory=dict)  # artifacts, offline, offline_from, plan, collector_policy
    pytest: dict = field(default_factory=dict)  # {version, plugins}
    named_by_plugin: bool = False


def invocation_of(config, offline_from: Optional[str], pytest_version: str) -> Invocation:
    """How this session was started, read from pytest's config (never kept), with the --specimen spec (ValueError
    naming the option when it cannot run here) and what made it offline."""
    import sys

    from inferlab import specimen as specimens
    from inferlab.host import environment

    try:
        specimen = specimens.load_runnable_spec(config.getoption("inferlab_specimen"), config.rootpath / "artifacts")
    except specimens.SpecimenError as error:
        raise ValueError(f"--specimen {config.getoption('inferlab_specimen')}: {error}") from None
    command, how = environment.typed_command(getattr(sys, "orig_argv", None), sys.argv, config.invocation_params.args,
                                             config.invocation_params.dir)
    option = config.getoption
    return Invocation(
        tuple(sys.argv), command, how, str(config.invocation_params.dir), config.rootpath,
        "plan" if option("inferlab_plan") else "run", specimen.as_dict(),
        {"artifacts": option("inferlab_artifacts"), "offline": option("inferlab_offline"), "offline_from": offline_from,
         "plan": option("inferlab_plan"),
         "collector_policy": collector.policy_of(bool(option("inferlab_gc_in_spans")))},
        {"version": pytest_version, "plugins": {d.project_name: d.version
                                                for _, d in config.pluginmanager.list_plugin_distinfo()}},
        option("inferlab_runs_dir") is not None)


def offline_setting(option: bool, environ) -> tuple[bool, Optional[str]]:
    """(offline, what made it so): --offline, or HF_HUB_OFFLINE (else TRANSFORMERS_OFFLINE) as huggingface_hub
    reads it; (False, None) when neither asks for it."""
    name = next((n for n in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if environ.get(n)), None)
    if option or name is None or environ[name].upper() not in ("1", "ON", "YES", "TRUE"):
        return (True, "--offline") if option else (False, None)
    return True, f"{name}={environ[name]}"


def claim_run(invocation: Invocation, *, record_dir: Optional[Path] = None, runs_dir: Optional[Path] = None,
              pid: int, hostname: str, clock: Callable[[], str] = utc_now, host=None,
              stamp: Callable[[], int] = time.perf_counter_ns, claim_without_end=None) -> "Run":
    """Claim a new record dir (record_dir, or a new folder under runs_dir) and open the run's files in it; the claim
    is the run's first write. Under runs_dir, earlier runs killed before their end (claim_without_end, the one
    reader's, finds them) are renamed -incomplete first. RecordDirError names the option and why it cannot be used."""
    claim, ended = {"pid": pid, "hostname": hostname, "claimed_utc": clock(), "command": invocation.command}, []
    try:
        if runs_dir is not None:
            ended = rename_ended_runs(runs_dir, hostname=hostname, now=clock(), claim_without_end=claim_without_end,
                                      by={"pid": pid, "hostname": hostname, "command": invocation.command})
            record_dir = claim_new_run_dir(runs_dir, run_dir_name(invocation.specimen["name"],
                                                                  invocation.mode == "plan"), claim)
        else:
            claim_record_dir(record_dir, claim)
    except RecordDirError as error:
        raise RecordDirError(f"{'--runs-dir' if runs_dir is not None else '--record-dir'}: {error}") from None
    (Path(record_dir) / TENSOR_DIR).mkdir(exist_ok=True)
    run = Run(record_dir, invocation, clock=clock, host=host, stamp=stamp)
    run.ended_elsewhere = ended
    return run


class Run:
    """Everything one session writes or remembers. host: inferlab.host.environment, or what answers its
    environment_record(root), torch_threads(requested) and torch_build() the same way."""

    def __init__(self, record_dir: Path, invocation: Invocation, *, clock: Callable[[], str] = utc_now, host=None,
                 stamp: Callable[[], int] = time.perf_counter_ns):
        if host is None:
            from inferlab.host import environment as host
        self.record_dir, self.invocation, self.clock, self.stamp, self.host = Path(record_dir), invocation, clock, \
            stamp, host
        self.log, self.tensors = RecordLog(self.record_dir / RECORDS_FILE), TensorStore(self.record_dir / TENSOR_DIR)
        self.ledger, self.signals, self.started_utc = Ledger(), endings.SignalWatch(), clock()
        self.signals.on_abandon = lambda: endings.abandon_note(self)
        # the schedule: node ids collected (before any deselection), the facts of every collected test, plan.json,
        # every test on disk with its checks, the tests outside the schedule a test waited for
        self.collected, self.collected_facts, self.planned, self.declared = [], [], [], []
        self.plan, self.missing = None, {}
        # the outcomes: counts, failed tests by check kind, a line per failure, failed checks of the specimen
        self.counts, self.failed_by_kind, self.failure_lines, self.specimen_failures = collections.Counter(), \
            collections.Counter(), [], 0
        self.session_end = self.rename = self.environment = self.predictions = self.refused = self.end_unwritten = None
        self.write_failure: Optional[str] = None  # the first record or final manifest not written (a full disk)
        self.environment_changed, self.ended_elsewhere = [], []  # what changed mid-run; earlier runs found killed
        self.thread_request = self.forward_watch = self.network_guard = None  # set by fixtures, and by --offline
        self.forwards_by_test: dict = {}  # node id -> the forwards the watch counted while it ran
        self.hook: Callable[[dict], None] = self.store  # the record hook; its default implementation is store
        self.on_manifest: Callable[[dict], None] = lambda manifest: None  # the manifest hook
        self.write_report: Optional[Callable[[Path], None]] = None  # inferlab.report's, handed in by the plugin

    @property
    def records(self) -> list[dict]:
        return self.log.settle()

    def records_of(self, kind: str) -> list[dict]:
        return [record for record in self.log.settle() if record["kind"] == kind]

    @property
    def collector_policy(self) -> str:
        """The garbage-collector policy of the timed spans (inferlab.measure.usage), from --gc-in-spans."""
        return self.invocation.options.get("collector_policy") or collector.DEFAULT_POLICY

    def emit(self, kind: str, test: Optional[str], fields: dict, declared: Optional[tuple] = None) -> dict:
        """One record, through the record hook; ValueError when `declared` (a test's @pytest.mark.records) lacks its
        kind, so that the plan says truthfully which tests write which records."""
        if declared is not None and kind not in declared:
            raise ValueError(f"{test}: record kind {kind!r} is not declared on the test; " + (
                f"expected one of {list(declared)} (add it to @pytest.mark.records)" if declared else
                f"the test declares no record kinds (add @pytest.mark.records({kind!r}))"))
        record = make_record(kind, test, len(self.log.settle()), self.clock(), fields, self.stamp())
        self.hook(record)
        return record

    def store(self, record: dict) -> None:
        """The record hook's default: one line of records.jsonl, fsynced; after a failed write, none (cannot_write)."""
        if self.write_failure is None:
            try:
                self.log.append(record)
            except OSError as error:
                self.write_failure = f"{RECORDS_FILE}: {os_error_words(error)}"

    @property
    def cannot_write(self) -> Optional[str]:
        """Why the folder takes no more writes (a record, tensor or manifest failed: a full disk): the session fails."""
        failure = self.write_failure or self.tensors.failure
        return failure and f"writing into {self.record_dir} failed ({failure})"

    def start(self, predictions: Optional[str] = None) -> None:
        """Copy the learner's predictions before any model computation (the run goes on without them, and says so),
        then write the start manifest."""
        self.predictions = {"supplied": False, "note": "no predictions were supplied (--predictions FILE)"}
        if predictions is not None:
            data = writing.read(predictions, "--predictions:")
            write_bytes_atomic(self.record_dir / PREDICTIONS_FILE, data)
            self.predictions = {
                "supplied": True, "source": str(Path(predictions).resolve()), "copied_to": PREDICTIONS_FILE,
                "sha256": sha256_file(self.record_dir / PREDICTIONS_FILE), "copied_at_utc": self.clock(),
                "source_mtime_utc": datetime.datetime.fromtimestamp(os.stat(predictions).st_mtime,
                                                                    datetime.timezone.utc).isoformat(),
                **writing.predictions_status(data.decode("utf-8"), writing.template(self.invocation.root,
                                                                            writing.PREDICTIONS_TEMPLATE))}
        self.write_manifest(None)

    def block_network(self) -> None:
        """--offline: hub offline flags on and every connection refused, for the whole session."""
        from inferlab import specimen

        self.network_guard = contextlib.ExitStack()
        self.network_guard.enter_context(specimen.offline_mode())

    def write_plan(self, tests: list[TestFacts], *, selection: dict, named_paths=(), named_tests=False) -> dict:
        """plan.json for these tests in run order (plan.make_plan), then its plan record: where it is, its hash."""
        parts, declared = experiment_files(self.invocation.root)
        self.plan = make_plan(mode=self.invocation.mode, facts=tests, parts=parts, collected=self.collected,
                              selection=selection, named_paths=named_paths, named_tests=named_tests,
                              collector=collector.declaration(self.collector_policy))
        self.planned = [entry["test"] for entry in self.plan["schedule"]]
        self.declared = declared + case_checks(self.collected_facts, declared)
        write_json_atomic(self.record_dir / PLAN_FILE, self.plan)
        self.emit("plan", None, {"file": PLAN_FILE, "sha256": sha256_file(self.record_dir / PLAN_FILE),
                                 "mode": self.plan["mode"], "tests": len(self.planned)})
        return self.plan

    def refusal(self, facts: TestFacts) -> Optional[str]:
        """Why this test must not start (plan.Ledger), naming the tests outside the schedule that it waits for."""
        not_run = [name for name in facts.requires if name not in self.ledger.checks]
        missing = missing_tests(not_run, self.declared, self.planned)
        for test in missing:
            self.missing.setdefault(test.get("nodeid") or test["function"], test)
        selection = (self.plan or {}).get("selection") or {}
        return self.ledger.refusal(facts.nodeid, facts.requires,
                                   absent=lambda name: absent_prerequisite(name, missing, selection))

    def record_outcome(self, facts: TestFacts, *, outcome: str, phase: str, duration: float,
                       longrepr: Optional[str] = None, skip_reason: Optional[str] = None) -> dict:
        """One test's outcome: its record (a failure's full text, a skip's reason), the counts, the ledger."""
        fields = {"outcome": outcome, "phase": phase, "duration": duration}
        fields.update({"longrepr": longrepr} if outcome in ("failed", "error") else
                      {"skip_reason": skip_reason} if outcome == "skipped" else {})
        self.counts[outcome] += 1
        record = self.emit("test_outcome", facts.nodeid, fields)
        if outcome in ("failed", "error"):
            self.failed_by_kind[facts.check_kind] += 1
            self.specimen_failures += bool(set(facts.provides) & set(endings.SPECIMEN_CHECKS))
            self.failure_lines.append(f"{outcome.upper()} {facts.nodeid} (full text: {RECORDS_FILE} seq "
                                      f"{record['seq']})")
        self.ledger.update(facts.nodeid, facts.provides, outcome, phase,
                           skip_reason if outcome == "skipped" else first_line(longrepr))
        return record

    def record_report(self, facts: TestFacts, report) -> None:
        """A test's outcome from pytest's report of its call, or of a failed or skipped setup or teardown; the record
        keeps the full text, and what pytest prints may be shorter (endings.shortened_longrepr)."""
        if not (report.when == "call" or report.failed or report.skipped):
            return
        longrepr = report.longrepr
        outcome = "skipped" if report.skipped else "passed" if report.passed else \
            "failed" if report.when == "call" else "error"
        reason = (str(longrepr[2]).removeprefix("Skipped: ") if isinstance(longrepr, tuple) else
                  first_line(report.longreprtext)) if report.skipped else None
        record = self.record_outcome(facts, outcome=outcome, phase=report.when, duration=report.duration,
                                     longrepr=None if longrepr is None else report.longreprtext, skip_reason=reason)
        report.longrepr = endings.shortened_longrepr(longrepr, outcome, facts.provides, self, record["seq"]) or longrepr

    def forwards_counted(self) -> int:
        return self.forward_watch.forwards if self.forward_watch is not None else 0

    def end_session(self, *, exit_status: int, exit_code_name: str, interrupted_status: int, should_stop=False,
                    should_fail=False, tests_failed: int = 0, collect_only: bool = False) -> dict:
        """The session_end record (before the report, which reads it) from how pytest says the session ended."""
        from inferlab.host import environment
        from inferlab.specimen import acquisition_cause

        signals = list(self.signals.received)
        code_name = "INTERRUPTED" if signals else exit_code_name
        # a source file edited or a package installed mid-run, against the environment the start manifest holds
        self.environment_changed = environment.changes(self.environment, self.host.environment_record(
            self.invocation.root))
        plan_only = self.invocation.mode == "plan"
        failed = self.ledger.checks.get(endings.SPECIMEN_CHECKS[0], {}).get("status") in ("failed", "error")
        self.session_end = endings.session_end(
            exit_status=interrupted_status if signals else exit_status, exit_code_name=code_name, signals=signals,
            collect_only=collect_only, plan_only=plan_only, planned=self.planned,
            stop_reason=endings.stop_reason(exit_code_name=code_name, signals=signals, should_fail=should_fail,
                                            should_stop=self.cannot_write or should_stop, tests_failed=tests_failed,
                                            refused=self.refused, session_limit_skips=self.ledger.session_limit_skips),
            with_outcome={r["test"] for r in self.records_of("test_outcome")}, outcome_counts=self.counts,
            partial_reasons=self.plan["partial_reasons"] if self.planned else ["no experiment test was collected"],
            optional_notes=(self.plan or {}).get("optional_left_out", []), failures_by_check_kind=self.failed_by_kind,
            acquisition_failure={"cause": acquisition_cause((self.records_of("artifact_acquisition") or [{}])[-1],
                                                            bool(self.invocation.options.get("offline"))),
                                 "failed_tests": self.specimen_failures} if failed else None,
            environment_changed=self.environment_changed,
            forward_reconciliation=None if plan_only or collect_only else endings.reconcile_forwards(
                self.forwards_counted(), dict(self.forwards_by_test), forward_budget((self.plan or {}).get(
                    "schedule") or [])))
        self.emit("session_end", None, self.session_end)
        return self.session_end

    def end_pytest(self, session, exitstatus: int, exit_codes) -> int:
        """pytest's session ended (Session, ExitCode as plain data): session_end, --lf's specimen, finish(); status."""
        self.signals.finishing = True  # from here a signal is noted, and does not tear the final records
        names, status = {int(code): code.name for code in exit_codes}, int(exitstatus)
        failed_before = self.write_failure  # a write of the final records that fails is said after the status line
        end = self.end_session(exit_status=status, exit_code_name=names.get(status, f"exit status {status}"),
                               interrupted_status=int(exit_codes.INTERRUPTED), should_stop=session.shouldstop,
                               should_fail=session.shouldfail, tests_failed=session.testsfailed,
                               collect_only=bool(session.config.option.collectonly))
        if getattr(session.config, "cache", None) is not None and self.invocation.mode == "run":
            session.config.cache.set(LAST_FAILED_SPECIMEN_KEY, self.invocation.specimen["name"])
        self.finish()
        self.end_unwritten = self.cannot_write if self.write_failure != failed_before else None
        return endings.HARNESS_FAILED_EXIT if self.end_unwritten else endings.exit_status(
            end, status, int(exit_codes.OK), int(exit_codes.INTERRUPTED))

    def finish(self) -> None:
        """After session_end: the report (a failure to write it is recorded, never raised over the outcome), under
        --runs-dir the name that says how the run ended, the final manifest."""
        if self.invocation.mode != "plan" and self.write_report is not None:
            try:
                self.write_report(self.record_dir)
            except Exception as error:  # the run's records must survive a broken report
                self.emit("report_error", None, {"error": f"{type(error).__name__}: {error}"})
        self.log.close()
        suffix = endings.outcome_suffix(self.session_end, self.counts) if self.invocation.named_by_plugin else None
        if suffix is not None:
            old, error = self.record_dir.name, None
            try:
                self.record_dir = rename_with_suffix(self.record_dir, suffix)
            except RecordDirError as refused:  # the folder's name does not say how the run ended: the manifest does
                error = str(refused)
            self.rename = {"from": old, "to": None if error else self.record_dir.name, "suffix": suffix,
                           "renamed": error is None, "error": error}
        if self.write_failure is None:  # a record was lost: the start manifest stays, the folder reads unfinished
            try:
                self.write_manifest(self.session_end)
            except OSError as error:  # a full disk: the manifest written at the start stays (complete: false)
                self.write_failure = f"{MANIFEST_FILE}: {os_error_words(error)}"

    def write_manifest(self, end: Optional[dict]) -> None:
        """manifest.json: at the start with complete false; at the end with how the session ended and every file. The
        environment is the one found at the start; what differs at the end is listed, not swapped in."""
        if self.environment is None:
            self.environment = self.host.environment_record(self.invocation.root)
        invocation, policy = self.invocation, self.collector_policy
        manifest = {
            "schema": RECORD_SCHEMA, "report_renderer_version": REPORT_RENDERER_VERSION, "mode": invocation.mode,
            "complete": bool(end and end["complete"]), "status": end["status"] if end else STARTED_STATUS,
            "exit_status": end and end["exit_status"], "exit_code_name": end and end["exit_code_name"],
            "session_end": end, "signals_during_finish": list(self.signals.during_finish),
            "outcome_counts": dict(self.counts), "command": invocation.command,
            "command_reconstructed_from": invocation.command_how, "argv": list(invocation.argv),
            "invocation_dir": invocation.invocation_dir, "started_utc": self.started_utc,
            "ended_utc": self.clock() if end else None, "record_dir": str(self.record_dir),
            "record_dir_rename": self.rename, "claim": CLAIM_FILE, "specimen": invocation.specimen,
            "options": {**{k: invocation.options.get(k) for k in ("artifacts", "offline", "offline_from", "plan")},
                        "network_blocked_for_session": self.network_guard is not None, "collector_policy": policy},
            "collector": collector.declaration(policy), "predictions": self.predictions,
            "pytest": dict(invocation.pytest), "torch_threads": self.host.torch_threads(self.thread_request),
            "torch_build": self.host.torch_build(), **self.environment,
            "environment_changed_during_run": self.environment_changed if end else [],
            "checks": self.ledger.checks, "protocol": protocol.as_dict()}
        self.on_manifest(manifest)
        if end is not None:
            manifest["files"] = file_inventory(self.record_dir, exclude=(MANIFEST_FILE,))
        write_json_atomic(self.record_dir / MANIFEST_FILE, manifest)

    def close(self) -> None:
        """Release what the session held: the network block, the signal handlers."""
        if self.network_guard is not None:
            self.network_guard.close()
        self.signals.restore()
