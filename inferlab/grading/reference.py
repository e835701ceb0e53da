"""The instructor's reference: what a trusted run pins and computed, and a graded run compared with it.

make_reference(view) takes, from a run the instructor trusts (in a course, their own run on the real
pythia-14m): the specimen's pins (name, repository, revision, synthetic or not, every allowlisted file's size
and SHA-256), the SHA-256 of every experiment source file as the run's manifest recorded it (inferlab/,
experiments/, conftest.py, pytest.ini, artifacts/*.json), every deterministic output
(inferlab.reading.deterministic.deterministic_outputs), and the declared tolerance for logits.

compare_reference(view, reference) checks a graded run against it, and only what both hold (an output the run
lacks is not compared: its items fail for it). Greedy ids follow the near-tie rule of inferlab.measure.near_tie: at
the first difference, a step whose top-two margin on either side is within the tolerance's near-tie limit at its
true top value (and whose runner-up is the other side's id) is a near-tie divergence, noted with the step and
both margins, and the ids after it are not compared; any other difference is a contradiction, and so are top-two
values beyond the tolerance at a step both computed from the same ids. Seeded sampling ids are compared only
when the run drew them with the same torch and transformers versions (otherwise the comparison is only
mentioned). Logits must agree within the tolerance; pins and source hashes exactly, each difference by file.
Each contradiction is an integrity problem of the graded run.

A reference applies to one specimen and one protocol: of another (mismatch(), ReferenceMismatch) it is a usage
error naming both, never a list of contradictions. choose_reference picks, of several references (one per
specimen), the one of the run's specimen.

The reference's format (REFERENCE_FORMAT, REFERENCE_SCHEMA) is documented in docs/grading.md.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from inferlab import protocol
from inferlab.base.commands import spelled
from inferlab.base.records import MANIFEST_FILE
from inferlab.measure import near_tie
from inferlab.measure.summaries import first_divergence
from inferlab.reading.deterministic import describe, deterministic_outputs
from inferlab.reading.runview import RunView

REFERENCE_FORMAT = "inferlab-reference"
REFERENCE_SCHEMA = 2  # 2: greedy steps' top two, the protocol, the CPU kernels
# Logits of the same specimen and software on another CPU differ by rounding; this is far above that and far
# below any real change of weights. A course may declare its own with `reference --atol/--rtol`.
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
SOURCE_PREFIXES = ("inferlab/", "experiments/")
SOURCE_FILES = ("conftest.py", "pytest.ini")
TOP_FIELDS = ("format", "schema", "made_utc", "tool", "from_run", "tolerance", "specimen", "protocol", "sources",
              "outputs")


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
                     "git_commit": git.get("commit"), "started_utc": view.manifest.get("started_utc"),
                     "cpu_kernels": (view.manifest.get("torch_build") or {}).get("cpu_kernels")},
        "tolerance": {"atol": atol, "rtol": rtol,
                      "rule": f"|run - reference| <= {atol:g} + {rtol:g}*|reference| for logits; a top-two margin "
                              f"<= 2*({atol:g} + {rtol:g}*|top logit|) is a near tie"},
        "specimen": pins(view),
        "protocol": {"sha256": protocol_digest(view.manifest.get("protocol")), "fields": view.manifest.get("protocol")},
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
        older = isinstance(data.get("schema"), int) and data["schema"] < REFERENCE_SCHEMA
        raise ReferenceError(f"{path}: reference schema {data.get('schema')!r}; this inferlab reads schema "
                             f"{REFERENCE_SCHEMA}" + (f" (an older reference knows no greedy step's margins: make it "
                                                      f"again with {spelled('reference RUN_DIR -o REF.json')})"
                                                      if older else ""))
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


class _PromptSteps:
    """What the reference knows of a prompt's greedy steps besides a trial's own steps (an older run recorded none):
    step 0 from the first-step logits' top ids and values, P1's first steps from the matched prefixes' uncached
    top two (both with their true top value)."""

    def __init__(self, outputs: dict):
        self.known: dict[tuple, near_tie.Step] = {}
        prompts = outputs.get("prompts") or {}
        for key, entry in (outputs.get("first_step") or {}).items():
            ids, values = entry.get("top_ids") or [], entry.get("top_values") or []
            if len(values) >= 2 and len(ids) >= 2:
                self.known.setdefault((key.split("/")[0], 0), near_tie.Step(values[0], values[1], ids[1]))
        cache = outputs.get("cache") or {}
        prompt_length = len(prompts.get(protocol.CACHE_REFERENCE_TRIAL[0]) or [])
        for prefix in cache.get("prefixes") or []:
            top, length = prefix.get("top2_uncached") or {}, prefix.get("prefix_length")
            if len(top.get("values") or []) == 2 and isinstance(length, int) and prompt_length:
                self.known.setdefault((protocol.CACHE_REFERENCE_TRIAL[0], length - prompt_length),
                                      near_tie.Step(top["values"][0], top["values"][1], top["ids"][1]))

    def steps(self, prompt_id: Optional[str], own: Optional[list], length: int) -> Optional[list]:
        """A trial's own steps, else what is known of its prompt's (None where nothing is; a gap ends the list)."""
        if own is not None:
            return own
        found = []
        for step in range(length):
            known = self.known.get((prompt_id, step))
            if known is None:
                break
            found.append(known)
        return found or None


def _compare_exact(result: Comparison, label: str, ours: Any, theirs: Any) -> None:
    if ours != theirs:
        result.contradictions.append(f"{label}: {describe(ours)} in the run, {describe(theirs)} in the reference")


def _compare_pins(result: Comparison, run_pins: dict, ref_pins: dict) -> None:
    """The specimen's identity and files, where the run recorded them (a partial run that stopped before its
    specimen was verified has none: not compared, and its items fail for that)."""
    compared = 0
    for name in ("name", "repo_id", "revision", "synthetic", "weights_sha256"):
        if run_pins.get(name) is None and ref_pins.get(name) is not None:
            continue  # not recorded by the run
        compared += 1
        _compare_exact(result, f"specimen {name}", run_pins.get(name), ref_pins.get(name))
    run_files, ref_files = run_pins.get("files") or {}, ref_pins.get("files") or {}
    if ref_files and not run_files:
        result.notes.append("specimen files: the run recorded none; not compared")
    for name in sorted(set(run_files) | set(ref_files) if run_files else ()):
        ours, theirs = run_files.get(name), ref_files.get(name)
        compared += 1
        if ours is None or theirs is None:
            result.contradictions.append(f"specimen file {name}: recorded in the "
                                         f"{'reference' if ours is None else 'run'} only")
        elif ours != theirs:
            result.contradictions.append(f"specimen file {name}: size {ours.get('size')} sha256 {ours.get('sha256')} "
                                         f"in the run, size {theirs.get('size')} sha256 {theirs.get('sha256')} in "
                                         "the reference")
    result.compared["pins"] = compared


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


def _steps(entry: dict) -> Optional[list]:
    return near_tie.steps_of(entry)


def _compare_ids(result: Comparison, label: str, ours: dict, theirs: dict, prompt_steps: _PromptSteps,
                 tolerance: dict) -> bool:
    """A greedy trial's ids by the near-tie rule (inferlab.measure.near_tie): equal, a near-tie divergence (noted), or a
    contradiction; top-two values beyond the tolerance at a compared step are a contradiction too."""
    ours_ids, theirs_ids = ours.get("ids") or [], theirs.get("ids") or []
    theirs_steps = prompt_steps.steps(theirs.get("prompt_id"), _steps(theirs), len(theirs_ids))
    found = near_tie.compare_greedy(ours_ids, theirs_ids, _steps(ours), theirs_steps, **tolerance)
    if found.value_problems:
        shown = found.value_problems[:near_tie.SHOWN_VALUE_PROBLEMS]
        more = len(found.value_problems) - len(shown)
        result.contradictions.append(f"{label}: top two raw logits beyond the tolerance at "
                                     + "; ".join(shown) + (f"; and {more} more" if more > 0 else ""))
    if found.status == "near_tie":
        result.notes.append(f"{label}: a near-tie divergence at step {found.step} ({found.margins_text()}, within "
                            f"the tolerance's near-tie limit): not a contradiction; the ids after it are not compared")
    elif found.status == "differ":
        known = found.theirs_margin is not None
        result.contradictions.append(
            f"{label}: ids first differ at step {found.step}: {describe(ours_ids)} in the run, {describe(theirs_ids)} "
            f"in the reference ({found.margins_text()}: "
            + ("not a near tie)" if known else "the reference knows no margin at that step)"))
    return True


def _within(ours: float, theirs: float, tolerance: dict) -> bool:
    return abs(ours - theirs) <= tolerance["atol"] + tolerance["rtol"] * abs(theirs)


def _compare_first_step(result: Comparison, ours: dict, theirs: dict, prompt_steps: _PromptSteps,
                        tolerance: dict) -> None:
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
        known = prompt_steps.known.get((key.split("/")[0], 0))
        if run_first != ref_first and not (known is not None and known.near_tie(**tolerance)):
            result.contradictions.append(f"first-step logits {key}: the largest is id {run_first} in the run, "
                                         f"{ref_first} in the reference")
    result.compared["first_step"] = compared


def _compare_outputs(result: Comparison, ours: dict, theirs: dict, tolerance: dict) -> None:
    prompt_steps = _PromptSteps(theirs)
    run_prompts, ref_prompts = ours.get("prompts") or {}, theirs.get("prompts") or {}
    for prompt_id in sorted(set(run_prompts) & set(ref_prompts)):
        _compare_exact(result, f"prompt {prompt_id} token ids", run_prompts[prompt_id], ref_prompts[prompt_id])
    same_software = (ours.get("torch_version"), ours.get("transformers_version")) == \
        (theirs.get("torch_version"), theirs.get("transformers_version"))
    counts = {"generation": 0, "sampled_not_compared": 0, "timing": 0, "cache_prefixes": 0, "batching": 0,
              "near_tie_divergences": 0}
    notes_before = len(result.notes)
    for trial_id, ref in (theirs.get("generation") or {}).items():
        run = (ours.get("generation") or {}).get(trial_id)
        if run is None:
            result.notes.append(f"generation {trial_id}: not in the run; not compared")
            continue
        if ref.get("sampled") and not same_software:
            counts["sampled_not_compared"] += 1
            continue
        if ref.get("sampled"):
            counts["generation"] += 1
            if run.get("ids") != ref.get("ids"):
                step = first_divergence(run.get("ids") or [], ref.get("ids") or [])
                result.contradictions.append(f"generation {trial_id}: ids first differ at step {step}: "
                                             f"{describe(run.get('ids'))} in the run, {describe(ref.get('ids'))} in "
                                             "the reference (seeded sampling under the same torch and transformers)")
            continue
        counts["generation"] += _compare_ids(result, f"generation {trial_id}", run, ref, prompt_steps, tolerance)
    if counts["sampled_not_compared"]:
        result.notes.append(
            f"{counts['sampled_not_compared']} seeded sampling trials not compared: the run drew them with torch "
            f"{ours.get('torch_version')} and transformers {ours.get('transformers_version')}, the reference with "
            f"torch {theirs.get('torch_version')} and transformers {theirs.get('transformers_version')}")
    for trial_id, ref in (theirs.get("timing") or {}).items():
        run = (ours.get("timing") or {}).get(trial_id)
        if run is not None:
            counts["timing"] += _compare_ids(result, f"timing {trial_id}", run, ref, prompt_steps, tolerance)
    run_cache, ref_cache = ours.get("cache") or {}, theirs.get("cache") or {}
    if ref_cache and run_cache:
        trial = _cache_reference_trial()
        steps = [{k: v for k, v in ((side.get("generation") or {}).get(trial) or {}).items()
                  if k in (near_tie.STEP_VALUES_FIELD, near_tie.STEP_IDS_FIELD)} for side in (ours, theirs)]
        _compare_cache(result, run_cache, ref_cache, prompt_steps, tolerance, counts, steps)
    for call, ref in (theirs.get("batching") or {}).items():
        run = (ours.get("batching") or {}).get(call)
        if run is not None:
            counts["batching"] += 1
            _compare_exact(result, f"batching call {call} ids", run.get("generated_ids_raw"),
                           ref.get("generated_ids_raw"))
    _compare_first_step(result, ours.get("first_step") or {}, theirs.get("first_step") or {}, prompt_steps, tolerance)
    counts["near_tie_divergences"] = sum("a near-tie divergence" in note for note in result.notes[notes_before:])
    result.compared.update(counts)


def _cache_reference_trial() -> Optional[str]:
    """The greedy trial whose first ids the matched-prefix comparison follows (protocol.CACHE_REFERENCE_TRIAL)."""
    return next((t.test_id for t in protocol.generation_trials()
                 if (t.prompt_id, t.condition, t.repetition) == protocol.CACHE_REFERENCE_TRIAL), None)


def _compare_cache(result: Comparison, run_cache: dict, ref_cache: dict, prompt_steps: _PromptSteps,
                   tolerance: dict, counts: dict, steps: list) -> None:
    """The fixed continuation by the near-tie rule, then each prefix both hold: its argmaxes (unless the
    reference's uncached margin there is a near tie by its true top value) and its margin, within twice the
    tolerance at that top value. The prefixes after a near-tie divergence of the continuation are not compared."""
    prompt_id = protocol.CACHE_REFERENCE_TRIAL[0]
    # each side's continuation with the steps of the trial it follows, as far as it goes
    ours, theirs = ({"ids": cache.get("continuation") or [], "prompt_id": prompt_id,
                     **{k: v[:len(cache.get("continuation") or [])] for k, v in side.items()}}
                    for cache, side in ((run_cache, steps[0]), (ref_cache, steps[1])))
    before = len(result.notes)
    _compare_ids(result, "cache continuation", ours, theirs, prompt_steps, tolerance)
    diverged = first_divergence(ours["ids"], theirs["ids"]) if len(result.notes) > before else None
    run_prefixes = {p.get("prefix_length"): p for p in run_cache.get("prefixes") or []}
    prompt_length = min((p.get("prefix_length") for p in ref_cache.get("prefixes") or []
                         if isinstance(p.get("prefix_length"), int)), default=0)
    for ref_prefix in ref_cache.get("prefixes") or []:
        length, run_prefix = ref_prefix.get("prefix_length"), run_prefixes.get(ref_prefix.get("prefix_length"))
        if run_prefix is None or (diverged is not None and isinstance(length, int)
                                  and length - prompt_length > diverged):
            continue
        counts["cache_prefixes"] += 1
        margin, top = ref_prefix.get("top2_margin_uncached"), (ref_prefix.get("top2_uncached") or {}).get("values")
        top_value = top[0] if top else None
        if top_value is None:
            known = prompt_steps.known.get((prompt_id, length - prompt_length)) if isinstance(length, int) else None
            top_value = known.top if known is not None else None
        limit = near_tie.near_tie_limit(top_value, **tolerance) if top_value is not None else None
        tie = isinstance(margin, (int, float)) and limit is not None and margin <= limit
        for name in ("argmax_uncached", "argmax_cached"):
            if run_prefix.get(name) != ref_prefix.get(name) and not tie:
                result.contradictions.append(f"cache prefix {length}: {name} {run_prefix.get(name)} in the run, "
                                             f"{ref_prefix.get(name)} in the reference")
        ours_margin = run_prefix.get("top2_margin_uncached")
        if isinstance(margin, (int, float)) and isinstance(ours_margin, (int, float)) and limit is not None and \
                not abs(ours_margin - margin) <= limit:
            result.contradictions.append(f"cache prefix {length}: top-two margin {ours_margin:.6g} in the run, "
                                         f"{margin:.6g} in the reference (each logit may move "
                                         f"{limit / 2:.3g} at top value {top_value:.6g})")


# --- which reference applies ---------------------------------------------------------------------------


class ReferenceMismatch(ReferenceError):
    """A reference of another specimen or protocol than the run's: a usage error (exit 2), naming both."""


def protocol_digest(protocol_dict: Any) -> Optional[str]:
    """The SHA-256 of a protocol (protocol.as_dict() as a run's manifest recorded it), as canonical JSON."""
    if not isinstance(protocol_dict, dict):
        return None
    return hashlib.sha256(json.dumps(protocol_dict, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _specimen_name(reference: dict) -> Optional[str]:
    return (reference.get("specimen") or {}).get("name")


def mismatch(view: RunView, reference: dict, file: Optional[str] = None) -> Optional[str]:
    """Why a reference does not apply to a run (another specimen, another protocol), naming both; None when it
    applies."""
    where = f"the reference {file}" if file else "the reference"
    run_name, ref_name = view.specimen_spec().get("name"), _specimen_name(reference)
    if run_name != ref_name:
        return (f"{where} is of specimen {ref_name!r}, the run of specimen {run_name!r}: give the reference made "
                f"for {run_name!r} ({spelled('reference RUN_DIR -o REF.json')} on a trusted run of it)")
    ours, theirs = protocol_digest(view.manifest.get("protocol")), (reference.get("protocol") or {}).get("sha256")
    if ours != theirs:
        different = sorted(k for k in set(view.manifest.get("protocol") or {}) | set((reference.get("protocol") or
                                                                                        {}).get("fields") or {})
                           if (view.manifest.get("protocol") or {}).get(k) !=
                           ((reference.get("protocol") or {}).get("fields") or {}).get(k))
        return (f"{where} is of protocol {str(theirs)[:12]}, the run of protocol {str(ours)[:12]} (sha256 of the "
                f"manifest's protocol; differing: {', '.join(different) or 'unknown'})")
    return None


def choose_reference(view: RunView, references: list[tuple[Optional[str], dict]]) -> tuple[Optional[str], dict]:
    """(file, reference) of the one reference of the run's specimen; ReferenceMismatch naming every specimen given
    (or the protocols) otherwise."""
    run_name = view.specimen_spec().get("name")
    matching = [(file, ref) for file, ref in references if _specimen_name(ref) == run_name]
    if not matching:
        given = ", ".join(f"{_specimen_name(ref)!r} ({file})" if file else repr(_specimen_name(ref))
                          for file, ref in references)
        if len(references) == 1:
            raise ReferenceMismatch(mismatch(view, references[0][1], references[0][0]))
        raise ReferenceMismatch(f"no reference of the run's specimen {run_name!r}: the references given are of "
                                f"{given}")
    file, reference = matching[0]
    why = mismatch(view, reference, file)
    if why:
        raise ReferenceMismatch(why)
    return file, reference


def specimens_given(references: list[tuple[Optional[str], dict]]) -> Optional[str]:
    """A usage error when two references are of one specimen (which would apply is not said), else None."""
    seen: dict = {}
    for file, reference in references:
        name = _specimen_name(reference)
        if name in seen:
            return f"two references of specimen {name!r}: {seen[name]} and {file}; give one per specimen"
        seen[name] = file
    return None


def compare_reference(view: RunView, reference: dict) -> Comparison:
    """Every contradiction between the run and the reference, and what was only noted. The reference must be of
    the run's specimen and protocol (mismatch(); ReferenceMismatch otherwise)."""
    why = mismatch(view, reference)
    if why:
        raise ReferenceMismatch(why)
    result = Comparison()
    tolerance = {"atol": float(reference["tolerance"]["atol"]), "rtol": float(reference["tolerance"]["rtol"])}
    _compare_pins(result, pins(view), reference.get("specimen") or {})
    _compare_sources(result, run_sources(view), reference.get("sources") or {})
    _compare_outputs(result, deterministic_outputs(view), reference.get("outputs") or {}, tolerance)
    kernels = kernels_line(view.manifest, (reference.get("from_run") or {}).get("cpu_kernels"))
    if kernels:
        result.notes.append(kernels)
    return result


def kernels_line(manifest: dict, reference_kernels: Optional[dict]) -> Optional[str]:
    """One line saying which CPU kernels the run and the reference's run used (environment.cpu_kernels)."""
    from inferlab.host.environment import describe_kernels

    run_kernels = (manifest.get("torch_build") or {}).get("cpu_kernels") if isinstance(manifest, dict) else None
    if run_kernels is None and reference_kernels is None:
        return None
    return f"CPU kernels: the run {describe_kernels(run_kernels)}; the reference's run {describe_kernels(reference_kernels)}"
