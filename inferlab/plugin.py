"""The pytest face of inferlab: options, the record hook, outcomes, manifest, bounds, plan, fixtures.

This and hookspec.py are the only modules that import pytest. The library functions they
call return plain data; this module turns them into records and test outcomes.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from inferlab import protocol, revised_criterion, session_status
from inferlab.interrupts import SignalWatch
from inferlab.records import (
    CLAIM_FILE,
    MANIFEST_FILE,
    PLAN_FILE,
    PREDICTIONS_FILE,
    RECORD_SCHEMA,
    RECORDS_FILE,
    REPORT_FILE,
    TENSOR_DIR,
    JsonlWriter,
    RecordDirError,
    TensorStore,
    claim_new_run_dir,
    claim_record_dir,
    describe_path,
    file_inventory,
    jsonable,
    rename_with_suffix,
    sha256_file,
    utc_now,
    write_json_atomic,
)

HELP = {
    "record_dir": "directory for this run's records; must be new or empty (required with experiments unless "
                  "--runs-dir is given; no default)",
    "runs_dir": "make a new record dir under this directory, named <UTC time>-<specimen> (and -plan with --plan); "
                "at the end a suffix says how the run ended: -failed, -partial, -partial-failed or -incomplete "
                "(default: none)",
    "specimen": f"specimen to run: a name with a spec in artifacts/<name>.json (default: {protocol.DEFAULT_SPECIMEN}; "
    f"'standin' is the synthetic, non-Pythia checkpoint)",
    "artifacts": "reuse the six specimen files from this directory after verifying them (default: none; "
    "the project cache under artifacts/cache/ is tried, then a bounded download)",
    "offline": "never open a network connection; missing files are an error (default: off)",
    "plan": "write plan.json and print the ordered schedule without loading a model (default: off)",
    "predictions": "copy this predictions file into the record dir before any model computation (default: none)",
    "revised_cache_criterion": "also judge the cache comparison under this justified revised criterion ATOL,RTOL "
    f"(e.g. 1e-4,1e-3), recorded beside the declared {protocol.CACHE_TOLERANCE.describe()}, which keeps its "
    "verdict; needs --justification (default: none, the declared criterion only)",
    "justification": "why the revised cache criterion is justified; recorded with it (default: none; "
    "required with --revised-cache-criterion)",
}

RUN_KEY = pytest.StashKey["RunState"]()
ROOT_CAUSE_KEY = pytest.StashKey[str]()  # why an item was skipped for a prerequisite
EXPERIMENTS_DIR = "experiments"
RESERVED_FIELDS = frozenset({"kind", "test", "seq", "wall_time"})
STOPPING_LISTENER = "inferlab-stopping-listener"


@dataclass
class RunState:
    """Everything one experiment session writes or remembers, kept in config.stash."""

    record_dir: Path
    writer: JsonlWriter
    tensors: TensorStore
    command_line: list[str]  # sys.argv, as the manifest's `argv` (and, for older readers, `command_line`)
    command: str = ""  # the command as the learner typed it
    command_how: str = ""
    named_by_plugin: bool = False  # made under --runs-dir: its name may gain a suffix at the end
    signals: SignalWatch = field(default_factory=SignalWatch)
    started_utc: str = field(default_factory=utc_now)
    setup_done_monotonic: Optional[float] = None  # when protocol.SETUP_DONE_CHECK passed
    seq: int = 0
    records: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)  # check name -> {"status", "by", "reason"}
    outcome_counts: collections.Counter = field(default_factory=collections.Counter)
    failure_lines: list = field(default_factory=list)
    thread_request: Optional[dict] = None
    predictions: Optional[dict] = None
    specimen: Optional[dict] = None  # the spec as data, "synthetic" included
    offline_guard: Optional[contextlib.ExitStack] = None  # held open for the session with --offline
    collected: list = field(default_factory=list)  # experiment node ids before any deselection
    deselected: list = field(default_factory=list)  # experiment node ids deselected (-k, -m, --lf, ...)
    planned: list = field(default_factory=list)  # experiment node ids after selection: the plan
    plan_status: dict = field(default_factory=dict)  # partial_reasons, protocol_complete, optional_left_out
    session_limit_skips: int = 0
    acquisition_error: Optional[str] = None  # the full reason, printed once at the end
    session_end: Optional[dict] = None
    environment: Optional[dict] = None  # as found at the start: the environment the run used
    rename: Optional[dict] = None  # under --runs-dir: {from, to, suffix, renamed, error} once the name was changed

    def records_of(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["kind"] == kind]


# --- options -----------------------------------------------------------------------------


def pytest_addhooks(pluginmanager):
    from inferlab import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser):
    group = parser.getgroup("inferlab", "inferlab experiment")
    group.addoption("--record-dir", dest="inferlab_record_dir", metavar="DIR", default=None, help=HELP["record_dir"])
    group.addoption("--runs-dir", dest="inferlab_runs_dir", metavar="DIR", default=None, help=HELP["runs_dir"])
    group.addoption("--specimen", dest="inferlab_specimen", metavar="NAME", default=protocol.DEFAULT_SPECIMEN,
                    help=HELP["specimen"])
    group.addoption("--artifacts", dest="inferlab_artifacts", metavar="DIR", default=None, help=HELP["artifacts"])
    group.addoption("--offline", dest="inferlab_offline", action="store_true", default=False, help=HELP["offline"])
    group.addoption("--plan", dest="inferlab_plan", action="store_true", default=False, help=HELP["plan"])
    group.addoption("--predictions", dest="inferlab_predictions", metavar="FILE", default=None,
                    help=HELP["predictions"])
    group.addoption("--revised-cache-criterion", dest="inferlab_revised_cache_criterion", metavar="ATOL,RTOL",
                    default=None, type=revised_criterion.parse_criterion, help=HELP["revised_cache_criterion"])
    group.addoption("--justification", dest="inferlab_justification", metavar="TEXT", default=None,
                    help=HELP["justification"])


def pytest_configure(config):
    config.addinivalue_line("markers", "provides(name): this test establishes the named check for later tests")
    config.addinivalue_line("markers", "requires(*names): skip unless every named check passed earlier")
    config.addinivalue_line("markers", "budget(category, selections=0, forwards=0, calls=0): what the test spends")
    config.addinivalue_line("markers", "records(*kinds): the record kinds this test writes; the plan carries them, "
                                       "readers ask the plan which tests produce a kind, and the record fixture "
                                       "refuses any other kind")
    config.addinivalue_line("markers", "optional_extension: an optional part of the protocol (on a module): "
                                       "leaving it out does not make a run partial")
    config.addinivalue_line("markers", "batching: the optional batching extension (deselect with -m 'not batching')")
    config.addinivalue_line("markers", "diagnostic: a protocol diagnostic or observation; its failure is a finding "
                                       "about the computation, kept with its evidence, not a broken harness")

    try:  # the two options go together; checked before anything is written
        revised_criterion.check_options(config.getoption("inferlab_revised_cache_criterion"),
                                        config.getoption("inferlab_justification"))
    except revised_criterion.RevisedCriterionError as error:
        raise pytest.UsageError(str(error)) from None
    raw_dir = config.getoption("inferlab_record_dir")
    runs_dir = config.getoption("inferlab_runs_dir")
    if raw_dir is None and runs_dir is None:
        return
    if raw_dir is not None and runs_dir is not None:
        raise pytest.UsageError("--record-dir and --runs-dir: give one of them, not both")
    # Everything that can be checked without writing is checked first: a refused run writes nothing.
    specimen_spec = _load_specimen_spec(config)
    predictions = _check_paths(config, raw_dir, runs_dir)
    from inferlab import environment

    command, command_how = environment.typed_command(getattr(sys, "orig_argv", None), sys.argv,
                                                     config.invocation_params.args, config.invocation_params.dir)
    claim = {"pid": os.getpid(), "hostname": socket.gethostname(), "claimed_utc": utc_now(), "command": command}
    try:
        if runs_dir is not None:
            record_dir = claim_new_run_dir(Path(os.path.expanduser(runs_dir)),
                                           _run_dir_name(specimen_spec.name, config.getoption("inferlab_plan")), claim)
        else:
            record_dir = Path(os.path.expanduser(raw_dir))
            claim_record_dir(record_dir, claim)  # the first write of the run
    except RecordDirError as error:
        option = "--runs-dir" if runs_dir is not None else "--record-dir"
        raise pytest.UsageError(f"{option}: {error}") from None

    (record_dir / TENSOR_DIR).mkdir(exist_ok=True)
    run = RunState(
        record_dir=record_dir,
        writer=JsonlWriter(record_dir / RECORDS_FILE),
        tensors=TensorStore(record_dir / TENSOR_DIR),
        command_line=list(sys.argv),
        command=command,
        command_how=command_how,
        named_by_plugin=runs_dir is not None,
    )
    run.specimen = specimen_spec.as_dict()
    run.signals.on_abandon = lambda: _abandon_note(run)
    config.stash[RUN_KEY] = run
    if run.signals.install():
        config.pluginmanager.register(_StoppingListener(run.signals), STOPPING_LISTENER)
    if config.getoption("inferlab_offline"):
        # For the whole session, not only acquisition: hub offline flags on, every connection refused.
        from inferlab import specimen

        run.offline_guard = contextlib.ExitStack()
        run.offline_guard.enter_context(specimen.offline_mode())
    run.predictions = _copy_predictions(predictions, record_dir, config.rootpath)
    _write_manifest(config, run, None)


def _check_paths(config, raw_dir: Optional[str], runs_dir: Optional[str]) -> Optional[str]:
    """Refuse, as usage errors and before anything is written, every path option that cannot work.

    An empty path would mean the current folder; --artifacts must be a directory; the run must not be
    written into the specimen copy; --predictions must be a regular file. Returns the predictions path.
    """
    options = {"--record-dir": raw_dir, "--runs-dir": runs_dir,
               "--artifacts": config.getoption("inferlab_artifacts"),
               "--predictions": config.getoption("inferlab_predictions")}
    wanted = {"--record-dir": "a new directory, e.g. --record-dir runs/first",
              "--runs-dir": "the folder for new runs, e.g. --runs-dir runs",
              "--artifacts": "the directory that holds the specimen's files",
              "--predictions": "your copy of predictions.md"}
    for option, value in options.items():
        if value is not None and not value.strip():
            raise pytest.UsageError(f"{option}: the path is empty ({value!r}), which would mean the current folder; "
                                    f"name {wanted[option]}")
    artifacts = options["--artifacts"]
    if artifacts is not None:
        where = Path(os.path.expanduser(artifacts))
        if not os.path.isdir(where):  # False, not an error, for a path that cannot be examined
            raise pytest.UsageError(f"--artifacts: {where} {describe_path(where)}; expected a directory that holds "
                                    f"the specimen's files (check it first: python -m inferlab check-artifacts DIR)")
        for option in ("--record-dir", "--runs-dir"):
            if options[option] is None:
                continue
            target = Path(os.path.expanduser(options[option]))
            try:
                inside = target.resolve().is_relative_to(where.resolve())
            except (OSError, RuntimeError):
                inside = False  # refused later with its own reason if it cannot be used at all
            if inside:
                raise pytest.UsageError(f"{option}: {target} is inside the --artifacts folder {where}: the run would "
                                        f"be written into the specimen copy; choose a folder outside it")
    predictions = options["--predictions"]
    if predictions is None:
        return None
    predictions = os.path.expanduser(predictions)
    if not os.path.isfile(predictions):
        what = describe_path(predictions)
        what += ", not a regular file" if what.startswith("is ") else ""
        raise pytest.UsageError(f"--predictions: {predictions} {what}; expected your copy of predictions.md")
    return predictions


def _abandon_note(run: RunState) -> str:
    """Where an abandoned run stands, for the one line printed when its final records are abandoned."""
    try:
        run.writer.flush()  # a record line already handed to the writer is kept whole
    except (OSError, ValueError):
        pass
    try:
        final = json.loads((run.record_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("session_end")
    except (OSError, ValueError, AttributeError):
        final = None
    if final is not None:
        return f"Its final records were already written in {run.record_dir}; only the terminal summary is cut short."
    return (f"{run.record_dir} keeps the manifest written when the run began (complete: false), so it reads as "
            f"unfinished; `python -m inferlab verify {run.record_dir}` lists what it holds.")


def _run_dir_name(specimen_name: str, plan: bool) -> str:
    """<UTC time>-<specimen>, and -plan for a plan: `ls runs` tells specimens and plans apart."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{specimen_name}" + ("-plan" if plan else "")


def _load_specimen_spec(config):
    """The --specimen spec, read before anything is written, so a bad name is a usage error."""
    from inferlab import specimen

    name = config.getoption("inferlab_specimen")
    try:
        spec = specimen.load_spec(name, config.rootpath / "artifacts")
    except specimen.SpecimenError as error:
        raise pytest.UsageError(f"--specimen {name}: {error}") from None
    problem = specimen.local_build_problem(spec)
    if problem:
        raise pytest.UsageError(f"--specimen {name}: {problem}")
    return spec


def _copy_predictions(source: Optional[str], record_dir: Path, root: Path) -> dict:
    """Copy the learner's predictions before any model computation; say so when there are none, and
    when the file is still the blank template (the run goes on either way)."""
    from inferlab import predictions

    if source is None:
        return {"supplied": False, "note": "no predictions were supplied (--predictions FILE)"}
    source_path = Path(source)
    target = record_dir / PREDICTIONS_FILE
    shutil.copyfile(source_path, target)
    text = target.read_text(encoding="utf-8", errors="replace")
    return {
        "supplied": True,
        "source": str(source_path.resolve()),
        "copied_to": PREDICTIONS_FILE,
        "sha256": sha256_file(target),
        "source_mtime_utc": _mtime_utc(source_path),
        "copied_at_utc": utc_now(),
        **predictions.template_status(text, predictions.read_template(root)),
    }


def _mtime_utc(path: Path) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat()


def get_run(config) -> Optional[RunState]:
    """The run state, or None when no --record-dir was given."""
    return config.stash.get(RUN_KEY, None)


# --- records -----------------------------------------------------------------------------


def emit(config, kind: str, test: Optional[str], fields: dict) -> dict:
    """Build a record (kind, test, seq, wall_time + fields) and hand it to every record hook."""
    run = get_run(config)
    if run is None:
        raise RuntimeError("no --record-dir: records cannot be written")
    clashing = RESERVED_FIELDS & set(fields)
    if clashing:
        raise ValueError(f"record {kind!r}: fields {sorted(clashing)} are reserved for the record envelope")
    warnings_seen = []
    record = {"kind": kind, "test": test, "seq": run.seq, "wall_time": utc_now()}
    record.update(jsonable(fields, warnings_seen.append))
    if warnings_seen:
        record["serialisation_warnings"] = warnings_seen
    run.seq += 1
    config.hook.pytest_inferlab_record(config=config, record=record)
    return record


@pytest.hookimpl(trylast=True)
def pytest_inferlab_record(config, record):
    run = get_run(config)
    run.writer.append(record)
    run.records.append(record)
    if record["kind"] == "artifact_acquisition" and record.get("error"):
        run.acquisition_error = str(record["error"])


# --- collection: experiment items, bounds, plan ---------------------------------------------


def is_experiment(item) -> bool:
    root = item.config.rootpath / EXPERIMENTS_DIR
    try:
        return item.path.is_relative_to(root)
    except AttributeError:
        return False


@pytest.hookimpl(tryfirst=True)  # before -k, -m, --deselect and --lf remove anything
def pytest_collection_modifyitems(session, config, items):
    experiments = [item for item in items if is_experiment(item)]
    if not experiments:
        return
    run = get_run(config)
    if run is None:
        raise pytest.UsageError(
            "--record-dir DIR (or --runs-dir DIR) is required to run the experiments (use a new directory, "
            "e.g. runs/first)"
        )
    run.collected = [item.nodeid for item in experiments]
    if not (hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer")):
        raise pytest.UsageError(
            f"this platform ({sys.platform}) has no POSIX interval timers, so the {protocol.TRIAL_LIMIT_S} s "
            f"per-trial limit cannot be enforced; the experiments refuse to run unbounded"
        )
    for item in experiments:
        if item.get_closest_marker("timeout") is None:
            # func_only: the limit is for the trial itself, not the session fixtures (download, load)
            # that the first test to need them happens to set up.
            item.add_marker(pytest.mark.timeout(protocol.TRIAL_LIMIT_S, method="signal", func_only=True))


def pytest_deselected(items):
    experiments = [item for item in items if is_experiment(item)]
    run = get_run(experiments[0].config) if experiments else None
    if run is not None:
        run.deselected.extend(item.nodeid for item in experiments)


def plan_entries(items) -> list[dict]:
    """The ordered schedule: each experiment test with its parameters, budget and prerequisites."""
    entries = []
    for index, item in enumerate(i for i in items if is_experiment(i)):
        budget = item.get_closest_marker("budget")
        params = getattr(getattr(item, "callspec", None), "params", {})
        entries.append({
            "index": index,
            "test": item.nodeid,
            "params": {name: _plain(value) for name, value in params.items()},
            "budget": dict(budget.kwargs) if budget else None,
            "requires": [n for m in item.iter_markers("requires") for n in m.args],
            "provides": [n for m in item.iter_markers("provides") for n in m.args],
            "timeout_s": _timeout_of(item),
            "check_kind": check_kind(item),
            "records": declared_records(item),
            "optional": item.get_closest_marker("optional_extension") is not None,
        })
    return entries


def declared_records(item) -> list[str]:
    """The record kinds a test declares with @pytest.mark.records(...), in order, each once."""
    return list(dict.fromkeys(kind for marker in item.iter_markers("records") for kind in marker.args))


def check_kind(item) -> str:
    """'diagnostic' for a protocol diagnostic (marked), else 'integrity': the harness, inputs and trials."""
    return "diagnostic" if item.get_closest_marker("diagnostic") is not None else "integrity"


def _plain(value):
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return {**asdict(value), "test_id": getattr(value, "test_id", None)}
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _timeout_of(item):
    marker = item.get_closest_marker("timeout")
    return marker.args[0] if marker and marker.args else None


def plan_totals(entries: list[dict]) -> dict:
    """Trials, selections, forwards and calls of the collected schedule, named like protocol.CAPS."""
    totals = collections.Counter()
    for entry in entries:
        budget = entry["budget"] or {}
        category = budget.get("category")
        selections = budget.get("selections", 0)
        if category == "generation":
            totals["generation_trials"] += 1
            totals["generation_new_tokens"] += selections
        elif category in ("timing_warmup", "timing_measured"):
            totals["timing_warmups" if category == "timing_warmup" else "timing_measured"] += 1
            totals["timing_selections"] += selections
        elif category == "cache":
            totals["cache_forwards"] += budget.get("forwards", 0)
        elif category == "batching":
            totals["batching_calls"] += budget.get("calls", 0)
        elif category == "memory":
            totals["memory_forwards"] += budget.get("forwards", 0)
    totals["core_trials"] = totals["generation_trials"] + totals["timing_warmups"] + totals["timing_measured"]
    totals["core_selections"] = totals["generation_new_tokens"] + totals["timing_selections"]
    # memory_forwards has no cap in the protocol: it is listed so that no forward goes uncounted.
    return {name: totals.get(name, 0) for name in (*protocol.CAPS, "memory_forwards")}


def build_plan(items, config, run: RunState) -> dict:
    """plan.json: the schedule, its totals against the caps, and every way it falls short of the protocol."""
    entries = plan_entries(items)
    totals = plan_totals(entries)
    planned = [entry["test"] for entry in entries]
    selection = _selection(config)
    named_paths, named_tests = _named_experiment_paths(config)
    parts = session_status.part_counts(session_status.experiment_parts(config.rootpath, EXPERIMENTS_DIR),
                                       run.collected or planned, planned)
    shortfalls, optional_notes = session_status.plan_shortfalls(totals, parts, named_tests)
    optional_files = {part["file"] for part in parts if part["optional"]}
    core_deselected = [n for n in run.deselected if session_status.file_of(n) not in optional_files]
    partial_reasons = session_status.selection_reasons(selection, len(core_deselected), named_paths) + shortfalls
    return {
        "schema": RECORD_SCHEMA,
        "mode": "plan" if config.getoption("inferlab_plan") else "run",
        "protocol": protocol.as_dict(),
        "schedule": entries,
        "totals": totals,
        "caps": dict(protocol.CAPS),
        "cap_violations": protocol.cap_violations(totals),
        "shortfalls": shortfalls,
        "parts": parts,
        "selection": {**selection, "named_paths": named_paths, "deselected": len(run.deselected)},
        "protocol_complete": not partial_reasons,
        "partial_reasons": partial_reasons,
        "optional_left_out": optional_notes,
    }


def _selection(config) -> dict:
    """The options in effect that can shrink the schedule."""
    option = config.option
    last_failed = config.pluginmanager.get_plugin("lfplugin")  # None with -p no:cacheprovider
    return {
        "keyword": getattr(option, "keyword", "") or None,
        "markexpr": getattr(option, "markexpr", "") or None,
        "deselect": list(getattr(option, "deselect", None) or []),
        # --lf narrows the run only when failures are on record; otherwise it runs everything.
        "last_failed": bool(getattr(option, "lf", False) and last_failed is not None
                            and getattr(last_failed, "lastfailed", None)),
        "stepwise": bool(getattr(option, "stepwise", False) or getattr(option, "stepwise_skip", False)),
    }


def _named_experiment_paths(config) -> tuple[list[str], bool]:
    """The command-line paths inside experiments/ when the folder as a whole was not named; node ids named?"""
    root = (config.rootpath / EXPERIMENTS_DIR).resolve()
    base = Path(config.invocation_params.dir)
    whole, inside = False, []
    for arg in config.args:
        path = (base / arg.split("::")[0]).resolve()
        if root == path or root.is_relative_to(path):
            whole = whole or "::" not in arg
        elif path.is_relative_to(root):
            inside.append(arg)
    if whole:
        return [], False
    return inside, any("::" in arg for arg in inside)


def pytest_collection_finish(session):
    run = get_run(session.config)
    if run is None or not any(is_experiment(i) for i in session.items):
        return
    plan = build_plan(session.items, session.config, run)
    run.planned = [entry["test"] for entry in plan["schedule"]]
    run.plan_status = {name: plan[name] for name in ("protocol_complete", "partial_reasons", "optional_left_out")}
    write_json_atomic(run.record_dir / PLAN_FILE, plan)
    emit(session.config, "plan", None, {"file": PLAN_FILE, "totals": plan["totals"],
                                        "cap_violations": plan["cap_violations"],
                                        "shortfalls": plan["shortfalls"],
                                        "tests": len(plan["schedule"]),
                                        "mode": plan["mode"],
                                        "protocol_complete": plan["protocol_complete"],
                                        "partial_reasons": plan["partial_reasons"]})
    if plan["cap_violations"]:
        raise pytest.UsageError("the schedule exceeds the protocol's caps: " + "; ".join(plan["cap_violations"]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """With --plan, print the schedule and stop before any test (and so any model) runs."""
    if not session.config.getoption("inferlab_plan"):
        return None
    run = get_run(session.config)
    if run is None:
        raise pytest.UsageError("--plan needs --record-dir DIR (plan.json is written there)")
    plan = json.loads((run.record_dir / PLAN_FILE).read_text()) if (run.record_dir / PLAN_FILE).exists() else None
    writer = session.config.get_terminal_writer()
    if plan is None:
        writer.line("inferlab plan: no experiment tests collected")
        return True
    writer.line(f"inferlab plan: {len(plan['schedule'])} tests, written to {run.record_dir / PLAN_FILE}")
    for entry in plan["schedule"]:
        budget = entry["budget"] or {}
        spend = ", ".join(f"{k}={v}" for k, v in budget.items() if k != "category")
        category = budget.get("category", "check")
        writer.line(f"{entry['index']:4d}  {category:16s} {spend:28s} {entry['test']}")
    writer.line("totals (planned/cap): " + ", ".join(f"{k}={v}/{plan['caps'].get(k, 'no cap')}"
                                                    for k, v in plan["totals"].items()))
    for note in plan["partial_reasons"]:
        writer.line(f"note: not the complete protocol: {note}")
    return True


# --- running: bounds, prerequisites, outcomes ------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Refuse to start after the session limit, and skip a test whose prerequisites did not pass."""
    run = get_run(item.config)
    if run is None or not is_experiment(item):
        return
    if run.setup_done_monotonic is not None:
        elapsed = time.monotonic() - run.setup_done_monotonic
        if elapsed > protocol.SESSION_LIMIT_S:
            run.session_limit_skips += 1
            pytest.skip(f"not run: the session limit of {protocol.SESSION_LIMIT_S} s after setup was reached "
                        f"({elapsed:.0f} s since '{protocol.SETUP_DONE_CHECK}' passed) before this test started")
    for marker in item.iter_markers("requires"):
        for name in marker.args:
            check = run.checks.get(name)
            if check is None:
                cause = f"prerequisite '{name}' has not run"
            elif check["status"] != "passed":
                cause = check["root_cause"]
            else:
                continue
            item.stash[ROOT_CAUSE_KEY] = cause
            if check is not None and check["status"] == "did not run":
                pytest.skip(f"not run: prerequisite '{name}' did not run, because {cause}")
            pytest.skip(f"not run: {cause}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    run = get_run(item.config)
    if run is None or not is_experiment(item):
        return report
    if report.when == "call" or report.failed or report.skipped:
        outcome = _outcome_name(report)
        longrepr = _longrepr_text(report)
        run.outcome_counts[outcome] += 1
        record = emit(item.config, "test_outcome", item.nodeid, {
            "outcome": outcome,
            "phase": report.when,
            "duration": report.duration,
            "longrepr": longrepr,
            "skip_reason": _skip_reason(report) if report.skipped else None,
            "check_kind": check_kind(item),
        })
        if outcome in ("failed", "error"):
            run.failure_lines.append(f"{outcome.upper()} {item.nodeid} (full text: {RECORDS_FILE} seq {record['seq']})")
        _update_checks(run, item, report, outcome, longrepr)
        _shorten_for_terminal(run, item, report, outcome, record["seq"])
    return report


def _shorten_for_terminal(run: RunState, item, report, outcome: str, seq: int) -> None:
    """Keep the terminal from repeating a failure's message under every test it stopped.

    The records keep every text in full; only what pytest prints changes. A failed acquisition's
    reason is printed once, in full, in the inferlab summary, with the next steps.
    """
    provides = {n for m in item.iter_markers("provides") for n in m.args}
    if outcome == "failed" and "acquisition" in provides and run.acquisition_error:
        report.longrepr = (f"The specimen could not be acquired. The reason and the next steps are printed once, "
                           f"in full, in the inferlab summary below; the traceback is kept in {RECORDS_FILE} seq {seq}.")
        return
    if outcome != "skipped" or not (isinstance(report.longrepr, tuple) and len(report.longrepr) == 3):
        return
    path, lineno, reason = report.longrepr
    shorter = str(reason)
    for message, pointer in sorted(_known_messages(run).items(), key=lambda item: -len(item[0])):
        shorter = shorter.replace(message, pointer)
    if shorter != reason:
        report.longrepr = (path, lineno, shorter)


def _known_messages(run: RunState) -> dict:
    """Failure messages printed once elsewhere in the output -> where: each failed check's reason
    (pytest's FAILURES section) and the acquisition error (the inferlab summary)."""
    found = {check["reason"]: "[its message: see FAILURES above]" for check in run.checks.values()
             if check["status"] in ("failed", "error") and check.get("reason") and len(check["reason"]) > 40}
    if run.acquisition_error:
        found[run.acquisition_error] = "[the reason: see the inferlab summary below]"
        for message in list(found):  # the failed check's message quotes the acquisition error
            if run.acquisition_error in message and message != run.acquisition_error:
                found[message] = "[the reason: see the inferlab summary below]"
    return found


def _outcome_name(report) -> str:
    if report.skipped:
        return "skipped"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return "passed"


def _longrepr_text(report) -> Optional[str]:
    if report.longrepr is None:
        return None
    return report.longreprtext if hasattr(report, "longreprtext") else str(report.longrepr)


def _skip_reason(report) -> Optional[str]:
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return _first_line(_longrepr_text(report))


def _first_line(text: Optional[str]) -> str:
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    # pytest puts the "E   ..." message lines near the end; prefer the first of them.
    messages = [line.strip()[1:].strip() for line in lines if line.lstrip().startswith("E ")]
    return messages[0] if messages else lines[-1]


def _update_checks(run: RunState, item, report, outcome: str, longrepr: Optional[str]) -> None:
    names = [n for m in item.iter_markers("provides") for n in m.args]
    for name in names:
        previous = run.checks.get(name)
        if previous is not None and previous["status"] != "passed":
            continue  # one failed provider fails the check for good
        if outcome == "passed":
            if report.when == "call":
                run.checks[name] = {"status": "passed", "by": item.nodeid, "reason": None, "root_cause": None}
                if name == protocol.SETUP_DONE_CHECK and run.setup_done_monotonic is None:
                    run.setup_done_monotonic = time.monotonic()
        else:
            reason = _skip_reason(report) if outcome == "skipped" else _first_line(longrepr)
            status = "did not run" if outcome == "skipped" else outcome
            # A provider skipped for its own missing prerequisite passes that root cause on, so a
            # chain of dependents names the first failure instead of nesting every link.
            root_cause = item.stash.get(ROOT_CAUSE_KEY, None) or f"prerequisite '{name}' {status} in {item.nodeid}: {reason}"
            run.checks[name] = {"status": status, "by": item.nodeid, "reason": reason, "root_cause": root_cause}


# --- session end: report, manifest, summary ---------------------------------------------------


def pytest_unconfigure(config):
    run = get_run(config)
    if run is None:
        return
    if run.offline_guard is not None:
        run.offline_guard.close()
    run.signals.restore()
    listener = config.pluginmanager.get_plugin(STOPPING_LISTENER)
    if listener is not None:
        config.pluginmanager.unregister(listener)


class _StoppingListener:
    """Tells the run's signal watch that pytest has the interrupt in hand (this hook carries no config)."""

    def __init__(self, watch: SignalWatch):
        self.watch = watch

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo):
        self.watch.stopping = True


def pytest_sessionfinish(session, exitstatus):
    run = get_run(session.config)
    if run is None:
        return
    config = session.config
    run.signals.finishing = True  # from here a signal is noted, and does not tear the final records
    run.session_end = _session_end(session, run, exitstatus)
    if run.session_end["interrupted"]:
        # pytest may not know: a second Ctrl-C inside its own interrupt handling used to leave exit status 0.
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    emit(config, "session_end", None, run.session_end)  # before the report, which reads it
    if not config.getoption("inferlab_plan"):
        _write_report(config, run)
    run.writer.close()
    if run.named_by_plugin:
        _add_outcome_suffix(run)
    _write_manifest(config, run, run.session_end)


def _session_end(session, run: RunState, exitstatus) -> dict:
    """The session_end record (schema 1): how the session ended, and whether that is the complete protocol."""
    config = session.config
    try:
        code_name = pytest.ExitCode(int(exitstatus)).name
    except ValueError:
        code_name = f"exit status {int(exitstatus)}"
    signals = list(run.signals.received)
    if signals:
        code_name = pytest.ExitCode.INTERRUPTED.name
    reason = session_status.stop_reason(
        exit_code_name=code_name, signals=signals, should_stop=session.shouldstop, should_fail=session.shouldfail,
        tests_failed=session.testsfailed, session_limit_skips=run.session_limit_skips)
    with_outcome = {r["test"] for r in run.records if r["kind"] == "test_outcome"}
    end = session_status.session_end_fields(
        exit_status=int(pytest.ExitCode.INTERRUPTED) if signals else int(exitstatus), exit_code_name=code_name,
        signals=signals, collect_only=bool(config.option.collectonly), plan_only=bool(config.getoption("inferlab_plan")),
        stopped_reason=reason, planned=run.planned, with_outcome=with_outcome,
        partial_reasons=run.plan_status.get("partial_reasons", []) if run.planned else
        ["no experiment test was collected"],
        optional_notes=run.plan_status.get("optional_left_out", []))
    end["status"] = session_status.status_line(end, dict(run.outcome_counts))
    return end


def outcome_suffix(end: dict, outcome_counts: dict) -> Optional[str]:
    """The suffix a run made under --runs-dir gets for how it ended; None for a complete run that passed.

    -incomplete: it did not reach its end; -failed: a test failed or errored; -partial: not the complete
    protocol; -partial-failed: both, so that `ls runs` tells it from a complete run that failed.
    """
    if end["plan_only"]:
        return None
    if end["interrupted"] or end["stopped_early"] or end["collect_only"] or end["tests_without_outcome"]:
        return "-incomplete"
    failed = bool(outcome_counts.get("failed") or outcome_counts.get("error") or end["exit_code_name"] != "OK")
    partial = not end["protocol_complete"]
    if failed and partial:
        return "-partial-failed"
    if failed:
        return "-failed"
    return "-partial" if partial else None


def _add_outcome_suffix(run: RunState) -> None:
    """Rename a run made under --runs-dir so its name says how it ended; when that fails, say so (manifest, terminal)."""
    suffix = outcome_suffix(run.session_end, run.outcome_counts)
    if suffix is None:
        return
    old_name = run.record_dir.name
    try:
        run.record_dir = rename_with_suffix(run.record_dir, suffix)
    except RecordDirError as error:
        # The folder keeps a name that does not say how the run ended: the manifest and the terminal say so.
        run.rename = {"from": old_name, "to": None, "suffix": suffix, "renamed": False, "error": str(error)}
        return
    run.rename = {"from": old_name, "to": run.record_dir.name, "suffix": suffix, "renamed": True, "error": None}


def _write_report(config, run: RunState) -> None:
    """The report is evidence too: a failure to write it is recorded, not raised over the outcome."""
    try:
        from inferlab import report

        report.write_report(run.record_dir)
    except Exception as error:  # the run's records must survive a broken report
        emit(config, "report_error", None, {"error": f"{type(error).__name__}: {error}"})


STARTED_STATUS = ("started: this is the manifest written when the run began; if it still says so, the session "
                  "never reached its end (killed, or crashed)")


def _write_manifest(config, run: RunState, end: Optional[dict]) -> None:
    """manifest.json: at the start with complete false; at the end with how the session ended and every file."""
    from inferlab import environment

    root = config.rootpath
    # The environment is recorded as it was at the start, when the code that ran was read; anything found
    # different at the end (a source file edited mid-run, a package installed) is listed, not swapped in.
    if run.environment is None:
        run.environment = environment.environment_record(root)
    started_environment = run.environment
    changed = environment.changes(started_environment, environment.environment_record(root)) if end else []
    manifest = {
        "schema": RECORD_SCHEMA,
        "mode": "plan" if config.getoption("inferlab_plan") else "run",
        "complete": bool(end and end["complete"]),
        "status": end["status"] if end else STARTED_STATUS,
        "exit_status": end["exit_status"] if end else None,
        "exit_code_name": end["exit_code_name"] if end else None,
        "session_end": end,
        "signals_during_finish": list(run.signals.during_finish),
        "outcome_counts": dict(run.outcome_counts),
        "command": run.command,
        "command_reconstructed_from": run.command_how,
        "argv": run.command_line,
        "command_line": run.command_line,
        "invocation_dir": str(config.invocation_params.dir),
        "started_utc": run.started_utc,
        "ended_utc": utc_now() if end else None,
        "record_dir": str(run.record_dir),
        "record_dir_rename": run.rename,
        "claim": CLAIM_FILE,
        "specimen": run.specimen,
        "options": {
            "artifacts": config.getoption("inferlab_artifacts"),
            "offline": config.getoption("inferlab_offline"),
            "network_blocked_for_session": run.offline_guard is not None,
            "plan": config.getoption("inferlab_plan"),
        },
        "predictions": run.predictions,
        "pytest": {"version": pytest.__version__, "plugins": _plugin_versions(config)},
        "torch_threads": environment.torch_threads(run.thread_request),
        "torch_build": environment.torch_build(),
        **started_environment,
        "environment_changed_during_run": changed,
        "checks": run.checks,
        "protocol": protocol.as_dict(),
    }
    config.hook.pytest_inferlab_manifest(config=config, manifest=manifest)
    if end is not None:
        manifest["files"] = file_inventory(run.record_dir, exclude=(MANIFEST_FILE,))
    write_json_atomic(run.record_dir / MANIFEST_FILE, manifest)


def _plugin_versions(config) -> dict:
    return {dist.project_name: dist.version for _, dist in config.pluginmanager.list_plugin_distinfo()}


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The inferlab summary comes last, after pytest's short summary, so its final line ends the output."""
    result = yield
    run = get_run(config)
    if run is not None:
        _write_summary(terminalreporter, run)
    return result


def _write_summary(terminalreporter, run: RunState) -> None:
    from inferlab import guidance

    write = terminalreporter.write_line
    terminalreporter.section("inferlab")
    write(f"record dir: {run.record_dir}")
    if run.rename and not run.rename["renamed"]:
        write(f"record dir: NOT renamed to end in {run.rename['suffix']} ({run.rename['error']}); its name does not "
              f"say how the run ended, its manifest does", red=True)
    synthetic = bool((run.specimen or {}).get("synthetic"))
    write(specimen_line(run.specimen or {}), yellow=synthetic, bold=synthetic)
    counts = ", ".join(f"{n} {k}" for k, n in sorted(run.outcome_counts.items())) or "no experiment tests ran"
    write(f"outcomes: {counts}")
    for line in run.failure_lines:
        write(line)
    predictions = run.predictions or {}
    plan_only = bool(run.session_end and run.session_end["plan_only"])
    if predictions.get("template_unanswered"):
        write(f"predictions: {predictions['source']} is still the unanswered template "
              f"({predictions['template_check']}). The run goes on, and the manifest says so; the lab asks for "
              f"your predictions before you look at any output.")
    elif not predictions.get("supplied") and not plan_only:
        write("predictions: none supplied (--predictions FILE); the lab asks for them before you look at any output")
    acquisition = run.checks.get("acquisition") or {}
    if acquisition.get("status") in ("failed", "error"):
        write("")
        write("The specimen could not be acquired, so nothing was measured. The reason:", bold=True)
        for line in (run.acquisition_error or acquisition.get("reason") or "(not recorded)").splitlines():
            write(f"  {line}")
        write("Next steps:", bold=True)
        failed_path = next((r.get("acquisition") for r in run.records_of("artifact_acquisition")), None)
        for number, step in enumerate(guidance.acquisition_next_steps(run.specimen, failed_path), start=1):
            write(f"  {number}. {step}")
        write("")
    if (run.record_dir / REPORT_FILE).exists():
        write(f"report: {run.record_dir / REPORT_FILE}")
    if run.session_end is not None:
        write(f"inferlab: {run.session_end['status']}", bold=True,
              red=not run.session_end["complete"] and not run.session_end["plan_only"])


def specimen_line(specimen: dict) -> str:
    """One line naming the run's specimen; a synthetic one is said to be synthetic, and not Pythia."""
    name, repo_id, revision = specimen.get("name"), specimen.get("repo_id"), specimen.get("revision")
    line = f"specimen: {name} ({repo_id} at revision {revision})"
    if specimen.get("synthetic"):
        line += (f"; SYNTHETIC, not Pythia: its weights are constructed, so nothing this run measures describes "
                 f"{protocol.PINNED_REPO_ID}")
    return line


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def inferlab_run(pytestconfig) -> RunState:
    """The session's run state (record dir, writers, checks)."""
    run = get_run(pytestconfig)
    if run is None:
        raise pytest.UsageError("--record-dir DIR is required for tests that record")
    return run


@pytest.fixture
def record(request, inferlab_run):
    """record(kind, **fields): emit a record attributed to the current test; returns it.

    A test that declares its kinds with @pytest.mark.records(...) may write only those, so that the plan says
    truthfully which tests produce which records."""
    declared = declared_records(request.node) if request.node.get_closest_marker("records") else None

    def _record(kind: str, **fields) -> dict:
        if declared is not None and kind not in declared:
            raise ValueError(f"{request.node.nodeid}: record kind {kind!r} is not declared on the test; expected one "
                             f"of {declared} (add it to @pytest.mark.records)")
        return emit(request.config, kind, request.node.nodeid, fields)

    return _record


@pytest.fixture(scope="session")
def session_record(pytestconfig, inferlab_run):
    """session_record(kind, **fields): emit a record that belongs to no single test."""
    def _record(kind: str, **fields) -> dict:
        return emit(pytestconfig, kind, None, fields)

    return _record


@pytest.fixture(scope="session")
def tensor_store(inferlab_run) -> TensorStore:
    """Safetensors files under the record dir's tensors/ folder."""
    return inferlab_run.tensors


# --- experiment fixtures: the specimen, loaded once per session ----------------------------------


@pytest.fixture(scope="session")
def specimen_spec(pytestconfig):
    """The specimen's spec (artifacts/<name>.json) named by --specimen."""
    return _load_specimen_spec(pytestconfig)


@pytest.fixture(scope="session")
def thread_controls(inferlab_run):
    """Set torch's thread counts before any torch computation; the requested and effective values."""
    from inferlab import loading, memory

    baseline_memory = memory.process_memory()  # before the model exists: the RSS baseline
    controls = loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS)
    inferlab_run.thread_request = controls["requested"]
    return {**controls, "baseline_process_memory": baseline_memory}


@pytest.fixture(scope="session")
def acquisition(pytestconfig, specimen_spec):
    """The outcome of acquiring the specimen: the result, or the error that stopped it (never raised)."""
    from inferlab import specimen

    return specimen.acquisition_outcome(specimen_spec, artifacts_dir=pytestconfig.getoption("inferlab_artifacts"),
                                        cache_root=pytestconfig.rootpath / "artifacts" / "cache",
                                        offline=pytestconfig.getoption("inferlab_offline"))


@pytest.fixture(scope="session")
def verification(acquisition):
    """Per-file verification of whatever directory acquisition examined, even a refused one (for evidence)."""
    return acquisition["verification"]


@pytest.fixture(scope="session")
def loaded_specimen(acquisition, specimen_spec, thread_controls):
    """The model and tokenizer, loaded once from the verified directory with the protocol's controls."""
    from inferlab import loading

    return loading.load_specimen(acquisition["directory"], specimen_spec)


@pytest.fixture(scope="session")
def model(loaded_specimen):
    return loaded_specimen["model"]


@pytest.fixture(scope="session")
def tokenizer(loaded_specimen):
    return loaded_specimen["tokenizer"]


@pytest.fixture(scope="session")
def encoded_prompts(tokenizer):
    """Every prompt of the lab tokenized once: {prompt_id: {record, input_ids, attention_mask, elapsed_s}}."""
    from inferlab import inputs

    encoded = {}
    for prompt_id, source in {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}.items():
        record_fields, input_ids, attention_mask = inputs.encode_prompt(tokenizer, prompt_id, source)
        encoded[prompt_id] = {"record": record_fields, "input_ids": input_ids, "attention_mask": attention_mask}
    return encoded
