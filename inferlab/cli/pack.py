"""`pack RUN_DIR -o FILE.tar.gz [--learner ID]`: one run folder and what was attached to it, as one archive to
submit, with who submits it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, directory, refuse_non_run

NAME = "pack"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "the archive was written and verify found no problem", 1: "the archive was written, but verify found "
                                                                     "problems (listed)",
         2: "nothing written: a usage error, not a run, a plan folder, a run still being written, a bad output"}
HELP = ("bundle a run folder, its addenda and a submission.json (the run, the commit, the inventory hashes) into "
        "one .tar.gz that grade reads directly")
EPILOG = """exit status:
  0  the archive was written and verify found no problem in the run
  1  the archive was written, but verify found problems in the run (listed; grade will report them)
  2  nothing written: a usage error, a folder that is not a run or is a plan (--plan), a run still being
     written by its session (wait for it to end), or an output file that exists, lies inside the run
     folder or cannot be written"""


def add_arguments(parser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("record_dir", type=directory, metavar="RUN_DIR")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.tar.gz",
                        help="the archive to write (a new file, outside the run folder)")
    parser.add_argument("--learner", metavar="ID",
                        help="who submits: your id in the course (a student number, login or e-mail), written "
                             "into submission.json for the grader's class view")


def run(args) -> int:
    from inferlab.submission.pack import PackError, pack_run
    from inferlab.reading.runview import RunView
    from inferlab.verify import verify_run

    if refuse_non_run("pack", args.record_dir):
        return EXIT_UNREADABLE
    view = RunView.read(args.record_dir)
    try:
        packed = pack_run(view, args.output, learner=args.learner)
    except PackError as error:
        print(f"pack: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    problems = verify_run(view)["problems"]
    print(f"pack: {packed['archive']}: run {packed['run']}, {packed['files']} files ({packed['addenda']} "
          f"attached afterwards), {packed['bytes']} bytes, sha256 {packed['sha256']}"
          + (f", learner {args.learner.strip()}" if args.learner is not None else ""))
    if problems:
        for line in problems:
            print(f"  {line}")
        print(f"pack: verify found {len(problems)} problem(s) in the run; grade will report them")
        return EXIT_PROBLEMS
    return EXIT_OK
