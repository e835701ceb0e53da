"""python -m inferlab verify DIR | compare DIR1 DIR2 | report DIR: read finished record dirs, no model.

Exit codes: 0 success; 1 verify found problems (or report --check found a difference);
2 a directory could not be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE = 0, 1, 2


def _directory(value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is not a directory")
    return path


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser with its three subcommands."""
    parser = argparse.ArgumentParser(prog="python -m inferlab", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="re-hash every file against the manifest and check the records "
                                                "are complete for the protocol; one line per problem")
    verify.add_argument("record_dir", type=_directory, metavar="DIR")
    verify.add_argument("--all-passed", action="store_true",
                        help="also count every failed, errored or skipped test as a problem (default: a gap with "
                             "recorded evidence is not a problem)")
    compare = commands.add_parser("compare", help="exact-id agreement per trial, tensor max abs diffs, timing "
                                                  "median ratios DIR2/DIR1, environment differences")
    compare.add_argument("dir1", type=_directory, metavar="DIR1")
    compare.add_argument("dir2", type=_directory, metavar="DIR2")
    report = commands.add_parser("report", help="regenerate report.md's text from the records alone and print it "
                                                "(report-details.md too with --check and --write)")
    report.add_argument("record_dir", type=_directory, metavar="DIR")
    mode = report.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="compare with DIR/report.md and DIR/report-details.md instead of printing; exit 1 if "
                           "either differs")
    mode.add_argument("--write", action="store_true",
                      help="rewrite DIR/report.md, DIR/report-details.md and the plots in place (the manifest's "
                           "hashes are not updated, so verify reports any file that changed)")
    return parser


def run_verify(record_dir: Path, all_passed: bool) -> int:
    from inferlab.verify import verify

    result = verify(record_dir)
    problems = list(result["problems"])
    if all_passed and not result["all_tests_passed"]:
        problems.append(f"not every test passed: {result['outcome_counts']}")
    for line in problems:
        print(line)
    if problems:
        print(f"verify: {len(problems)} problem(s) in {record_dir}")
        return EXIT_PROBLEMS
    gaps = len(result["explained_gaps"])
    tail = "" if result["all_tests_passed"] else (
        f"; not every test passed ({result['outcome_counts']}), and each gap has its recorded evidence ({gaps})")
    print(f"verify: OK ({result['records']} records, {result['files_checked']} files){tail}")
    return EXIT_OK


def run_compare(dir1: Path, dir2: Path) -> int:
    from inferlab.verify import compare, format_compare

    try:
        result = compare(dir1, dir2)
    except (OSError, ValueError) as error:
        print(f"compare: cannot read a record dir: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    sys.stdout.write(format_compare(result))
    return EXIT_OK


def run_report(record_dir: Path, check: bool, write: bool) -> int:
    from inferlab import report

    if write:
        print(report.write_report(record_dir))
        return EXIT_OK
    if not check:
        sys.stdout.write(report.render_report(record_dir))
        return EXIT_OK
    problems = report.check_pages(record_dir)
    for line in problems:
        print(f"report: {line}")
    if problems:
        return EXIT_PROBLEMS
    print(f"report: regenerated text is identical to {', '.join(report.PAGES)} in {record_dir}")
    return EXIT_OK


def main(argv=None) -> int:
    """Parse the command line and run one subcommand; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        return run_verify(args.record_dir, args.all_passed)
    if args.command == "compare":
        return run_compare(args.dir1, args.dir2)
    return run_report(args.record_dir, args.check, args.write)


if __name__ == "__main__":
    sys.exit(main())
