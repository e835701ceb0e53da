"""What the plugin's hooks and session fixtures do, once pytest's objects are read as plain attributes (the
config's options, plugins and arguments; a test's report; how the session ended), so that inferlab/plugin.py only
wires: the refusal of a session before anything is written, the plan after collection, a test's report recorded,
the session's end, and the thread controls and the watched model of the session fixtures. No pytest here: exit codes
come in as a {status: name} table, refusals go out as text for pytest's usage error.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from typing import Callable, Optional

from inferlab import protocol
from inferlab.run import lifecycle, options, plan, session_status, terminal
from inferlab.run.plan import EXPERIMENTS_DIR, TestFacts


def start_refusal(config, specimen_name: str) -> Optional[str]:
    """Why this session may not run at all (checked before anything is written), or None: no per-trial bound on
    this platform, parallel workers, a reordering plugin, --lf across specimens."""
    has_plugin = config.pluginmanager.has_plugin
    return (options.trial_bound_refusal(sys.platform, hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer"),
                                        has_plugin(options.TIMEOUT_PLUGIN),
                                        importlib.util.find_spec("pytest_timeout") is not None, sys.executable)
            or options.parallel_refusal(config.getoption("numprocesses", None))
            or options.reordering_refusal(config.option, has_plugin)
            or plan.last_failed_refusal(config.option, config.pluginmanager.get_plugin("lfplugin"),
                                        getattr(config, "cache", None), specimen_name))


def import_hint(nodeid: str, failure: str) -> Optional[str]:
    """For a test file this Python could not import for want of the project's environment: one line naming this
    interpreter and the one to use; None for any other collection failure."""
    return options.missing_module_hint(nodeid, failure, sys.executable)


def write_collected_plan(run: lifecycle.Run, config, locations: list, facts: list[TestFacts]) -> Optional[str]:
    """After every plugin's reordering, the experiment tests' (nodeid, file, line) `locations` in their run order:
    an order that is not the protocol's is refused before the plan is written; then plan.json. The refusal, or
    None."""
    disorder = options.order_refusal(locations, run.schedule.collected)
    if disorder is not None:
        run.refused = disorder
        return disorder
    named_paths, named_tests = plan.named_experiment_paths(config.args, config.invocation_params.dir,
                                                           config.rootpath / EXPERIMENTS_DIR)
    written = run.write_plan(facts, named_paths=named_paths, named_tests=named_tests,
                             parts=session_status.experiment_parts(config.rootpath, EXPERIMENTS_DIR),
                             selection=plan.selection_of(config.option, config.pluginmanager.get_plugin("lfplugin")))
    if written["cap_violations"]:
        return "the schedule exceeds the protocol's caps: " + "; ".join(written["cap_violations"])
    return None


def record_report(run: lifecycle.Run, facts: TestFacts, report) -> None:
    """An experiment test's outcome from one phase's report (the call, or a failed or skipped setup or teardown):
    its record in full; what pytest prints of it may be shortened (report.longrepr replaced)."""
    if not (report.when == "call" or report.failed or report.skipped):
        return
    outcome, longrepr, skip_reason = terminal.outcome_of(report)
    record = run.record_outcome(facts, outcome=outcome, phase=report.when, duration=report.duration,
                                longrepr=longrepr, skip_reason=skip_reason)
    shorter = terminal.shortened_longrepr(report.longrepr, outcome, facts.provides, run, record["seq"])
    if shorter is not None:
        report.longrepr = shorter


def end_session(run: lifecycle.Run, session, exit_status: int, exit_codes: dict[int, str], ok_status: int,
                interrupted_status: int, remember: Optional[Callable[[str, str], None]] = None) -> int:
    """The session's end (session_end, the report, the final manifest, the rename) from how pytest says it ended;
    the exit status the session ends with. `remember(key, value)` keeps the specimen for a later --lf."""
    run.signals.finishing = True  # from here a signal is noted, and does not tear the final records
    end = run.end_session(lifecycle.SessionFacts(
        exit_status=exit_status, exit_code_name=exit_codes.get(exit_status, f"exit status {exit_status}"),
        interrupted_status=interrupted_status, should_stop=session.shouldstop, should_fail=session.shouldfail,
        tests_failed=session.testsfailed, collect_only=bool(session.config.option.collectonly)))
    status = session_status.session_exit_status(end, exit_status, ok_status, interrupted_status)
    if remember is not None and run.invocation.mode == "run":
        remember(plan.LAST_FAILED_SPECIMEN_KEY, run.invocation.specimen["name"])  # for --lf
    run.finish()
    return status


def thread_controls(run: lifecycle.Run) -> dict:
    """Set torch's thread counts before any torch computation; the requested and effective values, and the process's
    memory before the model exists (the RSS baseline)."""
    from inferlab.measure import loading, memory

    baseline_memory = memory.process_memory()
    controls = loading.set_threads(protocol.INTRA_OP_THREADS, protocol.INTER_OP_THREADS)
    run.thread_request = controls["requested"]
    return {**controls, "baseline_process_memory": baseline_memory}


def load_watched(run: Optional[lifecycle.Run], directory, spec) -> dict:
    """The model and tokenizer loaded from the verified directory with the protocol's controls, and the watch on
    every forward of the model, which the run (if any) reconciles with its plan at its end."""
    from inferlab.measure import loading

    loaded = loading.load_specimen(directory, spec)
    watch = loading.ForwardWatch(loaded["model"])
    if run is not None:
        run.forward_watch = watch
    return {**loaded, "forward_watch": watch}
