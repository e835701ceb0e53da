"""`autograder gradescope -o autograder.zip [--specimen NAME | --artifacts DIR] [--reference REF.json]
[--rubric FILE]`: a Gradescope autograder that grades every submission with the course's own copy of inferlab
(inferlab.grading.autograder holds the logic, docs/grading.md the instructor's page)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_UNREADABLE

NAME = "autograder"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "the zip was written", 2: "a usage error: a specimen, copy, reference or rubric that cannot be used, "
                                           "or an output file that exists"}
HELP = ("write a Gradescope autograder zip (setup.sh, run_autograder and this project pinned inside: its source, "
        "the lock, CPU torch) that grades each submission, a pack archive or the learner's predictions and "
        "explanation, with the course's copy and never runs code from the submission")
EPILOG = """The zip's run_autograder grades a `pack` archive (replayed on the course's copy of the specimen), or, when
the submission holds only predictions and an explanation, makes the run itself offline with them. It writes
results.json in grade's gradescope format.

exit status:
  0  the zip was written
  2  a usage error: a specimen, copy, reference or rubric that cannot be used, or an output file that exists"""


def add_arguments(parser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("platform", choices=("gradescope",), help="the grading platform (gradescope)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="autograder.zip",
                        help="the zip to write (a new file)")
    copy = parser.add_mutually_exclusive_group()
    copy.add_argument("--specimen", metavar="NAME",
                      help="the specimen every submission is run and replayed on, built offline in the image "
                           "(default: standin)")
    copy.add_argument("--artifacts", type=Path, metavar="DIR",
                      help="your verified copy of pythia-14m's files, put into the zip (the specimen is then "
                           "pythia-14m)")
    parser.add_argument("--reference", type=Path, metavar="REF.json",
                        help="your reference (the reference subcommand), put into the zip: learners do not see it")
    parser.add_argument("--rubric", type=Path, metavar="FILE", help="your rubric (TOML), put into the zip")


def run(args) -> int:
    from inferlab.grading.autograder import AutograderError, write_gradescope_zip

    try:
        config = write_gradescope_zip(args.output, specimen=args.specimen, artifacts=args.artifacts,
                                      reference=args.reference, rubric=args.rubric)
    except AutograderError as error:
        print(f"autograder: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    project = config["project"]
    print(f"autograder: {args.output} written: Gradescope's setup.sh and run_autograder, inferlab "
          f"{project['inferlab_version']} (commit {project['git_commit'] or 'unknown'}"
          f"{', with uncommitted changes' if project['git_dirty'] else ''}), the lock (sha256 "
          f"{project['lock_sha256'][:12]}), specimen {config['specimen']}"
          + (", a reference" if config["reference"] else "") + (", a rubric" if config["rubric"] else ""))
    return EXIT_OK
