"""grade's output formats, each a pure function of the runs' grades: text (a short page for the learner: what
passed, then what to fix), json (GRADE_FORMAT with a schema version), junit (one testcase per checklist item,
points as properties, the failure message saying what to fix), gradescope (an autograder results.json) and
csv (one row per run, for a class). docs/grading.md describes each.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Optional
from xml.etree import ElementTree

from inferlab.grading.evidence import FAIL, MANUAL, PASS
from inferlab.grading.grade import GRADE_FORMAT, GRADE_SCHEMA, RunGrade, worst
from inferlab.grading.measures import measurement_columns
from inferlab.grading.rubric import ITEM_NUMBERS

FORMATS = ("text", "json", "junit", "gradescope")
MARK = {PASS: "pass", MANUAL: "manual", FAIL: "FAIL"}
EVIDENCE_IN_TEXT = 3


def _points(value: float) -> str:
    return f"{value:g}"


def _integrity_line(grade: RunGrade) -> str:
    problems = grade.integrity_problems
    if not problems:
        checked = "verify found no problem" + (" and the run agrees with the reference" if grade.reference else "")
        return f"integrity: OK ({checked})"
    return f"integrity: {len(problems)} PROBLEM(S): the evidence cannot be trusted (exit 3)"


def _check_lines(check, indent: str = "      ") -> list[str]:
    evidence = ", ".join(e.text() for e in check.evidence[:EVIDENCE_IN_TEXT])
    more = (check.count or len(check.evidence)) - min(len(check.evidence), EVIDENCE_IN_TEXT)
    where = f" [{evidence}{f', and {more} more' if more > 0 else ''}]" if evidence else ""
    lines = [f"{indent}{MARK[check.status]:6} {check.name}: {check.detail}{where}"]
    if check.fix and check.status != PASS:
        lines.append(f"{indent}       to fix: {check.fix}")
    return lines


def text_page(grade: RunGrade) -> str:
    """One run's page: the verdict, what passed, what to fix, integrity, findings."""
    if grade.error is not None:
        return f"grade: {grade.source}: NOT A RUN (exit 2)\n  {grade.error}\n"
    facts = grade.facts
    failing = [i for i in grade.items if i.status == FAIL]
    manual = sum(i.rubric.manual_points for i in grade.items)
    lines = [f"grade: {grade.source}: {grade.verdict.upper()} (exit {grade.exit_status}); score "
             f"{_points(grade.score)} of {_points(grade.max_score)} automatic points"
             + (f", and {_points(manual)} more for a person to award" if manual else ""),
             f"  run {facts.get('run_id')}: specimen {facts.get('specimen')}"
             + (" (SYNTHETIC, not Pythia)" if facts.get("synthetic") else "")
             + (", complete" if facts.get("complete") else ", NOT the complete protocol") + f", schema {facts.get('schema')}"]
    lines += [f"  {line}" for line in grade.completeness]
    lines.append("")
    done = [i for i in grade.items if i.status != FAIL]
    if done:
        lines.append("What passed:")
        for item in done:
            extra = f"; {_points(item.rubric.manual_points)} more points graded by a person" \
                if item.rubric.manual_points else ""
            lines.append(f"  [{MARK[item.status]}] {item.number}. {item.rubric.title} "
                         f"({_points(item.points)}/{_points(item.rubric.points)}{extra})")
            for check in item.checks:
                if check.status == MANUAL:
                    lines += _check_lines(check)
    if failing:
        lines += ["", "What to fix:"]
        for item in failing:
            required = "" if item.rubric.required else " (optional in this rubric)"
            lines.append(f"  [FAIL] {item.number}. {item.rubric.title} (0/{_points(item.rubric.points)}){required}")
            for check in item.checks:
                if check.status != PASS:
                    lines += _check_lines(check)
    lines += ["", _integrity_line(grade)]
    lines += [f"  - {problem}" for problem in grade.integrity_problems]
    for note in (grade.reference or {}).get("notes") or []:
        lines.append(f"  reference note: {note}")
    if grade.findings:
        lines += ["", "Findings (none of them costs points):"]
        for finding in grade.findings:
            where = ", ".join(f"{e['file']} seq {e['seq']}" if "seq" in e else e["file"] for e in finding["evidence"])
            lines.append(f"  - {finding['what']} [{where}]: {finding['meaning']}")
    if grade.notes:
        lines += ["", "Notes:"] + [f"  - {note}" for note in grade.notes]
    if grade.not_checked:
        lines += ["", "Not checked (what this grade does not establish):"]
        lines += [f"  - {line}" for line in grade.not_checked]
    return "\n".join(lines) + "\n"


def text(grades: list[RunGrade]) -> str:
    """Every run's page, and a closing line when there are several."""
    pages = "\n".join(text_page(g) for g in grades)
    return pages + (f"\n{closing_line(grades)}\n" if len(grades) > 1 else "")


def closing_line(grades: list[RunGrade]) -> str:
    """'grade: 3 runs: 2 failed, 1 passed; exit 1 (the worst)'."""
    counts: dict = {}
    for grade in grades:
        counts[grade.verdict] = counts.get(grade.verdict, 0) + 1
    return (f"grade: {len(grades)} runs: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
            + f"; exit {worst(g.exit_status for g in grades)} (the worst)")


def summary(grades: list[RunGrade]) -> str:
    """One line per run (for a class): its verdict, score, and the items to fix; then the closing line."""
    lines = []
    for number, grade in enumerate(grades, start=1):
        if grade.error is not None:
            lines.append(f"{number:3}. {grade.label}: NOT A RUN (exit 2): {grade.error}")
            continue
        failing = ", ".join(str(i.number) for i in grade.items if i.status == FAIL) or "none"
        problems = f"; {len(grade.integrity_problems)} integrity problem(s)" if grade.integrity_problems else ""
        lines.append(f"{number:3}. {grade.label}: {grade.verdict} (exit {grade.exit_status}), "
                     f"{_points(grade.score)}/{_points(grade.max_score)}; items to fix: {failing}{problems}")
    return "\n".join(lines + [closing_line(grades)]) + "\n"


def run_data(grade: RunGrade) -> dict:
    """One run's grade as plain data (the JSON format's element of `runs`)."""
    return {"source": grade.source, "label": grade.label, "verdict": grade.verdict, "exit_status": grade.exit_status,
            "error": grade.error, "facts": grade.facts, "score": grade.score, "max_score": grade.max_score,
            "manual_points": sum(i.rubric.manual_points for i in grade.items),
            "items": [i.as_dict() for i in grade.items],
            "integrity": {"ok": not grade.integrity_problems, "verify_problems": grade.integrity,
                          "completeness": grade.completeness, "reference": grade.reference},
            "findings": grade.findings, "notes": grade.notes, "measurements": grade.measurements}


def json_text(grades: list[RunGrade]) -> str:
    """The JSON format: {format, schema, rubric, exit_status, runs: [...]}."""
    rubric = grades[0].rubric.describe() if grades and grades[0].rubric else None
    data = {"format": GRADE_FORMAT, "schema": GRADE_SCHEMA, "rubric": rubric,
            "exit_status": worst(g.exit_status for g in grades), "runs": [run_data(g) for g in grades]}
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"


def _properties(parent, values: dict) -> None:
    node = ElementTree.SubElement(parent, "properties")
    for name, value in values.items():
        ElementTree.SubElement(node, "property", name=name, value="" if value is None else str(value))


def _check_text(item) -> str:
    return "\n".join(line for check in item.checks for line in _check_lines(check, indent=""))


def _suite(root, grade: RunGrade) -> tuple[int, int]:
    suite = ElementTree.SubElement(root, "testsuite", name=grade.label, time="0", skipped="0")
    _properties(suite, {"source": grade.source, "exit_status": grade.exit_status, "verdict": grade.verdict,
                        "score": _points(grade.score), "max_score": _points(grade.max_score),
                        **{k: grade.facts.get(k) for k in ("run_id", "specimen", "synthetic", "complete")}})
    failures = errors = 0
    if grade.error is not None:
        case = ElementTree.SubElement(suite, "testcase", classname="inferlab.submission", name="a run to grade",
                                      time="0")
        ElementTree.SubElement(case, "error", message=grade.error, type="not_a_run").text = grade.error
        errors = 1
    for item in grade.items:
        case = ElementTree.SubElement(suite, "testcase", classname="inferlab.checklist",
                                      name=f"item {item.number}: {item.rubric.title}", time="0")
        _properties(case, {"status": item.status, "points": _points(item.points),
                           "max_points": _points(item.rubric.points),
                           "manual_points": _points(item.rubric.manual_points), "required": item.rubric.required})
        if item.status == FAIL:
            failures += 1
            ElementTree.SubElement(case, "failure", message=item.message(), type="item_failed").text = _check_text(item)
        ElementTree.SubElement(case, "system-out").text = _check_text(item)
    if grade.error is None:
        case = ElementTree.SubElement(suite, "testcase", classname="inferlab.integrity", name="integrity", time="0")
        if grade.integrity_problems:
            failures += 1
            ElementTree.SubElement(case, "failure", message=f"{len(grade.integrity_problems)} integrity problem(s): "
                                   f"{grade.integrity_problems[0]}", type="integrity").text = \
                "\n".join(grade.integrity_problems)
        findings = "\n".join(f"finding: {f['what']}: {f['meaning']}" for f in grade.findings)
        ElementTree.SubElement(case, "system-out").text = findings or "no findings"
    suite.set("tests", str(len(suite.findall("testcase"))))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    return failures, errors


def junit(grades: list[RunGrade]) -> str:
    """JUnit XML: one testsuite per run, one testcase per checklist item (class inferlab.checklist) and one for
    integrity (class inferlab.integrity); points are testcase properties."""
    root = ElementTree.Element("testsuites", name="inferlab grade")
    totals = [_suite(root, grade) for grade in grades]
    root.set("tests", str(sum(len(s.findall("testcase")) for s in root.findall("testsuite"))))
    root.set("failures", str(sum(f for f, _ in totals)))
    root.set("errors", str(sum(e for _, e in totals)))
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def gradescope(grade: RunGrade) -> str:
    """Gradescope's autograder results.json for one submission: the score, and one test per checklist item with
    its score, max_score, status, visibility and output; integrity as a test without points."""
    if grade.error is not None:
        data = {"score": 0.0, "output": grade.error, "visibility": "visible",
                "tests": [{"name": "A run to grade", "status": "failed", "output": grade.error,
                           "visibility": "visible"}]}
        return json.dumps(data, indent=2) + "\n"
    tests = []
    for item in grade.items:
        output = _check_text(item)
        if item.rubric.manual_points:
            output = (f"{_points(item.rubric.manual_points)} more points are graded by a person, outside this "
                      f"autograder.\n") + output
        tests.append({"name": f"{item.number}. {item.rubric.title}", "number": str(item.number),
                      "score": item.points, "max_score": item.rubric.points,
                      "status": "failed" if item.status == FAIL else "passed",
                      "visibility": item.rubric.visibility, "output": output,
                      "tags": ["checklist"] + (["manual"] if item.status == MANUAL else [])})
    problems = grade.integrity_problems
    tests.append({"name": "Integrity of the run", "status": "failed" if problems else "passed",
                  "visibility": "visible",
                  "output": "\n".join(problems) if problems else _integrity_line(grade)})
    summary = text_page(grade)
    data = {"score": grade.score, "output": summary, "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests, "extra_data": {"format": GRADE_FORMAT, "schema": GRADE_SCHEMA,
                                           "exit_status": grade.exit_status, "facts": grade.facts}}
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"


def csv_columns() -> list[str]:
    """The CSV's header."""
    return (["source", "run_id", "specimen", "synthetic", "complete", "integrity", "exit_status"]
            + [f"item_{n}" for n in ITEM_NUMBERS] + ["score", "max_score"] + measurement_columns())


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def csv_text(grades: list[RunGrade]) -> str:
    """One row per run: its id, specimen, synthetic or not, complete, integrity, each item's status, the score
    and the key measurements."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(csv_columns())
    for grade in grades:
        facts = grade.facts
        integrity = "not_a_run" if grade.error else (
            f"{len(grade.integrity_problems)} problem(s)" if grade.integrity_problems else "ok")
        statuses = {i.number: i.status for i in grade.items}
        row = [grade.source, facts.get("run_id"), facts.get("specimen"), facts.get("synthetic"),
               facts.get("complete"), integrity, grade.exit_status]
        row += [statuses.get(n, "") for n in ITEM_NUMBERS] + [grade.score, grade.max_score]
        row += [grade.measurements.get(c) for c in measurement_columns()]
        writer.writerow([_cell(v) for v in row])
    return buffer.getvalue()


def render(grades: list[RunGrade], kind: str) -> Optional[str]:
    """The output of one format; None for gradescope over several runs (it holds one submission)."""
    if kind == "text":
        return text(grades)
    if kind == "json":
        return json_text(grades)
    if kind == "junit":
        return junit(grades)
    if kind == "gradescope":
        return gradescope(grades[0]) if len(grades) == 1 else None
    raise ValueError(f"unknown format {kind!r}; expected one of {', '.join(FORMATS)}")
