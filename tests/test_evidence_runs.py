"""The experiment's records hold the protocol's evidence: gates, warnings, phases, fed inputs, revised criterion,
timestamp overhead, fresh generation caches, the weight read and the forwards' mode. Small runs of the real experiment
files."""

from __future__ import annotations

import pytest

from shared_runs import experiment_in_process, experiment_once, records
from tiny_specimen import TINY_SPEC_NAME, build_tiny_specimen, write_spec

pytestmark = pytest.mark.process


def outcomes(found: list[dict]) -> dict:
    return {r["test"].split("::")[-1]: r for r in found if r["kind"] == "test_outcome"}


# --- 14.1: a wrongly loaded model stops every dependent, and the evidence stays ---------------------------

DEPENDENTS = ("test_generation_trial[P1-G-rep1]", "test_matched_prefix", "test_timing_trial[P1-cache_on-warmup]",
              "test_cache_storage_at_each_prefix", "test_parameter_storage", "test_batching_calls")
DEPENDENT_SELECTION = ("test_10_specimen or test_input or P1-G-rep1 or test_cache_criterion_declared or "
                       "test_matched_prefix or P1-cache_on-warmup or test_cache_storage_at_each_prefix or "
                       "test_parameter_storage or test_batching_calls")
FLOAT16_SDPA_LOAD = '''
import inferlab.measure.loading as _loading

_protocol_options = _loading.load_options


def _wrong_options():
    """Loaded wrongly on purpose: half precision and another attention implementation."""
    return {**_protocol_options(), "dtype": "float16", "attn_implementation": "sdpa"}


_loading.load_options = _wrong_options


def pytest_unconfigure(config):
    _loading.load_options = _protocol_options  # the session ran inside the harness's process: leave it as found
'''


def run_tiny(pytester, tmp_path, conftest_extra: str = "", selection: str = DEPENDENT_SELECTION, **damage):
    """The -k selection of the experiment on a tiny specimen (damaged as asked), pinned in the scratch project's
    own spec and given through --artifacts, as an inner session of this process: (the finished run, its records)."""
    specimen = build_tiny_specimen(tmp_path / "tiny-specimen", **damage)
    result = experiment_in_process(pytester, "--specimen", TINY_SPEC_NAME, "--artifacts", str(specimen), "-k",
                                   selection, conftest_extra=conftest_extra,
                                   prepare=lambda project: write_spec(project / "artifacts", specimen))
    return result, result.records()


def assert_dependents_stopped(found: list[dict], *reason_parts: str) -> None:
    by_test = outcomes(found)
    for name in DEPENDENTS:
        outcome = by_test[name]
        assert outcome["outcome"] == "skipped", (name, outcome)
        assert all(part in outcome["skip_reason"] for part in reason_parts), (name, outcome["skip_reason"])
    produced = {r["kind"] for r in found}
    assert not produced & {"generation", "cache_comparison", "cache_summary", "timing_trial", "batching"}, produced
    assert not [r for r in found if r["kind"] == "memory"]


def test_a_model_loaded_in_float16_with_sdpa_stops_every_dependent(pytester, tmp_path, monkeypatch):
    from inferlab.measure import loading

    # restored after the test on every path, whether or not the inner session got to undo its own patch
    monkeypatch.setattr(loading, "load_options", loading.load_options)
    result, found = run_tiny(pytester, tmp_path, FLOAT16_SDPA_LOAD)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout[-3000:]
    by_test = outcomes(found)
    assert by_test["test_model_load"]["outcome"] == "passed"
    assert by_test["test_model_inspection"]["outcome"] == "failed"
    inspection = next(r for r in found if r["kind"] == "model_inspection")  # the evidence is kept
    assert any("actual torch.float16" in v for v in inspection["violations"])
    assert "attn_implementation: expected eager, actual sdpa" in inspection["violations"]
    load = next(r for r in found if r["kind"] == "model_load")
    assert (load["options"]["dtype"], load["options"]["attn_implementation"]) == ("float16", "sdpa")
    assert_dependents_stopped(found, "model_inspection", "float16")
    assert by_test["test_input[P1]"]["outcome"] == "passed"  # tokenization does not depend on the weights
    assert loading.load_options()["dtype"] == "float32"  # the inner session's patch was undone in this process


def test_a_load_with_missing_and_unexpected_weights_stops_every_dependent(pytester, tmp_path):
    result, found = run_tiny(pytester, tmp_path, drop=("gpt_neox.final_layer_norm.bias",),
                             extra=("gpt_neox.stowaway.weight",))
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout[-3000:]
    by_test = outcomes(found)
    assert by_test["test_model_load"]["outcome"] == "failed"
    assert by_test["test_model_inspection"]["outcome"] == "skipped"
    load = next(r for r in found if r["kind"] == "model_load")  # the evidence is kept
    assert load["loading_info"]["missing_keys"] == ["gpt_neox.final_layer_norm.bias"]
    assert load["loading_info"]["unexpected_keys"] == ["gpt_neox.stowaway.weight"]
    assert any("newly initialized" in message["message"] for message in load["log_messages"])
    assert_dependents_stopped(found, "model_load", "missing_keys")


def test_a_faithful_tiny_load_lets_the_dependents_run(pytester, tmp_path):
    """Control for the two runs above: the same selection on a faithful load runs the dependents."""
    result, found = run_tiny(pytester, tmp_path)
    by_test = outcomes(found)
    assert by_test["test_model_inspection"]["outcome"] == "passed"
    assert all(by_test[name]["outcome"] != "skipped" for name in DEPENDENTS), {
        name: by_test[name]["outcome"] for name in DEPENDENTS}


TRAINING_AFTER_FIRST_FORWARD = '''
import pytest


@pytest.fixture(scope="session")
def model(loaded_specimen):
    """The specimen, put into training mode by its own first forward: inspection (before any forward) sees eval."""
    specimen_model = loaded_specimen["model"]
    specimen_model.register_forward_pre_hook(lambda module, args: module.train(True) and None)
    return specimen_model
'''


def test_a_forward_in_training_mode_fails_its_trial_with_the_evidence(pytester, tmp_path):
    """Issue 26 A4: the watch inside every forward sees what an inspection before the forwards cannot."""
    result, found = run_tiny(pytester, tmp_path, TRAINING_AFTER_FIRST_FORWARD,
                             "test_10_specimen or test_input or P1-G-rep1")
    by_test = outcomes(found)
    assert by_test["test_model_inspection"]["outcome"] == "passed", result.stdout[-3000:]
    trial = by_test["test_generation_trial[P1-G-rep1]"]
    assert trial["outcome"] == "failed" and "broke the controls" in trial["longrepr"]
    [generation] = [r for r in found if r["kind"] == "generation"]
    mode = generation["forward_mode"]
    assert mode["forwards"] >= 2 and mode["violation_count"] == mode["forwards"] - 1 and not mode["none_training"]
    assert mode["violations"][0]["training"] is True and mode["all_inference_mode"]


# --- 14.2-14.7 and 18.6: the records of a stand-in run --------------------------------------------------

FORWARD_PROBE = '''
import logging
import warnings

import pytest


@pytest.fixture(scope="session")
def model(loaded_specimen):
    """The specimen with a probe that warns and logs once per forward, wherever a forward happens."""
    specimen_model = loaded_specimen["model"]

    def probe(module, args, output):
        warnings.warn("forward-probe warning", UserWarning)
        logging.getLogger("transformers.forward_probe").warning("forward-probe log")

    specimen_model.register_forward_hook(probe)
    return specimen_model
'''
EVIDENCE_SELECTION = ("test_10_specimen or test_input or P1-G-rep1 or P1-S1-seed17 or test_40_cache or "
                      "P1-cache_on-warmup or P1-cache_off-rep1 or test_cache_storage_at_each_prefix or "
                      "test_batching_calls or test_timestamp_overhead or test_decode_step_weight_read")


@pytest.fixture(scope="module")
def evidence_run(tmp_path_factory, standin_dir):
    """One stand-in run of a selection that makes every kind of forward, with the probe (made once per session,
    whichever worker asks first)."""
    result = experiment_once(tmp_path_factory, "standin-evidence", "--specimen", "standin", "--artifacts",
                             str(standin_dir), "-k", EVIDENCE_SELECTION, conftest_extra=FORWARD_PROBE, here=True)
    found = result.records()
    failing = {name: o["longrepr"] for name, o in outcomes(found).items() if o["outcome"] != "passed"}
    assert result.returncode == pytest.ExitCode.OK, (failing, result.stdout[-3000:])
    return found


def of_kind(found: list[dict], kind: str) -> list[dict]:
    return [r for r in found if r["kind"] == kind]


def test_every_forward_records_its_warnings_and_log_messages(evidence_run):
    forward_records = {
        "generation": of_kind(evidence_run, "generation"),
        "timing_trial": of_kind(evidence_run, "timing_trial"),
        "cache_inspection": of_kind(evidence_run, "cache_inspection"),
        "cache_comparison": of_kind(evidence_run, "cache_comparison"),
        "cache_summary": of_kind(evidence_run, "cache_summary"),
        "batching": of_kind(evidence_run, "batching"),
    }
    for kind, found in forward_records.items():
        assert found, f"no {kind} record"
        for record in found:
            assert any("forward-probe warning" in m for m in record["warnings"]), (kind, record["warnings"])
            assert any("forward-probe log" in m for m in record["warnings"]), (kind, record["warnings"])
    # 16 selections = 1 prefill + 15 forwards, each warning once and logging once
    timing = forward_records["timing_trial"][0]
    assert sum("forward-probe warning" in m for m in timing["warnings"]) == 16


def test_every_forward_running_record_says_its_forwards_kept_the_controls(evidence_run):
    """Issue 26 A4: counted from inside every forward: the trials', the cache test's and the batching calls'."""
    observed = {"generation": of_kind(evidence_run, "generation"), "timing_trial": of_kind(evidence_run, "timing_trial"),
                "cache_summary": of_kind(evidence_run, "cache_summary"),
                "batching": [r for r in of_kind(evidence_run, "batching") if r["record_type"] == "summary"]}
    for kind, found in observed.items():
        assert found, kind
        for record in found:
            mode = record["forward_mode"]
            assert mode["forwards"] > 0 and mode["violation_count"] == 0, (kind, mode)
            assert mode["all_inference_mode"] and mode["none_training"]
    assert observed["timing_trial"][0]["forward_mode"]["forwards"] == 16  # a prefill and 15 steps
    assert observed["cache_summary"][0]["forward_mode"]["forwards"] == observed["cache_summary"][0]["forward_count"]


def test_output_decoding_is_a_phase_of_every_trial(evidence_run):
    phases = [r for r in of_kind(evidence_run, "phase") if r["name"] == "output_decoding"]
    generation_ids = [r["trial_id"] for r in of_kind(evidence_run, "generation")]
    timing_ids = [r["schedule_id"] for r in of_kind(evidence_run, "timing_trial")]
    assert [(p["source"], p["trial_id"]) for p in phases] == (
        [("generation", t) for t in generation_ids] + [("timing", t) for t in timing_ids])
    generation_decode = {r["trial_id"]: r["decode_s"] for r in of_kind(evidence_run, "generation")}
    for phase in phases:
        assert phase["elapsed_s"] >= 0 and phase["label"]
        if phase["source"] == "generation":
            assert phase["elapsed_s"] == generation_decode[phase["trial_id"]]


def test_the_cache_comparison_records_what_both_paths_were_fed(evidence_run):
    comparisons = of_kind(evidence_run, "cache_comparison")
    for row in comparisons:
        length = row["prefix_length"]
        for path in ("uncached", "cached"):
            fed = row["fed_inputs"][path]
            assert fed["attention_mask"] == [1] * length
            assert fed["position_ids"][-1] == fed["cache_position"][-1] == length - 1
        assert row["checks"]["fed_positions_aligned"] and row["checks"]["fed_masks_aligned"]
    summary = of_kind(evidence_run, "cache_summary")[0]
    for path in ("uncached", "cached"):
        check = summary["prefill_logits_to_keep"][path]
        assert check["ok"] and check["observed_shape"] == [1, 1, 50304]


def test_the_clock_is_recorded_and_no_benchmark_of_another_run(evidence_run):
    clock = of_kind(evidence_run, "clock_overhead")[0]
    assert clock["clock"] == "time.perf_counter_ns" and clock["reads_per_trial"] == 18
    assert clock["per_trial_overhead_ns"] == pytest.approx(clock["per_read_ns"] * 18)
    assert not of_kind(evidence_run, "benchmark_reference")  # issue 26 A6: another run's figure is not this run's


def test_every_generation_states_its_fresh_cache(evidence_run):
    generations = of_kind(evidence_run, "generation")
    assert [g["trial_id"] for g in generations] == ["P1-G-rep1", "P1-S1-seed17", "P1-S1-seed17-rerun"]
    for generation in generations:
        cache = generation["generation_cache"]
        assert cache["fresh"] and cache["length_before_first_forward"] == 0 and cache["new_object"], cache
        assert "built its own cache" in cache["how"]


def test_the_decode_steps_weight_read_is_recorded_with_the_caches(evidence_run):
    """Issue 26 A1: one pass over the step's weights, on the session's thread, beside the machine's caches."""
    read = of_kind(evidence_run, "weight_read")[0]
    assert read["threads"] == {"intra_op": 1, "inter_op": 1} and len(read["seconds"]) == read["passes"]
    assert read["left_out"][0]["name"] == "gpt_neox.embed_in.weight" and read["bytes"] > 20 * 2**20
    assert isinstance(read["caches"]["levels"], list) and read["fits_in_largest_cache"] in (True, False, "unknown")
    assert not of_kind(evidence_run, "memory_bandwidth")


def test_the_cache_bytes_come_from_the_cache_tests_own_forwards(evidence_run):
    """Issue 26 A3: no prefill forward of its own (no probe warning), the bytes at every prefix length."""
    [weighed] = [r for r in of_kind(evidence_run, "memory") if r["measure"] == "cache_storage"]
    comparisons = of_kind(evidence_run, "cache_comparison")
    assert [p["unique_bytes"] for p in weighed["per_prefix"]] == [
        r["cache_unique_bytes_after_forward"] for r in comparisons]
    assert weighed["prompt_length"] == comparisons[0]["prefix_length"] and "warnings" not in weighed


def test_without_the_probe_no_warning_is_added(standin_run):
    """The session's plain stand-in run (no probe; it passed) records no warning from any forward."""
    found = records(standin_run)
    forward_records = [r for r in found if r["kind"] in ("generation", "cache_comparison", "cache_summary")]
    assert forward_records and all(r["warnings"] == [] for r in forward_records)
