"""The written work a learner adds to a run: predictions and an explanation, answered in the templates' form."""

from __future__ import annotations

from typing import Optional

from inferlab import writing

from fixtures_records import REPO_ROOT

TEMPLATE = (REPO_ROOT / writing.EXPLANATION_TEMPLATE).read_text(encoding="utf-8")
PREDICTIONS_TEMPLATE = (REPO_ROOT / writing.PREDICTIONS_TEMPLATE).read_text(encoding="utf-8")


def answered_predictions() -> str:
    """The predictions template with every answer field filled in."""
    lines = []
    for line in PREDICTIONS_TEMPLATE.splitlines():
        match = writing.FIELD.match(line)
        lines.append(f"{match.group(1)}: my answer, written before the run" if match else line)
    return "\n".join(lines) + "\n"


def answered_explanation(under: Optional[str] = None) -> str:
    """The explanation template with `under` (by default words of its own naming the heading) in place of the
    guidance under every answer heading."""
    out, current = [], None  # current: the heading above, None under the page's title
    for line in TEMPLATE.splitlines():
        match = writing.HEADING.match(line)
        if match:
            current = match.group(2).strip() if len(match.group(1)) > 1 else None
            out.append(line)
        elif line.strip() and current is not None:
            out.append(under or f"My own words on {current}, resting on records.jsonl seq 40 and 139.")
        else:
            out.append(line)
    return "\n".join(out) + "\n"
