"""`autograder gradescope -o autograder.zip [--specimen NAME | --artifacts DIR] [--reference REF.json]
[--rubric FILE] [--accept writing|archive]`: a Gradescope autograder that grades every submission with the course's own copy of inferlab
(inferlab.gradescope.autograder holds the logic, docs/grading.md the instructor's page)."""

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
EPILOG = """The zip's run_autograder always makes the course's own run, offline on the course's specimen, with the
learner's predictions and explanation (the two text files, or those inside a `pack` archive), and scores every item
from it. A handed-in archive is a claim checked against that run: bit for bit where the two runs' conditions match,
and a contradiction scores 0 as an integrity problem. It writes results.json in grade's gradescope format, each
test saying which run its score came from.

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
    parser.add_argument("--accept", choices=("writing", "archive"),
                        help="what a submission may hold: writing (predictions and explanation only) or archive (a "
                             "`pack` archive only); default: either")


def run(args) -> int:
    from inferlab.gradescope.autograder import AutograderError, write_gradescope_zip

    try:
        config = write_gradescope_zip(args.output, specimen=args.specimen, artifacts=args.artifacts,
                                      reference=args.reference, rubric=args.rubric,
                                      accept=(args.accept,) if args.accept else ("writing", "archive"))
    except AutograderError as error:
        print(f"autograder: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    project = config["project"]
    print(f"autograder: {args.output} written: Gradescope's setup.sh and run_autograder, inferlab "
          f"{project['inferlab_version']} (commit {project['git_commit'] or 'unknown'}"
          f"{', with uncommitted changes' if project['git_dirty'] else ''}), the lock (sha256 "
          f"{project['lock_sha256'][:12]}), specimen {config['specimen']}"
          + (", a reference" if config["reference"] else "") + (", a rubric" if config["rubric"] else "")
          + f"; it takes {' or '.join(config['accept'])}")
    return EXIT_OK
