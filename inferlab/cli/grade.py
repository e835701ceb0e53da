"""`grade RUN [RUN ...]`: each run's seven checklist items, its integrity and its findings, for a learner or a
course CI; RUN is a record folder, a submission archive (pack), or a folder of submissions (a class)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from inferlab.cli import EXIT_UNREADABLE

NAME = "grade"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "every required checklist item passes", 1: "a checklist item fails, or the run is unfinished or partial",
         2: "a usage error, a rubric or reference that cannot be used, a folder that is not a run, a refused archive",
         3: "an integrity problem: the files contradict each other, the reference or the replay"}
HELP = ("grade runs item by item against the lab's submission checklist (record folders, submission archives, or "
        "a folder of submissions); reads files only, unless --replay re-executes them on your copy of the specimen")
EPILOG = """RUN may be a run's record folder, an archive made by `pack`, or a folder whose subfolders and archives
are one learner's submission each (a class: then --out DIR is where the class page goes). A subfolder that
holds Gradescope's submission_metadata.json beside one run folder or archive is that learner's submission.
For a class, pairs of submissions that share a run id, records, timing stamps, weight-read samples, an
explanation or predictions are flagged on the page, in the CSV and JSON and in both grades (a finding: no
point is taken).

exit status (over several runs, the worst):
  0  every required checklist item passes (items a person grades, `manual`, do not block)
  1  a checklist item fails (the output names it and says what to fix)
  2  a usage error, a rubric or reference that cannot be used, a folder that is not a run, a refused archive
  3  an integrity problem: verify finds one, a summary flag disagrees with the file it summarises, the run's
     harness is not this inferlab's (under the default rubric), the run contradicts the --reference, or an
     output of it contradicts its --replay on your own copy of the specimen (or it could not be replayed)
  141  the reader of the output went away (... | head)"""


def add_arguments(parser) -> None:
    from inferlab.grading.formats import FORMATS

    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    parser.add_argument("--reference", type=Path, metavar="REF.json", action="append",
                        help="an instructor's reference (made by the reference subcommand): what the run contradicts in it "
                             "is an integrity problem; once per specimen (each run is graded against the one of its "
                             "specimen; none of it: exit 2)")
    parser.add_argument("--rubric", type=Path, metavar="FILE",
                        help="the points per item (TOML; default: the rubric that ships with inferlab, see "
                             "docs/grading.md)")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text (default), json, junit (one testcase per item) or gradescope (results.json)")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write the format's output to FILE (the text page is still printed); for a folder of "
                             "submissions, the folder to write the class page into")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="also write one CSV row per run to FILE")
    parser.add_argument("--replay", action="store_true",
                        help="re-execute each run's deterministic parts on your own verified copy of the specimen "
                             "(offline; the model is loaded once per process) and fold the result into the grade: an "
                             "output that contradicts its replay is an integrity problem (a rubric's require_replay "
                             "turns it on)")
    parser.add_argument("--specimen", metavar="NAME",
                        help="with --replay: the specimen to replay every run on, from this checkout's artifacts/ "
                             "(default: the one each run names, if this checkout has its spec)")
    parser.add_argument("--artifacts", metavar="DIR",
                        help="with --replay: your own copy of the specimen's files, verified against its pins "
                             "before anything is loaded (default: this checkout's project cache; the stand-in is "
                             "built there)")
    parser.add_argument("--against", type=Path, metavar="COURSE_RUN",
                        help="a run the course made itself (the same protocol and specimen): each run's deterministic "
                             "outputs, pins and sources are compared with it, bit for bit where the two runs' recorded "
                             "conditions match (else within the reference's tolerance, said under not checked); a "
                             "contradiction is an integrity problem (the comparison the Gradescope bundle makes)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="grade in N processes (default 1); with --replay each loads the model once")


def _inside(path: Path, folders: list[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved == f or f in resolved.parents for f in folders)


def _usage(message: str) -> int:
    print(f"grade: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


def gradescope_submission(folder: Path) -> Optional[tuple[Path, Path]]:
    """(the one run folder or archive inside, its submission_metadata.json) for a class member laid out as
    Gradescope keeps a submission; None for anything else."""
    from inferlab.submission.archive import ARCHIVE_SUFFIXES
    from inferlab.grading.likeness import GRADESCOPE_METADATA
    from inferlab.reading.runview import not_a_run_reason

    metadata = folder / GRADESCOPE_METADATA
    if not folder.is_dir() or not metadata.is_file() or not_a_run_reason(folder) is None:
        return None
    inside = [p for p in folder.iterdir() if p.name != GRADESCOPE_METADATA and not p.name.startswith(".") and (
        p.is_dir() or p.name.endswith(ARCHIVE_SUFFIXES))]
    return (inside[0], metadata) if len(inside) == 1 else None


def class_members(folder: Path, members: list[Path]) -> list[tuple[Path, str, Optional[Path]]]:
    """(source to grade, its label on the page, its Gradescope metadata or None) for each member of a class."""
    found = []
    for member in members:
        laid_out = gradescope_submission(member)
        found.append((laid_out[0], member.name, laid_out[1]) if laid_out else (member, member.name, None))
    return found


def _what_folder(folder: Path) -> str:
    """What a folder of several runs or submissions is, and the two ways to grade it, for a reader who gave it
    without --out (a folder of runs, as --runs-dir makes, is not told to give --out DIR as if it were a class)."""
    import shlex

    from inferlab.cli import spelled
    from inferlab.grading.grade import submissions_in
    from inferlab.reading.runview import not_a_run_reason

    members = submissions_in(folder) or []
    if not all(member.is_dir() and not_a_run_reason(member) is None for member in members):
        return f"{folder}: a folder of submissions; give --out DIR for the class page"
    names = ", ".join(member.name for member in members[:3]) + (", ..." if len(members) > 3 else "")
    one = spelled(f"grade {shlex.quote(str(members[0]))}")
    return (f"{folder} is a folder of runs ({len(members)}: {names}), not one run: grade one run (`{one}`), or give "
            f"--out DIR to grade each as one learner's submission on a class page")


def run(args) -> int:
    from inferlab.base.outputs import OutputPathError, output_kind, write_text_atomic
    from inferlab.base.records import describe_path
    from inferlab.grading import formats
    from inferlab.grading.batch import grade_sources
    from inferlab.grading.classview import review_class, write_class_page
    from inferlab.grading.grade import submissions_in, worst
    from inferlab.grading.likeness import traits_of
    from inferlab.grading.reference import ReferenceError, load_reference, specimens_given
    from inferlab.grading.replayed import CourseRun, GraderCopy, GraderCopyError
    from inferlab.reading.runview import not_a_run_reason
    from inferlab.grading.rubric import RubricError, load_rubric

    try:
        rubric = load_rubric(args.rubric)
    except RubricError as error:
        return _usage(f"the rubric cannot be used: {error}")
    references = []
    for path in args.reference or []:
        try:
            references.append((str(path), load_reference(path)))
        except ReferenceError as error:
            return _usage(f"the reference cannot be used: {error}")
    twice = specimens_given(references)
    if twice:
        return _usage(twice)
    sources, classes, members_of = [], [], {}  # members_of: {source: (label, metadata)} for a class's members
    for given in args.runs:
        members = submissions_in(given)
        if members is None:
            sources.append(given)
        else:
            classes.append(given)
            for source, label, metadata in class_members(given, members):
                sources.append(source)
                members_of[source] = (label, metadata)
    folders = [p.resolve() for p in sources if p.is_dir()]
    files = [p.resolve() for p in sources if p.is_file()]
    for option, target in (("--out", args.out), ("--csv", args.csv)):
        if target is not None and (_inside(target, folders) or target.resolve() in files):
            return _usage(f"{option} {target} is inside a run folder or is a submission: grade never writes there")
    if classes and args.out is None:
        return _usage("; ".join(_what_folder(folder) for folder in classes))
    for option, target in (("--out", None if classes else args.out), ("--csv", args.csv)):
        try:  # before any grading: a directory, a disk or a socket is refused; a device or a FIFO is written through
            if target is not None:
                output_kind(target)
        except OutputPathError as error:
            return _usage(f"{option}: {error}")
    if classes and os.path.lexists(args.out) and not args.out.is_dir():
        return _usage(f"--out {args.out} {describe_path(args.out)}: for a class, --out names the folder the class "
                      "page goes into")
    if args.format == "gradescope" and len(sources) != 1:
        return _usage(f"--format gradescope writes one submission's results.json; {len(sources)} runs were given")
    # a rubric's require_replay is met by --against too (the course's run is the stronger check): only --replay typed
    # beside --against is a contradiction
    replay = args.replay or (bool(getattr(rubric, "require_replay", False)) and args.against is None)
    if not replay and (args.specimen or args.artifacts):
        return _usage("--specimen and --artifacts name the copy a replay runs on: give --replay too")
    if args.jobs < 1:
        return _usage(f"--jobs {args.jobs}: expected at least 1")
    if args.against is not None:
        if args.replay:
            return _usage("--against compares each run with the course's run; --replay re-executes it: give one")
        why = not_a_run_reason(args.against)
        if why:
            return _usage(f"--against {args.against}: expected a course run folder, actual: {why}")
    copy = GraderCopy(args.specimen, args.artifacts) if replay else None
    copy = CourseRun(args.against) if args.against is not None else copy
    try:
        if isinstance(copy, GraderCopy):
            copy.prepare(load=args.jobs == 1)
    except GraderCopyError as error:
        return _usage(f"--replay: {error}")
    grades = grade_sources(sources, rubric, references or None, copy=copy, jobs=args.jobs)
    review = None
    if classes:
        for source, grade in zip(sources, grades):
            if source in members_of:
                grade.label = members_of[source][0]
        traits = [traits_of(source, grade.label, (members_of.get(source) or (None, None))[1])
                  for source, grade in zip(sources, grades)]
        review = review_class(grades, traits)
    output = formats.render(grades, args.format, class_view=review)
    if args.out is None:
        sys.stdout.write(output)
    elif classes:
        try:
            written = write_class_page(grades, args.out, review)
        except (OutputPathError, OSError) as error:
            return _usage(f"--out: the class page cannot be written in {args.out}: {error}")
        sys.stdout.write(formats.summary(grades) if args.format == "text" else output)
        print(f"grade: class page {written[0]}", file=sys.stderr)
    else:
        try:
            write_text_atomic(args.out, output)
        except OutputPathError as error:
            return _usage(f"--out: {error}")
        if args.format != "text":
            sys.stdout.write(formats.text(grades))
        print(f"grade: {args.format} written to {args.out}", file=sys.stderr)
    if args.csv is not None:
        try:
            write_text_atomic(args.csv, formats.csv_text(grades))
        except OutputPathError as error:
            return _usage(f"--csv: {error}")
        print(f"grade: {len(grades)} CSV row(s) written to {args.csv}", file=sys.stderr)
    return worst(g.exit_status for g in grades)
