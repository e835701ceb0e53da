"""Whether a predictions file is still the blank template (predictions.md at the repository root).

The run goes on either way; the manifest and the terminal say so, because predictions written
after the run are not predictions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

TEMPLATE_FILE = "predictions.md"
# The template's answer fields: "Prediction:", "Uncertainty:", "Why:" at the start of a line.
FIELD = re.compile(r"^\s*(Prediction|Uncertainty|Why)\s*:(.*)$")
HEADING = re.compile(r"^\s*#")


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


def template_status(text: str, template_text: Optional[str]) -> dict:
    """{template_unanswered, template_check}: unanswered when the text is the template itself, or
    when it has the template's answer fields and every one of them is blank."""
    if template_text is not None and text.strip() == template_text.strip():
        return {"template_unanswered": True,
                "template_check": f"identical to the blank template {TEMPLATE_FILE}"}
    fields = answers(text)
    if fields and not any(fields):
        return {"template_unanswered": True,
                "template_check": f"all {len(fields)} answer fields (Prediction/Uncertainty/Why) are blank"}
    if fields:
        blank = sum(1 for field in fields if not field)
        return {"template_unanswered": False,
                "template_check": f"{len(fields) - blank} of {len(fields)} answer fields filled in"}
    return {"template_unanswered": False, "template_check": "not in the template's format; taken as answered"}


def read_template(root: Path) -> Optional[str]:
    """The blank template's text, or None when the repository has none."""
    path = Path(root) / TEMPLATE_FILE
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
