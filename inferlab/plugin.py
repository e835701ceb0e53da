"""The pytest face of inferlab: options, markers, hooks that hand plain data to the library, and fixtures.

This and hookspec.py are the only modules that import pytest. Each hook reads what it needs from pytest
(node ids, markers, reports, exit codes) and delegates: what a hook or fixture does to inferlab.run.hook_steps, the
run's lifecycle to inferlab.run.lifecycle, the schedule to inferlab.run.plan, the summary to inferlab.run.terminal.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Optional

import pytest

from inferlab import protocol
from inferlab.base.records import PLAN_FILE, RecordDirError, TensorStore
from inferlab.read import runview as earlier_runs
from inferlab.run import hook_steps, lifecycle, options, plan, terminal
from inferlab.run.interrupts import SignalWatch
from inferlab.run.plan import EXPERIMENTS_DIR, TestFacts

RUN_KEY = pytest.StashKey["lifecycle.Run"]()
FACTS_KEY = pytest.StashKey[TestFacts]()
STOPPING_LISTENER = "inferlab-stopping-listener"


# --- options and the start of the run ------------------------------------------------------------


def pytest_addhooks(pluginmanager):
    from inferlab import hookspec
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser):
    group = parser.getgroup("inferlab", "inferlab experiment")
    for flag, settings in options.OPTIONS.items():
        group.addoption(flag, **settings)


def pytest_configure(config):
    for line in options.MARKERS:
        config.addinivalue_line("markers", line)
    # HF_HUB_OFFLINE=1 is --offline, for the whole session (acquisition and the network block read the option)
    config.option.inferlab_offline, offline_from = options.offline_setting(config.getoption("inferlab_offline"),
                                                                           os.environ)
    raw_dir, runs_dir = config.getoption("inferlab_record_dir"), config.getoption("inferlab_runs_dir")
    if raw_dir is None and runs_dir is None:
        return
    if raw_dir is not None and runs_dir is not None:
        raise pytest.UsageError("--record-dir and --runs-dir: give one of them, not both")
    # Everything that can be checked without writing is checked first: a refused run writes nothing.
    invocation = lifecycle.invocation_of(config, _load_specimen_spec(config).as_dict(), offline_from, pytest.__version__)
    refusal = hook_steps.start_refusal(config, invocation.specimen["name"])
    if refusal is not None:
        raise pytest.UsageError(refusal)
    with _usage_error():
        predictions = options.check_paths({"--record-dir": raw_dir, "--runs-dir": runs_dir,
                                         "--artifacts": config.getoption("inferlab_artifacts"),
                                         "--predictions": config.getoption("inferlab_predictions")},
                                        cache_root=config.rootpath / "artifacts" / "cache")
    if config.option.collectonly:  # --co lists the tests and runs none: no run folder is made for it
        return
    with _usage_error("--runs-dir: " if runs_dir is not None else "--record-dir: "):
        run = lifecycle.claim_run(invocation, pid=os.getpid(), hostname=socket.gethostname(),
                                  reader=earlier_runs,
                                  record_dir=raw_dir and Path(os.path.expanduser(raw_dir)),
                                  runs_dir=runs_dir and Path(os.path.expanduser(runs_dir)))
    run.publish = lambda record: config.hook.pytest_inferlab_record(config=config, record=record)
    run.on_manifest = lambda manifest: config.hook.pytest_inferlab_manifest(config=config, manifest=manifest)
    run.write_report = _write_report
    config.stash[RUN_KEY] = run
    if run.signals.install():
        config.pluginmanager.register(_StoppingListener(run.signals), STOPPING_LISTENER)
    if config.getoption("inferlab_offline"):
        run.block_network()  # for the whole session, not only acquisition
    run.start(predictions)


def _write_report(record_dir: Path) -> None:
    """The session's report.md and plots, at its end (inferlab.report is imported then, not at the start)."""
    from inferlab import report

    report.write_report(record_dir)


def pytest_report_header(config):
    """At the start: the earlier runs of --runs-dir found killed before their end, and renamed; predictions that do
    not answer every question, said while they can still be fixed (before any output exists)."""
    run = get_run(config)
    return terminal.start_lines(run) if run is not None else []


@contextlib.contextmanager
def _usage_error(prefix: str = ""):
    """The library's refusal of an option, as pytest's usage error (no traceback), prefixed with the option."""
    from inferlab import specimen

    try:
        yield
    except (options.PathOptionError, RecordDirError,
            specimen.SpecimenError) as error:
        raise pytest.UsageError(f"{prefix}{error}") from None


def _load_specimen_spec(config):
    """The --specimen spec, read before anything is written, so a bad name is a usage error."""
    from inferlab import specimen

    name = config.getoption("inferlab_specimen")
    with _usage_error(f"--specimen {name}: "):
        return specimen.load_runnable_spec(name, config.rootpath / "artifacts")


def get_run(config) -> Optional[lifecycle.Run]:
    """The run, or None when no --record-dir was given."""
    return config.stash.get(RUN_KEY, None)


@pytest.hookimpl(trylast=True)
def pytest_inferlab_record(config, record):
    get_run(config).store(record)


# --- collection: experiment items, their facts, the plan ------------------------------------------


def is_experiment(item) -> bool:
    return getattr(item, "path", None) is not None and item.path.is_relative_to(item.config.rootpath / EXPERIMENTS_DIR)


def facts_of(item) -> TestFacts:
    """What an experiment test declares with its markers and parameters, as plain data (read once per item)."""
    facts = item.stash.get(FACTS_KEY, None)
    if facts is None:
        params = getattr(getattr(item, "callspec", None), "params", {})
        facts = item.stash[FACTS_KEY] = plan.facts_from_markers(item.nodeid, params, item.iter_markers)
    return facts


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report):
    """A test file a system pytest cannot import (no torch): one line naming the interpreter, not the ImportError."""
    if report.failed:
        report.longrepr = hook_steps.import_hint(report.nodeid, str(report.longrepr)) or report.longrepr


@pytest.hookimpl(tryfirst=True)  # before -k, -m, --deselect and --lf remove anything
def pytest_collection_modifyitems(session, config, items):
    experiments = [item for item in items if is_experiment(item)]
    refusal = options.collection_refusal(bool(experiments), config.getoption, config.option)
    if refusal is not None:
        raise pytest.UsageError(refusal)
    if not experiments:
        return
    run = get_run(config)
    if run is None and config.option.collectonly:
        return
    if run is None:
        raise pytest.UsageError("--record-dir DIR (or --runs-dir DIR) is required to run the experiments (use a new "
                                "directory, e.g. runs/first)")
    run.schedule.collected = [item.nodeid for item in experiments]
    for item in experiments:
        if item.get_closest_marker("timeout") is None:
            # func_only: the limit is for the trial itself, not the session fixtures (download, load)
            # that the first test to need them happens to set up.
            item.add_marker(pytest.mark.timeout(protocol.TRIAL_LIMIT_S, method="signal", func_only=True))
    run.schedule.collected_facts = [facts_of(item) for item in experiments]  # after the limit is marked


def pytest_deselected(items):
    experiments = [item for item in items if is_experiment(item)]
    run = get_run(experiments[0].config) if experiments else None
    if run is not None:
        run.schedule.deselected.extend(item.nodeid for item in experiments)


def pytest_collection_finish(session):
    config, run = session.config, get_run(session.config)
    experiments = [item for item in session.items if is_experiment(item)]
    if run is None or not experiments:
        return
    refusal = hook_steps.write_collected_plan(  # after every plugin's reordering
        run, config, [(item.nodeid, item.location[0], item.location[1] or 0) for item in experiments],
        [facts_of(item) for item in experiments])
    if refusal is not None:
        raise pytest.UsageError(refusal)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """With --plan, print the schedule and stop before any test (and so any model) runs."""
    if not session.config.getoption("inferlab_plan"):
        return None
    run = get_run(session.config)
    if run is None:
        raise pytest.UsageError("--plan needs --record-dir DIR (plan.json is written there)")
    writer = session.config.get_terminal_writer()
    for line in plan.plan_lines(run.schedule.plan, run.record_dir / PLAN_FILE):
        writer.line(line)
    return True


# --- running: bounds, prerequisites, outcomes ----------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Refuse to start after the session limit, and skip a test whose prerequisites did not pass."""
    run = get_run(item.config)
    if run is None or not is_experiment(item):
        return
    refusal = run.refusal(facts_of(item))
    if refusal is not None:  # reported at the test, not at this hook
        raise pytest.skip.Exception(refusal, _use_item_location=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The forwards each experiment test ran, setup and teardown included, from the session's forward watch."""
    run = get_run(item.config)
    before = run.forwards_counted() if run is not None else 0
    try:
        return (yield)
    finally:
        if run is not None and is_experiment(item):
            run.forwards_by_test[item.nodeid] = run.forwards_counted() - before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    run = get_run(item.config)
    if run is None or not is_experiment(item):
        return report
    hook_steps.record_report(run, facts_of(item), report)  # the record in full; what pytest prints may be shorter
    return report


# --- session end: session_end, report, manifest, summary -----------------------------------------------


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
    cache = getattr(session.config, "cache", None)
    session.exitstatus = hook_steps.end_session(
        run, session, int(exitstatus), {int(code): code.name for code in pytest.ExitCode}, int(pytest.ExitCode.OK),
        int(pytest.ExitCode.INTERRUPTED), remember=cache.set if cache is not None else None)


def pytest_unconfigure(config):
    run = get_run(config)
    if run is None:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # after pytest's own counts, so that it is the last line
        terminal.write_last_line(reporter.write_line, run)
    run.close()
    listener = config.pluginmanager.get_plugin(STOPPING_LISTENER)
    if listener is not None:
        config.pluginmanager.unregister(listener)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The inferlab summary comes after pytest's short summary; its status line ends the output (pytest_unconfigure)."""
    result = yield
    run = get_run(config)
    if run is not None:
        terminalreporter.section("inferlab")
        terminal.write_summary(terminalreporter.write_line, run)
    return result


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def inferlab_run(pytestconfig) -> lifecycle.Run:
    """The session's run (record dir, records so far, tensors, checks)."""
    run = get_run(pytestconfig)
    if run is None:
        raise pytest.UsageError("--record-dir DIR is required for tests that record")
    return run


@pytest.fixture
def record(request, inferlab_run):
    """record(kind, **fields): emit a record attributed to the current test; returns it.

    A test may write only the kinds it declares with @pytest.mark.records(...), so that the plan says
    truthfully which tests produce which records."""
    facts = facts_of(request.node)

    def _record(kind: str, **fields) -> dict:
        return inferlab_run.emit_declared(facts, kind, fields)

    return _record


@pytest.fixture(scope="session")
def session_record(inferlab_run):
    """session_record(kind, **fields): emit a record that belongs to no single test."""
    def _record(kind: str, **fields) -> dict:
        return inferlab_run.emit(kind, None, fields)

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
    return hook_steps.thread_controls(inferlab_run)


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
def loaded_specimen(request, acquisition, specimen_spec, thread_controls):
    """The model and tokenizer, loaded once from the verified directory with the protocol's controls, and the
    watch on every forward of the model (inferlab.measure.forward_mode)."""
    return hook_steps.load_watched(get_run(request.config), acquisition["directory"], specimen_spec)


@pytest.fixture
def forward_window(loaded_specimen):
    """The forwards of this test, from its start: window.summary() says whether each kept the controls."""
    return loaded_specimen["forward_watch"].window()


@pytest.fixture(scope="session")
def model(loaded_specimen):
    return loaded_specimen["model"]


@pytest.fixture(scope="session")
def tokenizer(loaded_specimen):
    return loaded_specimen["tokenizer"]


@pytest.fixture(scope="session")
def encoded_prompts(tokenizer):
    """Every prompt of the lab tokenized once: {prompt_id: {record, input_ids, attention_mask, elapsed_s}}."""
    from inferlab.measure import inputs

    return inputs.encode_prompts(tokenizer, {**protocol.PROMPTS, **protocol.TIMING_PROMPTS})
