"""`pack RUN_DIR -o FILE.tar.gz`: one run folder and what was attached to it, as one archive to submit."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, directory, refuse_non_run

NAME = "pack"
HELP = ("bundle a run folder, its addenda and a submission.json (the run, the commit, the inventory hashes) into "
        "one .tar.gz that grade reads directly")
EPILOG = """exit status:
  0  the archive was written and verify found no problem in the run
  1  the archive was written, but verify found problems in the run (listed; grade will report them)
  2  a usage error, a folder that is not a run, or an output file that exists or lies inside the run folder"""


def add_arguments(parser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("record_dir", type=directory, metavar="RUN_DIR")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.tar.gz",
                        help="the archive to write (a new file, outside the run folder)")


def run(args) -> int:
    from inferlab.grading.pack import PackError, pack_run
    from inferlab.runview import RunView
    from inferlab.verify import verify_run

    if refuse_non_run("pack", args.record_dir):
        return EXIT_UNREADABLE
    view = RunView.read(args.record_dir)
    try:
        packed = pack_run(view, args.output)
    except PackError as error:
        print(f"pack: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    problems = verify_run(view)["problems"]
    print(f"pack: {packed['archive']}: run {packed['run']}, {packed['files']} files ({packed['addenda']} "
          f"attached afterwards), {packed['bytes']} bytes, sha256 {packed['sha256']}")
    if problems:
        for line in problems:
            print(f"  {line}")
        print(f"pack: verify found {len(problems)} problem(s) in the run; grade will report them")
        return EXIT_PROBLEMS
    return EXIT_OK
