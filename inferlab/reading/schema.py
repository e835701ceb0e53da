"""Which layout a run's files were written in, and the one upgrade of an older run to the current layout.

Schema 1 is every run written before a run named its schema (no "schema" field in manifest.json or
plan.json). Schema 2 (records.RECORD_SCHEMA) adds, per plan entry, the record kinds the test writes
("records") and whether its part of the protocol is optional ("optional"); each field has one name.

upgrade() is applied once, when a run is read (inferlab.reading.runview), so that every reader knows one
name per field and one shape of plan:
- timing_trial records: token_times -> token_times_s; cache_comparison: top2_margin -> top2_margin_uncached;
  manifest.json: command_line -> argv. A run that holds both names (the runs of schema 2 written before the
  writers kept one) keeps the current one.
- a schema-1 plan declares no record kinds: each test's kinds are inferred from the records that test
  (any of its parametrizations) wrote, and the notes say so. A kind that no test wrote then has no known
  producer, so its absence cannot be explained by a test's outcome.
- parts: each plan part gets the label the report shows for it (see part_label).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

from inferlab.base.records import RECORD_SCHEMA

CURRENT = RECORD_SCHEMA
OLDEST = 1
# kind -> {old field name: current field name}
RENAMED_RECORD_FIELDS = {
    "timing_trial": {"token_times": "token_times_s"},
    "cache_comparison": {"top2_margin": "top2_margin_uncached"},
}
RENAMED_MANIFEST_FIELDS = {"command_line": "argv"}
INFERRED_NOTE = ("plan.json is of schema 1 and declares no record kinds: which test produces which kind was inferred "
                 "from the records each test wrote, so a kind no test wrote has no known producer")

# The labels reports have always shown for the protocol parts, by the number that starts an experiment
# file's name. Used for a plan part that records no label of its own (every plan written so far); a plan
# part with a "label" field is shown with that label. Frozen: a new experiment file gets its label from
# its plan entry, never from here.
LEGACY_PART_LABELS = (
    ("test_10", "Part 2: specimen, files and loading"),
    ("test_20", "Part 3: inputs"),
    ("test_30", "Part 3: the generation trials and their checks"),
    ("test_40", "Part 4: the matched-prefix cache test"),
    ("test_50", "Part 5: timing"),
    ("test_60", "Part 6: memory"),
    ("test_70", "optional batching extension"),
)


@dataclass
class Upgraded:
    """A run's data in the current shape, and what the upgrade had to assume (notes)."""

    schema: int
    records: list[dict]
    manifest: Optional[dict]
    plan: Optional[dict]
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the schema fields themselves disagree or are unknown


def schema_of(manifest: Optional[dict], plan: Optional[dict]) -> tuple[int, list[str]]:
    """The run's schema (1 when neither file names one) and any disagreement about it, one line each."""
    named = {name: data.get("schema") for name, data in (("manifest.json", manifest), ("plan.json", plan))
             if isinstance(data, dict) and "schema" in data}
    problems = [f"{name}: schema {value!r} is not a schema number" for name, value in named.items()
                if not isinstance(value, int) or isinstance(value, bool)]
    numbers = sorted({v for v in named.values() if isinstance(v, int) and not isinstance(v, bool)})
    if len(numbers) > 1:
        problems.append("manifest.json and plan.json name different schemas: "
                        + ", ".join(f"{name} {value}" for name, value in named.items()))
    schema = numbers[-1] if numbers else OLDEST
    if schema > CURRENT:
        problems.append(f"written in schema {schema}, newer than this inferlab reads ({OLDEST}..{CURRENT}): it is "
                        f"read as schema {CURRENT}, and any field this inferlab does not know is ignored")
    return schema, problems


def upgrade(records: list[dict], manifest: Optional[dict], plan: Optional[dict]) -> Upgraded:
    """The run in the current shape (copies; the arguments are left as they are)."""
    schema, problems = schema_of(manifest, plan)
    records = [_renamed(r, RENAMED_RECORD_FIELDS.get(r.get("kind"), {})) for r in records]
    manifest = _renamed(manifest, RENAMED_MANIFEST_FIELDS) if isinstance(manifest, dict) else manifest
    plan = copy.deepcopy(plan) if isinstance(plan, dict) else plan
    notes = []
    entries = [e for e in (plan or {}).get("schedule") or [] if isinstance(e, dict)] \
        if isinstance((plan or {}).get("schedule"), list) else []
    if schema == 1 and entries and not any("records" in e for e in entries):
        _infer_record_kinds(entries, records, plan)
        notes.append(INFERRED_NOTE)
    return Upgraded(schema=schema, records=records, manifest=manifest, plan=plan, notes=notes, problems=problems)


def _renamed(data: dict, names: dict) -> dict:
    if not any(old in data for old in names):
        return data
    data = dict(data)
    for old, new in names.items():
        if old in data:
            value = data.pop(old)
            data.setdefault(new, value)
    return data


def unparametrized(nodeid) -> str:
    """A node id without its parametrize id: every parametrization of one test function."""
    text = str(nodeid or "")
    return text[:text.index("[")] if text.endswith("]") and "[" in text else text


def _infer_record_kinds(entries: list[dict], records: list[dict], plan: dict) -> None:
    """Give each schema-1 plan entry the kinds its test function wrote, and `optional` from its part."""
    written: dict[str, list[str]] = {}
    for record in records:
        if record.get("kind") == "test_outcome" or not record.get("test"):
            continue
        kinds = written.setdefault(unparametrized(record["test"]), [])
        if record.get("kind") not in kinds:
            kinds.append(record.get("kind"))
    optional = {p.get("file") for p in plan.get("parts") or [] if isinstance(p, dict) and p.get("optional")}
    for entry in entries:
        entry["records"] = list(written.get(unparametrized(entry.get("test")), []))
        entry.setdefault("optional", str(entry.get("test") or "").split("::")[0] in optional)


def part_label(file: str, part: Optional[dict] = None) -> str:
    """The label the report shows for one experiment file's part: the plan part's own label, else the label
    reports have always shown for it, else its title, else the file's name."""
    if isinstance(part, dict) and isinstance(part.get("label"), str) and part["label"]:
        return part["label"]
    name = file.rsplit("/", 1)[-1]
    legacy = next((label for prefix, label in LEGACY_PART_LABELS if name.startswith(prefix)), None)
    if legacy is not None:
        return legacy
    if isinstance(part, dict) and isinstance(part.get("title"), str) and part["title"]:
        return part["title"]
    return name
