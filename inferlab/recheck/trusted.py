"""A claimed run compared with trusted outputs: a reference file's (inferlab.grading.reference), those of a run
the grader trusts (the course's own run, made in the autograder or by the instructor: `grade --against`), or those
a replay recomputed on the grader's copy (inferlab.recheck.replay, with its arrays in memory). The one rule is
inferlab.recheck.agreement's: bit for bit under the same conditions, else within a declared tolerance.

What is compared, of what both sides hold (an output the run lacks is not compared: its items fail for it): the
specimen's pins (name, repository, revision, synthetic or not, every allowlisted file's size and SHA-256) and the
experiment's source hashes exactly, each difference by file; the prompts' ids exactly; greedy ids by the near-tie
rule of inferlab.measure.near_tie (at the first difference, a step whose top-two margin on either side is within
the rule's near-tie limit at its true top value, and whose runner-up is the other side's id, is a near-tie
divergence, noted with the step and both margins, and the ids after it are not compared; any other difference is
a contradiction, and so are top-two values beyond the rule at a step both computed from the same ids); seeded
sampling ids only when both drew them with the same torch (otherwise only mentioned); first-step
logits' top values within the rule; the matched prefixes' continuation, lengths, argmaxes and margins; the
batching calls' ids exactly; and every saved tensor: when the rule is exact by its SHA-256, a difference named by
its record and field and (with the trusted arrays) its first differing element, and otherwise, with the trusted
arrays at hand, element by element within the tolerance; a tensor of a record the run holds that the run does not
reference is a contradiction too. Each contradiction is an integrity problem of the claimed run. A trusted side
that holds only some of the three (a replay holds no experiment sources) is compared in those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from inferlab import protocol
from inferlab.measure import near_tie
from inferlab.measure.summaries import first_divergence
from inferlab.reading.deterministic import describe, deterministic_outputs, tensor_owner
from inferlab.reading.runview import RunView
from inferlab.recheck.agreement import Allowance, array_difference, nucleus_edge

SOURCE_PREFIXES = ("inferlab/", "experiments/")
SOURCE_FILES = ("conftest.py", "pytest.ini")
PROCESSED_SCORES = "first_step_scores"  # the saved tensor a sampling trial's filters acted on
RAW_LOGITS = "first_step_logits"  # the same trial's raw logits, before any filter


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


@dataclass
class Comparison:
    """What a run contradicts in a reference (integrity problems), what was only noted, and what was compared."""

    contradictions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compared: dict = field(default_factory=dict)
    diverged_prefixes: set = field(default_factory=set)  # prefix lengths past a near-tie divergence: not compared

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
    """Two outputs that must be equal: a difference is a contradiction naming both."""
    if ours != theirs:
        result.contradictions.append(f"{label}: {describe(ours)} in the run, {describe(theirs)} in the reference")


def _compare_pins(result: Comparison, run_pins: dict, ref_pins: dict) -> None:
    """The specimen's identity and files, where the run recorded them (a partial run that stopped before its
    specimen was verified has none: not compared, and its items fail for that)."""
    compared = 0
    for name in ("name", "repo_id", "revision", "synthetic", "weights_sha256"):
        if name not in ref_pins or (run_pins.get(name) is None and ref_pins.get(name) is not None):
            continue  # not held by the trusted side (a replay's copy knows no repository), or not recorded by the run
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


def _compare_ids(result: Comparison, label: str, ours: dict, theirs: dict, prompt_steps: _PromptSteps,
                 tolerance: dict) -> bool:
    """A greedy trial's ids by the near-tie rule (inferlab.measure.near_tie): equal, a near-tie divergence (a note
    with the step and both margins), or a contradiction naming the first differing step; top-two values beyond the
    tolerance at a compared step are a contradiction too."""
    ours_ids, theirs_ids = ours.get("ids") or [], theirs.get("ids") or []
    theirs_steps = prompt_steps.steps(theirs.get("prompt_id"), near_tie.steps_of(theirs), len(theirs_ids))
    found = near_tie.compare_greedy(ours_ids, theirs_ids, near_tie.steps_of(ours), theirs_steps, **tolerance)
    if found.value_problems:
        shown = found.value_problems[:near_tie.SHOWN_VALUE_PROBLEMS]
        more = len(found.value_problems) - len(shown)
        result.contradictions.append(f"{label}: top two raw logits beyond the tolerance at " + "; ".join(shown)
                                     + (f"; and {more} more" if more > 0 else ""))
    if found.status == "near_tie":
        result.notes.append(f"{label}: a near-tie divergence at step {found.step} ({found.margins_text()}, within the "
                            "tolerance's near-tie limit): not a contradiction; the ids after it are not compared")
    elif found.status == "differ":
        result.contradictions.append(
            f"{label}: ids first differ at step {found.step}: {describe(ours_ids)} in the run, {describe(theirs_ids)} "
            f"in the reference ({found.margins_text()}: " + ("not a near tie)" if found.theirs_margin is not None
                                                             else "the reference knows no margin at that step)"))
    return True


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
            if token in run_top and token in ref_top and not near_tie.within(a, b, **tolerance):
                bad.append(f"id {token}: {a:.6g} against {b:.6g}")
            elif token not in run_top and not (a >= b or near_tie.within(a, b, **tolerance)):
                bad.append(f"id {token} ({b:.6g} in the reference) is not among the run's top {len(run_top)}")
            elif token not in ref_top and not (b >= a or near_tie.within(a, b, **tolerance)):
                bad.append(f"id {token} ({a:.6g} in the run) is not among the reference's top {len(ref_top)}")
        if bad:
            result.contradictions.append(f"first-step logits {key}: beyond the tolerance: " + "; ".join(bad[:4]) +
                                         (f"; and {len(bad) - 4} more" if len(bad) > 4 else ""))
        elif tolerance["atol"] or tolerance["rtol"]:  # bit for bit, the saved tensors' comparison names it
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
    result.compared["prompts"] = len(set(run_prompts) & set(ref_prompts))
    # A seed's numbers are torch's generator's, so another torch may draw others; what transformers does before a
    # draw (temperature, top-p) is in the processed scores, compared as saved tensors. So a transformers version the
    # run records, which its author can write, does not switch this comparison off.
    same_torch = ours.get("torch_version") == theirs.get("torch_version")
    software = "" if ours.get("transformers_version") == theirs.get("transformers_version") else (
        f"; the run records transformers {ours.get('transformers_version')}, the reference "
        f"{theirs.get('transformers_version')}")
    counts = {"generation": 0, "sampled_not_compared": 0, "timing": 0, "cache_prefixes": 0, "batching": 0,
              "near_tie_divergences": 0}
    notes_before, same_anyway = len(result.notes), 0
    for trial_id, ref in (theirs.get("generation") or {}).items():
        run = (ours.get("generation") or {}).get(trial_id)
        if run is None:
            result.notes.append(f"generation {trial_id}: not in the run; not compared")
            continue
        if ref.get("sampled") and not same_torch:
            counts["sampled_not_compared"] += 1
            same_anyway += run.get("ids") == ref.get("ids")
            continue
        if ref.get("sampled"):
            counts["generation"] += 1
            if run.get("ids") != ref.get("ids"):
                step = first_divergence(run.get("ids") or [], ref.get("ids") or [])
                result.contradictions.append(f"generation {trial_id}: ids first differ at step {step}: "
                                             f"{describe(run.get('ids'))} in the run, {describe(ref.get('ids'))} in "
                                             f"the reference (seeded sampling under the same torch{software})")
            continue
        counts["generation"] += _compare_ids(result, f"generation {trial_id}", run, ref, prompt_steps, tolerance)
    if counts["sampled_not_compared"]:
        result.notes.append(
            f"{counts['sampled_not_compared']} seeded sampling trials not compared: the run drew them with torch "
            f"{ours.get('torch_version')}, the reference with torch {theirs.get('torch_version')} ({same_anyway} of "
            "them drew the same ids all the same)")
    for trial_id, ref in (theirs.get("timing") or {}).items():
        run = (ours.get("timing") or {}).get(trial_id)
        if run is not None:
            counts["timing"] += _compare_ids(result, f"timing {trial_id}", run, ref, prompt_steps, tolerance)
    run_cache, ref_cache = ours.get("cache") or {}, theirs.get("cache") or {}
    if ref_cache and run_cache:
        trial = cache_reference_trial()
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


def cache_reference_trial() -> Optional[str]:
    """The greedy trial whose first ids the matched-prefix comparison follows (protocol.CACHE_REFERENCE_TRIAL)."""
    return next((t.test_id for t in protocol.generation_trials()
                 if (t.prompt_id, t.condition, t.repetition) == protocol.CACHE_REFERENCE_TRIAL and not t.is_rerun),
                None)


def _compare_cache(result: Comparison, run_cache: dict, ref_cache: dict, prompt_steps: _PromptSteps,
                   tolerance: dict, counts: dict, steps: list) -> None:
    """The fixed continuation by the near-tie rule, then each prefix both hold: its argmaxes (unless the
    reference's uncached margin there is a near tie by its true top value) and its margin, within twice the
    tolerance at that top value; a prefix length the run holds alone is a contradiction. The prefixes after a
    near-tie divergence of the continuation from the ids the trusted prefixes were fed are not compared."""
    prompt_id = protocol.CACHE_REFERENCE_TRIAL[0]
    # each side's continuation with the steps of the trial it follows, as far as it goes
    ours, theirs = ({"ids": cache.get("continuation") or [], "prompt_id": prompt_id,
                     **{k: v[:len(cache.get("continuation") or [])] for k, v in side.items()}}
                    for cache, side in ((run_cache, steps[0]), (ref_cache, steps[1])))
    before = len(result.notes)
    _compare_ids(result, "cache continuation", ours, theirs, prompt_steps, tolerance)
    # The ids the trusted prefixes were fed: its own continuation, or (a replay's) the run's own.
    fed = ref_cache.get("fed", theirs["ids"])
    diverged = first_divergence(ours["ids"], fed) if len(result.notes) > before else None
    # Only a near tie in the trusted run's own margin lets the two runs feed other ids honestly from there on.
    trusted_steps = prompt_steps.steps(prompt_id, near_tie.steps_of(theirs), len(theirs["ids"])) or []
    honest_swap = diverged is not None and diverged < len(trusted_steps) and \
        trusted_steps[diverged].near_tie(**tolerance)
    run_prefixes = {p.get("prefix_length"): p for p in run_cache.get("prefixes") or []}
    prompt_length = min((p.get("prefix_length") for p in ref_cache.get("prefixes") or []
                         if isinstance(p.get("prefix_length"), int)), default=0)
    trusted_lengths = {p.get("prefix_length") for p in ref_cache.get("prefixes") or []}
    for length in sorted(set(run_prefixes) - trusted_lengths, key=str):
        if diverged is None or not isinstance(length, int) or length - prompt_length <= diverged:
            result.contradictions.append(f"cache prefix {length}: in the run only, not in the reference")
    for ref_prefix in ref_cache.get("prefixes") or []:
        length, run_prefix = ref_prefix.get("prefix_length"), run_prefixes.get(ref_prefix.get("prefix_length"))
        if run_prefix is None:
            continue
        if diverged is not None and isinstance(length, int) and length - prompt_length > diverged:
            if honest_swap:  # the two runs fed other ids from here: their saved logits differ too
                result.diverged_prefixes.add(length)
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
    if result.diverged_prefixes:
        result.notes.append(f"cache prefixes {', '.join(map(str, sorted(result.diverged_prefixes)))}: after the "
                            "continuation's near-tie divergence (a near tie in the reference's own margin) their "
                            "argmaxes, margins and saved tensors are not compared")


def _compare_tensors(result: Comparison, ours: dict, theirs: dict, view: RunView, trusted, rule: Allowance) -> None:
    """Every saved tensor both sides hold. Under the same conditions (the rule exact) by its SHA-256, a difference
    named, when the trusted arrays are at hand (`trusted`: anything with verified_tensor(reference), the trusted
    run's view or a replay's arrays), by its first differing element. Under other conditions, with the trusted
    arrays at hand, element by element within the rule's tolerance (b the trusted value), so a tensor edited away
    from its top values is still seen; a reference file holds hashes only, and its tensors are then not compared (a
    note says so). A matched prefix past a near-tie divergence is not compared: from there the two runs fed the
    model other ids."""
    compared = 0
    if trusted is None and not rule.exact:
        result.notes.append("saved tensors: the reference holds their hashes only, so under other conditions they "
                            "are not compared")
        result.compared["tensors"] = compared
        return
    left_out = {f"cache_comparison {length}" for length in result.diverged_prefixes}
    for label in sorted(set(ours) & set(theirs)):
        if " ".join(label.split(" ")[:2]) in left_out:
            continue
        if rule.exact and ours[label]["sha256"] == theirs[label]["sha256"]:
            compared += 1
            continue
        a = view.verified_tensor(ours[label]) if trusted is not None else None
        b = trusted.verified_tensor(theirs[label]) if trusted is not None else None
        where = f"saved tensor {label} ({ours[label]['file']}[{ours[label]['key']}])"
        if not rule.exact and b is None:
            result.notes.append(f"{where}: not compared (the reference's file does not match its record)")
            continue
        compared += 1
        if not rule.exact and a is None:
            result.contradictions.append(f"{where}: the run's file does not match its record, so it cannot agree "
                                         "with the reference")
        elif not rule.exact:
            found, moved = array_difference(a, b, rule), 0
            if label.endswith(PROCESSED_SCORES):
                raw = theirs.get(label[:-len(PROCESSED_SCORES)] + RAW_LOGITS)
                found, moved = _compare_scores(a, b, trusted.verified_tensor(raw) if raw is not None else None,
                                              label.split(" ")[1], rule)
            if moved:
                result.notes.append(f"{where}: {moved} token(s) at the top-p filter's line kept on one side only, as "
                                    "the rounding of other conditions can move it: not a contradiction")
            if found:
                result.contradictions.append(f"{where}: beyond the tolerance against the reference, {found}")
        else:
            named = f"; {array_difference(a, b, rule)}" if a is not None and b is not None else ""
            result.contradictions.append(f"{where}: sha256 {ours[label]['sha256'][:16]} in the run, "
                                         f"{theirs[label]['sha256'][:16]} in the reference, under the same "
                                         f"conditions{named}")
    result.compared["tensors"] = compared


def _unreferenced(result: Comparison, ours: dict, theirs: dict, view: RunView) -> None:
    """A tensor the trusted side holds, of a record the run holds too (completed), that the run's record does not
    reference: the record's figures (a cache comparison's max |a-b|, a batch row's difference) then rest on no
    tensor anyone can read, so it is a contradiction. A record the run lacks altogether is not one (its items fail
    for it), nor is a matched prefix past a near-tie divergence (from there the runs fed other ids)."""
    held = {tensor_owner(r) for r in view.records if r.get("status", "ok") == "ok"}
    left_out = {f"cache_comparison {length}" for length in result.diverged_prefixes}
    for label in sorted(set(theirs) - set(ours)):
        owner = label.rsplit(" ", 1)[0]
        if owner in held and owner not in left_out:
            result.contradictions.append(f"saved tensor {label}: the run's record references no saved tensor there, "
                                         "and the reference has one")


def _compare_scores(claimed, trusted_scores, trusted_logits, trial_id: str, rule: Allowance) -> tuple:
    """A trial's processed first-step scores against trusted ones, by the rule: scores are logits / temperature, so
    the absolute room is atol / temperature, and where the rule is not exact a token kept on one side only is
    judged by the trusted raw logits (agreement.nucleus_edge). (the first difference or None, tokens moved at
    top-p's line)."""
    condition = next((protocol.CONDITIONS[t.condition] for t in protocol.generation_trials() if t.test_id == trial_id),
                     None)
    temperature = (condition.temperature if condition is not None else None) or 1.0
    top_p = (condition.top_p if condition is not None else None) or 1.0
    scores_rule = Allowance(rule.atol / temperature, rule.rtol, rule.differing)
    a, b, moved = nucleus_edge(claimed, trusted_scores, trusted_logits, temperature, top_p, scores_rule)
    return array_difference(a, b, scores_rule), moved


def trusted_outputs(view: RunView) -> dict:
    """What a trusted run holds to compare a claimed one with: its specimen's pins, its experiment sources and its
    deterministic outputs (a reference file holds the same three)."""
    return {"specimen": pins(view), "sources": run_sources(view), "outputs": deterministic_outputs(view)}


def compare_trusted(view: RunView, trusted: dict, rule: Allowance, trusted_arrays=None,
                    theirs: str = "the reference") -> Comparison:
    """Every contradiction of the run with `trusted` by the rule, and what was only noted. trusted holds the
    specimen's pins, the experiment's sources and the deterministic outputs (trusted_outputs(), a reference file),
    or some of them (a replay's), and only what it holds is compared; trusted_arrays hands its tensors by their
    references (verified_tensor: the trusted run's view, a replay's arrays; None for a reference file's hashes);
    `theirs` names the trusted side in every line."""
    result = Comparison()
    tolerance = {"atol": rule.atol, "rtol": rule.rtol}
    if "specimen" in trusted:
        _compare_pins(result, pins(view), trusted["specimen"] or {})
    if "sources" in trusted:
        _compare_sources(result, run_sources(view), trusted["sources"] or {})
    if "outputs" in trusted:
        outputs, others = deterministic_outputs(view), trusted["outputs"] or {}
        _compare_outputs(result, outputs, others, tolerance)
        _unreferenced(result, outputs.get("tensors") or {}, others.get("tensors") or {}, view)
        _compare_tensors(result, outputs.get("tensors") or {}, others.get("tensors") or {}, view, trusted_arrays, rule)
    if theirs != "the reference":
        for lines in (result.contradictions, result.notes):
            lines[:] = [line.replace("the reference's", f"{theirs}'s").replace("the reference", theirs)
                        for line in lines]
    return result
