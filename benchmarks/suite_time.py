"""How long `make test` and `make test-fast` take, beside one stand-in experiment run on the same machine.

Usage (from the repository root):  python -m benchmarks.suite_time [--record-to FILE] [--skip-reference-run]

Runs `make test` in the foreground (the Makefile is the one definition of what it runs: one pytest session over
the analytic and the harness tests on every core) with a JUnit report, then `make test-fast`, then one stand-in
experiment run on its own (`pytest experiments --specimen standin` into a temporary folder, removed afterwards).
It prints make test's wall time and exit status; from the JUnit report, the test time of each part
(analytic_tests, tests: summed over both workers, so the parts add up to more than the wall time) and of the
slowest files; make test-fast's wall time; the stand-in run's time; and each make target's time divided by it,
so that the ratios are read from one invocation on one machine (a machine twice as slow doubles every figure and
leaves the ratios). The result, with this machine's fingerprint and the commit, is appended to
runs/benchmarks/suite_time.jsonl (untracked) or to the file --record-to names. It is a benchmark, not a test: nothing asserts a time. The last line is exactly:
  make_test_s=<total> make_test_fast_s=<fast lane> standin_run_s=<one run> ratio=<total/run> fast_ratio=<fast/run>
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferlab.host import environment, machine  # noqa: E402

ROOT = machine.PROJECT_ROOT
SLOWEST_FILES = 8  # how many files the table lists
RESULTS_FILE = ROOT / "runs" / "benchmarks" / "suite_time.jsonl"


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's command line: --record-to, --skip-reference-run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-to", dest="results", type=Path, default=RESULTS_FILE, metavar="FILE",
                        help=f"append the result to this JSON Lines file (default: {RESULTS_FILE.relative_to(ROOT)}, "
                             "which git ignores)")
    parser.add_argument("--skip-reference-run", action="store_true",
                        help="time the make steps only (no ratio is printed)")
    return parser


def timed(command: list[str]) -> tuple[float, int]:
    """(wall seconds, exit status) of one command run in the repository root, its output passed through."""
    start = time.perf_counter()
    status = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL).returncode
    return time.perf_counter() - start, status


def standin_run_seconds() -> tuple[float, int]:
    """One stand-in experiment run into a temporary folder (removed afterwards): (wall seconds, exit status)."""
    scratch = Path(tempfile.mkdtemp(prefix="inferlab-suite-time-"))
    try:
        return timed([sys.executable, "-m", "pytest", "experiments", "--specimen", "standin", "-q",
                      "--record-dir", str(scratch / "run")])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_seconds_by_file(junit: Path) -> Counter:
    """Seconds of test time (setup, call and teardown) per test file, from a JUnit report; empty when there is none
    (make stopped before pytest wrote it)."""
    per_file: Counter = Counter()
    if not junit.is_file():
        return per_file
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        path = "/".join(module[:2]) + ".py" if len(module) >= 2 else case.get("classname", "")
        per_file[path] += float(case.get("time") or 0)
    return per_file


def main(argv: list[str] | None = None) -> int:
    """Time make test, then make test-fast, then the reference run; print the table and the last line; append the
    result. Exit 1 when either make target failed."""
    args = build_parser().parse_args(argv)
    started_at = environment.git_state(ROOT)  # what is timed is the checkout as it starts, not as it ends
    make = os.environ.get("MAKE", "make")
    scratch = Path(tempfile.mkdtemp(prefix="inferlab-suite-time-junit-"))
    try:
        junit = scratch / "make-test.xml"
        seconds, status = timed([make, "-s", "test", f"PYTEST_ARGS=--junitxml={junit}"])
        per_file = test_seconds_by_file(junit)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    fast_seconds, fast_status = timed([make, "-s", "test-fast"])
    total = round(seconds, 2)
    parts = Counter()
    for path, part_seconds in per_file.items():
        parts[path.split("/")[0]] += part_seconds
    reference = None if args.skip_reference_run else standin_run_seconds()
    print()
    print(f"{'make test':24} {total:8.1f} s wall   exit {status}   on {os.cpu_count()} CPUs")
    for part, part_seconds in sorted(parts.items()):
        print(f"  {part + '/':22} {part_seconds:8.1f} s of test time")
    for path, file_seconds in per_file.most_common(SLOWEST_FILES):
        print(f"    {path:40} {file_seconds:8.1f} s")
    print(f"{'make test-fast':24} {fast_seconds:8.1f} s wall   exit {fast_status}")
    result = {"benchmark": "benchmarks/suite_time.py", "recorded_utc": datetime.datetime.now(datetime.timezone.utc)
              .isoformat(), "machine": machine.machine_fingerprint(), "git": started_at,
              "make_test_s": total, "exit_status": status,
              "make_test_fast_s": round(fast_seconds, 2), "fast_exit_status": fast_status,
              "test_seconds": {part: round(value, 2) for part, value in sorted(parts.items())},
              "slowest_files": {path: round(value, 2) for path, value in per_file.most_common(SLOWEST_FILES)}}
    line = f"make_test_s={total:.1f} make_test_fast_s={fast_seconds:.1f}"
    if reference is not None:
        run_s, run_status = reference
        result.update(standin_run_s=round(run_s, 2), standin_run_exit_status=run_status, ratio=round(total / run_s, 2),
                      fast_ratio=round(fast_seconds / run_s, 2))
        print(f"{'one stand-in run':24} {run_s:8.1f} s wall   exit {run_status}")
        line += f" standin_run_s={run_s:.1f} ratio={total / run_s:.2f} fast_ratio={fast_seconds / run_s:.2f}"
    machine.append_result(result, args.results)
    print(f"(appended to {args.results})")
    print(line)
    return 0 if status == fast_status == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
