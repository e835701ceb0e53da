"""Whether a predictions file answers the lab's six questions (predictions.md at the repository root is the
blank template), one question at a time.

The session calls template_status when it copies the file, to say whether it is still the blank template (the
run goes on either way; the manifest and the terminal say so, because predictions written after the run are
not predictions). `grade` calls question_answers on the run's own copy of the file: its verdict comes from the
text, never from the flag the manifest carries (inferlab.grading.recompute checks that flag against the text).

The rule (docs/grading.md says it for a learner):
- The file is split into the six questions by their numbers. A question starts at a Markdown heading whose
  text begins with its number ("## 1. Will repeated ..." as in the template, "# 3)", "### Q4:"); when the
  file has no numbered heading, at a line that starts, unindented, with its number ("1. ...", "2) ...",
  "Q3: ...", "**4.** ...", "Question 5: ..."), numbers in increasing order (a numbered list inside an answer
  is part of that answer). A question's answer is everything under its start up to the next question or
  heading; on an unindented numbered line, the rest of that line too. The question's own wording, copied
  from the template, is not part of the answer.
- An answer counts when it holds at least MIN_ANSWER_WORDS words that are not placeholders (PLACEHOLDERS:
  "TODO", "tbd", "lol", "n/a", "xxx" ...; a word of punctuation only, such as "?", "..." or "-", is no
  word). In the template's format (Prediction:, Uncertainty:, Why: fields) the Prediction field must
  itself hold a word that is not a placeholder, and the labels are not words of the answer.
- A question that appears twice is answered when either place answers it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from inferlab.base import learner_text

TEMPLATE_FILE = "predictions.md"
QUESTIONS = (1, 2, 3, 4, 5, 6)  # the lab's six prediction questions, numbered as in the template
MIN_ANSWER_WORDS = 3
PLACEHOLDERS = learner_text.PLACEHOLDERS  # defined once, for every learner text (inferlab.base.learner_text)
# The template's answer fields: "Prediction:", "Uncertainty:", "Why:" at the start of a line.
FIELD = re.compile(r"^\s*(Prediction|Uncertainty|Why)\s*:(.*)$")
HEADING = re.compile(r"^\s{0,3}#")
NUMBERED_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*(?:\*\*)?\s*(?:Q(?:uestion)?\s*)?([1-9])\s*[.):]\s*(.*)$",
                              re.IGNORECASE)
NUMBERED_LINE = re.compile(r"^(?:\*\*)?(?:Q(?:uestion)?\s*)?([1-9])\s*[.):](?:\*\*)?\s*(.*)$", re.IGNORECASE)
WORD = re.compile(r"[^\W_]+(?:['’/][^\W_]+)*")


def answers(text: str) -> list[str]:
    """The text of every answer field, in order: what follows its label, up to the next label or heading."""
    found: list[list[str]] = []
    for line in text.splitlines():
        match = FIELD.match(line)
        if match:
            found.append([match.group(2)])
        elif HEADING.match(line):
            found.append(None)  # a heading ends the current answer
        elif found and found[-1] is not None:
            found[-1].append(line)
    return ["\n".join(parts).strip() for parts in found if parts is not None]


def words(text: str) -> list[str]:
    """The words of a text that are not placeholders."""
    return [w for w in WORD.findall(text) if not learner_text.is_placeholder(w)]


def _normal(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


@dataclass
class QuestionAnswers:
    """Which of the six questions a predictions file answers, and why each other one does not count."""

    format: str  # "template" (Prediction/Uncertainty/Why fields), "free-form", "empty" or "unnumbered"
    answered: list[int] = field(default_factory=list)
    missing: dict[int, str] = field(default_factory=dict)  # question -> why it does not count

    def missing_text(self) -> str:
        """'2, 3 (no answer); 5 (only placeholders (TODO))': the questions not answered, grouped by why."""
        by_reason: dict[str, list[int]] = {}
        for number, why in sorted(self.missing.items()):
            by_reason.setdefault(why, []).append(number)
        return "; ".join(f"{', '.join(map(str, numbers))} ({why})" for why, numbers in by_reason.items())

    def summary(self) -> str:
        """One line: how many questions are answered, and which are not and why."""
        if self.format == "empty":
            return next(iter(self.missing.values()), "empty")
        head = f"{len(self.answered)} of {len(QUESTIONS)} questions answered ({self.format})"
        return head + (f"; not answered: {self.missing_text()}" if self.missing else "")


def question_texts(template_text: Optional[str]) -> dict[int, list[str]]:
    """Each question's wording in the template (its numbered heading's words, lowercased); {} without one."""
    found = {}
    for line in (template_text or "").splitlines():
        match = NUMBERED_HEADING.match(line)
        if match and int(match.group(1)) in QUESTIONS:
            found[int(match.group(1))] = _normal(match.group(2))
    return found


def _sections(text: str) -> dict[int, list[str]]:
    """Question number -> the lines of its answer (see the module docstring)."""
    lines = text.splitlines()
    by_heading = any(NUMBERED_HEADING.match(line) for line in lines)
    sections: dict[int, list[str]] = {}
    current: Optional[list[str]] = None
    last = 0
    for line in lines:
        heading = NUMBERED_HEADING.match(line)
        plain = None if by_heading or HEADING.match(line) else NUMBERED_LINE.match(line)
        if heading and int(heading.group(1)) in QUESTIONS:
            current = sections.setdefault(int(heading.group(1)), [])
            current.append("\0" + heading.group(2))  # the heading's text: the question, not an answer
        elif plain and int(plain.group(1)) in QUESTIONS and int(plain.group(1)) > last:
            last = int(plain.group(1))
            current = sections.setdefault(last, [])
            current.append(plain.group(2))
        elif HEADING.match(line):
            current = None
        elif current is not None:
            current.append(line)
    return sections


def _without_wording(line: str, wording: list[str]) -> str:
    """The line without the question's own wording at its start (a learner may copy the question)."""
    found = WORD.findall(line)
    if wording and [w.lower() for w in found[:len(wording)]] == wording:
        return " ".join(found[len(wording):])
    return line


def _judge(lines: list[str], wording: list[str]) -> Optional[str]:
    """None when the answer counts, else why not."""
    prediction: Optional[list[str]] = None
    text_lines = []
    current = None  # the field the line belongs to: an answer may go on the lines after its label
    for line in lines:
        if line.startswith("\0"):  # a numbered heading's text: the question, not an answer
            continue
        match = FIELD.match(line)
        if match:
            current = match.group(1)
            line = match.group(2)
        else:
            line = _without_wording(line, wording)
        if current == "Prediction":
            prediction = (prediction or []) + [line]
        text_lines.append(line)
    text = " ".join(" ".join(text_lines).split())
    if prediction is not None and not words(" ".join(prediction)):
        given = " ".join(" ".join(prediction).split())
        return f"its Prediction field holds only a placeholder ({given[:40]})" if given else \
            "its Prediction field is blank"
    found = words(text)
    if not text:
        return "no answer"
    if not found:
        return f"only placeholders ({text[:40]})"
    if len(found) < MIN_ANSWER_WORDS:
        return f"{len(found)} word(s), fewer than {MIN_ANSWER_WORDS}: {' '.join(found)}"
    return None


def question_answers(text: str, template_text: Optional[str] = None) -> QuestionAnswers:
    """Which of the six questions `text` answers (the rule is in the module docstring); template_text (the
    blank template) gives each question's wording, which does not count as an answer."""
    if not text:
        return QuestionAnswers("empty", [], {n: "the file is empty" for n in QUESTIONS})
    if not text.strip():
        return QuestionAnswers("empty", [], {n: "the file holds only whitespace" for n in QUESTIONS})
    sections = _sections(text)
    if not sections:
        return QuestionAnswers("unnumbered", [], {n: "no section numbered for it" for n in QUESTIONS})
    kind = "template" if any(FIELD.match(line) for line in text.splitlines()) else "free-form"
    wording = question_texts(template_text)
    result = QuestionAnswers(kind)
    for number in QUESTIONS:
        if number not in sections:
            result.missing[number] = "no section numbered for it"
            continue
        why = _judge(sections[number], wording.get(number, []))
        if why is None:
            result.answered.append(number)
        else:
            result.missing[number] = why
    return result


def template_status(text: str, template_text: Optional[str]) -> dict:
    """{template_unanswered, template_check}, as the session records them: unanswered when the text is the
    template itself, or when it has the template's answer fields and every one of them is blank. The session
    does not judge a file in another form; grade judges every file question by question (question_answers)."""
    if template_text is not None and text.strip() == template_text.strip():
        return {"template_unanswered": True,
                "template_check": f"identical to the blank template {TEMPLATE_FILE}"}
    fields = answers(text)
    if fields and not any(fields):
        return {"template_unanswered": True,
                "template_check": f"all {len(fields)} answer fields (Prediction/Uncertainty/Why) are blank"}
    if fields:
        blank = sum(1 for answer in fields if not answer)
        return {"template_unanswered": False,
                "template_check": f"{len(fields) - blank} of {len(fields)} answer fields filled in"}
    return {"template_unanswered": False,
            "template_check": "not in the template's format (grade judges it question by question)"}


def read_template(root: Path) -> Optional[str]:
    """The blank template's text, or None when the repository has none."""
    path = Path(root) / TEMPLATE_FILE
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
