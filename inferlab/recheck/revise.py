"""A justified revised cache criterion applied after the run: the saved matched-prefix logits judged again,
kept as an addendum (kind revised_criterion, a JSON file under addenda/).

Before anything is judged, revision() refuses a run whose matched-prefix alignment checks (recorded in each
cache_comparison's `checks`, all but within_tolerance) did not all pass, or do not exist: a tolerance cannot
make two different prefixes comparable. It also refuses a criterion vacuous for the saved logits
(revised_criterion.vacuous_reason).

saved_prefixes() takes every cache_comparison record's two tensors, each checked against the SHA-256 and
shape its record holds (RunView.check_tensor): one that is missing or differs refuses the whole revision,
naming every such tensor. revision() judges them under the revised criterion with the same function the
run's --revised-cache-criterion uses (inferlab.measure.revised_criterion.evaluate), and under the declared one
too, as a check that the tensors still say what the records say. The declared criterion and its verdict
stay exactly as recorded in records.jsonl: the document repeats them beside the revised ones, labelled.
check_revision() recomputes a kept document from the tensors (verify uses it).

No model and no torch: the tensors are numpy arrays read by the one reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from inferlab import protocol
from inferlab.measure.revised_criterion import LABEL, RevisedCriterion, evaluate, judge, vacuous_reason
from inferlab.reading.addenda import REVISED_KIND
from inferlab.reading.addenda_store import Refused, RunState
from inferlab.reading.runview import RunView

DOCUMENT_SCHEMA = 1
DOCUMENT_NAME = "revised_criterion.json"
TOOL = "inferlab revise"
PATHS = ("cached", "uncached")
TOLERANCE_CHECK = "within_tolerance"  # the one check of a cache_comparison that is the diagnostic, not alignment


@dataclass
class SavedPrefix:
    """One compared prefix: its record, and its two logit vectors (numpy, (vocab,)) as their hashes say."""

    record: dict
    name: str
    prefix_length: Any
    cached: Any
    uncached: Any


def prefix_name(record: dict) -> str:
    """The prefix's name as the run keys its tensors ('prefix_08'), from the record (its name or its length)."""
    name = record.get("name")
    return name if isinstance(name, str) and name else f"prefix_{record.get('prefix_length', 0):02d}"


def saved_prefixes(view: RunView) -> list[SavedPrefix]:
    """Every compared prefix with both its tensors, each matching its record; Refused otherwise (every bad
    tensor named: missing, unreadable, another shape or another SHA-256)."""
    comparisons = view.kind("cache_comparison")
    if not comparisons:
        missing = view.why_missing("cache_comparison")
        raise Refused(f"{view.directory}: no cache_comparison record ({missing.reason.replace('_', ' ')}), so "
                      f"there are no saved logits to judge again; expected the matched-prefix test's records")
    prefixes, bad = [], []
    for record in comparisons:
        references = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
        arrays = {}
        for path in PATHS:
            reference = references.get(path)
            where = f"cache_comparison seq {record.get('seq')} tensors.{path}"
            if not isinstance(reference, dict) or not isinstance(reference.get("file"), str):
                bad.append(f"{where}: no tensor reference recorded")
                continue
            check = view.check_tensor(reference)
            shown = f"{reference['file']}[{reference.get('key')}]"
            if check.file_error is not None:
                bad.append(f"{where}: {reference['file']} {check.file_error.reason}")
            elif check.key_missing:
                bad.append(f"{where}: key {reference.get('key')!r} not in {reference['file']}")
            elif check.shape is not None:
                bad.append(f"{where}: {shown} has shape {check.shape}, the record says {reference.get('shape')}")
            elif check.sha256 is not None:
                bad.append(f"{where}: {shown} sha256 {check.sha256}, the record says {reference.get('sha256')}")
            else:
                arrays[path] = check.array
        if len(arrays) == len(PATHS):
            prefixes.append(SavedPrefix(record, prefix_name(record), record.get("prefix_length"), arrays["cached"],
                                        arrays["uncached"]))
    if bad:
        raise Refused(f"{view.directory}: {len(bad)} saved tensor(s) do not match their records, so nothing was "
                      f"judged again: " + "; ".join(bad))
    return prefixes


def declared_criterion(view: RunView) -> dict:
    """The declared criterion as the run recorded it (its cache_criterion record, else the cache summary's)."""
    for kind in ("cache_criterion", "cache_summary"):
        record = view.first(kind)
        if record and isinstance(record.get("atol"), (int, float)) and isinstance(record.get("rtol"), (int, float)):
            tolerance = protocol.Tolerance(atol=record["atol"], rtol=record["rtol"])
            return {"atol": record["atol"], "rtol": record["rtol"],
                    "rule": record.get("rule") or record.get("criterion") or tolerance.describe(),
                    "recorded_in": f"{kind} seq {record.get('seq')}"}
    raise Refused(f"{view.directory}: no cache_criterion record holds the declared atol and rtol, so the revised "
                  f"criterion has nothing to stand beside")


def declared_verdict(record: dict) -> Optional[bool]:
    """Whether a prefix passed the declared criterion, as recorded (its within_tolerance check, else passed)."""
    checks = record.get("checks") if isinstance(record.get("checks"), dict) else {}
    for value in (checks.get("within_tolerance"), record.get("passed")):
        if isinstance(value, bool):
            return value
    return None


def _reference(record: dict, path: str) -> dict:
    """The {file, key, sha256} a record holds for one of its tensors (None values when it holds none)."""
    tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}
    reference = tensors.get(path) if isinstance(tensors.get(path), dict) else {}
    return {name: reference.get(name) for name in ("file", "key", "sha256")}


def misaligned(prefixes: list[SavedPrefix]) -> list[str]:
    """One line per compared prefix whose alignment checks did not all pass, as its record holds them: every
    check of `checks` but the tolerance itself (same ids, masks and positions on both paths, finite logits of the
    vocabulary's size, the cache holding the prefix). A record without them has not shown that they passed."""
    lines = []
    for prefix in prefixes:
        checks = prefix.record.get("checks")
        where = f"cache_comparison seq {prefix.record.get('seq')} (prefix length {prefix.prefix_length})"
        if not isinstance(checks, dict) or not [name for name in checks if name != TOLERANCE_CHECK]:
            lines.append(f"{where}: records no alignment checks")
            continue
        failed = sorted(name for name, ok in checks.items() if name != TOLERANCE_CHECK and ok is not True)
        if failed:
            lines.append(f"{where}: failed {', '.join(failed)}")
    return lines


def revision(run: RunState, revised: RevisedCriterion, written_utc: str) -> dict:
    """The revised-criterion document for a run (see the module's docstring); Refused when a tensor fails, when
    a prefix's alignment checks did not pass, or when the criterion is vacuous for the saved logits."""
    view = run.view
    prefixes = saved_prefixes(view)
    bad = misaligned(prefixes)
    if bad:
        raise Refused(f"{view.directory}: the matched-prefix alignment checks did not all pass ({'; '.join(bad)}), so "
                      f"the two paths may not have computed the same prefix and no tolerance can make their logits "
                      f"comparable; expected every prefix's alignment checks passed (fix the harness, run again)")
    vacuous = vacuous_reason(((p.cached, p.uncached) for p in prefixes), revised.tolerance)
    if vacuous:
        raise Refused(f"--cache-criterion {revised.tolerance.atol:g},{revised.tolerance.rtol:g}: {vacuous}; "
                      f"expected a criterion that some cached vector in that range fails", usage=True)
    declared = declared_criterion(view)
    declared_tolerance = protocol.Tolerance(atol=declared["atol"], rtol=declared["rtol"])
    evaluation = evaluate(((p.name, p.prefix_length, p.cached, p.uncached) for p in prefixes), revised)
    rows = []
    for prefix in prefixes:
        record = prefix.record
        rows.append({
            "name": prefix.name, "prefix_length": prefix.prefix_length, "record_seq": record.get("seq"),
            "tensors": {path: _reference(record, path) for path in PATHS},
            "declared": {"passed": declared_verdict(record), "max_abs_diff": record.get("max_abs_diff"),
                         "fail_count": record.get("fail_count"), "fail_fraction": record.get("fail_fraction"),
                         "recomputed": judge(prefix.cached, prefix.uncached, declared_tolerance)},
            "revised": evaluation["per_prefix"][prefix.name],
        })
    summary = view.first("cache_summary") or {}
    disagree = [row["prefix_length"] for row in rows if row["declared"]["passed"] is not None
                and row["declared"]["passed"] != row["declared"]["recomputed"]["passed"]]
    return {
        "schema": DOCUMENT_SCHEMA, "kind": REVISED_KIND, "label": LABEL, "written_utc": written_utc, "tool": TOOL,
        "run_state": run.state, "justification": revised.justification,
        "declared": {**declared, "all_within_tolerance": summary.get("all_within_tolerance"),
                     "note": "as the session recorded it; this revision does not change it"},
        "revised": revised.as_record(),
        "prefixes": rows,
        "revised_evaluation": evaluation["summary"],
        "declared_recomputed_disagrees_at": disagree,
    }


def check_revision(view: RunView, file: str, data: bytes) -> list[str]:
    """A kept revision against the run: its prefixes are the run's records and their tensors, and each revised
    verdict is what the tensors give under its criterion now. One line per disagreement, naming the file."""
    try:
        document = json.loads(data.decode("utf-8"))
        revised_tolerance = protocol.Tolerance(atol=document["revised"]["atol"], rtol=document["revised"]["rtol"])
        rows = list(document["prefixes"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        return [f"{file}: not a revised-criterion document ({type(error).__name__}: {error})"]
    records = {record.get("seq"): record for record in view.kind("cache_comparison")}
    findings = []
    for row in rows:
        row = row if isinstance(row, dict) else {}
        record = records.get(row.get("record_seq"))
        if record is None:
            findings.append(f"{file}: a prefix names cache_comparison seq {row.get('record_seq')!r}, which the run's "
                            f"records do not hold")
            continue
        kept = row.get("tensors") if isinstance(row.get("tensors"), dict) else {}
        if any(kept.get(path) != _reference(record, path) for path in PATHS):
            findings.append(f"{file}: {row.get('name')}: its tensor references are not the ones cache_comparison seq "
                            f"{record.get('seq')} holds")
            continue
        arrays = [view.verified_tensor(record["tensors"][path]) for path in PATHS]
        if any(array is None for array in arrays):
            continue  # verify states every tensor that fails its record, once
        recomputed = judge(arrays[0], arrays[1], revised_tolerance)
        if row.get("revised") != recomputed:
            findings.append(f"{file}: {row.get('name')}: revised verdict {row.get('revised')}, recomputed from the "
                            f"tensors {recomputed}")
    return findings
