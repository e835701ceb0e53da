"""verify's consistency checks: every number a run derived is recomputed from what it was derived from, and the
protocol the run recorded must be this checkout's.

A learner can edit any record and re-hash the manifest, so hashes alone prove nothing about the numbers. What
an edit cannot escape without redoing the whole derivation is that derived numbers must agree with their
sources: a TTFT with its nanosecond stamps and with its prefill, a summary with its trials, the cache
comparison's statistics with the saved tensors, a decoded text with its ids. Each disagreement is one problem
line naming the record (kind, seq, the trial it belongs to, the field) and both values; a check that the run's
files do not allow (no tokenizer at hand, no stamp, a tensor that fails its hash) is said once in `not_checked`,
never passed in silence.

Recomputation uses the writer's own function on the writer's inputs (summaries.*, inferlab.measure.sizes) and compares
exactly; where the writer's arithmetic is float32 or float64 matters, it is redone that way (see the tensor
checks). A trial that failed or never ran is not recomputed: only what was completed is read.

The checks live in small modules over one Recheck (consistency_shared.py, with label, same and common_leaves):
the protocol's constants (here), the timing trials, their summaries and the clock (consistency_timing.py), the
other records' own fields, summaries and memory formulas (consistency_records.py), the tensors
(consistency_tensors.py) and the decoded texts (consistency_text.py).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any, Iterable, Optional

from inferlab import protocol
from inferlab.base.records import MANIFEST_FILE, PLAN_FILE
from inferlab.reading.deterministic import describe
from inferlab.run.plan import plan_totals
from inferlab.verify.consistency_shared import Recheck, common_leaves, label, same

# Protocol entries that are prose, not constants: a rewording is no different protocol. The rule string of the
# declared tolerance is checked instead as the text of the recorded atol and rtol.
PROSE = ("timing_stopping_rule", "cache_tolerance.rule")
_TOLERANCE_TEXT = re.compile(r"^\|a-b\| <= (?P<atol>\S+) \+ (?P<rtol>\S+)\*\|b\| \(b = (?P<reference>.*)\)$")


def tolerance_text(text: str) -> Optional[tuple[float, float, str]]:
    """(atol, rtol, reference) of a criterion written by protocol.Tolerance.describe, or None for other text."""
    match = _TOLERANCE_TEXT.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    try:
        return float(match["atol"]), float(match["rtol"]), match["reference"]
    except ValueError:
        return None


# --- the protocol the run recorded against this checkout's ---------------------------------------------


def check_protocol(recheck: Recheck) -> None:
    """manifest.json's and plan.json's protocol, the declared criterion and every record that restates a
    constant of the protocol, against this checkout's inferlab.protocol: a difference is a problem."""
    expected = protocol.as_dict()
    for file, data in ((MANIFEST_FILE, recheck.view.manifest), (PLAN_FILE, recheck.view.plan or {})):
        recorded = data.get("protocol")
        if not isinstance(recorded, dict):
            if data:
                recheck.not_checked(f"{file} protocol", "not recorded")
            continue
        _protocol_differences(recheck, file, recorded, expected)
    declared = {"atol": protocol.CACHE_TOLERANCE.atol, "rtol": protocol.CACHE_TOLERANCE.rtol,
                "near_tie_rule": protocol.NEAR_TIE_RULE, "logits_to_keep": protocol.LOGITS_TO_KEEP}
    for record in recheck.view.kind("cache_criterion") + recheck.view.kind("cache_summary"):
        for field, value in declared.items():
            if field in record and not same(record[field], value):
                _protocol_problem(recheck, label(record), field, record[field], value)
        if "near_tie_factor" in record and "near_tie_rule" not in record:
            # the flag of a diagnostic, not one of the protocol's constants: its near ties are recomputed by it
            recheck.not_checked(f"{label(record)} near_tie_factor", "the run judged near ties by an older rule "
                                f"(margin below {record['near_tie_factor']} x the observed difference), not by this "
                                "checkout's (within what the criterion lets the two top logits move)")
    for record in recheck.records:
        _criterion_texts(recheck, record)
    _generation_constants(recheck)
    _other_constants(recheck)
    plan = recheck.view.plan
    if plan is not None and isinstance(plan.get("schedule"), list) and isinstance(plan.get("totals"), dict):
        try:
            totals = plan_totals([e for e in plan["schedule"] if isinstance(e, dict)])
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            recheck.not_checked(f"{PLAN_FILE} totals", f"its schedule cannot be summed ({error})")
        else:
            for path, recorded, computed in common_leaves(plan["totals"], totals):
                if not same(recorded, computed):
                    recheck.checker.problem(f"inconsistent: {PLAN_FILE} totals.{path}: recorded {describe(recorded)}, "
                                            f"recomputed {describe(computed)} from its schedule's budgets")


def _protocol_problem(recheck: Recheck, where: str, path: str, recorded: Any, expected: Any) -> None:
    recheck.checker.problem(f"protocol: {where} {path}: recorded {describe(recorded)}, this checkout's "
                            f"inferlab.protocol has {describe(expected)}")


def _protocol_differences(recheck: Recheck, file: str, recorded: dict, expected: dict, path: str = "") -> None:
    for key in expected:
        inner = f"{path}.{key}" if path else key
        if inner in PROSE:
            continue
        if key not in recorded:
            recheck.not_checked(f"{file} protocol.{inner}", "not recorded (the run's protocol predates it)")
        elif isinstance(expected[key], dict) and isinstance(recorded[key], dict):
            _protocol_differences(recheck, file, recorded[key], expected[key], inner)
        elif not same(recorded[key], expected[key]):
            _protocol_problem(recheck, file, f"protocol.{inner}", recorded[key], expected[key])
    for key in recorded:
        if key not in expected:
            recheck.not_checked(f"{file} protocol.{path + '.' if path else ''}{key}",
                                "this checkout's protocol has no such entry")
    if path == "cache_tolerance" and "rule" in recorded:
        parsed = tolerance_text(recorded["rule"])
        if parsed is None or parsed[:2] != (recorded.get("atol"), recorded.get("rtol")):
            _protocol_problem(recheck, file, "protocol.cache_tolerance.rule", recorded["rule"],
                              protocol.CACHE_TOLERANCE.describe())


def _criterion_texts(recheck: Recheck, record: dict) -> None:
    """Every criterion text a record holds (rule, criterion, tolerance, at any depth) names the protocol's atol
    and rtol; a revised criterion (inferlab.measure.revised_criterion) is the learner's, declared beside it, and is
    left."""
    if record.get("kind") in ("cache_criterion_revised",):
        return
    for path, value in _texts(record):
        if path.split(".")[-1] not in ("rule", "criterion", "tolerance") or path.startswith("revised"):
            continue
        parsed = tolerance_text(value)
        if parsed is None:
            continue
        declared = protocol.CACHE_TOLERANCE.describe(parsed[2])
        if value != declared:
            _protocol_problem(recheck, label(record), path, value, declared)


def _texts(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _texts(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, str):
        yield path, value


def _generation_constants(recheck: Recheck) -> None:
    """Each generation trial's condition, seed, random resets and selection settings as the protocol has them."""
    trials = {t.test_id: t for t in protocol.generation_trials()}
    for record in recheck.completed("generation"):
        trial = trials.get(record.get("trial_id"))
        condition = protocol.CONDITIONS.get(record.get("condition"))
        if trial is None or condition is None:
            continue  # not a trial of the protocol: completeness says so
        where = label(record)
        controls = {k: v for k, v in asdict(condition).items() if k != "name"}
        for field, value in (("seed", trial.seed), ("condition_controls", controls)):
            if field in record and not same(record[field], value):
                _protocol_problem(recheck, where, field, record[field], value)
        config = record.get("generation_config")
        if isinstance(config, dict):
            settings = {**protocol.GENERATION_FIXED, **condition.generate_kwargs()}
            for field, value in settings.items():
                if field in config and not same(config[field], value):
                    _protocol_problem(recheck, where, f"generation_config.{field}", config[field], value)
        resets = record.get("rng_reset")
        if isinstance(resets, list):
            seeds = [r.get("seed") for r in resets if isinstance(r, dict)]
            if (condition.do_sample and (not seeds or any(s != trial.seed for s in seeds))) or \
                    (not condition.do_sample and resets):
                _protocol_problem(recheck, where, "rng_reset", resets,
                                  f"every generator reset with seed {trial.seed}" if condition.do_sample else [])


def _other_constants(recheck: Recheck) -> None:
    """The prompts as tokenized, the timing loop's length and logits_to_keep, the load options and thread counts."""
    prompts = {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}
    for record in recheck.view.kind("input"):
        if record.get("prompt_id") in prompts and "source" in record:
            if record["source"] != prompts[record["prompt_id"]]:
                _protocol_problem(recheck, label(record), "source", record["source"], prompts[record["prompt_id"]])
        if "add_special_tokens" in record and not same(record["add_special_tokens"], protocol.ADD_SPECIAL_TOKENS):
            _protocol_problem(recheck, label(record), "add_special_tokens", record["add_special_tokens"],
                              protocol.ADD_SPECIAL_TOKENS)
    for record in recheck.completed("timing_trial"):
        for field, value in (("new_tokens", protocol.TIMING_NEW_TOKENS), ("logits_to_keep", protocol.LOGITS_TO_KEEP)):
            if field in record and not same(record[field], value):
                _protocol_problem(recheck, label(record), field, record[field], value)
    controls = {"dtype": protocol.TORCH_DTYPE, "attn_implementation": protocol.ATTN_IMPLEMENTATION,
                "trust_remote_code": False, "use_safetensors": True, "local_files_only": True}
    for record in recheck.view.kind("model_load"):
        options = record.get("options") if isinstance(record.get("options"), dict) else {}
        for field, value in controls.items():
            if field in options and not same(options[field], value):
                _protocol_problem(recheck, label(record), f"options.{field}", options[field], value)
    threads = {"intra_op": protocol.INTRA_OP_THREADS, "inter_op": protocol.INTER_OP_THREADS}
    for record in recheck.view.kind("thread_controls"):
        if "requested" in record and not same(record["requested"], threads):
            _protocol_problem(recheck, label(record), "requested", record["requested"], threads)


# --- the whole walk ----------------------------------------------------------------------------------


def check_consistency(checker) -> None:
    """Every consistency check, in order: the protocol, the timing trials and the clock, the other records,
    the tensors, the decoded texts. Problems go to the checker; what could not be checked to checker.not_checked."""
    from inferlab.verify import consistency_records, consistency_tensors, consistency_text, consistency_timing

    recheck = Recheck(checker)
    families = (("protocol", check_protocol), ("timing", consistency_timing.check),
                ("records", consistency_records.check), ("tensor", consistency_tensors.check),
                ("decoded text", consistency_text.check))
    for name, check in families:
        try:
            check(recheck)
        except Exception as error:  # a record no writer of inferlab writes: said, and verify goes on
            checker.problem(f"inconsistent: the {name} consistency checks stopped at a record of a shape no "
                            f"inferlab writer makes ({type(error).__name__}: {error})")
    checker.not_checked.extend(recheck.not_checked_lines)
