"""The run's deterministic outputs, read back from its records and tensors (what a reference and a replay compare)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest

from inferlab import protocol
from inferlab.reading.deterministic import deterministic_outputs, sampled_trials, top_logits
from inferlab.reading.runview import RunView

from fixtures_records import build_complete_run

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "schema1-run"


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory) -> Path:
    """One built complete run for the module; the tests read it (a changed copy lives only in memory)."""
    return build_complete_run(tmp_path_factory.mktemp("deterministic") / "run")


def test_every_trial_of_a_complete_run_is_listed_with_the_ids_it_recorded(complete_run):
    run = complete_run
    view = RunView.read(run)
    outputs = deterministic_outputs(view)
    generation = {r["trial_id"]: r["generated_ids"] for r in view.kind("generation")}
    assert list(outputs["generation"]) == [t.test_id for t in protocol.generation_trials()]
    assert {t: o["ids"] for t, o in outputs["generation"].items()} == generation
    assert list(outputs["timing"]) == [t.test_id for t in protocol.timing_schedule()]
    assert outputs["absent"] == {"generation": {}, "timing": {}, "first_step": {}}
    # only the sampling conditions are marked as drawn from the random generator
    assert sampled_trials(outputs) == [t.test_id for t in protocol.generation_trials() if t.condition != "G"]
    assert outputs["prompts"] == {r["prompt_id"]: r["token_ids"] for r in view.kind("input")}


def test_first_step_top_ids_come_from_the_saved_tensor_and_a_tampered_tensor_is_named_absent(complete_run):
    run = complete_run
    view = RunView.read(run)
    record = next(r for r in view.kind("generation") if isinstance(r.get("first_step_logits"), dict))
    array = view.tensor(record["first_step_logits"])
    key = f"{record['prompt_id']}/{record['condition']}"
    assert deterministic_outputs(view)["first_step"][key]["top_ids"] == top_logits(array)["ids"]
    # the record claims another hash than its tensor has: the tensor is not trusted, and that is said
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for changed in records:
        if changed.get("seq") == record["seq"]:
            changed["first_step_logits"]["sha256"] = "0" * 64
    tampered = RunView.from_data(records, view.manifest, view.plan,
                                 {record["first_step_logits"]["file"]: view.tensor_file(record["first_step_logits"]["file"])})
    outputs = deterministic_outputs(tampered)
    assert key not in outputs["first_step"] and "not as its record says" in outputs["absent"]["first_step"][key]


def test_a_failed_trial_is_absent_with_its_status_never_filled_in(complete_run):
    run = complete_run
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    victim = next(r for r in records if r["kind"] == "generation")
    victim.update(status="failed", error="RuntimeError: boom")
    del victim["generated_ids"]
    view = RunView.from_data(records, json.loads((run / "manifest.json").read_text()),
                             json.loads((run / "plan.json").read_text()))
    outputs = deterministic_outputs(view)
    assert victim["trial_id"] not in outputs["generation"]
    assert outputs["absent"]["generation"][victim["trial_id"]] == "status 'failed'"


def test_top_logits_orders_by_value_then_by_the_lower_id():
    assert top_logits(numpy.array([0.5, 2.0, 2.0, -1.0]), k=3) == {"ids": [1, 2, 0], "values": [2.0, 2.0, 0.5]}


def test_the_run_written_by_an_older_main_gives_its_outputs_too():
    outputs = deterministic_outputs(RunView.read(FIXTURE))
    assert len(outputs["generation"]) == len(protocol.generation_trials()) and len(outputs["timing"]) == 24
    assert outputs["cache"]["prefixes"] and all("top2_margin_uncached" in p for p in outputs["cache"]["prefixes"])
