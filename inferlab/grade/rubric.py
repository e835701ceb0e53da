"""The rubric: the points of each of the lab's seven checklist items, which are required, and which headings of the
explanation hold an item's written work. Data in TOML; the default ships beside this module. load() refuses a file
that does not parse, an unknown field, a missing or repeated item or a value of the wrong type, naming the file, the
field, what was expected and what was found."""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DEFAULT = Path(__file__).resolve().with_name("default_rubric.toml")
NUMBERS = tuple(range(1, 8))
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's
TOP_FIELDS = {"schema", "name", "require_answered_predictions", "items"}
ITEM_FIELDS = {"number", "title", "points", "manual_points", "required", "visibility", "sections"}


class RubricError(ValueError):
    """A rubric that cannot be used."""


@dataclass(frozen=True)
class Item:
    number: int
    title: str
    points: float
    manual_points: float = 0.0
    required: bool = True
    visibility: str = "visible"
    sections: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rubric:
    name: str
    items: dict[int, Item]
    require_answered_predictions: int
    file: str
    sha256: str

    @property
    def max_score(self) -> float:
        return sum(item.points for item in self.items.values())

    def describe(self) -> dict:
        return {"name": self.name, "file": self.file, "sha256": self.sha256, "max_score": self.max_score,
                "manual_points": sum(item.manual_points for item in self.items.values())}


def _check(where: str, name: str, value, ok: bool, expected: str) -> None:
    if not ok:
        raise RubricError(f"{where}: {name} must be {expected}, found {value!r}")


def _refuse_unknown(where: str, raw: dict, known: set, what: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RubricError(f"{where}: unknown field(s) {', '.join(unknown)}; {what} has {', '.join(sorted(known))}")


def _item(where: str, raw) -> Item:
    if not isinstance(raw, dict):
        raise RubricError(f"{where}: an item must be a table ([[items]]), found {type(raw).__name__}")
    _refuse_unknown(where, raw, ITEM_FIELDS, "an item")
    number = raw.get("number")
    _check(where, "number", number, isinstance(number, int) and not isinstance(number, bool) and number in NUMBERS,
           "an item number from 1 to 7")
    where = f"{where} (item {number})"
    title = raw.get("title")
    _check(where, "title", title, isinstance(title, str) and bool(title.strip()), "a non-empty string")
    for name, value in (("points", raw.get("points")), ("manual_points", raw.get("manual_points", 0))):
        _check(where, name, value, isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
               "a number >= 0")
    _check(where, "required", raw.get("required", True), isinstance(raw.get("required", True), bool), "true or false")
    _check(where, "visibility", raw.get("visibility", "visible"), raw.get("visibility", "visible") in VISIBILITIES,
           f"one of {', '.join(VISIBILITIES)}")
    sections = raw.get("sections", [])
    _check(where, "sections", sections, isinstance(sections, list) and all(isinstance(s, str) for s in sections),
           "a list of headings")
    return Item(number, title.strip(), float(raw["points"]), float(raw.get("manual_points", 0)),
                raw.get("required", True), raw.get("visibility", "visible"), tuple(sections))


def load(path: Optional[Path] = None) -> Rubric:
    """The rubric in `path`, or the default one; RubricError naming what is wrong."""
    path = Path(path) if path is not None else DEFAULT
    try:
        data = path.read_bytes()
        raw = tomllib.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise RubricError(f"{path}: expected a TOML rubric, actual: unreadable ({error})") from None
    where = str(path)
    _refuse_unknown(where, raw, TOP_FIELDS, "a rubric")
    _check(where, "schema", raw.get("schema"), raw.get("schema") == 1, "1")
    answered = raw.get("require_answered_predictions", 6)
    _check(where, "require_answered_predictions", answered,
           isinstance(answered, int) and not isinstance(answered, bool) and 0 <= answered <= 6, "a whole number 0 to 6")
    items = [_item(f"{where}: items[{i}]", entry) for i, entry in enumerate(raw.get("items") or [])]
    numbers = sorted(item.number for item in items)
    _check(where, "items", numbers, numbers == list(NUMBERS), "items 1 to 7, each once")
    return Rubric(str(raw.get("name") or path.name), {item.number: item for item in items}, answered, str(path),
                  hashlib.sha256(data).hexdigest())
