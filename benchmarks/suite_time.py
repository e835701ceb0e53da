"""How long `make test` takes, step by step, beside one stand-in experiment run on the same machine.

Usage (from the repository root):  python -m benchmarks.suite_time [--record-to FILE] [--skip-reference-run]

Runs, one after another and in the foreground, each step of `make test` as its own make target
(test-analytic, test-harness: the Makefile is the one definition of what they run), then one
stand-in experiment run on its own (`pytest experiments --specimen standin` into a temporary folder, removed
afterwards), and prints one line per step with its wall time and exit status, the total, and the total divided
by the stand-in run's time, so that the ratio is read from one invocation on one machine. The result, with this
machine's fingerprint and the commit, is appended to runs/benchmarks/suite_time.jsonl (untracked) or to the
file --record-to names. It is a benchmark, not a test: nothing asserts a time. The last line is exactly:
  make_test_s=<total> standin_run_s=<one run> ratio=<total/run>
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
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferlab import environment, machine  # noqa: E402

ROOT = machine.PROJECT_ROOT
STEPS = ("test-analytic", "test-harness")  # `make test`'s prerequisites, in its order
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


def main(argv: list[str] | None = None) -> int:
    """Time each step, then the reference run; print the table and the last line; append the result."""
    args = build_parser().parse_args(argv)
    make = os.environ.get("MAKE", "make")
    steps = {}
    for step in STEPS:
        seconds, status = timed([make, "-s", step])
        steps[step] = {"wall_s": round(seconds, 2), "exit_status": status}
    total = round(sum(s["wall_s"] for s in steps.values()), 2)
    reference = None if args.skip_reference_run else standin_run_seconds()
    print()
    for step, result in steps.items():
        print(f"{step:16} {result['wall_s']:8.1f} s   exit {result['exit_status']}")
    print(f"{'make test':16} {total:8.1f} s   on {os.cpu_count()} CPUs")
    result = {"benchmark": "benchmarks/suite_time.py", "recorded_utc": datetime.datetime.now(datetime.timezone.utc)
              .isoformat(), "machine": machine.machine_fingerprint(), "git": environment.git_state(ROOT),
              "steps": steps, "make_test_s": total}
    line = f"make_test_s={total:.1f}"
    if reference is not None:
        run_s, run_status = reference
        result.update(standin_run_s=round(run_s, 2), standin_run_exit_status=run_status, ratio=round(total / run_s, 2))
        print(f"{'one stand-in run':16} {run_s:8.1f} s   exit {run_status}")
        line += f" standin_run_s={run_s:.1f} ratio={total / run_s:.2f}"
    machine.append_result(result, args.results)
    print(f"(appended to {args.results})")
    print(line)
    return 0 if all(s["exit_status"] == 0 for s in steps.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
