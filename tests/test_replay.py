"""replay: a run's deterministic computations redone on the grader's own verified copy of the specimen, with
plain transformers calls, and compared with the records (issue 25 item 3; docs/trust.md).

The session's one real stand-in run (conftest.standin_run) is replayed once through the command line; the
forged copy reuses one loaded model and replays only the parts its edits touch."""

from __future__ import annotations

import json
import time

import pytest

from inferlab import protocol, specimen
from inferlab.__main__ import main
from inferlab.base.records import MANIFEST_FILE, file_inventory
from inferlab.reading.deterministic import saved_tensors
from inferlab.reading.runview import RunView
from inferlab.recheck.replay import Replay

from forging import find, forge
from shared_runs import inferlab_command, loaded_once, made_once, share_loaded_models


@pytest.fixture(scope="module")
def honest(standin_run, standin_dir, tmp_path_factory):
    """`replay RUN --artifacts DIR` of the honest run, in process and once per session: (exit status, output lines,
    the run's files before, after)."""
    def make(_folder):
        before = file_inventory(standin_run)
        with pytest.MonkeyPatch.context() as patch:
            share_loaded_models(patch)  # the process's one load of the copy (grader_model below reuses it)
            status, printed = inferlab_command("replay", standin_run, "--artifacts", standin_dir)
        return [status, printed.splitlines(), before, file_inventory(standin_run)]

    return tuple(made_once(tmp_path_factory, "replay-of-the-standin-run", make))


def test_an_honest_run_replays_in_full_and_agrees_in_every_output(honest, standin_run):
    status, lines, _, _ = honest
    records = [json.loads(line) for line in (standin_run / "records.jsonl").read_text().splitlines()]
    saved = [r for r in records if r["kind"] == "generation" and r.get("first_step_logits")]
    expected = {
        "specimen pins": 2 + len(protocol.ALLOWLISTED_FILES),  # name, revision, each file's size and hash
        "prompts' ids": len({**protocol.PROMPTS, **protocol.TIMING_PROMPTS}),
        "generation trials' ids": len(protocol.generation_trials()),
        "first-step logits' top values": len({(r["prompt_id"], r["condition"]) for r in saved}),
        "matched prefixes": sum(1 for r in records if r["kind"] == "cache_comparison"),
        "timing trials' ids": len(protocol.timing_schedule()),
        "batching calls' ids": sum(1 for r in records if r["kind"] == "batching" and r["record_type"] == "call"),
        "saved tensors": len(saved_tensors(RunView.read(standin_run))),  # every one the run saved
    }
    compared = next(line for line in lines if line.startswith("compared with the replay (bit for bit): "))
    assert compared.split(": ", 1)[1] == ", ".join(f"{count} {what}" for what, count in expected.items()), compared
    assert not [line for line in lines if line.startswith("  contradiction: ")], lines
    assert status == 0 and lines[-1].startswith("replay: the run agrees with the replay in every compared output")


def test_replay_writes_nothing_into_the_run(honest):
    _, _, before, after = honest
    assert after == before


@pytest.fixture(scope="module")
def grader_model(standin_dir):
    """The grader's model and tokenizer, loaded once per process as replay loads them, each computation made once
    (shared_runs.loaded_once): every forged copy is still compared with the replay's outputs."""
    verification = specimen.check_specimen_files(standin_dir, specimen.load_spec("standin"))
    return loaded_once(standin_dir, verification)


def replayed(run, grader_model, *computations: str):
    """The run compared with the named computations of Replay (in the protocol's order), redone on the grader's
    model: the Comparison."""
    import torch

    model, tokenizer = grader_model
    replay = Replay(RunView.read(run), model, tokenizer, time.monotonic())
    with torch.inference_mode():
        for computation in computations:
            getattr(replay, computation)()
    return replay.compare()


def test_a_run_whose_ids_were_edited_disagrees_and_names_each_trial(standin_run, grader_model, tmp_path):
    """Greedy and timing ids edited (and re-hashed); the run also says another torch drew its seeded ids, so
    those are not compared (a note says how many drew the same ids all the same)."""
    def edit(records):
        find(records, "generation", trial_id="P1-G-rep2")["generated_ids"][4] += 1
        find(records, "timing_trial", schedule_id="P1x8-cache_on-rep2")["generated_ids"][9] += 1

    run = forge(standin_run, tmp_path / "edited", edit)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    manifest["distributions"]["torch"] = "2.0.0"
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))
    result = replayed(run, grader_model, "inputs", "generation", "timing")
    assert result.compared["prompts"] == len({**protocol.PROMPTS, **protocol.TIMING_PROMPTS})
    assert len(result.contradictions) == 2, result.contradictions
    for line, trial in zip(result.contradictions, ("generation P1-G-rep2", "timing P1x8-cache_on-rep2")):
        assert line.startswith(f"{trial}: ids first differ at step ") and " in the run, " in line, line
        assert " in the replay (" in line, line
    sampled = sum(1 for t in protocol.generation_trials() if protocol.CONDITIONS[t.condition].do_sample)
    assert result.compared["sampled_not_compared"] == sampled, result.compared
    note = next(note for note in result.notes if "seeded sampling trials not compared" in note)
    assert "the run drew them with torch 2.0.0" in note and f"({sampled} of them drew the same ids" in note, note


def test_no_comparison_is_switched_off_by_a_reference_removed_or_a_version_claimed(standin_run, grader_model,
                                                                                  tmp_path):
    """Two ways of leaving a forged figure nothing to be checked against, each caught by the replay before it
    compared through the one comparison and missed by that comparison's first version (found by a hostile
    review): the saved tensors' references removed from every matched prefix and batching call (verify then
    recomputes none of their figures, and says so); and a seeded trial's ids edited under a manifest that claims
    another transformers (a seed's numbers are torch's; what transformers does before the draw is in the
    processed scores, compared as saved tensors)."""
    def edit(records):
        for record in records:
            if record["kind"] == "cache_comparison":
                record.pop("tensors")
            elif record["kind"] == "batching" and record["record_type"] == "call":
                record.pop("first_step_logits")
        find(records, "generation", trial_id="P1-S2-seed17")["generated_ids"][5] += 1

    run = forge(standin_run, tmp_path / "stripped", edit)
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    manifest["distributions"]["transformers"] = "4.0.0"
    (run / MANIFEST_FILE).write_text(json.dumps(manifest))
    from inferlab.verify import verify_run

    assert {"cache comparison statistics", "batching first-step statistics"} <= {
        line.split(":")[0] for line in verify_run(run)["not_checked"]}
    result = replayed(run, grader_model, "inputs", "generation", "matched_prefix", "batching")
    records = [json.loads(line) for line in (standin_run / "records.jsonl").read_text().splitlines()]
    stripped = [f"saved tensor cache_comparison {r['prefix_length']} {side}" for r in records
                if r["kind"] == "cache_comparison" for side in ("cached", "uncached")]
    stripped += [f"saved tensor batching {r['call_index']} first_step_logits" for r in records
                 if r["kind"] == "batching" and r["record_type"] == "call"]
    said = [line.split(": ")[0] for line in result.contradictions
            if line.endswith(": the run's record references no saved tensor there, and the replay has one")]
    assert sorted(said) == sorted(stripped), result.contradictions
    [sampled] = [line for line in result.contradictions if line.startswith("generation P1-S2-seed17: ")]
    assert "ids first differ at step 5" in sampled and "the run records transformers 4.0.0" in sampled, sampled
    assert len(result.contradictions) == len(stripped) + 1, result.contradictions


def test_replay_refuses_what_is_not_a_run_or_a_copy_that_fails_verification(standin_run, tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--specimen", "standin"]) == 2
    assert "is not a run's record dir" in capsys.readouterr().err
    (tmp_path / "copy").mkdir()
    assert main(["replay", str(standin_run), "--artifacts", str(tmp_path / "copy")]) == 2
    assert "failed verification" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["replay", str(standin_run), "--artifacts", str(tmp_path), "--specimen", "standin"])
    assert usage.value.code == 2


def test_processed_scores_with_top_p_undone_and_their_hash_redone_disagree_with_the_replay(
        standin_run, grader_model, tmp_path):
    """P1-S3's saved scores given every dropped token's raw logit back (top-p undone), the record's hash redone: the
    raw logits still agree, and only the replay's own scores, from its own generate(), see it."""
    import hashlib

    import numpy
    from safetensors.numpy import load_file, save_file

    def edit(records):
        record = find(records, "generation", trial_id="P1-S3-seed17")
        scores, logits = record["first_step_scores"], record["first_step_logits"]
        path = run / scores["file"]
        tensors = load_file(str(path))
        raw = load_file(str(run / logits["file"]))[logits["key"]]
        edited = numpy.where(numpy.isneginf(tensors[scores["key"]]), raw, tensors[scores["key"]]).astype(numpy.float32)
        assert not numpy.array_equal(edited, tensors[scores["key"]]), "top-p dropped nothing: the test edits nothing"
        tensors[scores["key"]] = edited
        save_file(tensors, str(path))
        scores["sha256"] = hashlib.sha256(numpy.ascontiguousarray(edited).astype("<f4").tobytes()).hexdigest()
        if isinstance(record.get("first_step_scores_sha256"), str):
            record["first_step_scores_sha256"] = scores["sha256"]

    run = tmp_path / "edited"
    forge(standin_run, run, edit)
    result = replayed(run, grader_model, "inputs", "generation", "first_step")
    assert len(result.contradictions) == 1, result.contradictions
    line = result.contradictions[0]
    assert line.startswith("saved tensor generation P1-S3-seed17 first_step_scores (") and "under the same " \
        "conditions; element [" in line and " against -inf (" in line, line


def test_a_replay_past_the_session_limit_computes_nothing_more_and_the_run_cannot_agree(tmp_path_factory):
    """The bound: once the protocol's session limit has passed, no model call is made (the model here is None)."""
    from types import SimpleNamespace

    from inferlab.recheck.replay import LIMIT_S, agrees

    from fixture_runs import fixture_runs

    view = fixture_runs(tmp_path_factory).data("complete").view()
    tokenizer = SimpleNamespace(eos_token_id=0, pad_token_id=None, bos_token_id=None)
    late = Replay(view, None, tokenizer, time.monotonic() - LIMIT_S - 1)
    late.generation()
    late.timing()
    result = late.compare()
    assert result.contradictions == [f"stopped: the replay ran past the protocol's session limit of {LIMIT_S} s"]
    assert not agrees(result) and late.replayed["generation"] == {} and late.replayed["timing"] == {}
