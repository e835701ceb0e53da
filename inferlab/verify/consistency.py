"""verify's protocol check: the protocol a run recorded (in manifest.json and plan.json) must be this checkout's
inferlab.protocol, constant by constant, so that a run made under other prompts, seeds, budgets or tolerance is
named as such. Prose entries (a rule's wording) are not constants and are not compared.

verify does not recompute the run's derived figures: a run's numbers are checked against the course's own run by
`grade --against` (inferlab.grade.against), which no edit of the run's files can satisfy without the computation."""

from __future__ import annotations

from typing import Any, Iterable

from inferlab import protocol
from inferlab.base.records import MANIFEST_FILE, PLAN_FILE

PROSE = ("timing_stopping_rule", "cache_tolerance.rule", "contention_rule.rule", "near_tie_rule")


def differences(recorded: Any, expected: Any, path: str = "") -> Iterable[tuple[str, Any, Any]]:
    """(path, recorded, expected) for every leaf where two JSON values differ."""
    if isinstance(recorded, dict) and isinstance(expected, dict):
        for key in sorted(set(recorded) | set(expected)):
            yield from differences(recorded.get(key), expected.get(key), f"{path}.{key}" if path else key)
    elif recorded != expected and not (isinstance(recorded, list) and isinstance(expected, tuple)
                                       and recorded == list(expected)):
        yield path, recorded, expected


def check_consistency(checker) -> None:
    """The recorded protocol against this checkout's: one problem line per constant that differs."""
    expected = protocol.as_dict()
    for file, data in ((MANIFEST_FILE, checker.view.manifest), (PLAN_FILE, checker.view.plan or {})):
        recorded = data.get("protocol")
        if not isinstance(recorded, dict):
            checker.problem(f"protocol: {file} records no protocol")
            continue
        for path, found, wanted in differences(recorded, expected):
            if path not in PROSE:
                checker.problem(f"protocol: {file} {path}: recorded {found!r}, this checkout's inferlab.protocol "
                                f"has {wanted!r}")
