"""grade's output formats, pure functions of the grades, each naming the learner: text (for a person), json, junit
(one testcase per item), gradescope (results.json, with the learner's texts and a summary of the course's run for
the person who grades them) and csv (one row per submission)."""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Optional
from xml.etree import ElementTree

from inferlab.files import OutputPathError, output_kind, replace_hint, write_text_atomic
from inferlab.grade import rubric
from inferlab.grade.grade import EXIT_OK, FAIL, MANUAL, PASS, Grade, flag_copies, grade_source
from inferlab.read.parse import not_a_run_reason
from inferlab.read.runview import RunView

MARK = {PASS: "pass", MANUAL: "manual", FAIL: "FAIL"}
TEXT_LIMIT = 20_000  # characters of a learner's text shown in results.json


def _who(grade: Grade) -> str:
    return grade.learner or "(no learner id: pack --learner ID)"


def text_page(grade: Grade) -> str:
    if grade.error:
        return f"grade: {grade.source}: not graded (exit {grade.exit_status}): {grade.error}\n"
    lines = [f"grade: {grade.source}", f"learner: {_who(grade)}"]
    for item in grade.items:
        lines.append(f"  {MARK[item.status]:6} item {item.item.number}: {item.item.title} "
                     f"({item.points:g} of {item.item.points:g}"
                     + (f", plus {item.item.manual_points:g} a person awards" if item.item.manual_points else "") + ")")
        for check in item.checks:
            lines.append(f"      {MARK[check.status]:6} {check.name}: {check.detail}")
            if check.fix and check.status == FAIL:
                lines.append(f"             to fix: {check.fix}")
    if grade.integrity:
        lines.append(f"integrity: {len(grade.integrity)} problem(s): " + "; ".join(grade.integrity[:3]))
    lines += [f"finding (explain it; costs nothing): {finding}" for finding in grade.findings]
    lines += [f"note: {note}" for note in grade.notes]
    if grade.comparison and grade.comparison.timings:
        lines.append("timings (median of the measured trials, ms): run / course")
        for row in grade.comparison.timings:
            run, course = (f"{row[s] * 1e3:.3f}" if row[s] is not None else "-" for s in ("run", "course"))
            cache = "on" if row["use_cache"] else "off"
            lines.append(f"  {row['prompt_id']} cache {cache} {row['metric'].removesuffix('_s')}: {run} / {course}")
    lines.append(f"score: {grade.score:g} of {grade.max_score:g} (exit {grade.exit_status})")
    return "\n".join(lines) + "\n"


def text(grades: list[Grade]) -> str:
    pages = [text_page(g) for g in grades]
    if len(grades) > 1:
        pages.append(f"{len(grades)} submissions; worst exit status {max(g.exit_status for g in grades)}\n")
    return "\n".join(pages)


def as_json(grades: list[Grade]) -> str:
    return json.dumps({"format": "inferlab-grade", "schema": 2, "grades": [g.as_dict() for g in grades]},
                      indent=2, allow_nan=False, default=str) + "\n"


def junit(grades: list[Grade]) -> str:
    suites = ElementTree.Element("testsuites")
    for grade in grades:
        suite = ElementTree.SubElement(suites, "testsuite", name=f"{grade.learner or grade.source}",
                                       tests=str(len(grade.items)),
                                       failures=str(sum(i.status == FAIL for i in grade.items)),
                                       errors="1" if grade.error else "0",
                                       skipped=str(sum(i.status == MANUAL for i in grade.items)))
        properties = ElementTree.SubElement(suite, "properties")
        for name, value in (("learner", _who(grade)), ("score", f"{grade.score:g}"),
                            ("max_score", f"{grade.max_score:g}"), ("exit_status", str(grade.exit_status))):
            ElementTree.SubElement(properties, "property", name=name, value=value)
        if grade.error:
            case = ElementTree.SubElement(suite, "testcase", classname=grade.source, name="submission")
            ElementTree.SubElement(case, "error", message=grade.error)
        for item in grade.items:
            case = ElementTree.SubElement(suite, "testcase", classname=grade.source,
                                          name=f"item {item.item.number}: {item.item.title}")
            if item.status == FAIL:
                ElementTree.SubElement(case, "failure", message=item.message()[:500]).text = item.message()
            elif item.status == MANUAL:
                ElementTree.SubElement(case, "skipped", message="a person grades this item")
    return ElementTree.tostring(suites, encoding="unicode") + "\n"


def _shown(label: str, text: Optional[str]) -> str:
    if text is None:
        return f"{label}: none handed in"
    return f"--- {label} ---\n{text[:TEXT_LIMIT]}" + ("\n[cut]" if len(text) > TEXT_LIMIT else "")


def gradescope(grade: Grade, execution_time: float = 0.0, course_summary: Optional[str] = None) -> str:
    """An autograder's results.json for one submission (Gradescope's format)."""
    if grade.error:
        output = f"not graded: {grade.error}"
        data = {"score": 0.0, "output": output, "tests": [{"name": "A submission to grade", "score": 0.0,
                                                            "status": "failed", "output": output}]}
    else:
        tests = []
        for item in grade.items:
            output = item.message()
            if item.item.number in (1, 7):
                output += "\n\n" + _shown("your predictions", grade.texts.predictions)
                output += "\n\n" + _shown("your explanation", grade.texts.explanation)
                if course_summary:
                    output += "\n\n--- the course's run, the evidence these are read against ---\n" + course_summary
            tests.append({"name": f"Item {item.item.number}: {item.item.title}", "number": str(item.item.number),
                          "score": item.points, "max_score": item.item.points,
                          "status": "failed" if item.status == FAIL else "passed", "output": output,
                          "visibility": item.item.visibility})
        summary = [f"learner: {_who(grade)}"] + [f"note: {n}" for n in grade.notes] + \
                  [f"integrity: {p}" for p in grade.integrity] + [f"finding: {f}" for f in grade.findings]
        data = {"score": grade.score, "output": "\n".join(summary), "tests": tests}
    data["execution_time"] = round(execution_time, 3)
    data["extra_data"] = {"learner": grade.learner, "exit_status": grade.exit_status, "source": grade.source}
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"


def csv_text(grades: list[Grade]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    numbers = sorted({i.item.number for g in grades for i in g.items}) or list(range(1, 8))
    writer.writerow(["learner", "source", "score", "max_score", "exit_status", "compared_exactly",
                     *[f"item_{n}" for n in numbers], "notes"])
    for grade in grades:
        status = {i.item.number: i.status for i in grade.items}
        exact = "" if grade.comparison is None else str(grade.comparison.exact).lower()
        writer.writerow([grade.learner or "", grade.source, f"{grade.score:g}", f"{grade.max_score:g}",
                         grade.exit_status, exact, *[status.get(n, "") for n in numbers],
                         " | ".join(grade.notes + ([grade.error] if grade.error else []))])
    return out.getvalue()


def command(args) -> int:
    """`inferlab grade ...` (inferlab.cli): grade every source, print or write the formats; the exit status."""
    try:
        rules = rubric.load(args.rubric)
    except rubric.RubricError as error:
        return _usage(f"the rubric cannot be used: {error}")
    sources = [p.resolve() for p in args.runs]
    for option, target in [(o, t) for o, t in (("--out", args.out), ("--csv", args.csv)) if t is not None]:
        if any(target.resolve().is_relative_to(source) for source in sources):
            return _usage(f"{option} {target} is a submission or lies inside one: grade never writes there")
        try:  # before any grading: an existing file is refused unless --replace, a folder or a socket always
            output_kind(target, replace=args.replace)
        except OutputPathError as error:
            return _usage(f"{option}: {replace_hint(error)}")
    if args.out is not None and args.csv is not None and args.out.resolve() == args.csv.resolve():
        return _usage("--out and --csv name the same file")
    if args.format == "gradescope" and len(args.runs) != 1:
        return _usage(f"--format gradescope writes one submission's results.json; {len(args.runs)} were given")
    if len(args.against or []) > 1:  # argparse's append: a list, or None when not given
        return _usage(f"--against was given {len(args.against)} times; give the one course run to compare with")
    course, (against,) = None, args.against or [None]
    if against is not None:
        why = not_a_run_reason(against)
        if why:
            return _usage(f"--against {against}: expected the course's run folder: {why}")
        course = RunView.read(against)
        if course.unfinished or course.is_plan_folder:
            return _usage(f"--against {against}: the course's run must be a finished run "
                          f"({course.unfinished or 'a plan folder'})")
    grades = [grade_source(path, rules, course, str(against or "")) for path in args.runs]
    flag_copies(grades)
    output = gradescope(grades[0]) if args.format == "gradescope" else \
        {"text": text, "json": as_json, "junit": junit}[args.format](grades)
    try:
        if args.out is None:
            sys.stdout.write(output)
        else:
            write_text_atomic(args.out, output, replace=args.replace)
            if args.format != "text":
                sys.stdout.write(text(grades))
            print(f"grade: {args.format} written to {args.out}", file=sys.stderr)
        if args.csv is not None:
            write_text_atomic(args.csv, csv_text(grades), replace=args.replace)
            print(f"grade: {len(grades)} CSV row(s) written to {args.csv}", file=sys.stderr)
    except OutputPathError as error:
        return _usage(replace_hint(error))
    return max((g.exit_status for g in grades), default=EXIT_OK)


def _usage(message: str) -> int:
    print(f"grade: {message}", file=sys.stderr)
    return 2
