"""The pytest face of inferlab, wiring only: options, markers, hooks that hand plain data to the run (inferlab.run),
and fixtures; the only module that imports pytest. One record line: `record(kind, **fields)` -> Run.emit (its
envelope, then the pytest_inferlab_record hook) -> the default hook below -> RecordLog.append (one fsynced line)."""

from __future__ import annotations

import importlib
import os
import socket
import sys
from pathlib import Path
from typing import Optional

import pytest

from inferlab import protocol
from inferlab.files import import_hint
from inferlab.read import parse as runfolder
from inferlab.run import endings, plan
from inferlab.run.records import PLAN_FILE, RecordDirError, check_paths
from inferlab.run.session import OPTIONS, Run, claim_run, given_options, invocation_of, offline_setting

RUN_KEY, FACTS_KEY = pytest.StashKey[Run](), pytest.StashKey[plan.TestFacts]()


def pytest_addhooks(pluginmanager):
    from inferlab import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser):
    group = parser.getgroup("inferlab", "inferlab experiment")
    for flag, settings in OPTIONS.items():
        group.addoption(flag, **settings)


def pytest_configure(config):
    for line in plan.MARKERS:
        config.addinivalue_line("markers", line)
    config.option.inferlab_offline, offline_from = offline_setting(config.getoption("inferlab_offline"), os.environ)
    record_dir, runs_dir = config.getoption("inferlab_record_dir"), config.getoption("inferlab_runs_dir")
    if record_dir is None and runs_dir is None:
        return
    if record_dir is not None and runs_dir is not None:
        raise pytest.UsageError("--record-dir and --runs-dir: give one of them, not both")
    predictions = config.getoption("inferlab_predictions")
    try:  # everything that can be checked without writing is checked first: a refused run writes nothing
        invocation = invocation_of(config, offline_from, pytest.__version__)
        if (refused := plan.refusal(config, invocation.specimen["name"])) is not None:
            raise ValueError(refused)
        if plan.named_experiment_paths(config.args, config.invocation_params.dir, config.rootpath) is None:
            raise ValueError(plan.collection_refusal(False, given_options(config), False, False))
        check_paths({"--record-dir": record_dir, "--runs-dir": runs_dir, "--predictions": predictions,
                     "--artifacts": config.getoption("inferlab_artifacts")}, config.rootpath / "artifacts" / "cache")
        if config.option.collectonly:  # --co lists the tests and runs none: no run folder is made for it
            return
        run = claim_run(invocation, pid=os.getpid(), hostname=socket.gethostname(),
                        claim_without_end=runfolder.claim_without_end,
                        record_dir=record_dir and Path(os.path.expanduser(record_dir)),
                        runs_dir=runs_dir and Path(os.path.expanduser(runs_dir)))
    except (ValueError, RecordDirError) as refused:
        raise pytest.UsageError(str(refused)) from None
    run.hook = lambda record: config.hook.pytest_inferlab_record(config=config, record=record)
    run.on_manifest = lambda manifest: config.hook.pytest_inferlab_manifest(config=config, manifest=manifest)
    run.write_report = lambda record_dir: importlib.import_module("inferlab.report").write_report(record_dir)
    config.stash[RUN_KEY] = run
    if run.signals.install():
        config.pluginmanager.register(run.signals, "inferlab-signals")  # its pytest_keyboard_interrupt
    if config.getoption("inferlab_offline"):
        run.block_network()  # for the whole session, not only acquisition
    run.start(predictions and os.path.expanduser(predictions))


def get_run(config) -> Optional[Run]:  # None without --record-dir or --runs-dir
    return config.stash.get(RUN_KEY, None)


def pytest_report_header(config):
    return endings.start_lines(get_run(config)) if get_run(config) is not None else []


@pytest.hookimpl(trylast=True)
def pytest_inferlab_record(config, record):
    get_run(config).store(record)


# --- collection and running: experiment items, their facts, the plan, outcomes, the session's end ---------------


def is_experiment(item) -> bool:
    return item.path.is_relative_to(item.config.rootpath / plan.EXPERIMENTS_DIR)


def facts_of(item) -> plan.TestFacts:  # what an experiment test declares with its markers and parameters
    if FACTS_KEY not in item.stash:
        params = getattr(getattr(item, "callspec", None), "params", {})
        item.stash[FACTS_KEY] = plan.facts_from_markers(item.nodeid, params, item.iter_markers)
    return item.stash[FACTS_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report):
    if report.failed:  # a test file this Python cannot import for want of the project's environment: one line
        report.longrepr = import_hint(report.nodeid, str(report.longrepr), sys.executable) or report.longrepr


@pytest.hookimpl(tryfirst=True)  # before -k, -m, --deselect and --lf remove anything
def pytest_collection_modifyitems(session, config, items):
    experiments = [item for item in items if is_experiment(item)]
    run = get_run(config)
    refusal = plan.collection_refusal(bool(experiments), given_options(config), config.option.collectonly,
                                      run is not None)
    if refusal is not None:
        raise pytest.UsageError(refusal)
    if run is not None and experiments:
        run.collected = [item.nodeid for item in experiments]
        for item in experiments:  # func_only: the limit is the trial's, not the session fixtures' (download, load)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(protocol.TRIAL_LIMIT_S, method="signal", func_only=True))
        run.collected_facts = [facts_of(item) for item in experiments]  # after the limit is marked


def pytest_collection_finish(session):
    config, run = session.config, get_run(session.config)
    experiments = [item for item in session.items if is_experiment(item)]
    if run is None or not experiments:
        return
    where = [(item.nodeid, item.location[0], item.location[1] or 0) for item in experiments]  # after any reordering
    run.refused = plan.order_refusal(where, run.collected)  # an order not the protocol's is refused before the plan
    if run.refused is not None:
        raise pytest.UsageError(run.refused)
    # never None here: pytest_configure refused a run whose paths reach no experiment
    paths, tests = plan.named_experiment_paths(config.args, config.invocation_params.dir, config.rootpath)
    written = run.write_plan([facts_of(item) for item in experiments], named_paths=paths, named_tests=tests,
                             selection=plan.selection_of(config.option, config.pluginmanager.get_plugin("lfplugin")))
    if written["cap_violations"]:
        raise pytest.UsageError("the schedule exceeds the protocol's caps: " + "; ".join(written["cap_violations"]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """With --plan, print the schedule and stop before any test (and so any model) runs."""
    run = get_run(session.config)
    if run is None or not session.config.getoption("inferlab_plan"):
        return None  # a run, or --co (pytest lists the tests)
    for line in plan.plan_lines(run.plan, run.record_dir / PLAN_FILE):
        session.config.get_terminal_writer().line(line)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Refuse to start after the session limit, and skip a test whose prerequisites did not pass."""
    run = get_run(item.config)
    refusal = run.refusal(facts_of(item)) if run is not None and is_experiment(item) else None
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
        if run is not None and run.cannot_write:  # pytest stops before the next test, the session failed
            item.session.shouldfail = run.cannot_write


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if get_run(item.config) is not None and is_experiment(item):  # the record in full; what pytest prints is shorter
        get_run(item.config).record_report(facts_of(item), report)
    return report


def pytest_sessionfinish(session, exitstatus):
    if get_run(session.config) is not None:
        session.exitstatus = get_run(session.config).end_pytest(session, exitstatus, pytest.ExitCode)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The inferlab section comes after pytest's short summary; its status line ends the output (unconfigure)."""
    result = yield
    if get_run(config) is not None:
        terminalreporter.section("inferlab")
        endings.summary(terminalreporter.write_line, get_run(config))
    return result


def pytest_unconfigure(config):
    run = get_run(config)
    if run is not None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # after pytest's own counts, so that it is the last line
            endings.last_line(reporter.write_line, run)
        run.close()


# --- fixtures ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def inferlab_run(pytestconfig) -> Run:
    """The session's run: its record dir, its records so far (records_of), its tensors."""
    if get_run(pytestconfig) is None:
        raise pytest.UsageError("--record-dir DIR is required for tests that record")
    return get_run(pytestconfig)


@pytest.fixture
def record(request, inferlab_run):
    """record(kind, **fields): write one record of this test, of a kind it declares (@pytest.mark.records)."""
    facts = facts_of(request.node)
    return lambda kind, **fields: inferlab_run.emit(kind, facts.nodeid, fields, declared=facts.records)


@pytest.fixture(scope="session")
def tensor_store(inferlab_run):
    """Safetensors files under the record dir's tensors/ folder (run/records.py, TensorStore)."""
    return inferlab_run.tensors


@pytest.fixture(scope="session")
def specimen_spec(pytestconfig):
    """The specimen's spec (artifacts/<name>.json) named by --specimen."""
    from inferlab import specimen

    return specimen.load_runnable_spec(pytestconfig.getoption("inferlab_specimen"), pytestconfig.rootpath / "artifacts")


@pytest.fixture(scope="session")
def thread_controls(inferlab_run):
    """torch's threads set before any torch computation, and the process's memory before the model exists."""
    from inferlab.measure import loading, memory

    baseline = memory.process_memory()
    controls = loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS)
    inferlab_run.thread_request = controls["requested"]
    return {**controls, "baseline_process_memory": baseline}


@pytest.fixture(scope="session")
def acquisition(pytestconfig, specimen_spec):
    """The outcome of acquiring the specimen: the result, or the error that stopped it (never raised)."""
    from inferlab import specimen

    return specimen.acquisition_outcome(specimen_spec, artifacts_dir=pytestconfig.getoption("inferlab_artifacts"),
                                        cache_root=pytestconfig.rootpath / "artifacts" / "cache",
                                        offline=pytestconfig.getoption("inferlab_offline"))


@pytest.fixture(scope="session")
def verification(acquisition):
    """Per-file verification of whatever folder acquisition examined, even a refused one (for evidence)."""
    return acquisition["verification"]


@pytest.fixture(scope="session")
def loaded_specimen(inferlab_run, acquisition, specimen_spec, thread_controls):
    """The model and tokenizer loaded once with the protocol's controls, and the watch on its every forward."""
    from inferlab.measure import loading

    loaded = loading.load_specimen(acquisition["directory"], specimen_spec)
    inferlab_run.forward_watch = loading.ForwardWatch(loaded["model"])  # reconciled with the plan at the end
    return {**loaded, "forward_watch": inferlab_run.forward_watch}


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
