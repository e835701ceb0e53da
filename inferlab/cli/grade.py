"""`grade RUN_OR_ARCHIVE... [--against COURSE_RUN]`: the lab's checklist, item by item, for each submission."""

from __future__ import annotations

import sys
from pathlib import Path

from inferlab.cli import EXIT_UNREADABLE, REPLACE_HELP

NAME = "grade"
EXITS = {0: "every required item passes (items a person grades do not block)", 1: "an item fails",
         2: "a usage error, or a source that is not a run or a readable pack archive",
         3: "a run fails verify, or contradicts the course's run"}
HELP = ("grade runs or pack archives item by item against the lab's checklist; with --against, each is compared with "
        "the course's own run, which is the evidence (reads files only)")


def add_arguments(parser) -> None:
    from inferlab.grade.formats import FORMATS

    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_OR_ARCHIVE")
    parser.add_argument("--against", type=Path, metavar="COURSE_RUN", action="append",
                        help="the course's own run of the same specimen: items 2 to 6 are earned only where the run "
                             "agrees with it (exact where both computed under the same conditions, within the "
                             "declared tolerance otherwise, and the grade says which and why)")
    parser.add_argument("--rubric", type=Path, metavar="FILE", help="points per item (TOML; default: the shipped one)")
    parser.add_argument("--format", choices=FORMATS, default="text", help="the output's format (default text)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the format's output to FILE (a new file)")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="also write one CSV row per submission (a new file)")
    parser.add_argument("--replace", action="store_true", help=REPLACE_HELP)


def run(args) -> int:
    from inferlab.base.outputs import OutputPathError, output_kind, write_text_atomic
    from inferlab.grade import formats, grade, rubric
    from inferlab.read.runview import RunView, not_a_run_reason

    try:
        rules = rubric.load(args.rubric)
    except rubric.RubricError as error:
        return _usage(f"the rubric cannot be used: {error}")
    sources = [p.resolve() for p in args.runs]
    for option, target in (("--out", args.out), ("--csv", args.csv)):
        if target is None:
            continue
        if target.resolve() in sources or any(s in target.resolve().parents for s in sources if s.is_dir()):
            return _usage(f"{option} {target} is a submission or lies inside one: grade never writes there")
        try:  # before any grading: an existing file is refused unless --replace, a folder or a socket always
            output_kind(target, replace=args.replace)
        except OutputPathError as error:
            return _usage(f"{option}: {error}" + ("" if args.replace else " (or give --replace)"))
    if args.out is not None and args.csv is not None and args.out.resolve() == args.csv.resolve():
        return _usage("--out and --csv name the same file")
    if args.format == "gradescope" and len(args.runs) != 1:
        return _usage(f"--format gradescope writes one submission's results.json; {len(args.runs)} were given")
    course = None
    if args.against is not None and len(args.against) > 1:
        return _usage(f"--against was given {len(args.against)} times; give the one course run to compare with")
    args.against = args.against[0] if args.against else None
    if args.against is not None:
        why = not_a_run_reason(args.against)
        if why:
            return _usage(f"--against {args.against}: expected the course's run folder: {why}")
        course = RunView.read(args.against)
        if course.unfinished or course.is_plan_folder:
            return _usage(f"--against {args.against}: the course's run must be a finished run "
                          f"({course.unfinished or 'a plan folder'})")
    grades = [grade.grade_source(path, rules, course, str(args.against or "")) for path in args.runs]
    grade.flag_copies(grades)
    output = formats.render(grades, args.format)
    try:
        if args.out is None:
            sys.stdout.write(output)
        else:
            write_text_atomic(args.out, output, replace=args.replace)
            if args.format != "text":
                sys.stdout.write(formats.text(grades))
            print(f"grade: {args.format} written to {args.out}", file=sys.stderr)
        if args.csv is not None:
            write_text_atomic(args.csv, formats.csv_text(grades), replace=args.replace)
            print(f"grade: {len(grades)} CSV row(s) written to {args.csv}", file=sys.stderr)
    except OutputPathError as error:
        return _usage(str(error))
    return grade.worst(g.exit_status for g in grades)


def _usage(message: str) -> int:
    print(f"grade: {message}", file=sys.stderr)
    return EXIT_UNREADABLE
