"""How long `grade --against` takes over a class: N copies of one stand-in run, graded as a grader types it.

Usage (from the repository root):
    python -m benchmarks.grading [--runs N] [--source RUN_DIR] [--archives] [--record-to FILE]

Without --source it first makes one stand-in run (python -m pytest experiments --specimen standin), timed on its
own and printed beside the grading time. That run is the course's run; it is copied N times (default 40) into a
folder of submissions (with --archives, each copy is packed with `inferlab pack`, as learners hand them in), and one
`python -m inferlab grade SUBMISSIONS... --against SOURCE --out PAGE --csv CSV` is timed end to end in a fresh
process: every submission unpacked or read, verified and compared with the course's run. The target is at most
180 s for 40 submissions on two cores (issue 57).

Nothing is written into tracked files unless --record-to FILE is given (a JSON line with this machine's
fingerprint is appended to it). The last line is exactly:  grading_seconds=<s> runs=<n> per_run=<s>
Exit status 0 within the target (or with fewer than 40 runs, which it does not judge), 1 over it, 2 when the
source run, pack or grade itself failed.
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

TARGET_S = 180.0
TARGET_RUNS = 40


def run(command: list[str], what: str) -> subprocess.CompletedProcess:
    """command from the repository root; RuntimeError naming `what` when it exits 2 or more."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode >= 2:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}")
    return done


def main(argv=None) -> int:
    """Make or take a run, copy (and pack) it, time grade --against over the copies; the result line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=TARGET_RUNS, help=f"copies to grade (default {TARGET_RUNS})")
    parser.add_argument("--source", type=Path, help="a finished run to copy (default: make one stand-in run)")
    parser.add_argument("--archives", action="store_true", help="hand in each copy packed (default: run folders)")
    parser.add_argument("--record-to", type=Path, metavar="FILE",
                        help="append the result, with this machine's fingerprint, to FILE (JSON Lines)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: at least 1")
    run_seconds = None
    with tempfile.TemporaryDirectory(prefix="inferlab-grading-bench-") as work:
        work = Path(work)
        try:
            source = args.source
            if source is None:
                start, source = time.perf_counter(), work / "course-run"
                run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "experiments", "--specimen",
                     "standin", "--record-dir", str(source)], "the stand-in run")
                run_seconds = time.perf_counter() - start
            submissions = []
            for index in range(args.runs):
                copy = shutil.copytree(source, work / "submissions" / f"learner-{index:03d}")
                if args.archives:
                    archive = copy.with_suffix(".tar.gz")
                    run([sys.executable, "-m", "inferlab", "pack", str(copy), "-o", str(archive), "--learner",
                         copy.name], "pack")
                    shutil.rmtree(copy)
                    copy = archive
                submissions.append(str(copy))
            start = time.perf_counter()
            done = run([sys.executable, "-m", "inferlab", "grade", *submissions, "--against", str(source),
                        "--out", str(work / "page.txt"), "--csv", str(work / "grades.csv")], "grade")
            seconds = time.perf_counter() - start
        except RuntimeError as error:
            print(f"benchmarks.grading: {error}", file=sys.stderr)
            return 2
        rows = len((work / "grades.csv").read_text().splitlines()) - 1
    if rows != args.runs:
        print(f"benchmarks.grading: grade wrote {rows} rows for {args.runs} runs (exit {done.returncode})",
              file=sys.stderr)
        return 2
    per_run = seconds / args.runs
    judged = args.runs >= TARGET_RUNS  # fewer runs measure mostly the process start
    over = seconds * TARGET_RUNS / args.runs > TARGET_S
    verdict = (f"{'OVER' if over else 'within'} the target of {TARGET_S:g} s for {TARGET_RUNS}" if judged
               else f"fewer than {TARGET_RUNS} runs: not judged")
    kind = "archives" if args.archives else "run folders"
    print(f"graded {args.runs} {kind} --against one course run in {seconds:.2f} s end to end (grade exit "
          f"{done.returncode}), {per_run:.3f} s each; {verdict}")
    if run_seconds is not None:
        print(f"one stand-in run took {run_seconds:.1f} s here: the class of {args.runs} took "
              f"{seconds / run_seconds:.1f} times it")
    if args.record_to is not None:
        from inferlab.host import machine

        machine.append_result({"benchmark": "grading", "runs": args.runs, "archives": args.archives,
                               "seconds": seconds, "per_run_s": per_run, "standin_run_s": run_seconds,
                               "machine": machine.machine_fingerprint()}, args.record_to)
    print(f"grading_seconds={seconds:.3f} runs={args.runs} per_run={per_run:.4f}")
    return 1 if judged and over else 0


if __name__ == "__main__":
    sys.exit(main())
