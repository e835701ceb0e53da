"""Markdown formatting for the report pages: cells, numbers, tables, links. Pure functions of values."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Optional

MISSING = "(not recorded)"
DASH = "–"  # between the ends of a range


# Every character str.splitlines() breaks at: inside a table cell each would end the row.
LINE_BREAK = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def visible_line_breaks(text: str) -> str:
    """Line breaks written as escapes (\\n, \\r, \\u2028 …) so that the text stays on one line."""
    return LINE_BREAK.sub(lambda m: {"\n": "\\n", "\r": "\\r"}.get(m.group(), f"\\u{ord(m.group()):04x}"), text)


def code(text: str, in_table: bool = True) -> str:
    """An inline code span (backtick fence widened as needed); in a table cell, pipes are escaped and line
    breaks written visibly (\\n), so a command or path that holds one never splits the row."""
    if in_table:
        text = visible_line_breaks(text.replace("|", "\\|"))
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def visible_json(value: Any) -> str:
    """ASCII JSON in which a run of spaces can be counted: every space after the first of a run is written
    \\u0020 (a rendered page collapses runs of spaces, and tokenizers have tokens that are nothing else)."""
    return re.sub(r"(?<= ) ", r"\\u0020", json.dumps(value, ensure_ascii=True))


def jstr(value: Any, in_table: bool = True) -> str:
    """A value as ASCII JSON in a code span: quotes, every space, newlines, null and non-ASCII stay visible."""
    return code(visible_json(value), in_table=in_table)


def text_cell(text: Any) -> str:
    """Plain prose for a table cell: one line, pipes escaped; the placeholder for None."""
    if text is None:
        return MISSING
    return " ".join(str(text).split()).replace("|", "\\|")


def is_number(value: Any) -> bool:
    """A real int or float (bool excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def num(value: Any, digits: int = 6) -> str:
    """A number with `digits` significant digits; the placeholder for anything else."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else repr(value)
    if value is None:
        return MISSING
    return text_cell(value)


def ms(seconds: Any, decimals: int = 3) -> str:
    """Seconds shown as milliseconds; the placeholder when absent."""
    if is_number(seconds):
        return f"{seconds * 1e3:.{decimals}f}"
    return MISSING if seconds is None else text_cell(seconds)


def us(nanoseconds: Any) -> str:
    """Nanoseconds shown as microseconds with two decimals."""
    return f"{nanoseconds / 1e3:.2f}" if is_number(nanoseconds) else MISSING


def nbytes(value: Any) -> str:
    """Bytes with thousands separators, and MiB from 1 MiB up."""
    if is_number(value):
        value = int(value)
        return f"{value:,} B ({value / 2**20:.2f} MiB)" if value >= 2**20 else f"{value:,} B"
    return MISSING if value is None else text_cell(value)


def yes_no(value: Any) -> str:
    """yes / **no** for a check whose 'no' is a failure; the placeholder when absent."""
    if value is True:
        return "yes"
    if value is False:
        return "**no**"
    return MISSING if value is None else text_cell(value)


def flag(value: Any, alarm: bool = False) -> str:
    """yes/no where neither answer is a failure; alarm=True makes a 'yes' bold (a warning flag)."""
    if value is True:
        return "**yes**" if alarm else "yes"
    if value is False:
        return "no"
    return MISSING if value is None else text_cell(value)


def spread(values: list, scale=ms) -> str:
    """'median [min–max]' of a list of numbers, each through `scale`."""
    numbers = sorted(v for v in values if is_number(v))
    if not numbers:
        return MISSING
    middle = len(numbers) // 2
    median = numbers[middle] if len(numbers) % 2 else (numbers[middle - 1] + numbers[middle]) / 2
    return f"{scale(median)} [{scale(numbers[0])}{DASH}{scale(numbers[-1])}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Markdown table lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def abbreviate_ids(ids: Any, head: int = 3, tail: int = 1) -> str:
    """A list of token ids shortened to its first and last few, e.g. `9994 39807 45742 … 16636`."""
    if not isinstance(ids, list):
        return MISSING
    if not ids:
        return "(none)"
    words = [str(i) for i in ids]
    if len(words) > head + tail + 1:
        words = words[:head] + ["…"] + words[-tail:]
    return code(" ".join(words))


def message_lines(longrepr: Optional[str]) -> list[str]:
    """The 'E ' message lines of a pytest longrepr, in full; else its last non-empty line."""
    if not longrepr:
        return []
    lines = [line for line in str(longrepr).strip().splitlines() if line.strip()]
    messages = [line.strip()[1:].strip() for line in lines if line.lstrip().startswith("E ")]
    return messages or lines[-1:]


def first_message(longrepr: Optional[str]) -> str:
    """The first 'E ' line of a longrepr, uncut (the table cell shows all of it)."""
    lines = message_lines(longrepr)
    return lines[0] if lines else ""


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def bullet_list(items: Iterable[str]) -> list[str]:
    """'- item' lines."""
    return [f"- {item}" for item in items]


def skip_text(record: dict) -> str:
    """A skipped test's reason, from skip_reason or else its longrepr's last line."""
    return record.get("skip_reason") or first_message(record.get("longrepr")) or "(no reason recorded)"
