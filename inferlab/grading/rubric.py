"""The rubric: how many points each checklist item is worth, which items are required, and where an item's
written work sits in the explanation. It is data (TOML); the default ships as default_rubric.toml beside this
module and docs/grading.md documents every field.

load_rubric(path) reads and checks one; a file that does not parse, or holds an unknown field, a missing or
repeated item, or a value of the wrong type, raises RubricError naming the file, the field, what was expected
and what was found.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

RUBRIC_SCHEMA = 1
DEFAULT_RUBRIC = Path(__file__).resolve().with_name("default_rubric.toml")
ITEM_NUMBERS = tuple(range(1, 8))  # the lab's submission checklist has seven items
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's test visibilities
# What a course can require beyond the items' own checks (docs/grading.md#what-the-rubric-requires); each unmet
# requirement fails the item it belongs to (inferlab.grading.requirements), saying what to do.
GRADER_SOURCE_RULES = ("integrity", "item", "finding")  # what a harness that differs from the grader's copy is
REQUIREMENT_DEFAULTS = {
    "require_answered_predictions": 6,   # item 1: how many of the six prediction questions must be answered
    "require_specimen": [],              # item 3: the specimen names a run may use ([] = any)
    "allow_synthetic_specimen": True,    # item 3: false = the stand-in or replica specimens fail the item
    "require_lock_conformance": False,   # item 2: every distribution as requirements.lock pins it
    "grader_source": "integrity",        # the run's harness against the grader's: integrity, item (2) or finding
    "require_replay": False,             # item 4: a replay result must be given to grade (grade --replay)
}
TOP_FIELDS = {"schema", "name", "zero_score_on_integrity_problem", "items", *REQUIREMENT_DEFAULTS}
ITEM_FIELDS = {"number", "title", "points", "manual_points", "required", "visibility", "sections"}


class RubricError(ValueError):
    """A rubric that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class RubricItem:
    """One checklist item's points and settings."""

    number: int
    title: str
    points: float
    manual_points: float = 0.0
    required: bool = True
    visibility: str = "visible"
    sections: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rubric:
    """The whole rubric, with where it came from (file and SHA-256 of its bytes)."""

    name: str
    items: dict[int, RubricItem]
    zero_score_on_integrity_problem: bool = True
    file: str = str(DEFAULT_RUBRIC)
    sha256: str = ""
    default: bool = True
    notes: list[str] = field(default_factory=list)
    require_answered_predictions: int = REQUIREMENT_DEFAULTS["require_answered_predictions"]
    require_specimen: tuple[str, ...] = ()
    allow_synthetic_specimen: bool = REQUIREMENT_DEFAULTS["allow_synthetic_specimen"]
    require_lock_conformance: bool = REQUIREMENT_DEFAULTS["require_lock_conformance"]
    grader_source: str = REQUIREMENT_DEFAULTS["grader_source"]
    require_replay: bool = REQUIREMENT_DEFAULTS["require_replay"]

    @property
    def max_score(self) -> float:
        """The automatic points of all items together."""
        return sum(item.points for item in self.items.values())

    def describe(self) -> dict:
        """Where the rubric came from, for a result."""
        return {"name": self.name, "file": self.file, "sha256": self.sha256, "default": self.default,
                "max_score": self.max_score,
                "manual_points": sum(item.manual_points for item in self.items.values()),
                "requirements": self.requirements()}

    def requirements(self) -> dict:
        """The requirement settings, by their rubric keys."""
        return {name: list(getattr(self, name)) if name == "require_specimen" else getattr(self, name)
                for name in REQUIREMENT_DEFAULTS}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _wrong(where: str, name: str, expected: str, value: Any) -> RubricError:
    return RubricError(f"{where}: {name} must be {expected}, found {value!r}")


def _item(where: str, raw: Any, index: int) -> RubricItem:
    place = f"{where}: items[{index}]"
    if not isinstance(raw, dict):
        raise RubricError(f"{place}: expected a table ([[items]]), found {type(raw).__name__}")
    unknown = sorted(set(raw) - ITEM_FIELDS)
    if unknown:
        raise RubricError(f"{place}: unknown field(s) {', '.join(unknown)}; an item has {', '.join(sorted(ITEM_FIELDS))}")
    number = raw.get("number")
    if not isinstance(number, int) or isinstance(number, bool) or number not in ITEM_NUMBERS:
        raise _wrong(place, "number", "an item number from 1 to 7", number)
    place = f"{where}: item {number}"
    for name in ("title", "points"):
        if name not in raw:
            raise RubricError(f"{place}: {name} is missing")
    if not isinstance(raw["title"], str) or not raw["title"].strip():
        raise _wrong(place, "title", "a non-empty string", raw["title"])
    for name in ("points", "manual_points"):
        if name in raw and not (_number(raw[name]) and raw[name] >= 0):
            raise _wrong(place, name, "a number >= 0", raw[name])
    if "required" in raw and not isinstance(raw["required"], bool):
        raise _wrong(place, "required", "true or false", raw["required"])
    if raw.get("visibility", "visible") not in VISIBILITIES:
        raise _wrong(place, "visibility", "one of " + ", ".join(VISIBILITIES), raw.get("visibility"))
    sections = raw.get("sections", [])
    if not isinstance(sections, list) or not all(isinstance(s, str) and s.strip() for s in sections):
        raise _wrong(place, "sections", "a list of headings (strings)", sections)
    return RubricItem(number=number, title=raw["title"].strip(), points=float(raw["points"]),
                      manual_points=float(raw.get("manual_points", 0)), required=raw.get("required", True),
                      visibility=raw.get("visibility", "visible"), sections=tuple(sections))


def _requirements(where: str, data: dict) -> dict:
    """The requirement settings of a rubric's data, checked; the defaults for those it leaves out."""
    found = {name: data.get(name, default) for name, default in REQUIREMENT_DEFAULTS.items()}
    count = found["require_answered_predictions"]
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 6:
        raise _wrong(where, "require_answered_predictions", "a whole number from 0 to 6", count)
    names = found["require_specimen"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise _wrong(where, "require_specimen", "a list of specimen names (strings; [] for any)", names)
    for name in ("allow_synthetic_specimen", "require_lock_conformance", "require_replay"):
        if not isinstance(found[name], bool):
            raise _wrong(where, name, "true or false", found[name])
    if found["grader_source"] not in GRADER_SOURCE_RULES:
        raise _wrong(where, "grader_source", "one of " + ", ".join(GRADER_SOURCE_RULES), found["grader_source"])
    found["require_specimen"] = tuple(n.strip() for n in names)
    return found


def parse_rubric(text: str, where: str) -> dict:
    """The rubric's TOML as data; RubricError naming `where` (and the line) when it does not parse."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RubricError(f"{where}: not valid TOML ({error})") from None


def rubric_from_data(data: dict, where: str) -> Rubric:
    """A checked Rubric from parsed data; RubricError on the first thing wrong."""
    unknown = sorted(set(data) - TOP_FIELDS)
    if unknown:
        raise RubricError(f"{where}: unknown field(s) {', '.join(unknown)}; a rubric has "
                          f"{', '.join(sorted(TOP_FIELDS))}")
    if data.get("schema") != RUBRIC_SCHEMA:
        raise _wrong(where, "schema", str(RUBRIC_SCHEMA), data.get("schema"))
    if not isinstance(data.get("name", ""), str):
        raise _wrong(where, "name", "a string", data.get("name"))
    zero = data.get("zero_score_on_integrity_problem", True)
    if not isinstance(zero, bool):
        raise _wrong(where, "zero_score_on_integrity_problem", "true or false", zero)
    raw_items = data.get("items")
    if not isinstance(raw_items, list):
        raise RubricError(f"{where}: items is missing: expected one [[items]] table per checklist item 1 to 7")
    items: dict[int, RubricItem] = {}
    for index, raw in enumerate(raw_items):
        item = _item(where, raw, index)
        if item.number in items:
            raise RubricError(f"{where}: item {item.number} appears twice")
        items[item.number] = item
    missing = [n for n in ITEM_NUMBERS if n not in items]
    if missing:
        raise RubricError(f"{where}: item(s) {', '.join(map(str, missing))} missing: a rubric gives every one of "
                          f"the checklist's seven items its points (0 is allowed)")
    return Rubric(name=data.get("name") or Path(where).name, items=dict(sorted(items.items())),
                  zero_score_on_integrity_problem=zero, file=where, **_requirements(where, data))


def load_rubric(path: Optional[Union[str, Path]] = None) -> Rubric:
    """The rubric in `path` (the default rubric when None), checked; RubricError when it cannot be used."""
    source = Path(path) if path is not None else DEFAULT_RUBRIC
    try:
        raw = source.read_bytes()
    except OSError as error:
        raise RubricError(f"{source}: cannot be read ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RubricError(f"{source}: not UTF-8 ({error})") from None
    rubric = rubric_from_data(parse_rubric(text, str(source)), str(source))
    return dataclasses.replace(rubric, file=str(source), sha256=hashlib.sha256(raw).hexdigest(), default=path is None)
