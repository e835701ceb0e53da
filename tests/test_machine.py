"""inferlab.machine and benchmarks/overhead.py: the machine fingerprint and benchmark results found by it."""

from __future__ import annotations

import json

import pytest

from inferlab import machine

OTHER_MACHINE = {"system": "Darwin", "machine": "arm64", "cpu_model": "Apple M9", "logical_cpus": 64}


def result_for(fingerprint: dict, ratio: float, when: str) -> dict:
    return {"machine": fingerprint, "overhead_ratio": ratio, "recorded_utc": when, "software": {"torch": "x"}}


def test_fingerprint_names_the_hardware_and_no_host():
    fingerprint = machine.machine_fingerprint()
    assert set(fingerprint) == {"system", "machine", "cpu_model", "logical_cpus"}
    assert all(fingerprint.values())
    assert fingerprint == machine.machine_fingerprint()  # stable within a machine


def test_no_results_file_means_no_reference(tmp_path):
    reference = machine.benchmark_reference(tmp_path / "results.jsonl")
    assert (reference["found"], reference["file"], reference["result"]) == (False, None, None)
    assert "has not been run here" in reference["note"] and reference["machine"] == machine.machine_fingerprint()


def test_results_from_other_machines_are_not_a_reference(tmp_path):
    path = tmp_path / "results.jsonl"
    machine.append_result(result_for(OTHER_MACHINE, 1.01, "2026-01-01"), path)
    reference = machine.benchmark_reference(path)
    assert reference["found"] is False and reference["result"] is None and reference["file"] == str(path)
    assert "none recorded on a machine with this fingerprint" in reference["note"]


def test_the_latest_result_from_this_machine_is_the_reference(tmp_path):
    path = tmp_path / "results.jsonl"
    here = machine.machine_fingerprint()
    for result in (result_for(here, 1.02, "first"), result_for(OTHER_MACHINE, 1.5, "other"),
                   result_for(here, 0.99, "second")):
        machine.append_result(result, path)
    reference = machine.benchmark_reference(path)
    assert reference["found"] is True and reference["result"]["recorded_utc"] == "second"
    assert "2 result(s) recorded on a machine with this fingerprint" in reference["note"]


def test_a_damaged_results_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "results.jsonl"
    machine.append_result(result_for(OTHER_MACHINE, 1.0, "ok"), path)
    with path.open("a") as handle:
        handle.write("{not json\n")
    with pytest.raises(ValueError, match=r"results.jsonl:2: expected one JSON object per line"):
        machine.benchmark_reference(path)


def test_append_keeps_earlier_results(tmp_path):
    path = tmp_path / "deeper" / "results.jsonl"
    machine.append_result({"n": 1}, path)
    machine.append_result({"n": 2}, path)
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [1, 2]


def test_benchmark_result_carries_the_fingerprint_and_ratios():
    from benchmarks.overhead import make_result

    per_token_ns = {"instrumented": [110.0, 100.0, 105.0], "bare": [100.0, 100.0, 100.0],
                    "generate": [120.0, 121.0, 119.0]}
    warm = {"instrumented": [1, 2], "bare": [1, 2], "generate": [1, 2]}
    result = make_result(per_token_ns, warm, "stand-in", prompt_tokens=9, selections=16, rounds=3)
    assert result["machine"] == machine.machine_fingerprint()
    assert (result["overhead_ratio"], result["generate_ratio"]) == (1.05, 1.2)
    assert result["per_token_ns"]["instrumented"] == {"median": 105.0, "min": 100.0, "max": 110.0}
    assert result["ids_equal"] == {"instrumented_vs_bare": True, "instrumented_vs_generate": True}
    assert json.loads(json.dumps(result)) == result
