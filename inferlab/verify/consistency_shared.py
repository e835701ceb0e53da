"""What verify's consistency checks share: the Recheck they report through, a record's label, exact sameness of a
recorded and a recomputed value, and the common leaves of two nested values. consistency.py and its four parts
(consistency_timing, _records, _tensors, _text) import it; it imports none of them."""

from __future__ import annotations

from typing import Any, Iterable

from inferlab.reading.deterministic import describe


class Recheck:
    """What the consistency checks share: the checker to report to, the records in order, and what could not
    be checked (said once per reason)."""

    def __init__(self, checker):
        self.checker = checker
        self.view = checker.view
        self.records = checker.records
        self._position = {id(record): index for index, record in enumerate(self.records)}
        self._not_checked: dict[str, str] = {}

    # --- saying what was found ------------------------------------------------------------------------

    def differs(self, record: dict, field: str, recorded: Any, recomputed: Any, source: str) -> None:
        """One disagreement: the record, the field, what it says and what its source gives."""
        self.checker.problem(f"inconsistent: {label(record)} {field}: recorded {describe(recorded)}, "
                             f"recomputed {describe(recomputed)} from {source}")

    def expect(self, record: dict, field: str, recomputed: Any, source: str) -> None:
        """A field that must equal what its source gives, exactly; a field the record lacks is not compared."""
        if field in record and not same(record[field], recomputed):
            self.differs(record, field, record[field], recomputed, source)

    def expect_fields(self, record: dict, recomputed: dict, source: str, skip: Iterable[str] = ()) -> None:
        """Every field a record and its recomputation both have, compared leaf by leaf (nested dicts by path)."""
        for path, recorded, expected in common_leaves(record, recomputed, skip=tuple(skip)):
            if not same(recorded, expected):
                self.differs(record, path, recorded, expected, source)

    def not_checked(self, what: str, why: str) -> None:
        """A check the run's files do not allow, said once per `what`."""
        self._not_checked.setdefault(what, why)

    @property
    def not_checked_lines(self) -> list[str]:
        """What could not be checked, one line each."""
        return [f"{what}: {why}" for what, why in self._not_checked.items()]

    # --- reading --------------------------------------------------------------------------------------

    def before(self, kind: str, record: dict) -> list[dict]:
        """The records of a kind written before `record`: what a summary was computed from when it was made."""
        limit = self._position.get(id(record), len(self.records))
        return [r for r in self.view.kind(kind) if self._position.get(id(r), 0) < limit]

    def completed(self, kind: str) -> list[dict]:
        """The records of a kind whose trial completed (status ok, or no status)."""
        return [r for r in self.view.kind(kind) if r.get("status", "ok") == "ok"]

    def inputs(self) -> dict:
        """{prompt_id: token ids} of the input records."""
        return {r.get("prompt_id"): r.get("token_ids") for r in self.view.kind("input")
                if isinstance(r.get("token_ids"), list)}


def label(record: dict) -> str:
    """How a problem line names a record: its kind, its seq and the trial, prompt, measure or call it belongs to."""
    trial = record.get("trial_id") or record.get("schedule_id")
    bits = [trial] if isinstance(trial, str) else []
    if not bits:
        if isinstance(record.get("prompt_id"), str):
            bits.append(record["prompt_id"])
        if record.get("kind") == "timing_summary" and isinstance(record.get("use_cache"), bool):
            bits.append("cache on" if record["use_cache"] else "cache off")
        for key, prefix in (("measure", ""), ("call_index", "call "), ("prefix_length", "prefix length ")):
            if isinstance(record.get(key), (str, int)) and not isinstance(record.get(key), bool):
                bits.append(f"{prefix}{record[key]}")
    return f"{record.get('kind')} seq {record.get('seq')}" + (f" [{' '.join(bits)}]" if bits else "")


def same(a: Any, b: Any) -> bool:
    """Equal as JSON data, exactly: an int and a float of one value are equal, a bool is never a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def common_leaves(recorded: Any, recomputed: Any, path: str = "", skip: tuple = ()) -> Iterable[tuple[str, Any, Any]]:
    """(path, recorded, recomputed) for every field both hold; dicts are entered, anything else is one leaf."""
    if isinstance(recorded, dict) and isinstance(recomputed, dict):
        for key, value in recomputed.items():
            inner = f"{path}.{key}" if path else str(key)
            if key in recorded and inner not in skip:
                yield from common_leaves(recorded[key], value, inner, skip)
    else:
        yield path, recorded, recomputed
