"""`pack RUN_DIR -o FILE.tar.gz [--learner ID]`: one run and what was attached to it, as one archive to hand in."""

from __future__ import annotations

import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, REPLACE_HELP, directory, refuse_non_run

NAME = "pack"
EXITS = {0: "the archive was written and verify found no problem", 1: "the archive was written, but verify found "
                                                                     "problems in the run (listed)",
         2: "nothing written: a usage error, not a run, a plan folder, a run still being written, a bad output"}
HELP = "bundle a run folder, its addenda and a submission.json (who hands it in) into one .tar.gz for grade"


def add_arguments(parser) -> None:
    parser.add_argument("record_dir", type=directory, metavar="RUN_DIR")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.tar.gz",
                        help="the archive to write (a new file outside the run folder)")
    parser.add_argument("--learner", metavar="ID", help="who hands it in: your id in the course")
    parser.add_argument("--replace", action="store_true", help=REPLACE_HELP)


def run(args) -> int:
    from inferlab.grade.archive import ArchiveError, pack
    from inferlab.read.runview import RunView
    from inferlab.read.verify import verify_run

    if refuse_non_run("pack", args.record_dir):
        return EXIT_UNREADABLE
    view = RunView.read(args.record_dir)
    try:
        packed = pack(view, args.output, learner=args.learner, replace=args.replace)
    except ArchiveError as error:
        print(f"pack: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(f"pack: {packed['archive']}: run {packed['run']}, {packed['files']} files, {packed['bytes']} bytes"
          + (f", learner {args.learner.strip()}" if args.learner else ", no learner id (--learner ID)"))
    problems = verify_run(view)["problems"]
    for line in problems:
        print(f"  {line}")
    if problems:
        print(f"pack: verify found {len(problems)} problem(s) in the run; grade will report them")
        return EXIT_PROBLEMS
    return EXIT_OK
