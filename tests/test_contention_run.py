"""A real stand-in run with a busy loop pinned to the experiment's CPU during chosen timing trials: exactly those
trials (and any the kernel says another task held the CPU from) are marked contended from their own records, the
report's timing section and run status say so, the cache verdict leaves them out (or says it rests on all samples),
and verify catches a forged "uncontended" flag.

Made robust for a shared 2-core machine: the experiment (an inner session of this worker, whose one computing
thread is pinned for the run) and the busy loop are pinned to the same single CPU, so a busy trial shares its CPU
for certain, whatever else runs; the busy loop is started and stopped by a plugin in the
experiment's own conftest around the chosen trials' test calls (and is running before the call starts). That
plugin also reads the kernel's run delay of the experiment's thread (/proc/thread-self/schedstat: time spent
runnable but waiting for a CPU) around every trial's call, an account of the contention independent of the
run's own readings. A trial the busy loop did not touch but which is contended without the kernel's run queue
seeing it wait (a virtual machine's host taking the vCPU: steal time) is listed in the output, not asserted.
One run for the whole module, of P1's part of the timing schedule (with the tests it needs first: the specimen's, the
inputs' and the greedy trial its loop is checked against); leaving P1x8's out also shows verify reading a selection
that keeps some of a test's parameters as partial, not as missing records.
"""

from __future__ import annotations

import json
import os

import pytest

from inferlab import protocol
from inferlab.run.records import REPORT_FILE
from inferlab.measure import stats, usage
from inferlab.read.verify import verify_run

import shared_runs

pytestmark = [pytest.mark.process, pytest.mark.slow]

BUSY = ("P1-cache_on-rep2", "P1-cache_off-rep4")  # one measured trial of each side
# P1's part of the timing schedule (P1x8's trials run the same loop on a longer prompt), with the tests it needs first
TIMING_PART = "test_10_specimen or test_20_inputs or P1-G-rep1 or (test_50_timing and not P1x8)"
BUSY_SHARE_BELOW = 0.75  # a trial sharing its one CPU with the busy loop keeps less than this share of it

# Appended to the scratch project's conftest.py: the busy loop around the chosen trials, the kernel's run delay
# around every trial. Nothing of the experiment is patched.
BUSY_PLUGIN = '''

import json as _busy_json
import os as _busy_os
import subprocess as _busy_subprocess
import sys as _busy_sys

import pytest as _busy_pytest

_BUSY_TRIALS = set(_busy_os.environ["INFERLAB_TEST_BUSY_TRIALS"].split(","))
_BUSY_LOG = _busy_os.environ["INFERLAB_TEST_BUSY_LOG"]
_BUSY_CPU = int(_busy_os.environ["INFERLAB_TEST_BUSY_CPU"])
# it spins until the experiment's process is gone, so a crashed run leaves no busy loop behind
_SPIN = ("import os, sys\\nparent = os.getppid()\\nsys.stdout.write('r')\\nsys.stdout.flush()\\n"
         "while os.getppid() == parent:\\n    for _ in range(100000):\\n        pass\\n")


def _busy_schedstat():
    try:
        with open("/proc/thread-self/schedstat") as stat:
            cpu, delay = stat.read().split()[:2]
        return {"cpu_ns": int(cpu), "run_delay_ns": int(delay)}
    except (OSError, ValueError):
        return None


@_busy_pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    callspec = getattr(item, "callspec", None)
    trial = callspec.params.get("trial") if callspec is not None else None
    schedule_id = getattr(trial, "test_id", None)
    spinner = None
    if schedule_id in _BUSY_TRIALS:
        spinner = _busy_subprocess.Popen([_busy_sys.executable, "-c", _SPIN], stdout=_busy_subprocess.PIPE,
                                         preexec_fn=lambda: _busy_os.sched_setaffinity(0, {_BUSY_CPU}))
        spinner.stdout.read(1)  # it is spinning before the trial starts
    before = _busy_schedstat()
    try:
        return (yield)
    finally:
        after = _busy_schedstat()
        if spinner is not None:
            spinner.kill()
            spinner.wait()
        if schedule_id is not None:
            with open(_BUSY_LOG, "a") as log:
                log.write(_busy_json.dumps({"schedule_id": schedule_id, "busy": spinner is not None,
                                            "before": before, "after": after}) + "\\n")
'''


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory) -> dict:
    """The run (its thread pinned with its busy loop to one CPU), its records and the plugin's log: an inner
    session of this worker, whose main thread computes (torch's one intra-op thread) and is pinned for the run and
    let go after it."""
    folder = tmp_path_factory.mktemp("busy")
    cpu = min(os.sched_getaffinity(0))
    log = folder / "busy-log.jsonl"
    env = {"INFERLAB_TEST_BUSY_TRIALS": ",".join(BUSY), "INFERLAB_TEST_BUSY_LOG": str(log),
           "INFERLAB_TEST_BUSY_CPU": str(cpu)}
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # 0: this thread, the one the experiment computes on
    try:
        made = shared_runs.experiment_here(folder, "--specimen", "standin", "--offline", "-p", "no:cacheprovider",
                                           "-k", TIMING_PART, conftest_extra=BUSY_PLUGIN, env=env)
    finally:
        os.sched_setaffinity(0, allowed)
    assert made.returncode == 0, made.tail()
    calls = {entry["schedule_id"]: entry for entry in map(json.loads, log.read_text().splitlines())}
    return {"run": made.run, "records": made.records(), "calls": calls, "tail": made.tail()}


def trials_of(busy_run) -> dict:
    return {r["schedule_id"]: r for r in busy_run["records"] if r["kind"] == "timing_trial"}


def waited_ns(call: dict):
    """The kernel's run delay of the experiment's thread over one trial's test call, or None without schedstat."""
    if not call.get("before") or not call.get("after"):
        return None
    return call["after"]["run_delay_ns"] - call["before"]["run_delay_ns"]


def test_exactly_the_busy_trials_and_those_the_kernel_saw_waiting_are_marked_contended(busy_run):
    trials = trials_of(busy_run)
    calls = busy_run["calls"]
    assert {name for name, call in calls.items() if call["busy"]} == set(BUSY), calls
    for name in BUSY:
        record = trials[name]
        assert record["contended"] is True, (name, record["cpu_evidence"], busy_run["tail"])
        assert stats.loop_cpu_share(record) < BUSY_SHARE_BELOW, (name, record["cpu_evidence"])  # it shared its CPU
    unexplained = []
    for name, record in trials.items():
        assert record["contended"] == usage.recorded_evidence(record)["contended"]  # from its own readings
        if name in BUSY or record["contended"] is False:
            continue
        # not touched by the busy loop, yet contended: the kernel must say this thread waited for its CPU
        waited = waited_ns(calls[name])
        assert waited is not None, f"{name} is contended without the busy loop, and no schedstat says why"
        spans = [s for s in record["cpu_evidence"].values() if s["contended"]]
        lost = max(s["wall_ns"] - s["cpu_ns"] for s in spans)
        if waited < 0.5 * lost and not any(s["voluntary_switches"] for s in spans):
            # A loss the guest's run queue did not see: on this virtual machine the host takes the vCPU itself
            # (steal time; two full suites here saw 2 ms and 200 ms of it). Not asserted, since no account inside
            # the guest attributes it; said in the output instead (issue 33 stays open on this point).
            unexplained.append(f"{name}: lost {lost} ns, run delay {waited} ns")
    quiet = [n for n, r in trials.items() if n not in BUSY and r["contended"] is False]
    print(f"contended without the busy loop: {len(trials) - len(BUSY) - len(quiet)} of {len(trials) - len(BUSY)}; "
          f"not explained by the run queue: {unexplained}")


def test_the_report_and_run_status_say_which_trials_were_contended(busy_run):
    text = (busy_run["run"] / REPORT_FILE).read_text(encoding="utf-8")
    timing = text[text.index("## Timing"):text.index("\n## ", text.index("## Timing") + 1)]
    status = text[text.index("## Run status"):text.index("\n## ", text.index("## Run status") + 1)]
    contended = [n for n, r in trials_of(busy_run).items() if r["contended"]]
    assert f"Contended (‡): {len(contended)} of {len(trials_of(busy_run))} trials" in timing
    assert all(name in timing for name in BUSY)
    assert f"**The timing part was contended**: {len(contended)} of {len(trials_of(busy_run))} timing trials" in status
    assert "rerun on a quieter machine" in status
    assert "![Each timing trial in schedule order" in timing and (busy_run["run"] / "plot_cpu_share.png").is_file()


def test_the_cache_verdict_leaves_the_contended_trials_out_or_says_it_rests_on_them(busy_run):
    trials = list(trials_of(busy_run).values())
    contended = {t["schedule_id"] for t in trials if t["contended"]}
    for verdict in stats.cache_verdicts(trials)["verdicts"]:
        used = set(verdict["cache_on"]["schedule_ids"]) | set(verdict["cache_off"]["schedule_ids"])
        if verdict["samples"] == "uncontended":
            assert not used & contended, verdict
            assert {n for n in BUSY if n.startswith(verdict["prompt_id"] + "-")} <= set(verdict["not_used"])
            assert min(verdict["cache_on"]["n"], verdict["cache_off"]["n"]) >= protocol.VERDICT_MIN_UNCONTENDED
        else:
            assert "from all samples: fewer than" in verdict["reason"] and not verdict["not_used"]


def test_the_busy_run_verifies(busy_run):
    problems = verify_run(busy_run["run"])["problems"]
    assert len(problems) == 1 and problems[0].startswith(f"partial: -k '{TIMING_PART}'"), problems
