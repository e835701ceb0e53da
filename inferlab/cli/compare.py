"""`compare DIR1 DIR2`: what two runs agree on, trial by trial; it reports, it does not judge."""

from __future__ import annotations

import sys

from inferlab.cli import EXIT_OK, EXIT_UNREADABLE, directory, refuse_missing_dependencies, refuse_non_run

EXIT_INTEGRITY = 3  # a run fails verify: the comparison is printed, under the warning

NAME = "compare"
HELP = ("exact-id agreement per trial, tensor max abs diffs, timing median ratios DIR2/DIR1, environment differences; "
        "both runs are verified first (exit 3 when one fails)")


def add_arguments(parser) -> None:
    parser.add_argument("dir1", type=directory, metavar="DIR1")
    parser.add_argument("dir2", type=directory, metavar="DIR2")


def run(args) -> int:
    return run_compare(args.dir1, args.dir2)


def run_compare(dir1, dir2) -> int:
    """`compare DIR1 DIR2`: the comparison as text; exit 0, 2 when a directory cannot be read, 3 when a run fails
    verify (its integrity problems head the output)."""
    from inferlab.report.compare import compare, format_compare

    if refuse_non_run("compare", dir1, dir2) or refuse_missing_dependencies("compare", [dir1, dir2]):
        return EXIT_UNREADABLE
    try:
        result = compare(dir1, dir2)
    except (OSError, ValueError) as error:
        print(f"compare: cannot read a record dir: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    sys.stdout.write(format_compare(result))
    return EXIT_INTEGRITY if any(result["integrity"].values()) else EXIT_OK
