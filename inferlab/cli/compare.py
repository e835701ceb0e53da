"""`compare DIR1 DIR2`: what two runs agree on, trial by trial; it reports, it does not judge."""

from __future__ import annotations

import sys
from pathlib import Path

from inferlab.cli import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_UNREADABLE,
    directory,
    refuse_non_run,
    spelled,
)

EXIT_INTEGRITY = 3  # a run fails verify: the comparison is printed, under the warning
EXIT_SHORT = EXIT_PROBLEMS  # a run is unfinished or partial: the comparison is printed, under a note that says so

NAME = "compare"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "compared: both runs pass verify", 1: "compared, but a run is unfinished or partial (said first)",
         2: "a folder that cannot be read, is not a run or is a plan folder (nothing compared)",
         3: "compared, but a run fails verify (its integrity problems head the output)"}
HELP = ("exact-id agreement per trial, tensor max abs diffs, timing median ratios DIR2/DIR1, environment differences; "
        "both runs are verified first (exit 3 when one fails, 1 when one is unfinished or partial; a plan folder is "
        "refused, exit 2)")


def add_arguments(parser) -> None:
    parser.add_argument("dir1", type=directory, metavar="DIR1")
    parser.add_argument("dir2", type=directory, metavar="DIR2")


def run(args) -> int:
    return run_compare(args.dir1, args.dir2)


def run_compare(dir1, dir2) -> int:
    """`compare DIR1 DIR2`: the comparison as text; exit 0, 1 when a run is unfinished or partial (said first),
    2 when a directory cannot be read or is a plan folder, 3 when a run fails verify (its integrity problems head
    the output)."""
    from inferlab.report.compare import compare, format_compare

    if refuse_non_run("compare", dir1, dir2):
        return EXIT_UNREADABLE
    if Path(dir1).resolve() == Path(dir2).resolve():
        print(f"compare: DIR1 and DIR2 are the same run folder ({dir1}); give two runs", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        short = {name: short_of(directory) for name, directory in (("DIR1", dir1), ("DIR2", dir2))}
        result = compare(dir1, dir2)
    except (OSError, ValueError) as error:
        print(f"compare: cannot read a record dir: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    for name, lines in short.items():  # said first: the rows below cover only what such a run recorded
        for line in lines:
            print(f"compare: {name} fails verify as unfinished or partial: {line}")
    if any(short.values()):
        print(f"compare: the rows below compare only what each run recorded, and the exit is {EXIT_SHORT} "
              f"(`{spelled('verify DIR')}` says what is missing)")
    sys.stdout.write(format_compare(result))
    if any(result["integrity"].values()):
        return EXIT_INTEGRITY
    return EXIT_SHORT if any(short.values()) else EXIT_OK


def short_of(record_dir) -> list[str]:
    """verify's lines for a run that is unfinished or partial (empty for a finished, complete one)."""
    from inferlab.read.verify import verify_run

    return list(verify_run(record_dir).get("completeness") or [])
