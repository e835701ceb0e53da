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

The checks live in small modules over one Recheck (this module): the protocol's constants (here), the timing
trials, their summaries and the clock (consistency_timing.py), the other records' own fields, summaries and
memory formulas (consistency_records.py), the tensors (consistency_tensors.py) and the decoded texts
(consistency_text.py).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any, Iterable, Optional

from inferlab import protocol
from inferlab.reading.deterministic import describe
from inferlab.run.plan import plan_totals
from inferlab.base.records import MANIFEST_FILE, PLAN_FILE

# Protocol entries that are prose, not constants: a rewording is no different protocol. The rule string of the
# declared tolerance is checked instead as the text of the recorded atol and rtol.
PROSE = ("timing_stopping_rule", "cache_tolerance.rule")
_TOLERANCE_TEXT = re.compile(r"^\|a-b\| <= (?P<atol>\S+) \+ (?P<rtol>\S+)\*\|b\| \(b = (?P<reference>.*)\)$")


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
    and rtol; a revised criterion (inferlab.measure.revised_criterion) is the learner's, declared beside it, and is left."""
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
