"""How long `grade` takes over a class: 40 copies of one stand-in run, graded as a grader would type it.

Usage (from the repository root):
    python -m benchmarks.grading [--runs N] [--source RUN_DIR] [--record-to FILE]
    python -m benchmarks.grading --replay [--jobs N] [--artifacts DIR] [--runs N] [--source RUN_DIR]
    python -m benchmarks.grading --against [--jobs N] [--runs N] [--source RUN_DIR]

Without --source it first makes one stand-in run (python -m pytest experiments --specimen standin), timed on its
own: that time is printed beside the grading time, since a replay redoes a run's deterministic part. It copies
that run N times (default 40) into a folder of submissions, then times one `python -m inferlab grade SUBMISSIONS
--out PAGE --csv CSV` end to end in a fresh process: every run read and verified, its items checked, the class
page and its plot drawn. The target is at most 30 s for 40 runs on two cores (issue 24); a hand loop of `verify`
and `report --check` over 40 runs took 25.6 s.

With --replay, grade also re-executes every run on the grader's copy of the stand-in (`--replay --specimen
standin --artifacts DIR --jobs N`; DIR is --artifacts, else a stand-in built for the benchmark, not timed; N is
--jobs, default 2): the target is at most 180 s for 40 runs on two cores (issue 31).

With --against, grade compares every run with one course run instead (`--against COURSE_RUN --jobs N`; the
source run itself is the course's run, so every copy is compared bit for bit): the target is at most 180 s for 40
runs on two cores (issue 43).

Nothing is written into tracked files unless --record-to FILE is given (a JSON line with this machine's
fingerprint is appended to it). The last line is exactly:  grading_seconds=<s> runs=<n> per_run=<s>
Exit status 0 within the target (or with fewer than 40 runs, which it does not judge), 1 over it, 2 when the
source run or grade itself failed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(ROOT))

TARGET_S = 30.0
REPLAY_TARGET_S = 180.0
TARGET_RUNS = 40


def make_source(workdir: Path) -> Path:
    """One stand-in run, made with the experiment itself (not timed)."""
    target = workdir / "source-run"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "experiments",
                           "--specimen", "standin", "--record-dir", str(target)], cwd=ROOT, capture_output=True,
                          text=True)
    if not (target / "manifest.json").is_file():
        raise RuntimeError(f"the stand-in run failed (pytest exit {done.returncode}):\n{done.stdout[-2000:]}")
    return target


def build_standin(workdir: Path) -> Path:
    """The grader's copy of the stand-in, built offline for the benchmark (not timed)."""
    target = workdir / "grader-standin"
    done = subprocess.run([sys.executable, "-m", "inferlab.standin", str(target)], cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the stand-in build failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return target


def main(argv=None) -> int:
    """Make or take a run, copy it, time grade over the copies; print the result, the ratio line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=TARGET_RUNS, help=f"copies to grade (default {TARGET_RUNS})")
    parser.add_argument("--source", type=Path, help="a finished run to copy (default: make one stand-in run)")
    parser.add_argument("--replay", action="store_true", help="grade with --replay (the target is then "
                        f"{REPLAY_TARGET_S:g} s for {TARGET_RUNS})")
    parser.add_argument("--against", action="store_true", help="grade with --against the source run (the target "
                        f"is then {REPLAY_TARGET_S:g} s for {TARGET_RUNS})")
    parser.add_argument("--jobs", type=int, default=2, help="with --replay or --against: grade's --jobs (default 2)")
    parser.add_argument("--artifacts", type=Path, metavar="DIR",
                        help="with --replay: the grader's copy of the stand-in (default: one built for the benchmark)")
    parser.add_argument("--record-to", type=Path, metavar="FILE",
                        help="append the result, with this machine's fingerprint, to FILE (JSON Lines)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: at least 1")
    if args.replay and args.against:
        parser.error("--replay and --against: give one")
    target_s = REPLAY_TARGET_S if args.replay or args.against else TARGET_S
    run_seconds = None
    with tempfile.TemporaryDirectory(prefix="inferlab-grading-bench-") as work:
        work = Path(work)
        try:
            if args.source is None:
                start = time.perf_counter()
                source = make_source(work)
                run_seconds = time.perf_counter() - start
            else:
                source = args.source
            copy = (args.artifacts or build_standin(work)) if args.replay else None
        except RuntimeError as error:
            print(f"benchmarks.grading: {error}", file=sys.stderr)
            return 2
        submissions = work / "submissions"
        for index in range(args.runs):
            shutil.copytree(source, submissions / f"learner-{index:03d}")
        size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        command = [sys.executable, "-m", "inferlab", "grade", str(submissions), "--out", str(work / "page"),
                   "--csv", str(work / "grades.csv")]
        if copy is not None:
            command += ["--replay", "--specimen", "standin", "--artifacts", str(copy), "--jobs", str(args.jobs)]
        if args.against:
            command += ["--against", str(source), "--jobs", str(args.jobs)]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        rows = len((work / "grades.csv").read_text().splitlines()) - 1 if (work / "grades.csv").is_file() else 0
    if rows != args.runs:
        print(f"benchmarks.grading: grade wrote {rows} rows for {args.runs} runs (exit {done.returncode}):\n"
              f"{done.stderr[-2000:]}", file=sys.stderr)
        return 2
    per_run = seconds / args.runs
    judged = args.runs >= TARGET_RUNS  # fewer runs measure mostly the process start and the class plot
    over = seconds * TARGET_RUNS / args.runs > target_s
    verdict = (f"{'OVER' if over else 'within'} the target of {target_s:g} s for {TARGET_RUNS}" if judged
               else f"fewer than {TARGET_RUNS} runs: not judged")
    how = f" with --{'replay' if args.replay else 'against'} --jobs {args.jobs}" if args.replay or args.against else ""
    print(f"graded {args.runs} runs of {size / 1e6:.1f} MB each{how} in {seconds:.2f} s end to end (grade exit "
          f"{done.returncode}), {per_run:.3f} s per run; {verdict}")
    if run_seconds is not None:
        print(f"one stand-in run (the experiment itself) took {run_seconds:.1f} s here: grading one run{how} took "
              f"{per_run / run_seconds:.2f} of it, the class of {args.runs} {seconds / run_seconds:.1f} times it")
    if args.record_to is not None:
        from inferlab.host import machine

        machine.append_result({"benchmark": "grading", "runs": args.runs, "seconds": seconds, "per_run_s": per_run,
                               "run_bytes": size, "replay": args.replay, "against": args.against,
                               "jobs": args.jobs if args.replay or args.against else 1,
                               "standin_run_s": run_seconds, "machine": machine.machine_fingerprint()},
                              args.record_to)
    print(f"grading_seconds={seconds:.3f} runs={args.runs} per_run={per_run:.4f}")
    return 1 if judged and over else 0


if __name__ == "__main__":
    sys.exit(main())
