"""python -m inferlab verify DIR | compare DIR1 DIR2 | report DIR | check-artifacts DIR: no model, no network.

Exit codes: 0 success; 1 verify or check-artifacts found problems (or report --check found a
difference); 2 a directory could not be read, or is not a run's record dir; 3 report --check met
pages that another report renderer version wrote, so it did not compare their text (verify still
checks them against the manifest's hashes); 141 (128 + SIGPIPE) the reader of the output went away
(`... | head`): the command stops quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, EXIT_OTHER_RENDERER = 0, 1, 2, 3
EXIT_READER_GONE = 141  # what a shell reports for a command ended by SIGPIPE


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
                           "either differs, 3 if another report renderer version wrote them (not compared)")
    mode.add_argument("--write", action="store_true",
                      help="rewrite DIR/report.md, DIR/report-details.md and the plots in place (the manifest's "
                           "hashes are not updated, so verify reports any file that changed)")
    check = commands.add_parser("check-artifacts", help="check a directory of specimen files (for --artifacts) "
                                                        "against the specimen's pinned hashes, before a run")
    check.add_argument("artifacts_dir", type=_directory, metavar="DIR")
    check.add_argument("--specimen", default=None, metavar="NAME",
                       help="the specimen spec in artifacts/NAME.json (default: pythia-14m)")
    return parser


def refuse_non_run(command: str, *record_dirs: Path) -> bool:
    """Say so, and return True, when a folder is not a run's record dir: no command reads or writes in one."""
    from inferlab.runview import not_a_run_reason

    reasons = [reason for reason in map(not_a_run_reason, record_dirs) if reason]
    for reason in reasons:
        print(f"{command}: {reason}; nothing was read or written there", file=sys.stderr)
    return bool(reasons)


def run_verify(record_dir: Path, all_passed: bool) -> int:
    """`verify DIR`: one line per problem, then the verdict line; the exit code."""
    from inferlab.verify import verify_run

    if refuse_non_run("verify", record_dir):
        return EXIT_UNREADABLE
    result = verify_run(record_dir)
    problems = list(result["problems"])
    if all_passed and not result["all_tests_passed"]:
        problems.append(f"not every test passed: {result['outcome_counts']}")
    if all_passed and result["plan_folder"]:
        problems.append("a plan folder: no test ran, so no test passed")
    for line in problems:
        print(line)
    if problems:
        unlisted = (f"; not listed: {result['not_listed']} missing record(s) or outcome(s) of tests the run left out "
                    f"or never reached (said once above)") if result["not_listed"] else ""
        print(f"verify: {len(problems)} problem(s) in {record_dir}{unlisted}")
        return EXIT_PROBLEMS
    if result["plan_folder"]:
        print(f"verify: OK, a PLAN folder ({result['planned_tests']} tests planned, {result['files_checked']} files): "
              f"no test ran and nothing was measured")
        return EXIT_OK
    gaps = len(result["explained_gaps"])
    tail = "" if result["all_tests_passed"] else (
        f"; not every test passed ({result['outcome_counts']}), and each gap has its recorded evidence ({gaps})")
    print(f"verify: OK ({result['records']} records, {result['files_checked']} files){tail}")
    return EXIT_OK


def run_compare(dir1: Path, dir2: Path) -> int:
    """`compare DIR1 DIR2`: the comparison as text; exit 0 unless a directory cannot be read."""
    from inferlab.compare import compare, format_compare

    if refuse_non_run("compare", dir1, dir2):
        return EXIT_UNREADABLE
    try:
        result = compare(dir1, dir2)
    except (OSError, ValueError) as error:
        print(f"compare: cannot read a record dir: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    sys.stdout.write(format_compare(result))
    return EXIT_OK


def run_report(record_dir: Path, check: bool, write: bool) -> int:
    """`report DIR` (print), `--write` or `--check`; the exit code."""
    from inferlab import report

    if refuse_non_run("report", record_dir):  # never write a report into a folder that holds no run
        return EXIT_UNREADABLE
    from inferlab.runview import RunView

    view = RunView.read(record_dir)
    if view.is_plan_folder:
        print(f"report: {record_dir} is a plan folder (written by --plan): no test ran, so there is no run to report; "
              f"its schedule is in plan.json", file=sys.stderr)
        return EXIT_OK
    if view.session_end is None:
        print(f"report: {record_dir} has no session_end record: its session never reached its end (it was killed or "
              f"crashed). The report shows the records that exist; the run is not complete.", file=sys.stderr)
    if write:
        print(report.write_report(view, after_session=True))
        return EXIT_OK
    if not check:
        sys.stdout.write(report.render_report(view, after_session=True))
        return EXIT_OK
    checked = report.check(view, after_session=True)
    for line in checked.lines:
        print(f"report: {line}")
    if checked.status == "other_renderer":
        return EXIT_OTHER_RENDERER
    if checked.status == "differs":
        return EXIT_PROBLEMS
    print(f"report: regenerated text is identical to {', '.join(report.PAGES)} in {record_dir}")
    return EXIT_OK


def artifact_row_line(row: dict) -> str:
    """One line per specimen file: its size and hash, or, for an optional file that is absent, why that is fine."""
    state = "ok     " if row["ok"] else "PROBLEM"
    if not row.get("present") and row["ok"]:
        return f"{state} {row['name']}: absent (optional): {row.get('absence') or 'no reason recorded'}"
    if not row.get("present"):
        return f"{state} {row['name']}: missing"
    return f"{state} {row['name']}: {row['size']} bytes, sha256 {row['sha256']}"


def run_check_artifacts(artifacts_dir: Path, specimen_name) -> int:
    """`check-artifacts DIR`: each specimen file against its pins; the exit code."""
    from inferlab import protocol, specimen

    name = specimen_name or protocol.DEFAULT_SPECIMEN
    try:
        spec = specimen.load_spec(name)
    except specimen.SpecimenError as error:
        print(f"check-artifacts: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    result = specimen.check_specimen_files(artifacts_dir, spec)
    for row in result["files"]:
        print(artifact_row_line(row))
    for line in result["problems"]:
        print(f"problem: {line}")
    if not result["ok"]:
        print(f"check-artifacts: {artifacts_dir} is NOT a valid copy of {spec.repo_id} at {spec.revision} "
              f"({len(result['problems'])} problem(s)); --artifacts would refuse it")
        return EXIT_PROBLEMS
    print(f"check-artifacts: {artifacts_dir} is a valid copy of {spec.repo_id} at {spec.revision}: use "
          f"--artifacts {artifacts_dir}")
    return EXIT_OK


def main(argv=None) -> int:
    """Parse the command line and run one subcommand; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        return run_verify(args.record_dir, args.all_passed)
    if args.command == "compare":
        return run_compare(args.dir1, args.dir2)
    if args.command == "check-artifacts":
        return run_check_artifacts(args.artifacts_dir, args.specimen)
    return run_report(args.record_dir, args.check, args.write)


def run_command_line(argv=None) -> int:
    """main(), with its output flushed; a reader that closed the pipe (`| head`) ends it quietly."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Nothing more can reach the reader; point stdout at /dev/null so that the interpreter's own
        # flush at exit does not raise (and print) the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_READER_GONE


if __name__ == "__main__":
    sys.exit(run_command_line())
