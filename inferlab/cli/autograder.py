"""`autograder gradescope -o autograder.zip`: a Gradescope autograder that makes the course's own run for every
submission and grades what was handed in against it (inferlab.grade.bundle)."""

from __future__ import annotations

import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_UNREADABLE, REPLACE_HELP

NAME = "autograder"
EXITS = {0: "the zip was written", 2: "a usage error: a specimen, copy or rubric that cannot be used, or an output "
                                      "that exists (without --replace)"}
HELP = ("write a Gradescope autograder zip: for every submission it makes the course's own run, then grades the "
        "handed-in pack archive (or the writing alone) against it; nothing handed in is executed")


def add_arguments(parser) -> None:
    parser.add_argument("platform", choices=("gradescope",))
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="autograder.zip")
    copy = parser.add_mutually_exclusive_group()
    copy.add_argument("--specimen", metavar="NAME", help="a specimen built offline (standin, replica; default standin)")
    copy.add_argument("--artifacts", type=Path, metavar="DIR", help="your verified copy of pythia-14m, put in the zip")
    parser.add_argument("--rubric", type=Path, metavar="FILE", help="your rubric (TOML), put into the zip")
    parser.add_argument("--accept", default="writing,archive", metavar="WHAT",
                        help="what the course takes: writing, archive or both (default writing,archive)")
    parser.add_argument("--replace", action="store_true", help=REPLACE_HELP)


def run(args) -> int:
    from inferlab.grade.bundle import BundleError, write_zip

    try:
        config = write_zip(args.output, args.specimen, args.artifacts, args.rubric,
                           tuple(a.strip() for a in args.accept.split(",") if a.strip()), replace=args.replace)
    except BundleError as error:
        print(f"autograder: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(f"autograder: {args.output} written (specimen {config['specimen']}, accepts {', '.join(config['accept'])})")
    return EXIT_OK
