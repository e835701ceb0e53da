"""The replica through the experiment: its inputs are the real tokenizer's, and a model row without a token
goes through a greedy trial, timing trials, the records, `verify` and the report. Skipped where ../shared is absent."""

from __future__ import annotations

import pytest

from inferlab import protocol
from inferlab.measure.inputs import NO_TOKEN_NOTE
from inferlab.specimen import build, recipe
from shared_runs import experiment_in_process, inferlab_command, records
from variants import pin_variant

pytestmark = [pytest.mark.process, pytest.mark.skipif(
    not (build.reference_dir() / build.HEADER_FILE).is_file(),
    reason=f"the replica needs pythia-14m's published small files in {build.reference_dir()} (../shared beside "
           f"the project), present on the course's CI machines but not in a learner's clone",
)]
REAL_LENGTHS = {"P1": 8, "P2": 7, "P1x8": 64}
NO_TOKEN_ID = 50290  # one of the 27 rows (50277-50303) the real tokenizer has no token for


def test_a_replica_run_receives_the_real_tokenizers_inputs(replica_run):
    found = records(replica_run)  # the session's replica run (REPLICA_PARTS in conftest.py)
    inputs = {r["prompt_id"]: r for r in found if r["kind"] == "input"}
    assert {p: r["length"] for p, r in inputs.items()} == REAL_LENGTHS
    sources = {**protocol.PROMPTS, **protocol.TIMING_PROMPTS}
    assert all(r["serialized_matches_source"] and r["serialized"] == sources[p] for p, r in inputs.items())
    assert inputs["P1"]["token_ids"][0] == 510  # "The", as in the published ids for "The cat sat"
    # no pad token: the deliberate choice (reuse EOS, no new row) is recorded with its reason
    assert all(r["pad_token_id"] == 0 and "no pad token" in r["pad_reason"] for r in inputs.values())
    eos = next(r for r in found if r["kind"] == "eos_ids")
    assert eos["agree"] and eos["checkpoint_generation_config_present"] is False
    generation_config = next(r for r in found if r["kind"] == "artifact_file" and r["name"] == "generation_config.json")
    assert generation_config["absent_at_revision"] is True
    assert next(r for r in found if r["kind"] == "specimen")["synthetic"] is True


def test_the_replica_run_passes_verifies_as_the_selection_it_is_and_its_report_regenerates(replica_run):
    """Every test of the replica's parts passed (the fixture asserts exit 0); verify's one problem is the selection
    (no integrity problem), and `report --check` regenerates report.md exactly."""
    status, printed = inferlab_command("verify", replica_run)
    problems = printed.splitlines()[:-1]
    assert status == 1 and len(problems) == 1 and problems[0].startswith("partial: -k "), printed
    status, printed = inferlab_command("report", replica_run, "--check")
    assert status == 0 and printed.splitlines()[-1].startswith("report: regenerated text is identical"), printed
    acquisition = next(r for r in records(replica_run) if r["kind"] == "artifact_acquisition")
    assert acquisition["acquisition"] == "built_offline" and acquisition["ok"] is True
    assert all(r["outcome"] == "passed" for r in records(replica_run) if r["kind"] == "test_outcome"), printed


# The parts an id without a token passes through (a greedy trial, timing trials: P1's cache-on warm-up and first
# measured one, as every trial runs the same loop), with the tests they need first.
NO_TOKEN_PATHS = "test_10_specimen or test_20_inputs or P1-G-rep1 or P1-cache_on-warmup or P1-cache_on-rep1"


@pytest.mark.slow
def test_an_id_without_a_token_goes_through_generation_timing_and_the_report(pytester, tmp_path):
    variant = recipe.Variant(forced_token=NO_TOKEN_ID)
    result = experiment_in_process(pytester, "--specimen", "replica-notoken", "--artifacts", str(tmp_path / "variant"),
                                   "-k", NO_TOKEN_PATHS,
                                   prepare=lambda project: pin_variant(project, "replica-notoken", build.REPLICA, variant,
                                                                       tmp_path / "variant"))
    assert result.returncode == pytest.ExitCode.OK, result.tail()
    run = result.run
    found = records(run)

    greedy = next(r for r in found if r["kind"] == "generation" and r["trial_id"] == "P1-G-rep1")
    assert greedy["generated_ids"] == [NO_TOKEN_ID] * protocol.MAX_NEW_TOKENS
    assert greedy["text"] == "" and greedy["text_with_special"] == ""
    assert greedy["generated_pieces"]["pieces"] == [None] * protocol.MAX_NEW_TOKENS
    assert greedy["generated_pieces"]["note"] == NO_TOKEN_NOTE

    timing = [r for r in found if r["kind"] == "timing_trial" and r["status"] == "ok"]
    assert timing and all(r["profiling_text_not_a_response"] == "" for r in timing)
    assert all(r["profiling_pieces"]["ids_without_token"] == [NO_TOKEN_ID] * protocol.TIMING_NEW_TOKENS
               for r in timing)

    status, printed = inferlab_command("verify", run)  # in process, as the experiment ran
    problems = printed.splitlines()[:-1]  # a selection: verify's one line is that it is partial
    assert status == 1 and len(problems) == 1 and problems[0].startswith("partial: -k "), printed
    status, printed = inferlab_command("report", run, "--check")
    assert status == 0, printed
    page = (run / "report.md").read_text()
    assert "| `P1-G-rep1` | max_new_tokens | 16 | `\"\"` |" in page  # an empty continuation, shown as ""
