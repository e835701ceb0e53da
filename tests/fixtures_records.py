"""Synthetic record dirs for the report, verify and compare tests, written through the harness's own Run as a session
writes them (no model is run); a ticking clock and stamp and FixedHost make two builds byte-identical. The numbers are
invented test data in the shapes the experiments record, not measurements."""

from __future__ import annotations

import ast
import collections
import contextlib
import datetime
import functools
import itertools
import json
import random
import shutil
import types
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.files import dumps, write_json_atomic
from inferlab.run.records import MANIFEST_FILE, PLAN_FILE, RECORDS_FILE, file_inventory, make_record
from inferlab.measure import stats
from inferlab.run import endings, session
from inferlab.run.plan import EXPERIMENTS_DIR, TestFacts, _marker_args, experiment_files, forward_budget, \
    function_of, selection_of

REPO_ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64  # tiny on purpose: the tests check plumbing, not a real vocabulary
EOS_ID = 0
FAILED_ACQUISITION_MESSAGE = ("model.safetensors: sha256 " + "0" * 64 + ", expected "
                              "116a02532db461f91386a5b20f942ff2c8d4de7341e21b55caafc3d7b25f49a1")
SKIP_REASON = ("not run: prerequisite 'specimen' failed in experiments/test_10_specimen.py::test_acquisition: "
               + FAILED_ACQUISITION_MESSAGE)
SPECIMEN_TESTS = tuple(f"experiments/test_10_specimen.py::test_{name}"
                       for name in ("acquisition", "model_load", "thread_controls", "model_inspection"))
SAMPLING, CACHE, TIMING = "experiments/test_30_sampling.py", "experiments/test_40_cache.py", \
    "experiments/test_50_timing.py"
MEMORY_TEST, BATCHING_TEST = "experiments/test_60_memory.py::test_parameter_storage", \
    "experiments/test_70_batching.py::test_batching_calls"
FIXTURE_START = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
FIXTURE_ENVIRONMENT = {  # what FixedHost says of the machine, the software and the source
    "platform": {"python_version": "3.11.2", "python_implementation": "CPython", "os": "Linux",
                 "machine": "x86_64", "cpu_model": "Test CPU", "logical_cpus": 2},
    "distributions": {"numpy": "2.0.0", "safetensors": "0.8.0", "tokenizers": "0.22.2", "torch": "2.13.0",
                      "transformers": "4.57.1"},
    "requirements_lock_sha256": "ab" * 32,
    "lock_check": {"file": "requirements.lock", "found": True, "pins": 40, "python_locked": "3.11.7",
                   "python_running": "3.11.2", "not_compared": ["inferlab", "pip", "setuptools", "wheel"],
                   "differences": [{"name": "numpy", "locked": "2.4.6", "installed": "2.0.0"},
                                   {"name": "python", "locked": "3.11.7", "installed": "3.11.2"}]},
    "git": {"commit": "c0ffee" * 6 + "c0ff", "dirty": False},
    "source_sha256": {"inferlab/report.py": "cd" * 32},
    "thread_environment": {"OMP_NUM_THREADS": "1"},
    "deviations_from_reference": ["Python is CPython 3.11.2; the protocol's reference is CPython 3.13.13"],
}


def generation_nodeid(trial) -> str:
    return f"{SAMPLING}::test_generation_trial[{trial.test_id}]"


def timing_nodeid(trial) -> str:
    return f"{TIMING}::test_timing_trial[{trial.test_id}]"


def input_nodeid(prompt_id: str) -> str:
    return f"experiments/test_20_inputs.py::test_input[{prompt_id}]"


def all_nodeids() -> list[tuple[str, dict]]:
    """The planned tests in run order, with their budget markers."""
    tests = [SPECIMEN_TESTS[i] for i in (2, 0, 1, 3)] + [input_nodeid(p) for p in ("P1", "P2", "P1x8")]
    tests = [(nodeid, None) for nodeid in tests]
    tests += [(generation_nodeid(t), {"category": "generation", "selections": protocol.MAX_NEW_TOKENS})
              for t in protocol.generation_trials()]
    tests += [(f"{SAMPLING}::test_{name}", None)
              for name in ("first_step_logits_do_not_depend_on_selection", "greedy_repetitions_identical")]
    tests += [(f"{CACHE}::test_cache_criterion_declared", None),
              (f"{CACHE}::test_matched_prefix", {"category": "cache",
                                                  "forwards": 2 * protocol.CACHE_MAX_TARGET_TOKENS})]
    tests += [(timing_nodeid(t), {"category": "timing_warmup" if t.warmup else "timing_measured",
                                  "selections": protocol.TIMING_NEW_TOKENS}) for t in protocol.timing_schedule()]
    tests += [(f"{TIMING}::test_{name}", None)
              for name in ("timing_summary", "loop_matches_generate", "cache_divergence")]
    return tests + [(MEMORY_TEST, None), (BATCHING_TEST, {"category": "batching", "calls": 4})]


@functools.cache
def experiment_markers() -> dict[str, dict]:
    """Each experiment test function's markers from its source: {name: {records, requires, provides, ...}}."""
    found, optional_files = {}, {part["file"] for part in experiment_files(REPO_ROOT)[0] if part["optional"]}
    for path in sorted((REPO_ROOT / EXPERIMENTS_DIR).glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef):
                marks = {name: _marker_args(node.decorator_list, name) for name in ("records", "requires", "provides")}
                found[node.name] = {**marks, "records": list(dict.fromkeys(marks["records"])),
                                    "diagnostic": any(getattr(d, "attr", None) == "diagnostic"
                                                      for d in node.decorator_list),
                                    "optional": f"{EXPERIMENTS_DIR}/{path.name}" in optional_files}
    return found


def facts_of(nodeid: str, budget: Optional[dict]) -> TestFacts:
    """A fixture test's facts: its budget as given, its markers as the experiment declares them."""
    marks = experiment_markers().get(function_of(nodeid), {})
    return TestFacts(nodeid=nodeid, budget=budget, requires=tuple(marks.get("requires", ())),
                     provides=tuple(marks.get("provides", ())), records=tuple(marks.get("records", ())),
                     timeout_s=protocol.TRIAL_LIMIT_S, diagnostic=bool(marks.get("diagnostic")),
                     optional=bool(marks.get("optional")))


def ticking_clock():
    """A wall clock one second later at every reading, from 2025-01-01T00:00:00Z: two builds read the same times."""
    readings = itertools.count()
    return lambda: (FIXTURE_START + datetime.timedelta(seconds=next(readings))).isoformat()


def ticking_stamp():
    """A perf_counter_ns one millisecond later at every reading: the records' stamps, the same in every build."""
    readings = itertools.count(1)
    return lambda: 10**12 + next(readings) * 10**6


class FixedHost:
    """The same machine and software every time (FIXTURE_ENVIRONMENT), one torch thread each way."""

    def environment_record(self, root) -> dict:
        return json.loads(json.dumps(FIXTURE_ENVIRONMENT))

    def torch_threads(self, requested: Optional[dict]) -> dict:
        return {"requested": requested, "effective": {"intra_op": 1, "inter_op": 1}}

    @staticmethod
    def torch_build() -> dict:
        return {"version": "2.13.0+cpu", "cpu_only": True, "how_known": "its version carries the +cpu label",
                "cuda": None, "installed_from": None,
                "cpu_kernels": {"env_ATEN_CPU_CAPABILITY": None, "capability": "AVX2", "mkl_available": True,
                                "mkldnn_available": True, "mkldnn_enabled": True,
                                "config_lines": ["CPU capability usage: AVX2"]}}


PLAN_FIELDS_ADDED_LATER = ("mode", "parts", "selection", "protocol_complete", "partial_reasons", "optional_left_out")


class RunBuilder:
    """Writes one record dir through the harness's Run, as a session does; the tests give the values. Without
    current_format, plan.json is the older one (no check_kind, no PLAN_FIELDS_ADDED_LATER); report=False: no report."""

    def __init__(self, directory: Path, specimen: str, synthetic: bool, plan_only: bool = False,
                 current_format: bool = False, report: bool = True, plots: bool = True):
        if Path(directory).exists():
            raise FileExistsError(f"{directory}: a fixture run is built into a new directory")
        argv = ("pytest", "experiments", "--specimen", specimen, "--record-dir", str(directory))
        argv += ("--plan",) if plan_only else ()
        invocation = session.Invocation(
            argv=argv, command=" ".join(argv), command_how="the fixture's own command", invocation_dir=str(REPO_ROOT),
            root=REPO_ROOT, mode="plan" if plan_only else "run",
            specimen={"name": specimen, "synthetic": synthetic,
                      "repo_id": "inferlab/standin" if synthetic else protocol.PINNED_REPO_ID,
                      "revision": "685c649b" if synthetic else protocol.PINNED_REVISION},
            options={"artifacts": None, "offline": True, "plan": plan_only},
            pytest={"version": "9.2.0", "plugins": {}})
        self.run = session.claim_run(invocation, record_dir=Path(directory), pid=4242, hostname="fixture-host",
                                     clock=ticking_clock(), host=FixedHost(), stamp=ticking_stamp())
        self.run.network_guard = contextlib.ExitStack()  # an --offline session as its manifest says
        if report:
            from inferlab import report as report_module

            self.run.write_report = report_module.write_report if plots else \
                lambda record_dir: write_pages(record_dir, plots=False)
        self.current_format, self.specimen, self.synthetic = current_format, specimen, synthetic
        self.facts: dict[str, TestFacts] = {}
        self.run.start(None)

    def emit(self, kind: str, test: Optional[str], **fields) -> dict:
        return self.run.emit(kind, test, fields)

    def outcome(self, test: str, outcome: str = "passed", phase: str = "call", longrepr=None, skip_reason=None):
        # 0.1 s: longer than anything a fixture trial says it timed, as a test's duration always is
        return self.run.record_outcome(self.facts.get(test) or facts_of(test, None), outcome=outcome, phase=phase,
                                       duration=0.1, longrepr=longrepr, skip_reason=skip_reason)

    def write_plan(self, tests) -> None:
        self.facts = {nodeid: facts_of(nodeid, budget) for nodeid, budget in tests}
        self.run.write_plan(list(self.facts.values()), selection=selection_of(types.SimpleNamespace()))
        if not self.current_format:  # before the report reads it
            plan = json.loads((self.run.record_dir / PLAN_FILE).read_text())
            plan = {key: value for key, value in plan.items() if key not in PLAN_FIELDS_ADDED_LATER}
            plan["schedule"] = [{k: v for k, v in entry.items() if k != "check_kind"} for entry in plan["schedule"]]
            write_json_atomic(self.run.record_dir / PLAN_FILE, plan)

    def end_session(self) -> dict:
        """The session_end record of a session that ran to its end (exit status from the outcomes)."""
        failed = self.run.counts.get("failed") or self.run.counts.get("error")
        return self.run.end_session(exit_status=1 if failed else 0, exit_code_name="TESTS_FAILED" if failed else "OK",
                                    interrupted_status=2)

    def finish(self) -> Path:
        """session_end (unless already written), the report, the closed records, the final manifest."""
        if self.run.session_end is None:
            self.end_session()
        self.run.finish()
        errors = self.run.records_of("report_error")  # a session keeps going; a fixture must not hide a broken page
        assert not errors, f"the fixture run's report could not be written: {errors}"
        return self.run.record_dir


def _specimen_start(run: RunBuilder, ok: bool) -> None:
    """The thread controls (passed), then the acquisition's records: its outcome and every allowlisted file's."""
    run.emit("thread_controls", SPECIMEN_TESTS[2], requested={"intra_op": 1, "inter_op": 1},
             effective={"intra_op": 1, "inter_op": 1}, matches=True, errors=[])
    run.outcome(SPECIMEN_TESTS[2])
    run.emit("specimen", SPECIMEN_TESTS[0], name=run.specimen, synthetic=run.synthetic,
             description="synthetic stand-in with pythia-14m's architecture and random weights" if run.synthetic
             else "EleutherAI/pythia-14m", repo_id="inferlab/standin" if run.synthetic else protocol.PINNED_REPO_ID,
             revision="685c649b" if run.synthetic else protocol.PINNED_REVISION)
    run.emit("artifact_acquisition", SPECIMEN_TESTS[0], acquisition="reuse:project_cache",
             directory="artifacts/cache/x", elapsed_s=0.05, status="ok" if ok else "failed",
             error=None if ok else FAILED_ACQUISITION_MESSAGE)
    for index, name in enumerate(protocol.ALLOWLISTED_FILES):
        bad, digest = not ok and name == "model.safetensors", f"{index:02d}" * 32
        run.emit("artifact_file", SPECIMEN_TESTS[0], name=name, size=1000 + index, sha256="00" * 32 if bad else digest,
                 expected_sha256=digest, expected_size=1000 + index, ok=not bad,
                 problem=FAILED_ACQUISITION_MESSAGE if bad else None, acquisition="reuse:project_cache")


def _fake_text(ids: list[int]) -> str:
    # Includes a pipe and a newline so the report's escaping is exercised.
    return "".join({0: "", 5: " |", 7: "\n"}.get(i, f" w{i}") for i in ids)


def build_complete_run(directory: Path, synthetic: bool = True, report: bool = True) -> Path:
    """A complete protocol run's record dir (26 generations, 24 timing trials, cache, memory, batching), no plot."""
    import torch

    rng = random.Random(0)
    run = RunBuilder(directory, "standin" if synthetic else protocol.DEFAULT_SPECIMEN, synthetic, report=report,
                     plots=False)
    run.write_plan(all_nodeids())

    # threads, specimen, load, inspection (in the experiment's order)
    _specimen_start(run, ok=True)
    run.emit("phase", SPECIMEN_TESTS[0], name="artifact_acquisition", elapsed_s=0.05, label="local reuse")
    run.outcome(SPECIMEN_TESTS[0])
    run.emit("model_load", SPECIMEN_TESTS[1], model_class="GPTNeoXForCausalLM", elapsed_s=0.4, warnings=[],
             options={"local_files_only": True, "use_safetensors": True, "trust_remote_code": False,
                      "dtype": "float32", "attn_implementation": "eager", "device_map": None},
             tokenizer={"class": "GPTNeoXTokenizerFast", "is_fast": True, "eos_token_id": EOS_ID})
    run.emit("model_inspection", SPECIMEN_TESTS[3], **{"class": "GPTNeoXForCausalLM"}, parameter_count=14067712,
             devices=["cpu"], dtypes=["float32"], unique_parameter_storage_bytes=56270848,
             checkpoint_file_bytes=28143920, config={"vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 6})
    run.emit("phase", SPECIMEN_TESTS[1], name="model_and_tokenizer_load", elapsed_s=0.4, label="load")
    run.outcome(SPECIMEN_TESTS[1])
    run.outcome(SPECIMEN_TESTS[3])

    # inputs
    prompt_ids = {}
    for prompt_id, source in {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}.items():
        ids = prompt_ids[prompt_id] = [rng.randrange(1, VOCAB) for _ in range(9 if prompt_id != "P1x8" else 72)]
        run.emit("input", input_nodeid(prompt_id), prompt_id=prompt_id, source=source, serialized=source,
                 serialized_matches_source=True, token_ids=ids, token_pieces=[f"w{i}" for i in ids],
                 length=len(ids), attention_mask=[1] * len(ids), add_special_tokens=False, eos_token_id=EOS_ID,
                 pad_token_id=EOS_ID, pad_reason="reuse EOS id; no padding with batch size 1")
        run.outcome(input_nodeid(prompt_id))

    # the generation matrix
    first_logits = {p: torch.randn(VOCAB, generator=torch.Generator().manual_seed(i))
                    for i, p in enumerate(protocol.PROMPTS)}
    greedy, seeded = {}, {}
    for trial in protocol.generation_trials():
        key = (trial.prompt_id, trial.condition, trial.seed)
        if trial.condition == "G" and trial.prompt_id not in greedy:
            ids = greedy[trial.prompt_id] = [rng.randrange(1, VOCAB) for _ in range(protocol.MAX_NEW_TOKENS)]
            ids[0] = int(first_logits[trial.prompt_id].argmax())  # greedy selects the argmax of the first logits
        elif trial.condition == "G" or trial.is_rerun:
            ids = greedy[trial.prompt_id] if trial.condition == "G" else seeded[key]
        else:
            length = 6 if trial.condition == "S2" and trial.seed == 23 else protocol.MAX_NEW_TOKENS
            ids = seeded[key] = [rng.randrange(1, VOCAB) for _ in range(length)]
            if length < protocol.MAX_NEW_TOKENS:
                ids[-1] = EOS_ID
        reference = run.run.tensors.put("first_step_logits", f"{trial.prompt_id}/{trial.condition}",
                                        first_logits[trial.prompt_id]) if trial.keeps_first_step_logits else None
        run.emit("generation", generation_nodeid(trial), trial_index=trial.index, trial_id=trial.test_id,
                 prompt_id=trial.prompt_id, condition=trial.condition, seed=trial.seed, repetition=trial.repetition,
                 is_rerun=trial.is_rerun, prompt_ids=prompt_ids[trial.prompt_id], generated_ids=ids,
                 sequence_ids=prompt_ids[trial.prompt_id] + ids, text=_fake_text(ids),
                 text_with_special=_fake_text(ids) + ("<|endoftext|>" if ids[-1] == EOS_ID else ""),
                 generated_length=len(ids), stop_reason="eos" if ids[-1] == EOS_ID else "max_new_tokens",
                 generation_config={"max_new_tokens": protocol.MAX_NEW_TOKENS, "do_sample": trial.condition != "G"},
                 processors=[], rng_reset=[] if trial.seed is None else [{"call": "torch.manual_seed",
                                                                          "seed": trial.seed}],
                 warnings=[], elapsed_s=0.02, status="ok", first_step_logits=reference)
        run.outcome(generation_nodeid(trial))
    check_test, greedy_test = (f"{SAMPLING}::test_first_step_logits_do_not_depend_on_selection",
                               f"{SAMPLING}::test_greedy_repetitions_identical")
    run.emit("first_step_logits_check", check_test, prompts=["P1", "P2"], max_abs_diff={"P1": 0.0, "P2": 0.0},
             all_equal=True, processed_scores_differ_where_t_not_1=True, passed=True)
    run.outcome(check_test)
    generations = run.run.records_of("generation")
    for prompt_id in protocol.PROMPTS:
        run.emit("sampling_summary", greedy_test, **stats.sampling_summary(generations, prompt_id))
    run.outcome(greedy_test)

    # the matched-prefix cache test
    cache_test, tolerance = f"{CACHE}::test_matched_prefix", protocol.CACHE_TOLERANCE
    m = protocol.CACHE_MAX_TARGET_TOKENS
    run.emit("cache_criterion", f"{CACHE}::test_cache_criterion_declared", criterion=tolerance.describe(),
             atol=tolerance.atol, rtol=tolerance.rtol)
    run.outcome(f"{CACHE}::test_cache_criterion_declared")
    for k in range(m):
        length = len(prompt_ids["P1"]) + k
        uncached = torch.randn(VOCAB, generator=torch.Generator().manual_seed(100 + k))
        cached = uncached.clone() if k == 0 else uncached + 1e-7 * (k + 1)
        references = {name: run.run.tensors.put("cache_logits", f"{name}/prefix_{length:02d}", tensor)
                      for name, tensor in (("cached", cached), ("uncached", uncached))}
        diff = float((cached.double() - uncached.double()).abs().max())
        top = torch.topk(uncached.double(), 2).values
        margin, allowance = float(top[0] - top[1]), tolerance.tie_allowance(float(top[0]), float(top[1]))
        run.emit("cache_comparison", cache_test, prefix_length=length, max_abs_diff=diff, fail_fraction=0.0,
                 bitwise_equal=diff == 0.0, argmax_cached=int(cached.argmax()), argmax_uncached=int(uncached.argmax()),
                 top2_margin_uncached=margin, near_tie_allowance=allowance, near_tie=margin <= allowance, passed=True,
                 tensors=references)
    run.emit("cache_inspection", cache_test, cache_type="DynamicCache", layer_count=6,
             unique_bytes=6 * 2 * 4 * 32 * 16 * 4)
    run.emit("cache_summary", cache_test, m=m, forward_count=2 * m, forward_count_expected=2 * m,
             all_within_tolerance=True, all_argmax_equal=True, all_bitwise_equal=False, any_near_tie=False,
             cache_reuse_exercised=True, notes=[], passed=True)
    run.outcome(cache_test)

    # timing
    trials = []
    for trial in protocol.timing_schedule():
        length = len(prompt_ids[trial.prompt_id])
        prefill = 0.002 * (1 + length / 40) + rng.random() * 1e-4
        step = 0.001 if trial.use_cache else 0.001 * (1 + length / 40)
        times, now = [], prefill + 2e-5
        for _ in range(protocol.TIMING_NEW_TOKENS):
            times.append(now)
            now += step + rng.random() * 1e-4
        ids = greedy["P1"] if trial.prompt_id == "P1" else [rng.randrange(0, 3) for _ in range(16)]
        if not trial.use_cache and trial.prompt_id == "P1x8":
            ids = ids[:10] + [1] * 6  # cache on and off diverge at index 10
        trials.append(run.emit(
            "timing_trial", timing_nodeid(trial), prompt_id=trial.prompt_id, use_cache=trial.use_cache,
            warmup=trial.warmup, schedule_index=trial.schedule_index, repetition=trial.repetition,
            schedule_id=trial.test_id, status="ok", prompt_ids=prompt_ids[trial.prompt_id], prompt_length=length,
            generated_ids=ids, output_length=len(ids), token_times_s=times, prefill_s=prefill, ttft_s=times[0],
            loop_s=times[-1], mean_post_first_interval_s=stats.mean_post_first_interval(times),
            eos_positions=[i for i, t in enumerate(ids) if t == EOS_ID]))
        run.outcome(timing_nodeid(trial))
    for prompt_id in protocol.TIMING_PROMPTS:
        for use_cache in (True, False):
            run.emit("timing_summary", f"{TIMING}::test_timing_summary",
                     **stats.timing_summary(trials, prompt_id, use_cache))
    run.outcome(f"{TIMING}::test_timing_summary")
    run.emit("loop_vs_generate", f"{TIMING}::test_loop_matches_generate", prompt_id="P1", equal=True,
             first_difference=None, compared_length=16)
    run.outcome(f"{TIMING}::test_loop_matches_generate")
    for prompt_id in protocol.TIMING_PROMPTS:
        run.emit("cache_divergence", f"{TIMING}::test_cache_divergence", **stats.cache_divergence(trials, prompt_id))
    run.outcome(f"{TIMING}::test_cache_divergence")

    # memory and batching
    run.emit("memory", MEMORY_TEST, what="parameters", unique_bytes=56270848, analytic_bytes=56270848,
             note="tensor payload of parameters only; not process memory")
    run.emit("memory", MEMORY_TEST, what="process_rss", current_rss={"bytes": 400_000_000, "meaning": "current"},
             peak_rss={"bytes": 450_000_000, "meaning": "lifetime peak (freeing objects does not lower it)"},
             unmeasured_categories={"activations": "temporary hidden states", "workspace": "kernel scratch"})
    run.outcome(MEMORY_TEST)
    for index in range(4):
        run.emit("batching", BATCHING_TEST, record_type="call", call_index=index, pad_token_id=EOS_ID,
                 padding_side="left", attention_mask=[[1] * 9], row_to_request={"0": "P1" if index != 1 else "P2"})
    run.emit("batching", BATCHING_TEST, record_type="summary", generate_calls=4, first_step_max_abs_diff=2e-7,
             generated_ids_all_identical=True, pad_token_id=EOS_ID, padding_side="left")
    run.outcome(BATCHING_TEST)
    return run.finish()


def build_failed_run(directory: Path, report: bool = True) -> Path:
    """A default-specimen run that failed at artifact verification, every later test skipped with the reason; its
    report is written plots and all (nothing can be drawn, and a test checks that nothing is)."""
    run = RunBuilder(directory, protocol.DEFAULT_SPECIMEN, synthetic=False, report=report, plots=True)
    run.write_plan(all_nodeids())
    _specimen_start(run, ok=False)
    run.outcome(SPECIMEN_TESTS[0], "failed", longrepr=f"E   Failed: {FAILED_ACQUISITION_MESSAGE}")
    for nodeid, _ in all_nodeids():
        if nodeid not in (SPECIMEN_TESTS[0], SPECIMEN_TESTS[2]):
            run.outcome(nodeid, "skipped", phase="setup", longrepr=f"('x', 1, 'Skipped: {SKIP_REASON}')",
                        skip_reason=SKIP_REASON)
    return run.finish()


def copy_run(source: Path, target: Path) -> Path:
    """A private copy of a built record dir that a test may edit."""
    return Path(shutil.copytree(source, target))


def rewrite_records(directory: Path, transform) -> None:
    """Replace a run's records with transform(records), renumber seq, and refresh the manifest's inventory: the
    manifest then matches the new files, so only the protocol checks (not the hashes) can catch the alteration."""
    directory = Path(directory)
    records = renumbered(transform([json.loads(line) for line in (directory / RECORDS_FILE).read_text().splitlines()]))
    (directory / RECORDS_FILE).write_text("".join(dumps(r) + "\n" for r in records), encoding="ascii")
    refresh_manifest(directory, records)


def renumbered(records: list[dict]) -> list[dict]:
    """The records with seq 0, 1, ... in their order (in place, and returned), as rewrite_records writes them."""
    for seq, record in enumerate(records):
        record["seq"] = seq
    return records


def outcome_counts(records: list[dict]) -> dict:
    """{outcome: count} of the test_outcome records, in the order first met (the manifest's outcome_counts)."""
    return dict(collections.Counter(r["outcome"] for r in records if r["kind"] == "test_outcome"))


def refresh_manifest(directory: Path, records: Optional[list] = None) -> None:
    """Recompute the manifest's file inventory (and outcome counts, given the records) after an edit."""
    fields = {} if records is None else {"outcome_counts": outcome_counts(records)}
    edit_manifest(directory, **fields, files=file_inventory(Path(directory), exclude=(MANIFEST_FILE,)))


# --- records other tracks add (session_end, run-level measurements, new fields), for the report tests ----

TYPED_COMMAND = "python -m pytest experiments --specimen standin --record-dir runs/first"
CLOCK_READS_PER_TRIAL = 17
FIXTURE_PARAMETERS = [  # a two-tensor "model" in model_inspection's shape: input embedding and the rest
    {"name": name, "shape": [VOCAB, 128], "numel": VOCAB * 128, "device": "cpu", "dtype": "float32"}
    for name in ("gpt_neox.embed_in.weight", "embed_out.weight")]
CACHE_BYTES_PER_POSITION = 6144
WEIGHT_BYTES = VOCAB * 128 * 4  # embed_out of FIXTURE_PARAMETERS
WEIGHT_PASS_SECONDS = [0.0004, 0.0002, 0.0003, 0.0005, 0.0003]
FIXTURE_CACHES = {"source": "/sys/devices/system/cpu/cpu0/cache", "largest_bytes": 32 * 2**20, "note": "cpu0",
                  "levels": [{"level": 1, "type": "Data", "bytes": 32768, "size": "32K", "shared_cpu_list": "0"},
                             {"level": 3, "type": "Unified", "bytes": 32 * 2**20, "size": "32768K",
                              "shared_cpu_list": "0-1"}]}


def _envelope(kind: str, test: Optional[str], **fields) -> dict:
    """A record made by the harness's writer, for splicing into a run's records (rewrite_records renumbers seq)."""
    return make_record(kind, test, 0, "2025-01-01T00:09:00+00:00", fields)


def with_check_kinds(records: list[dict]) -> list[dict]:
    """Give every test_outcome its check_kind, as the plugin records it."""
    for record in records:
        if record["kind"] == "test_outcome" and "check_kind" not in record:
            record["check_kind"] = facts_of(record["test"] or "", None).check_kind
    return records


def session_end_record(records: list[dict], **overrides) -> dict:
    """A session_end consistent with the outcomes in `records`, made by the harness's writer; overrides of its inputs
    go through it (so interrupted, complete and status follow), then every override replaces its field."""
    from inferlab.specimen import acquisition_cause

    outcomes = [r for r in records if r["kind"] == "test_outcome"]
    counts = collections.Counter(r["outcome"] for r in outcomes)
    failing = [r for r in outcomes if r["outcome"] in ("failed", "error")]
    provided = [set(experiment_markers().get(function_of(r["test"]), {}).get("provides", ())) for r in failing]
    acquisition = ([r for r in records if r["kind"] == "artifact_acquisition"] or [{}])[-1]
    acquisition_failure = {"cause": acquisition_cause(acquisition),
                           "failed_tests": sum(bool(set(endings.SPECIMEN_CHECKS) & p) for p in provided)} \
        if any("acquisition" in p for p in provided) else None
    failed = bool(counts.get("failed") or counts.get("error"))
    fields = endings.session_end(
        exit_status=overrides.get("exit_status", 1 if failed else 0),
        exit_code_name=overrides.get("exit_code_name", "TESTS_FAILED" if failed else "OK"),
        signals=overrides.get("signals", []), collect_only=overrides.get("collect_only", False), plan_only=False,
        stop_reason=overrides.get("stop_reason"), planned=[t for t, _ in all_nodeids()],
        with_outcome={r["test"] for r in outcomes}, partial_reasons=overrides.get("partial_reasons", []),
        optional_notes=[], outcome_counts=counts,
        failures_by_check_kind=collections.Counter(r.get("check_kind", "integrity") for r in failing),
        forward_reconciliation=endings.reconcile_forwards(0, {}, forward_budget(
            [{"test": t, "budget": b} for t, b in all_nodeids()])),
        acquisition_failure=acquisition_failure)
    return _envelope("session_end", None, **{**fields, **overrides})


def new_evidence_records(records: list[dict]) -> list[dict]:
    """Add what schemas 4-13 bring to a complete run's records (in place, and returned)."""
    records = with_check_kinds(records)
    added = []
    for record in records:
        kind = record["kind"]
        if kind == "generation":
            record["generation_cache"] = {"fresh": True, "how": "a new DynamicCache per generate() call"}
            record["warnings"] = ["UserWarning: a captured warning | with a pipe"] if record["trial_id"] == \
                "P2-G-rep1" else []
        elif kind == "cache_comparison":
            length = record["prefix_length"]
            record["fed_inputs"] = {"uncached": {"attention_mask": [1] * length, "position_ids": list(range(length)),
                                                 "cache_position": list(range(length))},
                                    "cached": {"attention_mask": [1] * length, "position_ids": [length - 1],
                                               "cache_position": [length - 1]}}
            record["cache_seq_length_after_forward"] = length
            record["cache_unique_bytes_after_forward"] = length * CACHE_BYTES_PER_POSITION
            record["revised"] = {"atol": 1e-4, "rtol": 1e-3, "passed": True, "fail_count": 0, "fail_fraction": 0.0}
        elif kind == "cache_summary":
            record["prefill_logits_to_keep"] = {"uncached": [1, 1, VOCAB], "cached": [1, 1, VOCAB]}
            record["revised_evaluation"] = {"atol": 1e-4, "rtol": 1e-3, "rule": "|a-b| <= 0.0001 + 0.001*|b|",
                                            "justification": "a test justification", "all_within_tolerance": True,
                                            "failing_prefix_lengths": []}
        elif kind == "model_inspection":
            record["parameters"] = FIXTURE_PARAMETERS
        elif kind == "artifact_file":
            record["reference"] = {"revision": "cf967c0a" + "0" * 32, "size": record["size"],
                                   "sha256": record["sha256"], "status": "matches"}
            record["absent_at_revision"] = False
        elif kind == "input" and record["prompt_id"] == "P2":
            record["token_pieces"] = [None] + record["token_pieces"][1:]  # an id with no token (schema 13)
        elif kind == "batching" and record.get("record_type") == "summary":
            # what the two rows below give: the larger first-step difference, and one row that diverges
            record.update(first_step_max_abs_diff=2.5e-7, generated_ids_all_identical=False)
            record["comparisons"] = [
                {"batch_call_index": 2, "row": 0, "request_id": "P1", "singleton_call_index": 0,
                 "unpadded_prompt_matches_singleton": True, "padding_columns": 0, "first_step_max_abs_diff": 1.5e-7,
                 "first_step_argmax_agree": True, "generated_ids_identical": True, "first_divergence": None},
                {"batch_call_index": 2, "row": 1, "request_id": "P2", "singleton_call_index": 1,
                 "unpadded_prompt_matches_singleton": True, "padding_columns": 2, "first_step_max_abs_diff": 2.5e-7,
                 "first_step_argmax_agree": True, "generated_ids_identical": False, "first_divergence": 4}]
    for trial in protocol.generation_trials():
        added.append(_envelope("phase", generation_nodeid(trial), name="output_decoding", trial_id=trial.test_id,
                               source="generation", elapsed_s=1e-4, label="tokenizer.decode of the generated ids"))
    for trial in [r for r in records if r["kind"] == "timing_trial"]:
        added.append(_envelope("phase", trial["test"], name="output_decoding", trial_id=trial["schedule_id"],
                               source="timing", elapsed_s=2e-4, label="tokenizer.decode, outside the timed loop"))
    added.append(_envelope("clock_overhead", None, clock="time.perf_counter_ns", reads=100000,
                           elapsed_ns=5_000_000, per_read_ns=50.0, reads_per_trial=CLOCK_READS_PER_TRIAL,
                           per_trial_overhead_ns=50.0 * CLOCK_READS_PER_TRIAL, method="back-to-back reads"))
    added.append(_envelope("weight_read", "experiments/test_50_timing.py::test_decode_step_weight_read",
                           method="one pass = Tensor.sum() of each weight tensor", tensor_count=1,
                           bytes=WEIGHT_BYTES, left_out=[{"name": "gpt_neox.embed_in.weight", "bytes": WEIGHT_BYTES,
                                                          "why": "the input embedding"}],
                           threads={"intra_op": 1, "inter_op": 1}, passes=5, seconds=WEIGHT_PASS_SECONDS,
                           median_s=sorted(WEIGHT_PASS_SECONDS)[2], warmup_s=0.001, caches=FIXTURE_CACHES,
                           fits_in_largest_cache=True, note="a time for these reads on this machine"))
    added.append(_envelope("memory", "experiments/test_60_memory.py::test_cache_storage_at_each_prefix",
                           measure="cache_storage", point="after the cache test's prefill of P1", prompt_id="P1",
                           prompt_length=9, unique_bytes=9 * CACHE_BYTES_PER_POSITION, logical_length=9,
                           expected_bytes=9 * CACHE_BYTES_PER_POSITION))
    criterion = next(i for i, r in enumerate(records) if r["kind"] == "cache_criterion")
    records.insert(criterion + 1, _envelope("cache_criterion_revised", records[criterion]["test"], atol=1e-4,
                                            rtol=1e-3, rule="|a-b| <= 0.0001 + 0.001*|b|",
                                            justification="a test justification"))
    outcomes_start = next(i for i, r in enumerate(records) if r["kind"] == "test_outcome"
                          and "test_60_memory" in (r["test"] or ""))
    return records[:outcomes_start] + added + records[outcomes_start:]


def write_pages(directory: Path, plots: bool = False) -> None:
    """The report as write_report writes it; plots=False draws none and removes those an earlier rendering drew."""
    from inferlab import report
    from inferlab.files import write_text_atomic
    from inferlab.report import plots as plots_module

    if plots:
        report.write_report(Path(directory))
        return
    write_text_atomic(Path(directory) / report.REPORT_FILE, report.render_report(Path(directory)))
    for name in (plots_module.TOKEN_TIMES_PNG, plots_module.TTFT_INTERVAL_PNG, plots_module.CACHE_DIFF_PNG):
        (Path(directory) / name).unlink(missing_ok=True)


def rerender(directory: Path, plots: bool = False) -> Path:
    """Write the report again from the (edited) records and refresh the manifest's inventory, as a session would."""
    refresh_manifest(directory)
    write_pages(directory, plots=plots)
    refresh_manifest(directory)
    return directory


def edit_manifest(directory: Path, **fields) -> None:
    """Set top-level manifest fields (for example predictions or command)."""
    manifest = json.loads((Path(directory) / MANIFEST_FILE).read_text())
    write_json_atomic(Path(directory) / MANIFEST_FILE, {**manifest, **fields})


def rich_change(session_end: Optional[dict] = None, transform=None):
    """build_rich_run's change of a complete run's records: newer records, transform, a session_end (False: none)."""
    def change(records):
        # build_complete_run already ended its session; this run's own session_end replaces that one
        records = new_evidence_records([r for r in records if r["kind"] != "session_end"])
        records = transform(records) if transform is not None else records
        return records + ([session_end_record(records, **(session_end or {}))] if session_end is not False else [])

    return change


def build_rich_run(directory: Path, session_end: Optional[dict] = None, transform=None, plots: bool = False,
                   base: Optional[Path] = None) -> Path:
    """rich_change(session_end, transform) of a complete run, its report rendered; base: a build_complete_run to copy
    instead of building one anew (the same bytes but for the folder's path)."""
    if base is None:
        build_complete_run(directory, report=False)
    else:
        copy_run(base, directory)
    edit_manifest(directory, command=TYPED_COMMAND)
    rewrite_records(directory, rich_change(session_end, transform))
    return rerender(directory, plots=plots)


def build_failed_run_ended(directory: Path) -> Path:
    """build_failed_run with check kinds on its outcomes, its report rendered anew."""
    build_failed_run(directory, report=False)
    rewrite_records(directory, with_check_kinds)
    return rerender(directory, plots=True)


def build_plan_folder(directory: Path) -> Path:
    """What --plan leaves: the claim, the manifests, plan.json, a plan record and a plan_only session_end; no report."""
    run = RunBuilder(directory, protocol.DEFAULT_SPECIMEN, synthetic=False, plan_only=True)
    run.write_plan(all_nodeids())
    return run.finish()


def _start_manifest(directory: Path) -> None:
    """The manifest back to the one written when the run began: no inventory, complete false, status 'started'."""
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    manifest.pop("files", None)
    manifest.update(complete=False, exit_status=None, exit_code_name=None, ended_utc=None, session_end=None,
                    outcome_counts={}, status=session.STARTED_STATUS)
    write_json_atomic(directory / MANIFEST_FILE, manifest)


def kill_after(directory: Path, tests_done: int) -> Path:
    """What a SIGKILL after `tests_done` test outcomes leaves: no session_end, no report, the start manifest."""
    directory = Path(directory)
    kept, outcomes = [], 0
    for line in (directory / RECORDS_FILE).read_text().splitlines(keepends=True):
        if outcomes >= tests_done:
            break
        kept.append(line)
        outcomes += json.loads(line)["kind"] == "test_outcome"
    (directory / RECORDS_FILE).write_text("".join(kept), encoding="ascii")
    for page in [directory / "report.md", *directory.glob("*.png")]:
        page.unlink(missing_ok=True)
    _start_manifest(directory)
    return directory


def abandon_finish(directory: Path) -> Path:
    """What a second Ctrl-C during the final writes leaves: session_end and the report, the start manifest."""
    _start_manifest(Path(directory))
    return Path(directory)


# --- trials that produced nothing: a failed trial, and a run interrupted mid-trial (report tests) ---------

INTERRUPT_ERROR = "KeyboardInterrupt: SIGINT received"


def fail_generation(records: list[dict], trial_id: str, error: str = "RuntimeError: the trial broke",
                    outcome: Optional[str] = "failed") -> list[dict]:
    """Replace one generation trial's record by what a trial that raised leaves (status failed, its error and
    identity, no ids) and, unless outcome is None, its outcome by a failure; without an outcome it is dropped."""
    kept = []
    for record in records:
        if record["kind"] == "generation" and record["trial_id"] == trial_id:
            identity = ("trial_index", "trial_id", "prompt_id", "condition", "seed", "repetition", "is_rerun")
            record = {**{k: record[k] for k in ("kind", "test", "seq", "wall_time") + identity},
                      "status": "failed", "error": error}
        elif record["kind"] == "test_outcome" and record["test"].endswith(f"[{trial_id}]"):
            if outcome is None:
                continue
            record = {**record, "outcome": outcome, "longrepr": f"E   {error}"}
        kept.append(record)
    return kept


def interrupt_at_generation(records: list[dict], trial_id: str) -> list[dict]:
    """What Ctrl-C during one generation trial leaves: the records before it, its failed record, no outcome."""
    cut = next(i for i, r in enumerate(records) if r["kind"] == "generation" and r["trial_id"] == trial_id)
    return fail_generation(records[:cut + 1], trial_id, error=INTERRUPT_ERROR, outcome=None)
