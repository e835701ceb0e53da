"""Early EOS end to end: stand-in variants whose P1 greedy trial stops after 1 and after 3 tokens, run
through every part of the experiment that an early stop changes, its records, `verify` and the report.

A real Pythia run takes these paths; the base stand-in almost never does under greedy selection, so the
variants force EOS after chosen clusters (inferlab.specimen.recipe.Variant) and are pinned on the fly in the
scratch project's own spec file, used through --artifacts like a learner's copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferlab import protocol, specimen
from inferlab.measure import cache_check, loading
from inferlab.specimen import recipe
from inferlab.specimen.build import STANDIN
from shared_runs import experiment_in_process, inferlab_command, make_project, records
from variants import pin_variant

EOS = 0


@pytest.fixture(scope="module")
def base_p1(standin_dir, standin_spec):
    """P1's ids and its first three greedy ids on the base stand-in."""
    loaded = loading.load_specimen(standin_dir, standin_spec)
    ids = loaded["tokenizer"](protocol.PROMPTS["P1"], add_special_tokens=protocol.ADD_SPECIAL_TOKENS)["input_ids"]
    with torch.inference_mode():
        output = loaded["model"].generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                          max_new_tokens=3, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    return ids, output[0, len(ids):].tolist()


def variant_for_stop_after(stop_after: int, prompt_ids: list[int], greedy: list[int]) -> recipe.Variant:
    """A variant whose P1 greedy trial selects EOS as token number `stop_after` (1 = at once)."""
    structure = recipe.structure()
    context = [prompt_ids[-1], *greedy]  # the current token before each selection
    forced = int(structure.cluster[context[stop_after - 1]])
    earlier = {int(structure.cluster[token]) for token in context[:stop_after - 1]}
    assert forced not in earlier, f"precondition: cluster {forced} already occurs before selection {stop_after}"
    assert EOS not in greedy[:stop_after - 1], "precondition: the base chain has no EOS before the forced one"
    return recipe.Variant(forced_eos_clusters=(forced,))


# What the test reads, with the tests these need first (the specimen's and the inputs'): P1's reference trial, the
# cache test, P1's cache-on warm-up and first measured timing trial (every trial runs the same loop), the
# loop-against-generate check and batching. P2's trials, the other timing trials and memory take no path an early
# EOS changes, and are left out.
EOS_PATHS = ("test_10_specimen or test_20_inputs or P1-G-rep1 or test_40_cache or P1-cache_on-warmup or "
             "P1-cache_on-rep1 or test_loop_matches_generate or test_70_batching")


def run_variant(pytester, tmp_path, stop_after: int, base_p1) -> Path:
    """The experiment's EOS_PATHS on the variant, pinned in a scratch project's own spec and given through
    --artifacts (an inner session of this process: the variant patches nothing here)."""
    prompt_ids, greedy = base_p1
    name = f"standin-eos{stop_after}"
    variant = variant_for_stop_after(stop_after, prompt_ids, greedy)
    result = experiment_in_process(
        pytester, "--specimen", name, "--artifacts", str(tmp_path / name), "-k", EOS_PATHS,
        prepare=lambda project: pin_variant(project, name, STANDIN, variant, tmp_path / name))
    assert result.returncode == pytest.ExitCode.OK, result.tail()
    return result.run


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("stop_after", [1, 3], ids=["eos-after-1", "eos-after-3"])
def test_early_eos_runs_end_to_end(pytester, tmp_path, base_p1, stop_after):
    run = run_variant(pytester, tmp_path, stop_after, base_p1)
    found = records(run)
    by_kind = lambda kind: [r for r in found if r["kind"] == kind]  # noqa: E731

    # 1) generate() stops at EOS and the shorter output is kept as it is
    reference = next(r for r in by_kind("generation") if r["trial_id"] == "P1-G-rep1")
    assert reference["generated_ids"][-1] == EOS and reference["generated_length"] == stop_after
    assert reference["stop_reason"] == "eos"
    assert len(reference["sequence_ids"]) == reference["prompt_length"] + stop_after

    # 2) the cache test compares exactly the m available targets; m = 1 is recorded as prefill only
    summary = next(r for r in by_kind("cache_summary") if r.get("available"))
    assert summary["m"] == stop_after and len(by_kind("cache_comparison")) == stop_after
    assert summary["forward_count"] == 2 * stop_after
    assert summary["cache_reuse_exercised"] is (stop_after > 1)
    assert (cache_check.NOTE_PREFILL_ONLY in summary["notes"]) is (stop_after == 1)
    prefix_outcomes = [r for r in by_kind("test_outcome") if "test_cache_prefix_agrees" in r["test"]]
    assert [r["outcome"] for r in prefix_outcomes] == (
        ["passed"] * stop_after + ["skipped"] * (protocol.CACHE_MAX_TARGET_TOKENS - stop_after))

    # 3) the timing loop goes on past the EOS and says so
    p1_cache_on = [t for t in by_kind("timing_trial") if t["prompt_id"] == "P1" and t["use_cache"]]
    assert len(p1_cache_on) == 2 and all(t["output_length"] == protocol.TIMING_NEW_TOKENS for t in p1_cache_on)
    assert all(t["eos_selected"] and t["eos_positions"][0] == stop_after - 1 for t in p1_cache_on)
    assert all(t["continued_past_eos"] for t in p1_cache_on)

    # 4) loop and generate agree through the EOS, and no more
    check = by_kind("loop_vs_generate")[0]
    assert check["equal"] and check["compared_length"] == stop_after

    # 4b) in a batch the rows stop at different lengths, and each still matches its singleton
    batch = next(r for r in by_kind("batching") if r["record_type"] == "summary")
    lengths = {c["request_id"]: len(c["generated_ids_batch"]) for c in batch["comparisons"]}
    assert lengths["P1"] == stop_after and all(c["generated_ids_identical"] for c in batch["comparisons"])
    if stop_after > 1:  # P2 ends with the same '.', so only a later stop can leave it running
        assert lengths["P2"] > lengths["P1"], lengths

    # 5) the records verify (verify's one line is that the selection is partial), and the report renders from them
    # (empty text included); the commands run in process too
    status, printed = inferlab_command("verify", run)
    problems = printed.splitlines()[:-1]
    assert status == 1 and len(problems) == 1 and problems[0].startswith("partial: -k "), printed
    status, printed = inferlab_command("report", run, "--check")
    assert status == 0, printed
    if stop_after == 1:
        assert reference["text"] == ""
        assert "prefill only: cache reuse not exercised" in (run / "report.md").read_text()


@pytest.mark.slow
def test_a_variant_pin_is_refused_for_the_base_bytes(tmp_path, base_p1):
    """The variant's spec pins the variant's weights: the base stand-in does not pass it (no silent swap)."""
    prompt_ids, greedy = base_p1
    project = make_project(tmp_path / "project")
    pin_variant(project, "standin-eos1", STANDIN, variant_for_stop_after(1, prompt_ids, greedy), tmp_path / "variant")
    spec = specimen.load_spec("standin-eos1", project / "artifacts")
    base = STANDIN.build(tmp_path / "base")
    assert base["files"]["model.safetensors"]["sha256"] != spec.expected["model.safetensors"]["sha256"]
    assert not specimen.check_specimen_files(tmp_path / "base", spec)["ok"]
