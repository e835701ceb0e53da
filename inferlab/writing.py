"""A learner's own texts: reading one safely, and judging its form (never its content, which a person grades).

- read(): the one check of a file a learner wrote, wherever it enters (the run's --predictions, `attach`, the
  Gradescope bundle): a regular UTF-8 file of at most MAX_BYTES, not empty, no NUL byte. The bytes checked are
  the bytes kept.
- question_answers(): which of the lab's six prediction questions a predictions file answers. The file is split
  at the questions' numbers (a heading "## 1. ..." as in the template, or, without numbered headings, a line
  starting "1." / "2)" / "Q3:"); an answer counts when it holds at least MIN_WORDS words that are not
  placeholders, and in the template's form its Prediction field holds one. The question's own wording, copied
  from the template, is no answer.
- sections_written(): which headings of the explanation template a text has written under: at least MIN_WORDS
  words that are neither placeholders ("TODO", "tbd", "lorem" ...) nor the template's own guidance.

The session judges the predictions when it copies them (the terminal says at once what is missing, while it can
still be fixed), `attach` judges an explanation, and `grade` judges both again from the files themselves.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

MAX_BYTES = 1_000_000  # a text a person wrote, not data
EXPECTED = f"a regular UTF-8 text file of at most {MAX_BYTES:,} bytes"
MIN_WORDS = 3
QUESTIONS = (1, 2, 3, 4, 5, 6)
PREDICTIONS_TEMPLATE, EXPLANATION_TEMPLATE = "predictions.md", "explanation.md"
# Words that stand in for an answer without being one (compared lowercased; any run of x's too).
PLACEHOLDERS = frozenset({"todo", "tbd", "tba", "tbc", "lol", "n/a", "na", "xxx", "fixme", "placeholder", "idk",
                          "asdf", "blah", "lorem", "ipsum", "dolor", "amet", "consectetur", "adipiscing", "elit",
                          "foo", "baz", "qwerty"})
WORD = re.compile(r"[^\W_]+(?:['’/][^\W_]+)*")
FIELD = re.compile(r"^\s*(Prediction|Uncertainty|Why)\s*:(.*)$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
NUMBERED_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*(?:\*\*)?\s*(?:Q(?:uestion)?\s*)?([1-9])\s*[.):]\s*(.*)$", re.I)
NUMBERED_LINE = re.compile(r"^(?:\*\*)?(?:Q(?:uestion)?\s*)?([1-9])\s*[.):](?:\*\*)?\s*(.*)$", re.I)


class NotText(ValueError):
    """Not a learner's text; usage=True when the path itself cannot be used (missing, a folder, a FIFO)."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.usage = usage


def read(path, role: str = "FILE") -> bytes:
    """The bytes of a learner's text file, read once; NotText naming the file, the limit and what was found."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as error:
        raise NotText(f"{role} {path}: {error.strerror or error}; expected {EXPECTED}", usage=True) from None
    if not stat.S_ISREG(info.st_mode):
        raise NotText(f"{role} {path} is not a regular file; expected {EXPECTED}", usage=True)
    if info.st_size > MAX_BYTES:
        raise NotText(f"{role} {path} is {info.st_size:,} bytes; expected {EXPECTED}")
    try:  # O_NONBLOCK: a path swapped for a FIFO since stat() does not wait for a writer
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise NotText(f"{role} {path} stopped being a regular file; expected {EXPECTED}", usage=True)
            data = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise NotText(f"{role} {path} cannot be read ({error.strerror or error})", usage=True) from None
    if len(data) > MAX_BYTES:
        raise NotText(f"{role} {path} grew past {MAX_BYTES:,} bytes while read; expected {EXPECTED}")
    if not data:
        raise NotText(f"{role} {path} is empty; expected the text you wrote, {EXPECTED}")
    nul = data.find(bytes(1))
    if nul >= 0:
        raise NotText(f"{role} {path} is binary (a NUL byte at offset {nul}); expected {EXPECTED}")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotText(f"{role} {path} is not UTF-8 (byte {error.start}: {error.reason}); expected {EXPECTED}") from None
    return data


def is_placeholder(word: str) -> bool:
    """Whether a word stands in for text without being any (TODO, lorem, xxxx ...)."""
    return word.lower() in PLACEHOLDERS or re.fullmatch(r"[xX]{2,}", word) is not None


def words(text: str) -> list[str]:
    """The words of a text that are not placeholders (punctuation alone is no word)."""
    return [w for w in WORD.findall(text) if not is_placeholder(w)]


def template(root: Path, name: str) -> Optional[str]:
    """A template's text from the project folder, or None when it is absent."""
    try:
        return (Path(root) / name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


# --- predictions ---------------------------------------------------------------------------------------------


@dataclass
class Answers:
    """Which of the six questions a predictions file answers, and why each other one does not count."""

    answered: list[int] = field(default_factory=list)
    missing: dict[int, str] = field(default_factory=dict)

    def summary(self) -> str:
        """'4 of 6 questions answered; not answered: 2 (no answer), 5 (only placeholders: TODO)'."""
        text = f"{len(self.answered)} of {len(QUESTIONS)} questions answered"
        if self.missing:
            text += "; not answered: " + ", ".join(f"{n} ({why})" for n, why in sorted(self.missing.items()))
        return text


def _lower_words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def _question_wording(template_text: Optional[str]) -> dict[int, list[str]]:
    found = {}
    for line in (template_text or "").splitlines():
        match = NUMBERED_HEADING.match(line)
        if match and int(match.group(1)) in QUESTIONS:
            found[int(match.group(1))] = _lower_words(match.group(2))
    return found


def _question_sections(text: str) -> dict[int, list[str]]:
    """Question number -> the lines of its answer (a numbered heading's own text is marked, not an answer)."""
    lines = text.splitlines()
    by_heading = any(NUMBERED_HEADING.match(line) for line in lines)
    found: dict[int, list[str]] = {}
    current, last = None, 0
    for line in lines:
        heading = NUMBERED_HEADING.match(line)
        plain = None if by_heading or HEADING.match(line) else NUMBERED_LINE.match(line)
        if heading and int(heading.group(1)) in QUESTIONS:
            current = found.setdefault(int(heading.group(1)), [])
            current.append("\0" + heading.group(2))
        elif plain and int(plain.group(1)) in QUESTIONS and int(plain.group(1)) > last:
            last = int(plain.group(1))
            current = found.setdefault(last, [])
            current.append(plain.group(2))
        elif HEADING.match(line):
            current = None
        elif current is not None:
            current.append(line)
    return found


def _judge(lines: list[str], wording: list[str]) -> Optional[str]:
    """None when the answer counts, else why not."""
    prediction, kept, current = None, [], None
    for line in lines:
        if line.startswith("\0"):
            continue
        match = FIELD.match(line)
        if match:
            current, line = match.group(1), match.group(2)
        else:
            found = WORD.findall(line)
            if wording and [w.lower() for w in found[:len(wording)]] == wording:
                line = " ".join(found[len(wording):])  # the question copied into the answer is no answer
        if current == "Prediction":
            prediction = (prediction or []) + [line]
        kept.append(line)
    text = " ".join(" ".join(kept).split())
    if prediction is not None and not words(" ".join(prediction)):
        return "its Prediction field is blank or a placeholder"
    if not text:
        return "no answer"
    found = words(text)
    if not found:
        return f"only placeholders: {text[:30]}"
    if len(found) < MIN_WORDS:
        return f"{len(found)} word(s), fewer than {MIN_WORDS}"
    return None


def question_answers(text: str, template_text: Optional[str] = None) -> Answers:
    """Which of the six questions `text` answers (the rule is in the module docstring)."""
    sections = _question_sections(text)
    wording = _question_wording(template_text)
    result = Answers()
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


def predictions_status(text: str, template_text: Optional[str]) -> dict:
    """What the session records of predictions as it copies them: the questions they answer, and whether they are
    still the blank template (the template itself, or its form with nothing answered)."""
    found = question_answers(text, template_text)
    blank = not found.answered and (text.strip() == (template_text or "").strip() or any(
        FIELD.match(line) for line in text.splitlines()))
    return {"template_unanswered": blank, "answered": found.answered, "answers": found.summary()}


# --- the explanation -----------------------------------------------------------------------------------------


def headings(text: str) -> list[tuple[int, str, list[str]]]:
    """(level, heading, the lines under it up to the next heading) for every Markdown heading, in order."""
    found: list[tuple[int, str, list[str]]] = []
    for line in text.splitlines():
        match = HEADING.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2).strip(), []))
        elif found:
            found[-1][2].append(line)
    return found


def _key(heading: str) -> str:
    return " ".join(heading.lower().split())


def template_sections(template_text: str) -> list[str]:
    """The headings of the explanation template that ask for text (not the title, not a heading that only groups
    deeper ones, such as Limitations)."""
    found = headings(template_text)[1:]
    return [heading for index, (level, heading, _) in enumerate(found)
            if not (index + 1 < len(found) and found[index + 1][0] > level)]


def sections_written(text: str, template_text: str) -> dict:
    """{written: [...], missing: [...] (no such heading), empty: {heading: why}} for the template's sections."""
    guidance = {_key(h): {line.strip() for line in body if line.strip()} for _, h, body in headings(template_text)}
    present = {_key(h): body for _, h, body in headings(text)}
    written, missing, empty = [], [], {}
    for heading in template_sections(template_text):
        body = present.get(_key(heading))
        if body is None:
            missing.append(heading)
            continue
        own = [line for line in body if line.strip() and line.strip() not in guidance.get(_key(heading), set())]
        count = len(words(" ".join(own)))
        if count >= MIN_WORDS:
            written.append(heading)
        else:
            empty[heading] = "the template's text only" if not own else f"{count} word(s) of text, placeholders aside"
    return {"written": written, "missing": missing, "empty": empty}


def structure(text: str, template_text: Optional[str]) -> dict:
    """The explanation's form as `attach` records it: {template, ok, headings_missing, empty_sections}."""
    if template_text is None:
        return {"template": EXPLANATION_TEMPLATE, "ok": None, "note": "the template was not found; not checked"}
    found = sections_written(text, template_text)
    return {"template": EXPLANATION_TEMPLATE, "ok": not found["missing"] and not found["empty"],
            "headings_missing": found["missing"], "empty_sections": list(found["empty"])}
