"""`report DIR`: regenerate the report's pages from the records alone (print, --check or --write)."""

from __future__ import annotations

import sys

from inferlab.cli import (
    EXIT_OK,
    EXIT_OTHER_RENDERER,
    EXIT_PROBLEMS,
    EXIT_UNREADABLE,
    directory,
    refuse_non_run,
)

NAME = "report"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "the report printed or written; --check or --after found "
            "nothing", 1: "--check found a difference, or --after an addendum changed, removed or not listed",
         2: "not a run's record dir, a plan folder, or a Python without the project's packages",
         3: "--check met pages another report renderer version wrote: not compared"}
HELP = "regenerate report.md's text from the records alone and print it (report-details.md too with --check and --write)"


def add_arguments(parser) -> None:
    parser.add_argument("record_dir", type=directory, metavar="DIR")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="compare with DIR/report.md and DIR/report-details.md instead of printing; exit 1 if "
                           "either differs, 3 if another report renderer version wrote them (not compared)")
    mode.add_argument("--write", action="store_true",
                      help="rewrite DIR/report.md, DIR/report-details.md and the plots in place (the manifest's "
                           "hashes are not updated, so verify reports any file that changed)")
    mode.add_argument("--after", action="store_true",
                      help="print the after-run page instead: your predictions (written before the run) beside the "
                           "explanation attached after it, and any revised cache criterion beside the declared one, "
                           "from the records and the addenda; it is never written into DIR; exit 1 if an addendum "
                           "changed since it was attached")


def run(args) -> int:
    return run_report(args.record_dir, args.check, args.write, args.after)


def run_report(record_dir, check: bool, write: bool, after: bool = False) -> int:
    """`report DIR` (print), `--write`, `--check` or `--after` (the after-run page, inferlab.report.after); the
    exit code."""
    from inferlab import report

    if refuse_non_run("report", record_dir):  # never write a report into a folder that holds no run
        return EXIT_UNREADABLE
    from inferlab.read.runview import RunView

    view = RunView.read(record_dir)
    if view.session_end is None:
        from inferlab.run.ended import claimant_alive

        how = ("it is still running" if claimant_alive(view.claim) else
               "it never reached its end: it was killed or crashed")
        print(f"report: {record_dir} has no session_end record: {how}. The report shows the records that exist; "
              f"the run is not complete.", file=sys.stderr)
    if after:
        from inferlab.report import after as after_page

        page = after_page.AfterPage(view)
        sys.stdout.write(page.render())
        if page.problems:
            print(f"report: {len(page.problems)} problem(s) with the addenda of {record_dir} (an addendum changed, "
                  f"removed or not listed since it was attached; the page's last section names each, and how to "
                  f"repair it): exit 1", file=sys.stderr)
            return EXIT_PROBLEMS
        return EXIT_OK
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
