"""An honest failure stays honest (issue 45, item 1): real stand-in runs in which the per-trial time limit strikes
(a limit of 1 ms on the chosen tests and a 50 ms pause of the process inside each of them, set by a plugin given with
-p: no file of the project and no record is edited) in every kind of experiment test: the specimen's, the inputs', greedy and sampled generation trials, the
cache comparison, timing, memory, batching and the summaries. Each run is verified (no integrity problem, the
failed tests named) and graded: a failed item, exit 1, with the failure quoted, never an integrity problem (3).

Three sessions, each made once and shared: a limit that strikes in the specimen's or the inputs' tests skips
every test after them (they provide what the rest need), so those two kinds get a session each, and one session
strikes in every other kind at once. docs/grading.md says what verify and grade make of an honest ending."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from inferlab.grade import rubric
from inferlab.grade.grade import grade_source
from inferlab.read.verify import integrity_problems
from inferlab.read.verify import verify_run

from shared_runs import experiment_here, inferlab_command, made_once

STRIKE_PLUGIN = '''"""A per-trial limit that strikes: a test whose node id matches INFERLAB_STRIKE gets a 1 ms limit, and the
process pauses for 50 ms at the start of that test's body, inside its timed call, as a machine paused by a closed lid
or a suspended terminal would: the limit strikes there whatever the test is, a check that takes less than a
millisecond included."""
import functools
import os
import re
import time

import pytest


def _paused(test):
    @functools.wraps(test)
    def paused(*args, **kwargs):
        time.sleep(0.05)
        return test(*args, **kwargs)

    return paused


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    pattern = re.compile(os.environ["INFERLAB_STRIKE"])
    for item in items:
        if pattern.search(item.nodeid):
            item.add_marker(pytest.mark.timeout(0.001, method="signal", func_only=True), append=False)
            item.obj = _paused(item.obj)
'''
SESSIONS = {
    # every kind that no other test needs first: P2's trials and P1's beyond the first of each condition and the
    # rerun (those stay, for the checks and the cache comparison that need them), P1's sampling check, the cache
    # comparison, timing, memory, batching, summaries
    "kinds": r"test_generation_trial\[(P2-|P1-G-rep[23]|P1-S\d-seed(23|31))|test_greedy_repetitions_identical\[P1|"
             r"test_matched_prefix|test_(50|60|70)_",
    "specimen": r"test_10_specimen",
    "inputs": r"test_20_inputs",
}
TIMEOUT = "Timeout (>0.001s) from pytest-timeout"


def struck_run(tmp_path_factory, name: str):
    """The run of one session of SESSIONS, made once: (its folder, its exit status)."""
    def make(folder):
        plugins = folder / "plugins"
        plugins.mkdir(parents=True)
        (plugins / "strike_limit.py").write_text(STRIKE_PLUGIN)
        made = experiment_here(folder, "--specimen", "standin", "-p", "strike_limit", sys_path=(plugins,),
                               env={"INFERLAB_STRIKE": SESSIONS[name]})
        return {"run": str(made.run), "returncode": made.returncode, "tail": made.stdout[-3000:]}

    made = made_once(tmp_path_factory, f"struck-{name}", make)
    from pathlib import Path

    return Path(made["run"]), made["returncode"], made["tail"]


def timed_out(run) -> list[str]:
    """The tests whose outcome is a failure by the time limit."""
    outcomes = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    return [r["test"] for r in outcomes if r["kind"] == "test_outcome" and r.get("outcome") == "failed"
            and TIMEOUT in str(r.get("longrepr"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SESSIONS))
def test_a_time_limit_that_strikes_is_a_failed_item_never_an_integrity_problem(tmp_path_factory, name):
    run, status, tail = struck_run(tmp_path_factory, name)
    assert status == 1, tail  # the session's own exit: tests failed
    struck = timed_out(run)
    assert struck, tail
    result = verify_run(run)
    assert integrity_problems(result) == [], result["problems"]
    assert result["outcome_counts"]["failed"] >= len(struck)
    grade = grade_source(run, rubric.load())
    assert grade.exit_status == 1 and grade.integrity == [], grade.integrity
    status, printed = inferlab_command("grade", run)  # what a grader reads
    assert status == 1 and "(exit 1)" in printed.splitlines()[-1] and "integrity" not in printed
    assert "Timeout (>0.001s)" in printed  # the failure record, quoted


@pytest.mark.slow
def test_the_limit_struck_in_every_kind_of_experiment_test(tmp_path_factory):
    struck = {name: timed_out(struck_run(tmp_path_factory, name)[0]) for name in SESSIONS}
    every = [test for tests in struck.values() for test in tests]
    kinds = {
        "specimen": "test_10_specimen.py::",
        "inputs": "test_20_inputs.py::",
        "greedy trial": "test_generation_trial[P2-G-",
        "sampled trial": "test_generation_trial[P2-S",
        "sampling checks": "test_30_sampling.py::test_greedy_repetitions_identical[P1",
        "cache comparison": "test_40_cache.py::test_matched_prefix",
        "timing trial": "test_50_timing.py::test_timing_trial[",
        "timing summary": "test_50_timing.py::test_timing_summary[",
        "memory": "test_60_memory.py::",
        "batching": "test_70_batching.py::",
    }
    missing = [kind for kind, where in kinds.items() if not any(where in test for test in every)]
    assert not missing, (missing, every)


FULL_DISK_BYTES = 256 << 10  # 256 KiB: the plan and the manifest fit; the first saved logits do not (a larger disk only
# lets the run go on longer before it fills)


def full_disk_run(tmp_path_factory) -> dict:
    """A stand-in run whose record folder is a small file system of its own (FULL_DISK_BYTES), mounted for it (root
    only): it fills during the run, as a learner's full disk would. Made once; the run is copied off the small disk, byte for byte,
    before it is unmounted. {"run", "returncode", "tail"} or {"skip": why}."""
    if os.geteuid() != 0:
        return {"skip": "mounting a small file system for the record folder needs root (CI runs as root)"}

    def make(folder):
        mounted, refused = [], []

        def prepare(project):
            disk = project / "run"
            disk.mkdir()
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FULL_DISK_BYTES}", "inferlab-full-disk",
                                   str(disk)], capture_output=True, text=True)
            (mounted if done.returncode == 0 else refused).append(done.stderr.strip() or str(disk))

        try:
            made = experiment_here(folder, "--specimen", "standin", prepare=prepare)
            if refused:
                return {"skip": f"mount refused here: {refused[0]}"}
            kept = folder / "run-from-the-full-disk"
            shutil.copytree(made.run, kept)
        finally:
            for _ in mounted:  # a mount left behind outlives the session: that must fail loudly, never pass quietly
                done = subprocess.run(["umount", str(folder / "project" / "run")], capture_output=True, text=True)
                assert done.returncode == 0, f"the small disk is still mounted: {done.stderr.strip()}"
        return {"run": str(kept), "returncode": made.returncode, "tail": (made.stdout + made.stderr)[-3000:]}

    return made_once(tmp_path_factory, "full-disk", make)


@pytest.mark.slow
def test_a_full_disk_is_an_unfinished_run_never_an_integrity_problem(tmp_path_factory):
    made = full_disk_run(tmp_path_factory)
    if "skip" in made:
        pytest.skip(made["skip"])
    from pathlib import Path

    run = Path(made["run"])
    # exit 1: the session failed; 2 would say someone interrupted it
    assert made["returncode"] == 1 and "No space left on device" in made["tail"], made["tail"]
    lines = (run / "records.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])  # whole lines only, none torn
    # the session stopped after the first test whose write failed, and said why in its last line
    failed = [r for r in map(json.loads, lines[:-1]) if r["kind"] == "test_outcome" and r["outcome"] == "failed"]
    assert len(failed) == 1 and "No space left on device" in failed[0]["longrepr"], failed
    assert "stopped: writing into run failed" in made["tail"].splitlines()[-1], made["tail"]  # --record-dir run
    result = verify_run(run)
    assert integrity_problems(result) == [], result["problems"]
    status, printed = inferlab_command("grade", run)  # exit 1, as a failed item, never an integrity problem
    assert status == 1 and "did not reach its end: stopped: writing into" in printed and "integrity" not in printed
