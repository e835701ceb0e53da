"""grade's output formats, each a pure function of the runs' grades: text (a short page for the learner: what
passed, then what to fix), json (GRADE_FORMAT with a schema version), junit (one testsuite per submission, one
testcase per checklist item, points and statuses as the testsuite's properties), gradescope (an autograder
results.json) and csv (one row per learner, for a class). docs/grading.md describes each.

The JUnit file is valid under the xunit2 schema pytest tests its own output against (junit-10.xsd): properties
only on <testsuite>, a manual item <skipped> with its reason, no `time` (grade measures none), suites named
uniquely and every testcase named after its submission, so a class file keeps one (classname, name) per case.
Every format carries what the grade could not establish (RunGrade.not_checked).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Optional
from xml.etree import ElementTree

from inferlab.grading.evidence import FAIL, MANUAL, PASS
from inferlab.grading.grade import GRADE_FORMAT, GRADE_SCHEMA, RunGrade, worst
from inferlab.grading.likeness import SHARED_FINDING, SHARED_WHAT
from inferlab.grading.measures import measurement_columns
from inferlab.grading.rubric import ITEM_NUMBERS

FORMATS = ("text", "json", "junit", "gradescope")
MARK = {PASS: "pass", MANUAL: "manual", FAIL: "FAIL"}
EVIDENCE_IN_TEXT = 3


def _points(value: float) -> str:
    return f"{value:g}"


def learner_text(grade: RunGrade) -> str:
    """Who the submission names ('ada@example.edu', several joined by ', '), from its facts: pack --learner's
    submission.json for an archive, and in a class also Gradescope's metadata; '' when it names nobody."""
    return ", ".join(str(x.get("id") or x.get("name") or x.get("email")) for x in grade.facts.get("learners") or [])


def points_forfeited(grade: RunGrade) -> bool:
    """Whether an integrity problem sets every item's points to 0 (the rubric's zero_score_on_integrity_problem)."""
    return bool(grade.error is None and grade.integrity_problems and grade.rubric
                and grade.rubric.zero_score_on_integrity_problem)


def awarded(grade: RunGrade, item) -> float:
    """The points an item adds to the score: its own, or 0 when an integrity problem forfeits them."""
    return 0.0 if points_forfeited(grade) else item.points


def _forfeit_reason(grade: RunGrade) -> str:
    problems = grade.integrity_problems
    return (f"no points: the run has {len(problems)} integrity problem(s), so its evidence cannot be trusted: "
            f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def _integrity_line(grade: RunGrade) -> str:
    problems = grade.integrity_problems
    if not problems:
        checked = ("verify found no problem but that the run is not the complete protocol (above)"
                   if grade.completeness else "verify found no problem") + \
            (" and the run agrees with the reference" if grade.reference else "")
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
    if learner_text(grade):
        sources = ", ".join(dict.fromkeys(str(x.get("from")) for x in grade.facts["learners"]))
        lines.append(f"  learner: {learner_text(grade)} (as {sources} says; it decides no point)")
    lines += [f"  {line}" for line in grade.completeness]
    lines.append("")
    done = [i for i in grade.items if i.status != FAIL]
    if done:
        lines.append("What passed:")
        for item in done:
            extra = f"; {_points(item.rubric.manual_points)} more points graded by a person" \
                if item.rubric.manual_points else ""
            lines.append(f"  [{MARK[item.status]}] {item.number}. {item.rubric.title} "
                         f"({_points(awarded(grade, item))}/{_points(item.rubric.points)}{extra})")
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
        others = [str(f["other"]) for f in grade.findings if f.get("kind") == SHARED_FINDING]
        shares = f"; shares evidence with {', '.join(others)} (a finding for a person)" if others else ""
        lines.append(f"{number:3}. {grade.label}: {grade.verdict} (exit {grade.exit_status}), "
                     f"{_points(grade.score)}/{_points(grade.max_score)}; items to fix: {failing}{problems}{shares}")
    return "\n".join(lines + [closing_line(grades)]) + "\n"


def run_data(grade: RunGrade) -> dict:
    """One run's grade as plain data (the JSON format's element of `runs`)."""
    return {"source": grade.source, "label": grade.label, "verdict": grade.verdict, "exit_status": grade.exit_status,
            "error": grade.error, "facts": grade.facts, "score": grade.score, "max_score": grade.max_score,
            "manual_points": sum(i.rubric.manual_points for i in grade.items),
            "items": [i.as_dict() for i in grade.items],
            "integrity": {"ok": not grade.integrity_problems, "verify_problems": grade.integrity,
                          "completeness": grade.completeness, "reference": grade.reference},
            "not_checked": grade.not_checked, "findings": grade.findings, "notes": grade.notes,
            "measurements": grade.measurements}


def json_text(grades: list[RunGrade], class_view: Optional[dict] = None) -> str:
    """The JSON format: {format, schema, rubric, exit_status, runs: [...]}, and for a class `class`: what pairs
    of submissions share and how many machines the class ran on (classview.class_data)."""
    rubric = grades[0].rubric.describe() if grades and grades[0].rubric else None
    data = {"format": GRADE_FORMAT, "schema": GRADE_SCHEMA, "rubric": rubric,
            "exit_status": worst(g.exit_status for g in grades), "runs": [run_data(g) for g in grades]}
    if class_view is not None:
        data["class"] = class_view
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"


def _properties(parent, values: dict) -> None:
    node = ElementTree.SubElement(parent, "properties")
    for name, value in values.items():
        text = "" if value is None else ("true" if value else "false") if isinstance(value, bool) else str(value)
        ElementTree.SubElement(node, "property", name=name, value=text)


def _check_text(item) -> str:
    return "\n".join(line for check in item.checks for line in _check_lines(check, indent=""))


def suite_names(grades: list[RunGrade]) -> list[str]:
    """One name per submission, unique in the file: its label, and ' (2)', ' (3)' ... after a label seen before."""
    names, seen = [], {}
    for grade in grades:
        seen[grade.label] = seen.get(grade.label, 0) + 1
        names.append(grade.label if seen[grade.label] == 1 else f"{grade.label} ({seen[grade.label]})")
    return names


def _suite_properties(grade: RunGrade) -> dict:
    """The testsuite's properties: the submission, its verdict and score, and each item's status and points."""
    values = {"source": grade.source, "learner": learner_text(grade) or None, "exit_status": grade.exit_status,
              "verdict": grade.verdict, "score": _points(grade.score), "max_score": _points(grade.max_score),
              **{k: grade.facts.get(k) for k in ("run_id", "specimen", "synthetic", "complete")}}
    for item in grade.items:
        values.update({f"item_{item.number}_status": item.status,
                       f"item_{item.number}_points": _points(awarded(grade, item)),
                       f"item_{item.number}_max_points": _points(item.rubric.points),
                       f"item_{item.number}_manual_points": _points(item.rubric.manual_points),
                       f"item_{item.number}_required": item.rubric.required})
    values["integrity_problems"] = len(grade.integrity_problems) if grade.error is None else None
    values.update({f"not_checked_{n}": reason for n, reason in enumerate(grade.not_checked, start=1)})
    return values


def _suite(root, grade: RunGrade, name: str) -> tuple[int, int, int]:
    suite = ElementTree.SubElement(root, "testsuite", name=name)
    _properties(suite, _suite_properties(grade))
    failures = skipped = errors = 0
    if grade.error is not None:
        case = ElementTree.SubElement(suite, "testcase", classname="inferlab.submission",
                                      name=f"a run to grade [{name}]")
        ElementTree.SubElement(case, "error", message=grade.error, type="not_a_run").text = grade.error
        errors = 1
    forfeited = points_forfeited(grade)
    for item in grade.items:
        case = ElementTree.SubElement(suite, "testcase", classname="inferlab.checklist",
                                      name=f"item {item.number}: {item.rubric.title} [{name}]")
        points = (f"points {_points(awarded(grade, item))} of {_points(item.rubric.points)} automatic"
                  + (f", {_points(item.rubric.manual_points)} more for a person" if item.rubric.manual_points else "")
                  + f"; checklist status {item.status}")
        if item.status == FAIL:
            failures += 1
            ElementTree.SubElement(case, "failure", message=item.message(), type="item_failed").text = _check_text(item)
        elif forfeited:
            failures += 1
            ElementTree.SubElement(case, "failure", message=_forfeit_reason(grade), type="integrity").text = \
                "\n".join(grade.integrity_problems)
        elif item.status == MANUAL:
            skipped += 1
            waiting = "; ".join(f"{c.name}: {c.detail}" for c in item.checks if c.status == MANUAL)
            ElementTree.SubElement(case, "skipped", type="manual", message=(
                f"for a person to grade ({_points(item.rubric.manual_points)} points): {waiting}"
                if item.rubric.manual_points else f"for a person to grade: {waiting}"))
        ElementTree.SubElement(case, "system-out").text = points + "\n" + _check_text(item)
    if grade.error is None:
        case = ElementTree.SubElement(suite, "testcase", classname="inferlab.integrity", name=f"integrity [{name}]")
        if grade.integrity_problems:
            failures += 1
            ElementTree.SubElement(case, "failure", message=f"{len(grade.integrity_problems)} integrity problem(s): "
                                   f"{grade.integrity_problems[0]}", type="integrity").text = \
                "\n".join(grade.integrity_problems)
        lines = [f"not checked: {reason}" for reason in grade.not_checked]
        lines += [f"finding: {f['what']}: {f['meaning']}" for f in grade.findings]
        ElementTree.SubElement(case, "system-out").text = "\n".join(lines) or "no findings"
    suite.set("tests", str(len(suite.findall("testcase"))))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    return failures, errors, skipped


def junit(grades: list[RunGrade]) -> str:
    """JUnit XML valid under pytest's xunit2 schema: one testsuite per submission (named uniquely), its points and
    statuses as the suite's properties; one testcase per checklist item (classname inferlab.checklist, the name
    ending in [submission]) and one for integrity (inferlab.integrity). A failing item is a <failure> saying what
    to fix, a manual item <skipped> with its reason, and with an integrity problem that forfeits the points every
    item is a failure of type integrity. No time is given: grade measures none."""
    root = ElementTree.Element("testsuites", name="inferlab grade")
    totals = [_suite(root, grade, name) for grade, name in zip(grades, suite_names(grades))]
    root.set("tests", str(sum(len(s.findall("testcase")) for s in root.findall("testsuite"))))
    root.set("failures", str(sum(f for f, _, _ in totals)))
    root.set("errors", str(sum(e for _, e, _ in totals)))
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def gradescope(grade: RunGrade) -> str:
    """Gradescope's autograder results.json for one submission: the score, and one test per checklist item with
    its score, max_score, status, visibility and output; integrity as a test without points. The item tests add
    up to the score: when an integrity problem forfeits the points, each is 0 and failed, saying why."""
    if grade.error is not None:
        data = {"score": 0.0, "output": grade.error, "visibility": "visible",
                "tests": [{"name": "A run to grade", "status": "failed", "output": grade.error,
                           "visibility": "visible"}]}
        return json.dumps(data, indent=2) + "\n"
    tests = []
    forfeited = points_forfeited(grade)
    for item in grade.items:
        output = _check_text(item)
        if item.rubric.manual_points:
            output = (f"{_points(item.rubric.manual_points)} more points are graded by a person, outside this "
                      f"autograder.\n") + output
        if forfeited:
            output = f"{_forfeit_reason(grade)}\nThe item's own checks ({item.status}):\n" + output
        tests.append({"name": f"{item.number}. {item.rubric.title}", "number": str(item.number),
                      "score": awarded(grade, item), "max_score": item.rubric.points,
                      "status": "failed" if item.status == FAIL or forfeited else "passed",
                      "visibility": item.rubric.visibility, "output": output,
                      "tags": ["checklist"] + (["manual"] if item.status == MANUAL else [])})
    problems = grade.integrity_problems
    unchecked = [f"not checked: {reason}" for reason in grade.not_checked]
    tests.append({"name": "Integrity of the run", "status": "failed" if problems else "passed",
                  "visibility": "visible",
                  "output": "\n".join((problems if problems else [_integrity_line(grade)]) + unchecked)})
    summary = text_page(grade)
    data = {"score": grade.score, "output": summary, "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests, "extra_data": {"format": GRADE_FORMAT, "schema": GRADE_SCHEMA,
                                           "exit_status": grade.exit_status,
                                           "learner": learner_text(grade) or None, "facts": grade.facts,
                                           "not_checked": grade.not_checked}}
    return json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"


def csv_columns() -> list[str]:
    """The CSV's header."""
    return (["source", "run_id", "specimen", "synthetic", "complete", "integrity", "exit_status", "learner",
             "learner_name", "learner_email", "shared_with"]
            + [f"item_{n}" for n in ITEM_NUMBERS] + ["score", "max_score"] + measurement_columns())


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def shared_with(grade: RunGrade, labels: list[str]) -> str:
    """'2 ada.tar.gz (the same run id, the same records.jsonl); 4 dee (the same explanation)' from the findings
    the class view added (likeness.flag_grades)."""
    parts = []
    for finding in grade.findings:
        if finding.get("kind") == SHARED_FINDING:
            other = finding["other"]
            figures = finding.get("similarity") or {}
            words = ", ".join(SHARED_WHAT[what] + (f" {figures[what]:.0%}" if what in figures else "")
                              for what in finding["shared"])
            parts.append(f"{other} {labels[other - 1] if 0 < other <= len(labels) else ''} ({words})")
    return "; ".join(parts)


def csv_text(grades: list[RunGrade]) -> str:
    """One row per learner (a group submission gives each of its learners a row; a submission that names none
    has one row): its id, specimen, synthetic or not, complete, integrity, who, what it shares with another
    submission, each item's status, the score and the key measurements."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(csv_columns())
    labels = [g.label for g in grades]
    for grade in grades:
        facts = grade.facts
        integrity = "not_a_run" if grade.error else (
            f"{len(grade.integrity_problems)} problem(s)" if grade.integrity_problems else "ok")
        statuses = {i.number: i.status for i in grade.items}
        shared = shared_with(grade, labels)
        for learner in facts.get("learners") or [{}]:
            row = [grade.source, facts.get("run_id"), facts.get("specimen"), facts.get("synthetic"),
                   facts.get("complete"), integrity, grade.exit_status, learner.get("id"), learner.get("name"),
                   learner.get("email"), shared]
            row += [statuses.get(n, "") for n in ITEM_NUMBERS] + [grade.score, grade.max_score]
            row += [grade.measurements.get(c) for c in measurement_columns()]
            writer.writerow([_cell(v) for v in row])
    return buffer.getvalue()


def render(grades: list[RunGrade], kind: str, class_view: Optional[dict] = None) -> Optional[str]:
    """The output of one format; None for gradescope over several runs (it holds one submission)."""
    if kind == "text":
        return text(grades)
    if kind == "json":
        return json_text(grades, class_view)
    if kind == "junit":
        return junit(grades)
    if kind == "gradescope":
        return gradescope(grades[0]) if len(grades) == 1 else None
    raise ValueError(f"unknown format {kind!r}; expected one of {', '.join(FORMATS)}")
