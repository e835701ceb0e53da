"""`grade RUN [RUN ...]`: each run's seven checklist items, its integrity and its findings, for a learner or a
course CI; RUN is a record folder, a submission archive (pack), or a folder of submissions (a class)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferlab.cli import EXIT_UNREADABLE

NAME = "grade"
HELP = ("grade runs item by item against the lab's submission checklist (record folders, submission archives, or "
        "a folder of submissions); reads files only")
EPILOG = """RUN may be a run's record folder, an archive made by `pack`, or a folder whose subfolders and archives
are one learner's submission each (a class: then --out DIR is where the class page goes).

exit status (over several runs, the worst):
  0  every required checklist item passes (items a person grades, `manual`, do not block)
  1  a checklist item fails (the output names it and says what to fix)
  2  a usage error, a rubric or reference that cannot be used, a folder that is not a run, a refused archive
  3  an integrity problem: verify finds one, a summary flag disagrees with the file it summarises, the run's
     harness is not this inferlab's (under the default rubric), or the run contradicts the --reference
  141  the reader of the output went away (... | head)"""


def add_arguments(parser) -> None:
    from inferlab.grading.formats import FORMATS

    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    parser.add_argument("--reference", type=Path, metavar="REF.json",
                        help="an instructor's reference (made by the reference subcommand): what the run contradicts in it "
                             "is an integrity problem")
    parser.add_argument("--rubric", type=Path, metavar="FILE",
                        help="the points per item (TOML; default: the rubric that ships with inferlab, see "
                             "docs/grading.md)")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text (default), json, junit (one testcase per item) or gradescope (results.json)")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write the format's output to FILE (the text page is still printed); for a folder of "
                             "submissions, the folder to write the class page into")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="also write one CSV row per run to FILE")


def _inside(path: Path, folders: list[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved == f or f in resolved.parents for f in folders)


def _usage(message: str) -> int:
    print(f"grade: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


def run(args) -> int:
    from inferlab.grading import formats
    from inferlab.grading.classview import write_class_page
    from inferlab.grading.grade import grade_source, submissions_in, worst
    from inferlab.grading.reference import ReferenceError, load_reference
    from inferlab.grading.rubric import RubricError, load_rubric
    from inferlab.records import write_text_atomic

    try:
        rubric = load_rubric(args.rubric)
    except RubricError as error:
        return _usage(f"the rubric cannot be used: {error}")
    reference = None
    if args.reference is not None:
        try:
            reference = load_reference(args.reference)
        except ReferenceError as error:
            return _usage(f"the reference cannot be used: {error}")
    sources, classes = [], []
    for given in args.runs:
        members = submissions_in(given)
        if members is None:
            sources.append(given)
        else:
            classes.append(given)
            sources += members
    folders = [p.resolve() for p in sources if p.is_dir()]
    files = [p.resolve() for p in sources if p.is_file()]
    for option, target in (("--out", args.out), ("--csv", args.csv)):
        if target is not None and (_inside(target, folders) or target.resolve() in files):
            return _usage(f"{option} {target} is inside a run folder or is a submission: grade never writes there")
    if classes and args.out is None:
        return _usage(f"{', '.join(map(str, classes))}: a folder of submissions; give --out DIR for the class page")
    if args.format == "gradescope" and len(sources) != 1:
        return _usage(f"--format gradescope writes one submission's results.json; {len(sources)} runs were given")
    grades = [grade_source(source, rubric, reference, reference_file=str(args.reference) if reference else None)
              for source in sources]
    output = formats.render(grades, args.format)
    if args.out is None:
        sys.stdout.write(output)
    elif classes:
        written = write_class_page(grades, args.out)
        sys.stdout.write(formats.summary(grades) if args.format == "text" else output)
        print(f"grade: class page {written[0]}", file=sys.stderr)
    else:
        write_text_atomic(args.out, output)
        if args.format != "text":
            sys.stdout.write(formats.text(grades))
        print(f"grade: {args.format} written to {args.out}", file=sys.stderr)
    if args.csv is not None:
        write_text_atomic(args.csv, formats.csv_text(grades))
        print(f"grade: {len(grades)} CSV row(s) written to {args.csv}", file=sys.stderr)
    return worst(g.exit_status for g in grades)
