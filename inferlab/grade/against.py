"""The one comparison of a handed-in run (a claim) with the course's own run (the evidence).

Exact where both runs computed under the same conditions (torch build, CPU kernel set and its switches, CPU model,
effective threads): every id and saved tensor must then be equal bit for bit. Otherwise tensors must agree within
the declared tolerance, differing ids are shown but not held against the run (other kernels may round a near tie
the other way), and the comparison says it was not exact and why. The conditions come from the claim's own
manifest: editing them only loosens the comparison, which the grade then says; it never raises a score.
Compared, by item: 3 the specimen's files; 4 the inputs' ids and masks (exact always), the trials' ids and
first-step logits; 5 the matched-prefix logits; 6 the timing trials' ids and the counted bytes (exact always).
Timings are shown side by side, never compared. A contradiction names the first element that differs.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import asdict, dataclass, field
from typing import Optional

from inferlab import protocol

TIMING_METRICS = ("prefill_s", "ttft_s", "mean_post_first_interval_s", "loop_s")


def conditions(view) -> dict:
    """What decides whether two runs compute bit for bit alike, as the run's manifest records it."""
    manifest = view.manifest
    build = manifest.get("torch_build") if isinstance(manifest.get("torch_build"), dict) else {}
    kernels = build.get("cpu_kernels") if isinstance(build.get("cpu_kernels"), dict) else {}
    platform = manifest.get("platform") if isinstance(manifest.get("platform"), dict) else {}
    threads = manifest.get("torch_threads") if isinstance(manifest.get("torch_threads"), dict) else {}
    return {"torch": build.get("version"),
            "kernels": {k: v for k, v in kernels.items() if k == "capability" or k.startswith("env_")},
            "cpu_model": platform.get("cpu_model"), "threads": threads.get("effective")}


@dataclass
class Comparison:
    """What the comparison found: per item, contradictions (each fails its item) and notes."""

    course: str
    exact: bool
    why_not_exact: list[str] = field(default_factory=list)
    different_specimen: Optional[str] = None
    contradictions: dict[int, list[str]] = field(default_factory=dict)
    notes: dict[int, list[str]] = field(default_factory=dict)
    compared: collections.Counter = field(default_factory=collections.Counter)  # item -> values compared
    timings: list[dict] = field(default_factory=list)

    def contradict(self, item: int, message: str) -> None:
        self.contradictions.setdefault(item, []).append(message)

    def how(self) -> str:
        """One line: exact, or within the tolerance and why."""
        if self.exact:
            return f"exact (bit for bit): both runs computed under the same conditions ({self.course})"
        return (f"not exact, within the declared tolerance {protocol.CACHE_TOLERANCE.describe('the course run')}, "
                f"because {'; '.join(self.why_not_exact)}; ids that differ are shown, not held against the run")

    def as_dict(self) -> dict:
        # asdict would rebuild the Counter from (key, value) pairs, counting them: it is given as a dict
        return {**asdict(self), "compared": dict(self.compared), "how": self.how()}


def _tensor_difference(claimed, course, exact: bool) -> Optional[str]:
    """Where a claimed array departs from the course's: None, or the first element in words."""
    import numpy as np

    if claimed.shape != course.shape:
        return f"shape {list(claimed.shape)}, the course's {list(course.shape)}"
    if exact:
        kind = f"u{claimed.dtype.itemsize}"
        bad = np.flatnonzero(claimed.reshape(-1).view(kind) != course.reshape(-1).view(kind))
        rule = "bit for bit"
    else:
        tol = protocol.CACHE_TOLERANCE
        a, b = claimed.astype("float64").reshape(-1), course.astype("float64").reshape(-1)
        bad = np.flatnonzero(~(np.abs(a - b) <= tol.atol + tol.rtol * np.abs(b)))
        rule = "within the tolerance"
    if bad.size == 0:
        return None
    first = int(bad[0])
    index = [int(i) for i in np.unravel_index(first, claimed.shape)]
    return (f"element {index}: {claimed.reshape(-1)[first]!r}, the course's {course.reshape(-1)[first]!r} "
            f"({bad.size} of {claimed.size} elements differ; compared {rule})")


def _pairs(claim, course, kind: str, key: str) -> list[tuple]:
    """(key, the run's record, the course's record) of each record of a kind that both runs hold; a record the run
    lacks fails its item as incomplete (grade.py), not as a contradiction."""
    mine, theirs = ({r.get(key): r for r in side.kind(kind) if r.get("status", "ok") == "ok"}
                    for side in (claim, course))
    return [(name, mine[name], record) for name, record in theirs.items() if name in mine]


def _ids(found: Comparison, item: int, what: str, name: str, record: dict, course_record: dict, exact: bool) -> None:
    found.compared[item] += 1
    claimed, expected = record.get(name) or [], course_record.get(name) or []
    if claimed == expected:
        return
    shorter = min(len(claimed), len(expected))  # they differ: at a shared position, else where one ends
    where = next((i for i in range(shorter) if claimed[i] != expected[i]), shorter)
    message = (f"{what} {name}: position {where}: {claimed[where:where + 1]}, the course's {expected[where:where + 1]} "
               f"(seq {record.get('seq')})")
    if exact:
        found.contradict(item, message)
    else:
        found.notes.setdefault(item, []).append(f"differs (not held against the run): {message}")


def _tensor(found: Comparison, claim, course, item: int, what: str, claimed_ref, course_ref) -> None:
    expected = course.tensors.verified(course_ref)
    if expected is None:
        return  # the course's own tensor is missing: nothing to compare against
    found.compared[item] += 1
    claimed = claim.tensors.verified(claimed_ref)
    if claimed is None:
        found.contradict(item, f"{what}: the course's run holds this tensor, the run's is missing or does not match "
                               "its record")
        return
    difference = _tensor_difference(claimed, expected, found.exact)
    if difference is not None:
        found.contradict(item, f"{what} ({claimed_ref.get('file')}[{claimed_ref.get('key')}]): {difference}")


def _timing_rows(claim, course) -> list[dict]:
    """Median of each timing metric per prompt and cache setting, the run's beside the course's."""
    rows = []
    for prompt_id in protocol.TIMING_PROMPTS:
        for use_cache in (True, False):
            for metric in TIMING_METRICS:
                row = {"prompt_id": prompt_id, "use_cache": use_cache, "metric": metric}
                for side, view in (("run", claim), ("course", course)):
                    values = [r.get(metric) for r in view.kind("timing_trial") if r.get("prompt_id") == prompt_id
                              and r.get("use_cache") == use_cache and not r.get("warmup")
                              and isinstance(r.get(metric), (int, float))]
                    row[side] = statistics.median(values) if values else None
                    row[f"{side}_n"] = len(values)
                rows.append(row)
    return rows


def compare(claim, course, course_label: str) -> Comparison:
    """Compare the run `claim` reads with the course's run (both RunViews)."""
    mine, theirs = conditions(claim), conditions(course)
    differ = [f"{name}: the run's {mine[name]!r}, the course's {theirs[name]!r}"
              for name in mine if mine[name] != theirs[name]]
    found = Comparison(course_label, exact=not differ, why_not_exact=differ)
    specimen, course_specimen = ((s.get("name"), s.get("revision")) for s in (claim.specimen_spec(),
                                                                              course.specimen_spec()))
    if specimen != course_specimen:
        found.different_specimen = (f"the run used {specimen[0]} at {specimen[1]}, the course's run "
                                    f"{course_specimen[0]} at {course_specimen[1]}")
        return found
    for name, got, expected in _pairs(claim, course, "artifact_file", "name"):
        found.compared[3] += 1
        if (got.get("sha256"), got.get("size")) != (expected.get("sha256"), expected.get("size")):
            found.contradict(3, f"artifact_file {name}: sha256 {got.get('sha256')} size {got.get('size')}, the "
                                f"course's {expected.get('sha256')} size {expected.get('size')}")
    for item, kind, key, names in ((4, "input", "prompt_id", ("token_ids", "attention_mask")),
                                   (4, "generation", "trial_id", ("generated_ids",)),
                                   (6, "timing_trial", "schedule_id", ("generated_ids",))):
        for name, record, course_record in _pairs(claim, course, kind, key):
            for field_name in names:  # ids from a tokenizer do not depend on kernels: exact always
                _ids(found, item, f"{kind} {name}", field_name, record, course_record, found.exact or kind == "input")
    for name, record, course_record in _pairs(claim, course, "generation", "trial_id"):
        if course_record.get("first_step_logits"):
            _tensor(found, claim, course, 4, f"generation {name} first_step_logits", record.get("first_step_logits"),
                    course_record["first_step_logits"])
    for length, record, course_record in _pairs(claim, course, "cache_comparison", "prefix_length"):
        for path in ("cached", "uncached"):
            _tensor(found, claim, course, 5, f"cache_comparison prefix {length} {path} logits",
                    (record.get("tensors") or {}).get(path), (course_record.get("tensors") or {}).get(path))
    memory = {(r.get("measure"), r.get("point")): r for r in claim.kind("memory")}
    for record in course.kind("memory"):
        key = (record.get("measure"), record.get("point"))
        if record.get("measure") in ("parameter_storage", "cache_storage") and key in memory:
            found.compared[6] += 1
            if memory[key].get("unique_bytes") != record.get("unique_bytes"):
                found.contradict(6, f"memory {key[0]} {key[1] or ''}: {memory[key].get('unique_bytes')} bytes, the "
                                    f"course's {record.get('unique_bytes')} (seq {memory[key].get('seq')})")
    found.timings = _timing_rows(claim, course)
    return found
