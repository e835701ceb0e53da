"""The instructor's reference: what a trusted run pins and computed, and a graded run compared with it.

make_reference(view) takes, from a run the instructor trusts (in a course, their own run on the real
pythia-14m): the specimen's pins (name, repository, revision, synthetic or not, every allowlisted file's size
and SHA-256), the SHA-256 of every experiment source file as the run's manifest recorded it (inferlab/,
experiments/, conftest.py, pytest.ini, artifacts/*.json), every deterministic output
(inferlab.deterministic.deterministic_outputs), and the declared tolerance for logits.

compare_reference(view, reference) checks a graded run against it. Token ids must be equal, except that a first
difference at a step whose top-two margin in the reference is within the tolerance is a near tie (reported,
not held against the run); where the margin of that step is not known, a difference is a contradiction.
Seeded sampling ids are compared only when the run drew them with the same torch and transformers versions
(otherwise the comparison is only mentioned). Logits must agree within the tolerance; pins and source hashes
exactly, each difference by file. Outputs the run lacks are not compared (its items fail for them).
Each contradiction is an integrity problem of the graded run.

The reference's format (REFERENCE_FORMAT, REFERENCE_SCHEMA) is documented in docs/grading.md.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from inferlab.cli import spelled
from inferlab.deterministic import describe, deterministic_outputs
from inferlab.records import MANIFEST_FILE
from inferlab.runview import RunView
from inferlab.summaries import first_divergence

REFERENCE_FORMAT = "inferlab-reference"
REFERENCE_SCHEMA = 1
# Logits of the same specimen and software on another CPU differ by rounding; this is far above that and far
# below any real change of weights. A course may declare its own with `reference --atol/--rtol`.
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
SOURCE_PREFIXES = ("inferlab/", "experiments/")
SOURCE_FILES = ("conftest.py", "pytest.ini")
TOP_FIELDS = ("format", "schema", "made_utc", "tool", "from_run", "tolerance", "specimen", "sources", "outputs")


class ReferenceError(ValueError):
    """A reference file that cannot be used; the message names the file and what is wrong."""


def experiment_source(path: str) -> bool:
    """Whether a source path is part of the experiment: inferlab/, experiments/, conftest.py, pytest.ini or an
    artifacts/*.json specimen spec."""
    return path.startswith(SOURCE_PREFIXES) or path in SOURCE_FILES or (
        path.startswith("artifacts/") and path.endswith(".json") and path.count("/") == 1)


def run_sources(view: RunView) -> dict[str, str]:
    """{path: sha256} of the experiment source files as the run's manifest recorded them."""
    hashes = view.manifest.get("source_sha256")
    return {p: h for p, h in sorted(hashes.items()) if experiment_source(p)} if isinstance(hashes, dict) else {}


def pins(view: RunView) -> dict:
    """The specimen's pins as the run recorded them: its identity and every allowlisted file's size and hash."""
    outputs_specimen = deterministic_outputs(view)["specimen"]
    files = {}
    for record in view.kind("artifact_file"):
        if isinstance(record.get("name"), str) and record["name"] not in files:
            files[record["name"]] = {"size": record.get("size"), "sha256": record.get("sha256")}
    return {**outputs_specimen, "files": dict(sorted(files.items()))}


def near_tie_limit(top_value: float, atol: float, rtol: float) -> float:
    """A top-two margin at or below this can swap when each of the two logits moves within the tolerance."""
    return 2 * (atol + rtol * abs(top_value))


def make_reference(view: RunView, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL,
                   now: Optional[str] = None) -> dict:
    """The reference of one trusted run, as plain data (written as REF.json)."""
    manifest_bytes = b""
    if view.directory is not None and (view.directory / MANIFEST_FILE).is_file():
        manifest_bytes = (view.directory / MANIFEST_FILE).read_bytes()
    git = view.manifest.get("git") if isinstance(view.manifest.get("git"), dict) else {}
    return {
        "format": REFERENCE_FORMAT, "schema": REFERENCE_SCHEMA,
        "made_utc": now or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tool": "inferlab reference",
        "from_run": {"record_dir": view.directory.name if view.directory is not None else None,
                     "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest() if manifest_bytes else None,
                     "git_commit": git.get("commit"), "started_utc": view.manifest.get("started_utc")},
        "tolerance": {"atol": atol, "rtol": rtol,
                      "rule": f"|run - reference| <= {atol:g} + {rtol:g}*|reference| for logits; a top-two margin "
                              f"<= 2*({atol:g} + {rtol:g}*|top logit|) is a near tie"},
        "specimen": pins(view),
        "sources": run_sources(view),
        "outputs": deterministic_outputs(view),
    }


def load_reference(path: Path) -> dict:
    """A reference file, checked for its format and schema; ReferenceError naming the file otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ReferenceError(f"{path}: cannot be read ({error})") from None
    except ValueError as error:
        raise ReferenceError(f"{path}: not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") != REFERENCE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ReferenceError(f"{path}: not an inferlab reference (format {found!r}, expected {REFERENCE_FORMAT!r}; "
                             f"make one with {spelled('reference RUN_DIR -o REF.json')})")
    if data.get("schema") != REFERENCE_SCHEMA:
        raise ReferenceError(f"{path}: reference schema {data.get('schema')!r}; this inferlab reads schema "
                             f"{REFERENCE_SCHEMA}")
    absent = [name for name in TOP_FIELDS if name not in data]
    if absent:
        raise ReferenceError(f"{path}: missing field(s) {', '.join(absent)}")
    tolerance = data["tolerance"]
    if not all(isinstance(tolerance.get(k), (int, float)) and tolerance[k] >= 0 for k in ("atol", "rtol")):
        raise ReferenceError(f"{path}: tolerance must hold atol and rtol >= 0, found {tolerance!r}")
    return data


# --- comparing -------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """What a run contradicts in a reference (integrity problems), what was only noted, and what was compared."""

    contradictions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compared: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """Plain data."""
        return {"contradictions": list(self.contradictions), "notes": list(self.notes), "compared": dict(self.compared)}


class _Margins:
    """Top-two margins the reference knows, per (prompt, step of the greedy continuation), with the top value."""

    def __init__(self, outputs: dict):
        self.known: dict[tuple, tuple[float, float]] = {}
        prompts = outputs.get("prompts") or {}
        for key, entry in (outputs.get("first_step") or {}).items():
            values = entry.get("top_values") or []
            if len(values) >= 2:
                self.known.setdefault((key.split("/")[0], 0), (values[0] - values[1], values[0]))
        cache = outputs.get("cache") or {}
        prompt_length = len(prompts.get("P1") or [])
        for prefix in cache.get("prefixes") or []:
            margin, length = prefix.get("top2_margin_uncached"), prefix.get("prefix_length")
            if isinstance(margin, (int, float)) and isinstance(length, int) and prompt_length:
                self.known.setdefault(("P1", length - prompt_length), (float(margin), 0.0))

    def near_tie(self, prompt_id: str, step: int, atol: float, rtol: float) -> Optional[float]:
        """The margin when step `step` of the prompt's greedy continuation is a known near tie; else None."""
        margin, top = self.known.get((prompt_id, step), (None, 0.0))
        if margin is not None and margin <= near_tie_limit(top, atol, rtol):
            return margin
        return None


def _compare_exact(result: Comparison, label: str, ours: Any, theirs: Any) -> None:
    if ours != theirs:
        result.contradictions.append(f"{label}: {describe(ours)} in the run, {describe(theirs)} in the reference")


def _compare_pins(result: Comparison, run_pins: dict, ref_pins: dict) -> None:
    for name in ("name", "repo_id", "revision", "synthetic", "weights_sha256"):
        _compare_exact(result, f"specimen {name}", run_pins.get(name), ref_pins.get(name))
    run_files, ref_files = run_pins.get("files") or {}, ref_pins.get("files") or {}
    for name in sorted(set(run_files) | set(ref_files)):
        ours, theirs = run_files.get(name), ref_files.get(name)
        if ours is None or theirs is None:
            result.contradictions.append(f"specimen file {name}: recorded in the "
                                         f"{'reference' if ours is None else 'run'} only")
        elif ours != theirs:
            result.contradictions.append(f"specimen file {name}: size {ours.get('size')} sha256 {ours.get('sha256')} "
                                         f"in the run, size {theirs.get('size')} sha256 {theirs.get('sha256')} in "
                                         "the reference")
    result.compared["pins"] = 5 + len(set(run_files) | set(ref_files))


def _compare_sources(result: Comparison, ours: dict, theirs: dict) -> None:
    for path in sorted(set(ours) | set(theirs)):
        if path not in ours:
            result.contradictions.append(f"source {path}: in the reference, not recorded by the run")
        elif path not in theirs:
            result.contradictions.append(f"source {path}: recorded by the run, not in the reference")
        elif ours[path] != theirs[path]:
            result.contradictions.append(f"source {path}: sha256 {ours[path]} in the run, {theirs[path]} in the "
                                         "reference")
    result.compared["sources"] = len(set(ours) | set(theirs))


def _compare_ids(result: Comparison, label: str, ours: list, theirs: list, prompt_id: Optional[str],
                 margins: _Margins, tolerance: dict) -> bool:
    """Ids equal, or differing first at a known near tie (noted); a contradiction otherwise. True when compared."""
    step = first_divergence(ours, theirs)
    if step is None:
        return True
    margin = margins.near_tie(prompt_id, step, tolerance["atol"], tolerance["rtol"]) if prompt_id else None
    if margin is not None:
        result.notes.append(f"{label}: ids first differ at step {step}, a near tie in the reference (top-two margin "
                            f"{margin:.3g}); not a contradiction")
        return True
    known = prompt_id is not None and (prompt_id, step) in margins.known
    result.contradictions.append(
        f"{label}: ids first differ at step {step}: {describe(ours)} in the run, {describe(theirs)} in the reference"
        + ("" if known else " (the reference knows no margin at that step)")
        + (" (its top-two margin in the reference is above the tolerance)" if known else ""))
    return True


def _within(ours: float, theirs: float, tolerance: dict) -> bool:
    return abs(ours - theirs) <= tolerance["atol"] + tolerance["rtol"] * abs(theirs)


def _compare_first_step(result: Comparison, ours: dict, theirs: dict, margins: _Margins, tolerance: dict) -> None:
    compared = 0
    for key, ref in theirs.items():
        run = ours.get(key)
        if run is None:
            result.notes.append(f"first-step logits {key}: not in the run; not compared")
            continue
        compared += 1
        if run.get("sha256") == ref.get("sha256"):
            continue  # bitwise the same tensor
        run_top = dict(zip(run.get("top_ids") or [], run.get("top_values") or []))
        ref_top = dict(zip(ref.get("top_ids") or [], ref.get("top_values") or []))
        run_edge = min(run_top.values(), default=float("-inf"))
        ref_edge = min(ref_top.values(), default=float("-inf"))
        bad = []
        for token in sorted(set(run_top) | set(ref_top)):
            a, b = run_top.get(token, run_edge), ref_top.get(token, ref_edge)
            if token in run_top and token in ref_top and not _within(a, b, tolerance):
                bad.append(f"id {token}: {a:.6g} against {b:.6g}")
            elif token not in run_top and not (a >= b or _within(a, b, tolerance)):
                bad.append(f"id {token} ({b:.6g} in the reference) is not among the run's top {len(run_top)}")
            elif token not in ref_top and not (b >= a or _within(a, b, tolerance)):
                bad.append(f"id {token} ({a:.6g} in the run) is not among the reference's top {len(ref_top)}")
        if bad:
            result.contradictions.append(f"first-step logits {key}: beyond the tolerance: " + "; ".join(bad[:4]) +
                                         (f"; and {len(bad) - 4} more" if len(bad) > 4 else ""))
        else:
            result.notes.append(f"first-step logits {key}: not bitwise equal, within the tolerance")
        run_first, ref_first = (run.get("top_ids") or [None])[0], (ref.get("top_ids") or [None])[0]
        if run_first != ref_first and margins.near_tie(key.split("/")[0], 0, **tolerance) is None:
            result.contradictions.append(f"first-step logits {key}: the largest is id {run_first} in the run, "
                                         f"{ref_first} in the reference")
    result.compared["first_step"] = compared


def _compare_outputs(result: Comparison, ours: dict, theirs: dict, tolerance: dict) -> None:
    margins = _Margins(theirs)
    _compare_exact(result, "prompt token ids", ours.get("prompts"), theirs.get("prompts"))
    same_software = (ours.get("torch_version"), ours.get("transformers_version")) == \
        (theirs.get("torch_version"), theirs.get("transformers_version"))
    counts = {"generation": 0, "sampled_not_compared": 0, "timing": 0, "cache_prefixes": 0, "batching": 0}
    for trial_id, ref in (theirs.get("generation") or {}).items():
        run = (ours.get("generation") or {}).get(trial_id)
        if run is None:
            result.notes.append(f"generation {trial_id}: not in the run; not compared")
            continue
        if ref.get("sampled") and not same_software:
            counts["sampled_not_compared"] += 1
            continue
        prompt_id = None if ref.get("sampled") else ref.get("prompt_id")
        counts["generation"] += _compare_ids(result, f"generation {trial_id}", run.get("ids"), ref.get("ids"),
                                             prompt_id, margins, tolerance)
    if counts["sampled_not_compared"]:
        result.notes.append(
            f"{counts['sampled_not_compared']} seeded sampling trials not compared: the run drew them with torch "
            f"{ours.get('torch_version')} and transformers {ours.get('transformers_version')}, the reference with "
            f"torch {theirs.get('torch_version')} and transformers {theirs.get('transformers_version')}")
    for trial_id, ref in (theirs.get("timing") or {}).items():
        run = (ours.get("timing") or {}).get(trial_id)
        if run is not None:
            counts["timing"] += _compare_ids(result, f"timing {trial_id}", run.get("ids"), ref.get("ids"),
                                             ref.get("prompt_id"), margins, tolerance)
    run_cache, ref_cache = ours.get("cache") or {}, theirs.get("cache") or {}
    if ref_cache and run_cache:
        _compare_ids(result, "cache continuation", run_cache.get("continuation") or [],
                     ref_cache.get("continuation") or [], "P1", margins, tolerance)
        run_prefixes = {p.get("prefix_length"): p for p in run_cache.get("prefixes") or []}
        for ref_prefix in ref_cache.get("prefixes") or []:
            length, run_prefix = ref_prefix.get("prefix_length"), run_prefixes.get(ref_prefix.get("prefix_length"))
            if run_prefix is None:
                continue
            counts["cache_prefixes"] += 1
            margin = ref_prefix.get("top2_margin_uncached")
            tie = isinstance(margin, (int, float)) and margin <= near_tie_limit(0.0, **tolerance)
            for name in ("argmax_uncached", "argmax_cached"):
                if run_prefix.get(name) != ref_prefix.get(name) and not tie:
                    result.contradictions.append(f"cache prefix {length}: {name} {run_prefix.get(name)} in the run, "
                                                 f"{ref_prefix.get(name)} in the reference")
            ours_margin = run_prefix.get("top2_margin_uncached")
            if isinstance(margin, (int, float)) and isinstance(ours_margin, (int, float)) and \
                    not abs(ours_margin - margin) <= 2 * (tolerance["atol"] + tolerance["rtol"] * abs(margin)):
                result.contradictions.append(f"cache prefix {length}: top-two margin {ours_margin:.6g} in the run, "
                                             f"{margin:.6g} in the reference")
    for call, ref in (theirs.get("batching") or {}).items():
        run = (ours.get("batching") or {}).get(call)
        if run is not None:
            counts["batching"] += 1
            _compare_exact(result, f"batching call {call} ids", run.get("generated_ids_raw"),
                           ref.get("generated_ids_raw"))
    _compare_first_step(result, ours.get("first_step") or {}, theirs.get("first_step") or {}, margins, tolerance)
    result.compared.update(counts)


def compare_reference(view: RunView, reference: dict) -> Comparison:
    """Every contradiction between the run and the reference, and what was only noted."""
    result = Comparison()
    tolerance = {"atol": float(reference["tolerance"]["atol"]), "rtol": float(reference["tolerance"]["rtol"])}
    _compare_pins(result, pins(view), reference.get("specimen") or {})
    _compare_sources(result, run_sources(view), reference.get("sources") or {})
    _compare_outputs(result, deterministic_outputs(view), reference.get("outputs") or {}, tolerance)
    return result
