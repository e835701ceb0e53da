"""Check a finished record directory, and compare two of them, from the files alone (no model, no torch).

verify(DIR) re-hashes every file against the manifest and checks that the records are complete
for the protocol: counts per kind, the schedule, the budgets, the tensor references, and that
every failure or gap has its evidence (a recorded failed, errored or skipped test with its
message). compare(DIR1, DIR2) reports; it does not judge.

A run that did not finish (interrupted, stopped early, killed) or that ran only part of the protocol
(-k, -m, one file) says so once: "unfinished: ..." and "partial: ...". The records such a run could
never have written (for tests it deselected, or never reached) are then not listed one by one; every
other problem (a hash, a seq gap, a record that contradicts its outcome) still is.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterable, Optional

from inferlab import protocol
from inferlab.records import MANIFEST_FILE, PLAN_FILE, RECORDS_FILE, REPORT_FILE, TENSOR_DIR, sha256_file
from inferlab.summaries import first_divergence

NON_PASSING = ("failed", "error", "skipped")
FAILED_STATUSES = ("failed", "error")  # a record saying so needs a non-passing outcome of its test
RECORD_BASE_FIELDS = ("kind", "test", "seq", "wall_time")

# The experiment tests that write each kind of record, by test function name. A missing record is
# explained only by a failed, errored or skipped outcome of one of its own producers, so an
# unrelated skip elsewhere in the same file cannot excuse it.
# The per-trial kinds (generation, timing_trial) are matched by their protocol test ids instead.
KIND_PRODUCERS = {
    "specimen": ("test_acquisition",),
    "artifact_acquisition": ("test_acquisition",),
    "artifact_file": ("test_artifact_file",),
    "model_load": ("test_model_load",),
    "model_inspection": ("test_model_inspection",),
    "thread_controls": ("test_thread_controls",),
    "input": ("test_input",),
    "first_step_logits_check": ("test_first_step_logits_do_not_depend_on_selection",),
    "sampling_summary": ("test_greedy_repetitions_identical",),
    "cache_criterion": ("test_cache_criterion_declared",),
    "cache_comparison": ("test_matched_prefix",),
    "cache_inspection": ("test_matched_prefix",),
    "cache_summary": ("test_matched_prefix",),
    "cache_divergence": ("test_cache_divergence",),
    "timing_summary": ("test_timing_summary",),
    "loop_vs_generate": ("test_loop_matches_generate",),
    "memory": ("test_parameter_storage", "test_cache_storage_after_prefill",
               "test_cache_storage_after_sixteen_tokens", "test_process_memory", "test_unmeasured_categories"),
    "batching": ("test_batching_calls",),
}


def function_name(nodeid: Optional[str]) -> Optional[str]:
    """The test function's name in a node id: 'experiments/test_40_cache.py::test_matched_prefix[x]' -> 'test_matched_prefix'."""
    if not nodeid or "::" not in nodeid:
        return None
    return nodeid.split("::")[-1].split("[")[0]


def _expected_input_prompts() -> list[str]:
    return list(dict.fromkeys([*protocol.PROMPTS, *protocol.TIMING_PROMPTS]))


def _timing_combinations() -> list[tuple[str, bool]]:
    return list(dict.fromkeys((t.prompt_id, t.use_cache) for t in protocol.timing_schedule()))


# --- small readers -------------------------------------------------------------------------


def bracket_id(nodeid: Optional[str]) -> Optional[str]:
    """The parametrize id of a node id, 'P1-S2-seed23' from 'x.py::test_g[P1-S2-seed23]'; None without one."""
    if not nodeid or not nodeid.endswith("]") or "[" not in nodeid:
        return None
    return nodeid[nodeid.index("[") + 1:-1]


def token_times_of(record: dict) -> Optional[list]:
    """A timing trial's selection times in seconds from t_start, whichever name the record uses."""
    for name in ("token_times", "token_times_s"):
        if isinstance(record.get(name), list):
            return record[name]
    return None


def tensor_references(value: Any, path: str = "") -> Iterable[tuple[str, dict]]:
    """Every {file, key, sha256, ...} tensor reference nested anywhere in a record, with its field path."""
    if isinstance(value, dict):
        if isinstance(value.get("file"), str) and isinstance(value.get("key"), str) and "sha256" in value:
            yield path or "(record)", value
        for name, inner in value.items():
            yield from tensor_references(inner, f"{path}.{name}" if path else name)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from tensor_references(inner, f"{path}[{index}]")


def read_tensor_file(path: Path) -> dict:
    """All tensors of a safetensors file as numpy arrays (numpy framework, so no torch import)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}


def tensor_sha256(array) -> str:
    """SHA-256 of a tensor's raw little-endian bytes, as inferlab.records.TensorStore hashes them."""
    import numpy

    data = numpy.ascontiguousarray(array)
    if data.dtype.byteorder == ">":
        data = data.byteswap().view(data.dtype.newbyteorder("<"))
    return hashlib.sha256(data.tobytes()).hexdigest()


# --- verify --------------------------------------------------------------------------------


class _Verifier:
    """Collects one line per problem while walking the record directory."""

    def __init__(self, record_dir: Path):
        self.dir = Path(record_dir)
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.records: list[dict] = []
        self.manifest: Optional[dict] = None
        self.plan: Optional[dict] = None
        self.files_checked = 0
        # How the session ended, from the records (set by read_ending): why tests are missing, if known.
        self.end: Optional[dict] = None  # the last session_end record
        self.unfinished: Optional[str] = None  # why the session did not reach its end
        self.partial: list[str] = []  # the plan's reasons for not being the complete protocol
        self.schedule: list[str] = []  # the planned node ids
        self.with_outcome: set = set()  # node ids with a test_outcome record
        self.unreached: set = set()  # planned tests without an outcome, in an unfinished session
        self.final_records_missing = False  # unfinished, and the manifest is still the one from the start
        self.suppressed = 0  # missing records and outcomes explained by the ending or the deselection

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def _read_json(self, path: Path, when_missing: str):
        """A JSON file's data, or None after recording why it could not be read."""
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.problem(f"{path}: {when_missing}")
        except (OSError, ValueError) as error:
            self.problem(f"{path}: not readable JSON ({error})")
        return None

    # 1) files against the manifest
    def check_manifest_and_files(self) -> None:
        if self.manifest is None:
            return
        if self.final_records_missing:  # said once, in the unfinished line
            return
        if self.manifest.get("exit_status") is None:
            self.problem(f"{MANIFEST_FILE}: exit_status is null, expected the session's exit status")
        listed = self.manifest.get("files")
        if not isinstance(listed, dict):
            self.problem(f"{MANIFEST_FILE}: no 'files' inventory (it is written at session end), so no file "
                         f"hash can be checked")
            return
        for relative, expected in sorted(listed.items()):
            target = self.dir / relative
            if not target.is_file():
                self.problem(f"{relative}: listed in the manifest but missing")
                continue
            self.files_checked += 1
            size = target.stat().st_size
            if size != expected.get("size"):
                self.problem(f"{relative}: size {size} bytes, manifest says {expected.get('size')}")
            digest = sha256_file(target)
            if digest != expected.get("sha256"):
                self.problem(f"{relative}: sha256 {digest}, manifest says {expected.get('sha256')} (file changed)")
        present = sorted(p.relative_to(self.dir).as_posix() for p in self.dir.rglob("*") if p.is_file())
        for relative in present:
            if relative != MANIFEST_FILE and relative not in listed:
                self.problem(f"{relative}: present but not listed in the manifest (added after the session)")

    # 2) records.jsonl itself
    def check_records_file(self) -> bool:
        path = self.dir / RECORDS_FILE
        try:
            raw = path.read_bytes()
        except OSError as error:
            self.problem(f"{path}: not readable ({error})")
            return False
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as error:
            self.problem(f"{RECORDS_FILE}: not ASCII as written ({error})")
            text = raw.decode("utf-8", errors="replace")
        ok = True
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                record = json.loads(line)
            except ValueError as error:
                self.problem(f"{RECORDS_FILE}:{number}: not a JSON object ({error})")
                ok = False
                continue
            if not isinstance(record, dict):
                self.problem(f"{RECORDS_FILE}:{number}: a {type(record).__name__}, expected a JSON object")
                ok = False
                continue
            absent = [name for name in RECORD_BASE_FIELDS if name not in record]
            if absent:
                self.problem(f"{RECORDS_FILE}:{number}: missing field(s) {', '.join(absent)}")
            self.records.append(record)
        seqs = [r.get("seq") for r in self.records]
        if seqs != list(range(len(seqs))):
            first = next((i for i, s in enumerate(seqs) if s != i), None)
            self.problem(f"{RECORDS_FILE}: seq is not 0..{len(seqs) - 1} in order; record {first + 1} has seq "
                         f"{seqs[first]!r}, expected {first}")
        return ok

    def of_kind(self, kind: str) -> list[dict]:
        return [r for r in self.records if r.get("kind") == kind]

    # 3) failures and their evidence
    def check_outcome_evidence(self) -> None:
        outcomes = self.of_kind("test_outcome")
        for record in outcomes:
            outcome, test = record.get("outcome"), record.get("test")
            if outcome in ("failed", "error") and not (record.get("longrepr") or "").strip():
                self.problem(f"{RECORDS_FILE} seq {record.get('seq')}: {test} {outcome} with no longrepr (no evidence)")
            if outcome == "skipped" and not (record.get("skip_reason") or "").strip():
                self.problem(f"{RECORDS_FILE} seq {record.get('seq')}: {test} skipped with no reason")
            if outcome not in ("passed", *NON_PASSING):
                self.problem(f"{RECORDS_FILE} seq {record.get('seq')}: {test} has outcome {outcome!r}, expected one of "
                             f"passed, failed, error, skipped")
        if self.manifest is not None and isinstance(self.manifest.get("outcome_counts"), dict) \
                and not self.final_records_missing:
            counted = dict(collections.Counter(r.get("outcome") for r in outcomes))
            if counted != self.manifest["outcome_counts"]:
                self.problem(f"{MANIFEST_FILE}: outcome_counts {self.manifest['outcome_counts']} but "
                             f"{RECORDS_FILE} holds {counted}")
        for record in self.records:
            status = record.get("status")
            if record.get("kind") == "test_outcome" or status not in FAILED_STATUSES:
                continue
            if self._non_passing(record.get("test")):
                continue
            if record.get("test") in self.unreached:
                # The session stopped inside this test (a Ctrl-C lands in the trial, which records its failure
                # and re-raises): the test has no outcome at all, which the ending explains. A passed outcome
                # would contradict the record, and is reported below.
                self.notes.append(f"{RECORDS_FILE} seq {record.get('seq')}: {record.get('kind')} status {status!r}: "
                                  f"its test {record.get('test')} was cut short ({self.unfinished}), so it has no "
                                  f"outcome")
                continue
            self.problem(f"{RECORDS_FILE} seq {record.get('seq')}: {record.get('kind')} has status {status!r} "
                         f"but its test {record.get('test')} has no non-passing outcome")

    def _non_passing(self, nodeid: Optional[str]) -> Optional[dict]:
        if nodeid is None:
            return None
        return next((r for r in self.of_kind("test_outcome")
                     if r.get("test") == nodeid and r.get("outcome") in NON_PASSING), None)

    def _non_passing_param(self, test_id: str) -> Optional[dict]:
        return next((r for r in self.of_kind("test_outcome")
                     if bracket_id(r.get("test")) == test_id and r.get("outcome") in NON_PASSING), None)

    def _non_passing_producer(self, test_names: tuple) -> Optional[dict]:
        return next((r for r in self.of_kind("test_outcome") if r.get("outcome") in NON_PASSING
                     and function_name(r.get("test")) in test_names), None)

    def _explain(self, what: str, evidence: Optional[dict]) -> None:
        if evidence is None:
            return
        self.notes.append(f"{what}: explained by {evidence.get('test')} {evidence.get('outcome')} "
                          f"(seq {evidence.get('seq')})")

    def require(self, what: str, producers: tuple) -> None:
        """A gap: a problem unless one of the record's producing tests has a recorded non-passing outcome,
        or none of them ran because the run left them out or never reached them."""
        evidence = self._non_passing_producer(producers)
        if evidence is not None:
            self._explain(what, evidence)
            return
        why = self._why_never_run(lambda nodeid: function_name(nodeid) in producers)
        if why is not None:
            self._suppress(what, why)
            return
        self.problem(f"{what}, and none of its producing tests ({', '.join(producers)}) has a failed, error or "
                     f"skipped outcome")

    def _why_never_run(self, matches) -> Optional[str]:
        """Why no test that `matches` (a node id predicate) ran, when the records say why; else None.

        Deselected: none is in the plan, and the plan says it is partial. Not reached: each one is planned
        and has no outcome, in a session that was interrupted, stopped early or killed.
        """
        scheduled = [nodeid for nodeid in self.schedule if matches(nodeid)]
        if any(nodeid in self.with_outcome for nodeid in scheduled):
            return None  # one of them ran: a missing record needs its own evidence
        if scheduled:
            if self.unfinished and all(nodeid in self.unreached for nodeid in scheduled):
                return f"not reached ({self.unfinished})"
            return None
        return "deselected (partial run)" if self.partial else None

    def _suppress(self, what: str, why: str) -> None:
        self.suppressed += 1
        self.notes.append(f"{what}: {why}")

    # 0) how the session ended, read before anything is judged
    def read_ending(self) -> None:
        """What the records say about the session's end and the plan: which missing tests are explained."""
        ends = self.of_kind("session_end")
        self.end = ends[-1] if ends else None
        self.plan = self._read_json(self.dir / PLAN_FILE, "missing")
        self.schedule = [entry.get("test") for entry in (self.plan or {}).get("schedule") or []
                         if isinstance(entry, dict)] if isinstance(self.plan, dict) else []
        self.with_outcome = {r.get("test") for r in self.of_kind("test_outcome")}
        plan = self.plan if isinstance(self.plan, dict) else {}
        # A plan written before partial_reasons existed falls short by what its totals say, nothing more.
        reasons = plan["partial_reasons"] if "partial_reasons" in plan else protocol.shortfalls(plan.get("totals") or {})
        self.partial = [str(reason) for reason in reasons or []]
        if self.end is None:
            self.unfinished = "no session_end record: the session never reached its end (it was killed or crashed)"
        elif self.end.get("collect_only"):
            self.unfinished = "collect only (--co): no test ran"
        elif self.end.get("interrupted") or self.end.get("stopped_early"):
            self.unfinished = str(self.end.get("stop_reason") or "stopped before its end")
        if self.unfinished:
            self.unreached = {nodeid for nodeid in self.schedule if nodeid not in self.with_outcome}
        manifest = self.manifest if isinstance(self.manifest, dict) else None
        self.final_records_missing = bool(self.unfinished and manifest is not None
                                          and manifest.get("session_end") is None and "files" not in manifest)

    def report_ending(self) -> None:
        """The one line for an unfinished run and the one line for a partial plan (both problems), put first."""
        found_so_far, self.problems = self.problems, []
        if self.unfinished:
            line = f"unfinished: {self.unfinished}"
            if self.schedule and not (self.end or {}).get("collect_only"):
                first = next((n for n in self.schedule if n in self.unreached), None)
                line += f"; {len(self.unreached)} of {len(self.schedule)} planned tests have no outcome" + \
                    (f" (the first: {first})" if first else "")
            if self.final_records_missing:
                line += (f"; its manifest is the one written when the run began (complete is "
                         f"{self.manifest.get('complete')!r}, no file inventory), so no file hash can be checked")
            self.problem(line)
        if self.partial:
            more = len(self.partial) - 1
            self.problem(f"partial: {self.partial[0]}" + (f" (and {more} more shortfall(s): {PLAN_FILE} "
                                                            f"partial_reasons)" if more else ""))
        self.problems += found_so_far

    # 4) the plan
    def check_plan(self) -> None:
        if len(self.of_kind("plan")) != 1:
            self.problem(f"{RECORDS_FILE}: {len(self.of_kind('plan'))} plan record(s), expected exactly 1")
        if self.plan is None:
            return
        totals = self.plan.get("totals") or {}
        for violation in protocol.cap_violations(totals):
            self.problem(f"{PLAN_FILE}: {violation}")
        # The totals are rechecked here: a shortfall the plan does not name is a plan that hides one.
        for reason in protocol.shortfalls(totals):
            if reason not in self.partial:
                self.problem(f"{PLAN_FILE}: not the complete protocol: {reason}, and its partial_reasons do not "
                             f"say so")
        schedule = self.plan.get("schedule") or []
        for entry in schedule:
            if entry.get("test") in self.unreached:
                self.suppressed += 1
            elif entry.get("test") not in self.with_outcome:
                self.problem(f"{PLAN_FILE}: planned test {entry.get('test')} has no recorded outcome")
        planned = [bracket_id(e.get("test")) for e in schedule]
        expected_generation = [t.test_id for t in protocol.generation_trials()]
        expected_timing = [t.test_id for t in protocol.timing_schedule()]
        for name, expected in (("generation", expected_generation), ("timing", expected_timing)):
            order = [p for p in planned if p in expected]
            if order != [p for p in expected if p in order]:
                self.problem(f"{PLAN_FILE}: {name} trials are not in protocol order: {order}")
        # the tests ran in the plan's order
        plan_index = {e.get("test"): i for i, e in enumerate(schedule)}
        run_order = [plan_index[r["test"]] for r in self.of_kind("test_outcome") if r.get("test") in plan_index]
        first_seen = list(dict.fromkeys(run_order))
        if first_seen != sorted(first_seen):
            self.problem(f"{RECORDS_FILE}: tests did not run in the order of {PLAN_FILE}")

    # 4b) how the session ended
    def check_session_end(self) -> None:
        """The session_end record against the records; how it ended is said once, by report_ending."""
        ends = self.of_kind("session_end")
        if not ends:
            return
        if len(ends) > 1:
            self.problem(f"{RECORDS_FILE}: {len(ends)} session_end records, expected exactly 1")
        end = ends[-1]
        if end.get("plan_only"):
            self.problem(f"{RECORDS_FILE}: session_end says this is a plan, but the records hold test outcomes")
        interrupted_as_said = end.get("interrupted") and end.get("exit_code_name") == "INTERRUPTED"
        if end.get("exit_code_name") not in ("OK", "TESTS_FAILED") and not interrupted_as_said:
            self.problem(f"session_end: exit status {end.get('exit_status')} ({end.get('exit_code_name')})")
        missing = end.get("tests_without_outcome") or []
        if missing and not self.unfinished:
            self.problem(f"session_end: {len(missing)} planned test(s) have no outcome, e.g. {missing[0]}")
        if self.plan is not None and set(missing) != {n for n in self.schedule if n not in self.with_outcome}:
            actual = sum(1 for n in self.schedule if n not in self.with_outcome)
            self.problem(f"session_end: tests_without_outcome lists {len(missing)} test(s), but {PLAN_FILE} and "
                         f"the test_outcome records leave {actual} planned test(s) without an outcome")
        if self.manifest is not None and self.manifest.get("complete") != end.get("complete") \
                and not self.final_records_missing:
            self.problem(f"{MANIFEST_FILE}: complete is {self.manifest.get('complete')!r} but session_end says "
                         f"{end.get('complete')!r}")

    # 5) counts per kind
    def check_kinds(self) -> None:
        def at_least_one(kind):
            if not self.of_kind(kind):
                self.require(f"no {kind} record", KIND_PRODUCERS[kind])

        for kind in ("specimen", "artifact_acquisition", "model_load", "model_inspection", "thread_controls",
                     "first_step_logits_check", "sampling_summary", "cache_criterion", "cache_inspection",
                     "cache_divergence", "loop_vs_generate", "memory"):
            at_least_one(kind)

        files = self.of_kind("artifact_file")
        names = [r.get("name") for r in files]
        if sorted(names) != sorted(protocol.ALLOWLISTED_FILES):
            self.require(f"artifact_file records for {sorted(names)}, expected exactly "
                         f"{sorted(protocol.ALLOWLISTED_FILES)}", KIND_PRODUCERS["artifact_file"])

        inputs = {r.get("prompt_id") for r in self.of_kind("input")}
        for prompt_id in _expected_input_prompts():
            if prompt_id not in inputs:
                self.require(f"no input record for {prompt_id}", KIND_PRODUCERS["input"])

        comparisons = self.of_kind("cache_comparison")
        lengths = [r.get("prefix_length") for r in comparisons]
        if not comparisons:
            self.require("no cache_comparison record", KIND_PRODUCERS["cache_comparison"])
        elif len(comparisons) > protocol.CACHE_MAX_TARGET_TOKENS:
            self.problem(f"{len(comparisons)} cache_comparison records, expected 1..{protocol.CACHE_MAX_TARGET_TOKENS}")
        elif not all(isinstance(n, int) for n in lengths) or \
                lengths != list(range(lengths[0], lengths[0] + len(lengths))):
            self.problem(f"cache_comparison prefix lengths {lengths}, expected consecutive integers")
        criteria = self.of_kind("cache_criterion")
        if criteria and comparisons and min(r["seq"] for r in criteria) > min(r["seq"] for r in comparisons):
            self.problem("cache_criterion was recorded after the first cache_comparison; it must be declared first")
        summaries = self.of_kind("cache_summary")
        if len(summaries) != 1:
            if summaries:
                self.problem(f"{len(summaries)} cache_summary records, expected 1")
            else:
                self.require("no cache_summary record", KIND_PRODUCERS["cache_summary"])

        present = collections.Counter((r.get("prompt_id"), r.get("use_cache")) for r in self.of_kind("timing_summary"))
        for combination in _timing_combinations():
            if present[combination] > 1:
                self.problem(f"{present[combination]} timing_summary records for {combination}, expected 1")
            elif not present[combination]:
                self.require(f"no timing_summary for prompt {combination[0]} use_cache={combination[1]}",
                             KIND_PRODUCERS["timing_summary"])
        extra = set(present) - set(_timing_combinations())
        if extra:
            self.problem(f"timing_summary records for unknown combinations {sorted(map(str, extra))}")

    # 6) the generation matrix
    def check_generation(self) -> None:
        trials = protocol.generation_trials()
        key_to_index = {(t.prompt_id, t.condition, t.seed, t.repetition): t.index for t in trials}
        seen: dict[int, list[dict]] = collections.defaultdict(list)
        order = []
        new_tokens = 0
        for record in self.of_kind("generation"):
            key = (record.get("prompt_id"), record.get("condition"), record.get("seed"), record.get("repetition"))
            index = key_to_index.get(key)
            if index is None:
                self.problem(f"generation seq {record.get('seq')}: {key} is not a trial of the protocol")
                continue
            seen[index].append(record)
            order.append(index)
            if record.get("status") != "ok":
                self._check_failed_trial("generation", trials[index].test_id, record)
                continue
            ids = record.get("generated_ids")
            length = record.get("generated_length")
            if isinstance(ids, list) and isinstance(length, int) and len(ids) != length:
                self.problem(f"generation {trials[index].test_id}: generated_length {length} but {len(ids)} ids")
            count = len(ids) if isinstance(ids, list) else (length or 0)
            new_tokens += count
            if count > protocol.MAX_NEW_TOKENS:
                self.problem(f"generation {trials[index].test_id}: {count} new tokens, the budget is "
                             f"{protocol.MAX_NEW_TOKENS}")
            config = record.get("generation_config")
            if isinstance(config, dict) and config.get("max_new_tokens") not in (None, protocol.MAX_NEW_TOKENS):
                self.problem(f"generation {trials[index].test_id}: max_new_tokens {config.get('max_new_tokens')}, "
                             f"expected {protocol.MAX_NEW_TOKENS}")
        if order != sorted(order):
            self.problem(f"generation records are not in protocol order: trial indices {order}")
        for trial in trials:
            self._one_record_per_trial("generation", trial.test_id, seen[trial.index])
        if new_tokens > protocol.CAPS["generation_new_tokens"]:
            self.problem(f"generation: {new_tokens} new tokens in all, cap {protocol.CAPS['generation_new_tokens']}")

    def _one_record_per_trial(self, kind: str, test_id: str, found: list) -> None:
        """Exactly one record per planned trial (none regenerated); a missing one needs a non-passing outcome."""
        if len(found) > 1:
            self.problem(f"{kind} {test_id}: {len(found)} records, expected 1 (no trial is regenerated)")
        elif not found:
            evidence = self._non_passing_param(test_id)
            why = None if evidence else self._why_never_run(lambda nodeid: bracket_id(nodeid) == test_id)
            if evidence is not None:
                self._explain(f"{kind} {test_id} missing", evidence)
            elif why is not None:
                self._suppress(f"{kind} {test_id} missing", why)
            else:
                self.problem(f"{kind} {test_id}: no record and no failed, error or skipped outcome "
                             f"for a test with id [{test_id}]")

    def _check_failed_trial(self, kind: str, test_id: str, record: dict) -> None:
        """A trial recorded as failed must carry its error and a failed or errored test outcome."""
        if not record.get("error"):
            self.problem(f"{kind} {test_id}: status {record.get('status')!r} without an error message")
        evidence = self._non_passing_param(test_id)
        if evidence is not None:
            self._explain(f"{kind} {test_id} failed", evidence)
        elif record.get("test") in self.unreached:  # cut short by the ending; see check_outcome_evidence
            self.notes.append(f"{kind} {test_id} failed: its test was cut short ({self.unfinished})")
        else:
            self.problem(f"{kind} {test_id}: status {record.get('status')!r} but no failed or errored test outcome")

    # 7) the timing schedule
    def check_timing(self) -> None:
        schedule = protocol.timing_schedule()
        seen: dict[int, list[dict]] = collections.defaultdict(list)
        order = []
        selections = 0
        for record in self.of_kind("timing_trial"):
            index = record.get("schedule_index")
            if not isinstance(index, int) or not 0 <= index < len(schedule):
                self.problem(f"timing_trial seq {record.get('seq')}: schedule_index {index!r} is not in the "
                             f"schedule (0..{len(schedule) - 1})")
                continue
            planned = schedule[index]
            seen[index].append(record)
            order.append(index)
            actual = (record.get("prompt_id"), record.get("use_cache"), record.get("warmup"))
            expected = (planned.prompt_id, planned.use_cache, planned.warmup)
            if actual != expected:
                self.problem(f"timing_trial {planned.test_id}: (prompt_id, use_cache, warmup) = {actual}, the "
                             f"schedule says {expected}")
            if record.get("status") != "ok":
                self._check_failed_trial("timing_trial", planned.test_id, record)
                continue
            ids = record.get("generated_ids")
            selections += len(ids) if isinstance(ids, list) else 0
            if not isinstance(ids, list) or len(ids) != protocol.TIMING_NEW_TOKENS:
                self.problem(f"timing_trial {planned.test_id}: {len(ids) if isinstance(ids, list) else 'no'} "
                             f"generated ids, expected {protocol.TIMING_NEW_TOKENS}")
            times = token_times_of(record)
            if not isinstance(times, list) or len(times) != protocol.TIMING_NEW_TOKENS:
                self.problem(f"timing_trial {planned.test_id}: {len(times) if isinstance(times, list) else 'no'} "
                             f"token times, expected {protocol.TIMING_NEW_TOKENS}")
            elif any(not isinstance(t, (int, float)) for t in times) or any(b < a for a, b in zip(times, times[1:])) \
                    or times[0] < 0:
                self.problem(f"timing_trial {planned.test_id}: token times are not non-negative and non-decreasing")
        if order != sorted(order):
            self.problem(f"timing_trial records are not in schedule order: schedule indices {order}")
        for planned in schedule:
            self._one_record_per_trial("timing_trial", planned.test_id, seen[planned.schedule_index])
        if selections > protocol.CAPS["timing_selections"]:
            self.problem(f"timing: {selections} selections in all, cap {protocol.CAPS['timing_selections']}")

    # 8) other budgets
    def check_budgets(self) -> None:
        for record in self.of_kind("cache_summary"):
            forwards = record.get("forward_count")
            if isinstance(forwards, int) and forwards > protocol.CAPS["cache_forwards"]:
                self.problem(f"cache_summary: {forwards} forwards, cap {protocol.CAPS['cache_forwards']}")
            expected = record.get("forward_count_expected")
            if isinstance(forwards, int) and isinstance(expected, int) and forwards != expected:
                self.problem(f"cache_summary: {forwards} forwards counted, expected {expected} (2m)")
        calls = [r for r in self.of_kind("batching") if r.get("record_type") == "call"
                 or ("record_type" not in r and r.get("call_index") is not None)]
        if len(calls) > protocol.CAPS["batching_calls"]:
            self.problem(f"batching: {len(calls)} generate calls, cap {protocol.CAPS['batching_calls']}")

    # 9) the report exists and was written without error
    def check_report(self) -> None:
        if not (self.dir / REPORT_FILE).is_file() and not self.final_records_missing:
            self.problem(f"{REPORT_FILE}: missing (it is written at session end, also after failures)")
        for record in self.of_kind("report_error"):
            self.problem(f"{REPORT_FILE}: the session could not write it (seq {record.get('seq')}): "
                         f"{record.get('error')}")

    # 10) tensors
    def check_tensors(self) -> None:
        loaded: dict[str, Optional[dict]] = {}
        for record in self.records:
            for field_path, ref in tensor_references(record):
                where = f"{record.get('kind')} seq {record.get('seq')} {field_path}"
                relative = ref["file"]
                if relative not in loaded:
                    target = self.dir / relative
                    if not target.is_file():
                        loaded[relative] = None
                    else:
                        try:
                            loaded[relative] = read_tensor_file(target)
                        except Exception as error:  # any unreadable file is a problem line, not a crash
                            self.problem(f"{relative}: not a readable safetensors file "
                                         f"({type(error).__name__}: {error})")
                            loaded[relative] = {}
                tensors = loaded[relative]
                if tensors is None:
                    self.problem(f"{where}: tensor file {relative} is missing")
                    continue
                if ref["key"] not in tensors:
                    if tensors:
                        self.problem(f"{where}: key {ref['key']!r} not in {relative}")
                    continue
                array = tensors[ref["key"]]
                if "shape" in ref and list(array.shape) != list(ref["shape"]):
                    self.problem(f"{where}: {relative}[{ref['key']}] has shape {list(array.shape)}, record says "
                                 f"{ref['shape']}")
                digest = tensor_sha256(array)
                if digest != ref["sha256"]:
                    self.problem(f"{where}: {relative}[{ref['key']}] sha256 {digest}, record says {ref['sha256']}")

    # a plan folder: a schedule, and nothing that ran
    def is_plan_folder(self) -> bool:
        if self.manifest is not None and self.manifest.get("mode") == "plan":
            return True
        return any(r.get("plan_only") for r in self.of_kind("session_end")) or \
            any(r.get("mode") == "plan" for r in self.of_kind("plan"))

    def check_plan_folder(self) -> None:
        self.plan = self._read_json(self.dir / PLAN_FILE, "missing")
        if len(self.of_kind("plan")) != 1:
            self.problem(f"{RECORDS_FILE}: {len(self.of_kind('plan'))} plan record(s), expected exactly 1")
        ends = self.of_kind("session_end")
        if len(ends) != 1:
            self.problem(f"{RECORDS_FILE}: {len(ends)} session_end record(s), expected exactly 1"
                         + (" (the plan was never finished)" if not ends else ""))
        elif not ends[0].get("plan_only"):
            self.problem("session_end: plan_only is not true in a folder whose manifest says it is a plan")
        ran = [r for r in self.records if r.get("kind") not in ("plan", "session_end")]
        if ran:
            self.problem(f"{RECORDS_FILE}: a plan folder holds {len(ran)} record(s) besides the plan, e.g. "
                         f"{ran[0].get('kind')!r} (seq {ran[0].get('seq')})")
        if self.plan is not None:
            for violation in protocol.cap_violations(self.plan.get("totals") or {}):
                self.problem(f"{PLAN_FILE}: {violation}")

    def run(self) -> dict:
        self.manifest = self._read_json(self.dir / MANIFEST_FILE, "missing; no file can be checked against it")
        readable = self.check_records_file() or bool(self.records)
        plan_folder = readable and self.is_plan_folder()
        if plan_folder:
            self.check_manifest_and_files()
            self.check_plan_folder()
            return self.result(plan_folder=True)
        if readable:
            self.read_ending()
            self.report_ending()
        self.check_manifest_and_files()
        explained = self.unfinished or (self.partial and self.end is not None and self.end.get("complete") is False)
        if self.manifest is not None and self.manifest.get("complete") is not True and not explained:
            self.problem(f"{MANIFEST_FILE}: complete is {self.manifest.get('complete')!r}, expected true "
                         f"(the session did not finish, was interrupted, or is not the complete protocol: "
                         f"{self.manifest.get('status', 'no status recorded')})")
        if readable:
            self.check_outcome_evidence()
            self.check_plan()
            self.check_session_end()
            self.check_kinds()
            self.check_generation()
            self.check_timing()
            self.check_budgets()
            self.check_report()
            self.check_tensors()
        return self.result(plan_folder=False)

    def result(self, plan_folder: bool) -> dict:
        outcomes = collections.Counter(r.get("outcome") for r in self.of_kind("test_outcome"))
        return {
            "record_dir": str(self.dir),
            "plan_folder": plan_folder,
            "planned_tests": len((self.plan or {}).get("schedule") or []),
            "ok": not self.problems,
            "problems": list(self.problems),
            "explained_gaps": list(self.notes),
            "unfinished": self.unfinished,
            "partial": list(self.partial),
            "not_listed": self.suppressed,
            "records": len(self.records),
            "files_checked": self.files_checked,
            "outcome_counts": dict(sorted(outcomes.items())),
            "all_tests_passed": bool(outcomes) and set(outcomes) == {"passed"},
        }


def verify(record_dir: Path) -> dict:
    """Check a record dir: {ok, problems: [one line each], explained_gaps, records, files_checked, outcome_counts,
    all_tests_passed}."""
    return _Verifier(Path(record_dir)).run()


# --- compare -------------------------------------------------------------------------------


def _load_for_compare(record_dir: Path) -> dict:
    """Records and manifest of a dir; raises ValueError naming the file when either is unreadable."""
    from inferlab.records import read_records

    record_dir = Path(record_dir)
    if not (record_dir / RECORDS_FILE).is_file():
        raise ValueError(f"{record_dir / RECORDS_FILE}: missing")
    records = read_records(record_dir)
    try:
        manifest = json.loads((record_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        manifest = {}
    except ValueError as error:
        raise ValueError(f"{record_dir / MANIFEST_FILE}: not readable JSON ({error})") from None
    return {"dir": record_dir, "records": records, "manifest": manifest}


def _id_agreement(rows_a: dict, rows_b: dict, order: list) -> list[dict]:
    result = []
    for key, label in order:
        a, b = rows_a.get(key), rows_b.get(key)
        ids_a = a.get("generated_ids") if a else None
        ids_b = b.get("generated_ids") if b else None
        if a is None or b is None or ids_a is None or ids_b is None:
            status = "missing in " + " and ".join(n for n, r in (("DIR1", ids_a), ("DIR2", ids_b)) if r is None)
            result.append({"trial": label, "equal": None, "first_difference": None, "status": status})
            continue
        difference = first_divergence(ids_a, ids_b)
        result.append({"trial": label, "equal": difference is None, "first_difference": difference,
                       "status": "equal" if difference is None else f"differ from index {difference}"})
    return result


def _tensor_files(record_dir: Path) -> list[str]:
    folder = record_dir / TENSOR_DIR
    return sorted(p.relative_to(record_dir).as_posix() for p in folder.glob("*.safetensors")) if folder.is_dir() else []


def _tensor_agreement(dir_a: Path, dir_b: Path) -> list[dict]:
    import numpy

    rows = []
    for relative in sorted(set(_tensor_files(dir_a)) | set(_tensor_files(dir_b))):
        loaded, unreadable = [], []
        for name, folder in (("DIR1", dir_a), ("DIR2", dir_b)):
            try:
                loaded.append(read_tensor_file(folder / relative) if (folder / relative).is_file() else {})
            except Exception as error:  # reported as a row, not raised: compare reports
                loaded.append({})
                unreadable.append(f"{name}: {type(error).__name__}: {error}")
        if unreadable:
            rows.append({"file": relative, "key": "*", "max_abs_diff": None, "bitwise_equal": None,
                         "status": "unreadable in " + "; ".join(unreadable)})
        a, b = loaded
        for key in sorted(set(a) | set(b)):
            row = {"file": relative, "key": key, "max_abs_diff": None, "bitwise_equal": None}
            if key not in a or key not in b:
                row["status"] = "missing in " + ("DIR1" if key not in a else "DIR2")
            elif a[key].shape != b[key].shape:
                row["status"] = f"shapes differ {list(a[key].shape)} vs {list(b[key].shape)}"
            else:
                x, y = a[key].astype(numpy.float64), b[key].astype(numpy.float64)
                with numpy.errstate(invalid="ignore"):
                    # equal values (the same infinity included, e.g. a filtered -inf score) differ by 0
                    diff = numpy.where(x == y, 0.0, numpy.abs(x - y))
                row["max_abs_diff"] = float(numpy.nanmax(diff)) if diff.size and not numpy.isnan(diff).all() else \
                    (0.0 if not diff.size else float("nan"))
                row["nan_entries"] = int(numpy.isnan(diff).sum())
                row["bitwise_equal"] = a[key].tobytes() == b[key].tobytes()
                row["status"] = "bitwise equal" if row["bitwise_equal"] else "differ"
                if row["nan_entries"]:
                    row["status"] += f" ({row['nan_entries']} NaN entries left out of the max)"
            rows.append(row)
    return rows


TIMING_METRICS = ("prefill_s", "ttft_s", "mean_post_first_interval_s", "loop_s")


def _timing_medians(records: list[dict]) -> dict:
    """Per (prompt, use_cache): the median of each metric over the measured (non-warmup) trials."""
    from inferlab.summaries import mean_post_first_interval, median_min_max

    values: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    for record in records:
        if record.get("kind") != "timing_trial" or record.get("warmup"):
            continue
        key = (record.get("prompt_id"), record.get("use_cache"))
        for metric in TIMING_METRICS:
            value = record.get(metric)
            if value is None and metric == "mean_post_first_interval_s":
                times = token_times_of(record)
                value = mean_post_first_interval(times) if times and len(times) > 1 else None
            if isinstance(value, (int, float)):
                values[key][metric].append(value)
    return {key: {m: median_min_max(v)["median"] for m, v in metrics.items() if v} for key, metrics in values.items()}


def _environment_differences(manifest_a: dict, manifest_b: dict) -> list[dict]:
    rows = []

    def add(section, name, a, b):
        if a != b:
            rows.append({"section": section, "name": name, "dir1": a, "dir2": b})

    for section in ("platform", "distributions", "thread_environment", "git"):
        a, b = manifest_a.get(section) or {}, manifest_b.get(section) or {}
        for name in sorted(set(a) | set(b)):
            add(section, name, a.get(name), b.get(name))
    for name in ("specimen", "requirements_lock_sha256", "deviations_from_reference"):
        add("manifest", name, manifest_a.get(name), manifest_b.get(name))
    return rows


def _artifact_rows(records: list[dict]) -> dict:
    """name -> the last artifact_file record's {sha256, size} (what the run verified, or found wrong)."""
    return {r.get("name"): {"sha256": r.get("sha256"), "size": r.get("size")}
            for r in records if r.get("kind") == "artifact_file"}


def _artifact_differences(records_a: list[dict], records_b: list[dict]) -> list[dict]:
    """Every artifact file of either run, with its hash and size in each and whether they are the same."""
    a, b = _artifact_rows(records_a), _artifact_rows(records_b)
    names = list(dict.fromkeys([*protocol.ALLOWLISTED_FILES, *sorted(n for n in {*a, *b} if n is not None)]))
    rows = []
    for name in names:
        x, y = a.get(name), b.get(name)
        if x is None and y is None:
            status = "no artifact_file record in either dir"
        elif x is None or y is None:
            status = "missing in " + ("DIR1" if x is None else "DIR2")
        elif x == y:
            status = "equal"
        else:
            status = "differ"
        rows.append({"file": name, "dir1": x, "dir2": y, "equal": status == "equal", "status": status})
    methods = [next((r.get("acquisition") for r in reversed(records) if r.get("kind") == "artifact_acquisition"),
                    None) for records in (records_a, records_b)]
    if methods[0] != methods[1]:
        rows.append({"file": "(acquisition)", "dir1": methods[0], "dir2": methods[1], "equal": False,
                     "status": "differ"})
    return rows


def compare(dir_a: Path, dir_b: Path) -> dict:
    """Compare two record dirs: {generation, timing_ids, tensors, timing_ratios, environment} rows (reports only)."""
    a, b = _load_for_compare(Path(dir_a)), _load_for_compare(Path(dir_b))

    def generation_rows(run):
        return {(r.get("prompt_id"), r.get("condition"), r.get("seed"), r.get("repetition")): r
                for r in run["records"] if r.get("kind") == "generation"}

    def timing_rows(run):
        return {r.get("schedule_index"): r for r in run["records"] if r.get("kind") == "timing_trial"}

    generation_order = [((t.prompt_id, t.condition, t.seed, t.repetition), t.test_id)
                        for t in protocol.generation_trials()]
    timing_order = [(t.schedule_index, t.test_id) for t in protocol.timing_schedule()]
    medians_a, medians_b = _timing_medians(a["records"]), _timing_medians(b["records"])
    ratios = []
    for prompt_id, use_cache in _timing_combinations():
        key = (prompt_id, use_cache)
        for metric in TIMING_METRICS:
            x, y = medians_a.get(key, {}).get(metric), medians_b.get(key, {}).get(metric)
            ratio = y / x if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0 else None
            ratios.append({"prompt_id": prompt_id, "use_cache": use_cache, "metric": metric,
                           "median_dir1": x, "median_dir2": y, "ratio_dir2_over_dir1": ratio})
    return {
        "dir1": str(a["dir"]),
        "dir2": str(b["dir"]),
        "generation": _id_agreement(generation_rows(a), generation_rows(b), generation_order),
        "timing_ids": _id_agreement(timing_rows(a), timing_rows(b), timing_order),
        "tensors": _tensor_agreement(a["dir"], b["dir"]),
        "timing_ratios": ratios,
        "artifacts": _artifact_differences(a["records"], b["records"]),
        "environment": _environment_differences(a["manifest"], b["manifest"]),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return value
    return json.dumps(value)


def format_compare(result: dict) -> str:
    """A readable plain-text rendering of compare()'s result."""
    lines = [f"compare: DIR1 = {result['dir1']}", f"         DIR2 = {result['dir2']}", ""]
    for title, rows in (("generation trials (exact generated ids)", result["generation"]),
                        ("timing trials (exact generated ids)", result["timing_ids"])):
        equal = sum(1 for r in rows if r["equal"])
        lines.append(f"{title}: {equal} of {len(rows)} equal")
        width = max((len(r["trial"]) for r in rows), default=5)
        lines += [f"  {r['trial']:<{width}}  {r['status']}" for r in rows]
        lines.append("")
    lines.append("tensors (max abs diff per key)")
    if not result["tensors"]:
        lines.append("  no tensor files in either dir")
    for row in result["tensors"]:
        lines.append(f"  {row['file']}[{row['key']}]  max_abs_diff={_fmt(row['max_abs_diff'])}  {row['status']}")
    lines += ["", "timing: per-condition medians of the measured trials, ratio DIR2/DIR1"]
    for row in result["timing_ratios"]:
        cache = "cache_on " if row["use_cache"] else "cache_off"
        lines.append(f"  {row['prompt_id']:<5} {cache} {row['metric']:<27} dir1={_fmt(row['median_dir1'])} s  "
                     f"dir2={_fmt(row['median_dir2'])} s  ratio={_fmt(row['ratio_dir2_over_dir1'])}")
    artifacts = result.get("artifacts") or []
    equal = sum(1 for row in artifacts if row["equal"])
    lines += ["", f"artifacts (sha256 and size of every file each run verified): {equal} of {len(artifacts)} equal"]
    for row in artifacts:
        if row["equal"]:
            lines.append(f"  {row['file']}  equal  sha256={row['dir1']['sha256']}")
            continue
        lines.append(f"  {row['file']}  {row['status']}")
        if row["status"] == "differ":
            lines.append(f"    dir1: {_fmt(row['dir1'])}")
            lines.append(f"    dir2: {_fmt(row['dir2'])}")
    lines += ["", "environment differences"]
    if not result["environment"]:
        lines.append("  none (platform, distributions, thread environment, git, specimen, lock and deviations agree)")
    for row in result["environment"]:
        lines.append(f"  {row['section']}.{row['name']}: dir1={_fmt(row['dir1'])}  dir2={_fmt(row['dir2'])}")
    return "\n".join(lines) + "\n"

