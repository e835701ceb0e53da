"""`revise RUN_DIR --cache-criterion ATOL,RTOL --justification TEXT`: the saved logits judged again (hashes first),
kept as an addendum through the same evaluation as the run's --revised-cache-criterion; refusals write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.measure.revised_criterion import RevisedCriterion, evaluate, judge
from inferlab.reading import addenda
from inferlab.reading.runview import RunView
from inferlab.verify import verify_run

from fixtures_records import copy_run, rewrite_records
from fixture_runs import runs  # noqa: F401 (a fixture)
from test_attach import answered_explanation, built, ledger, run, tree  # noqa: F401 (fixtures)

JUSTIFICATION = "the one-token path sums in another order; errors near 1e-6 are rounding, not a cache fault"


ALIGNMENT = ("same_prefix", "vocab_dim_cached", "vocab_dim_uncached", "finite", "cache_length_matches_prefix",
             "fed_masks_aligned", "fed_positions_aligned")  # a real run's cache_comparison checks (cache_check)


def aligned(run: Path, change=None) -> Path:
    """The fixture run with the alignment checks a real run records in each cache_comparison (all passed, unless
    change(record) alters them) and its summary's all_inputs_aligned: revise takes only a run that has them. The
    manifest's inventory is refreshed; the report is not rendered again."""
    def transform(records):
        for record in records:
            if record["kind"] == "cache_comparison":
                record["checks"] = {**{name: True for name in ALIGNMENT}, "within_tolerance": True}
                if change is not None:
                    change(record)
                record["passed"] = all(record["checks"].values())
        summary = next(r for r in records if r["kind"] == "cache_summary")
        summary["all_inputs_aligned"] = all(r["checks"][name] for r in records if r["kind"] == "cache_comparison"
                                            for name in ("fed_masks_aligned", "fed_positions_aligned"))
        return records

    rewrite_records(run, transform)
    return run


@pytest.fixture
def standin(standin_run, tmp_path) -> Path:
    return copy_run(standin_run, tmp_path / "standin")


def revise(run: Path, criterion: str = "1e-4,1e-3", justification: str = JUSTIFICATION) -> int:
    return main(["revise", str(run), "--cache-criterion", criterion, "--justification", justification])


def document(run: Path, seq: int = -1) -> dict:
    return json.loads((run / ledger(run)[seq]["file"]).read_text())


def test_on_a_finished_stand_in_run_attach_and_revise_succeed_and_verify_names_both(standin, tmp_path, capsys):
    session = tree(standin)
    explanation = tmp_path / "explanation.md"
    explanation.write_text(answered_explanation())
    assert main(["attach", str(standin), str(explanation)]) == 0
    assert revise(standin) == 0
    out = capsys.readouterr().out
    assert "the saved logits of 8 prefixes, each matching its recorded SHA-256, judged again" in out
    assert "|a-b| <= 0.0001 + 0.001*|b|" in out and "stay as recorded in records.jsonl" in out
    after = tree(standin)
    assert {name: after[name] for name in session} == session
    assert set(after) - set(session) == {"addenda.jsonl", "addenda/explanation.md", "addenda/revised_criterion.json"}
    assert main(["verify", str(standin)]) == 0
    assert capsys.readouterr().out.endswith("; 2 addenda added after the session, intact\n")


def test_the_document_holds_both_criteria_both_verdicts_the_justification_and_the_time(standin):
    assert revise(standin) == 0
    entry = ledger(standin)[0]
    assert entry["kind"] == addenda.REVISED_KIND and entry["tool"] == "inferlab revise"
    kept = document(standin)
    assert kept["written_utc"] == entry["attached_utc"] and kept["justification"] == JUSTIFICATION
    declared = RunView.read(standin).first("cache_criterion")
    assert (kept["declared"]["atol"], kept["declared"]["rtol"]) == (declared["atol"], declared["rtol"])
    assert kept["declared"]["recorded_in"] == f"cache_criterion seq {declared['seq']}"
    assert kept["revised"] == RevisedCriterion(protocol.Tolerance(1e-4, 1e-3), JUSTIFICATION).as_record()
    comparisons = RunView.read(standin).kind("cache_comparison")
    assert [row["record_seq"] for row in kept["prefixes"]] == [r["seq"] for r in comparisons]
    for row, record in zip(kept["prefixes"], comparisons):
        assert row["declared"]["passed"] is record["checks"]["within_tolerance"]  # as recorded
        assert row["declared"]["recomputed"]["passed"] is record["checks"]["within_tolerance"]
        assert row["tensors"]["cached"]["sha256"] == record["tensors"]["cached"]["sha256"]
        assert set(row["revised"]) == {"atol", "rtol", "passed", "fail_count", "fail_fraction"}
    assert kept["revised_evaluation"]["all_within_tolerance"] is True and kept["declared_recomputed_disagrees_at"] == []


def test_revise_and_the_run_option_record_the_same_shape_and_numbers(standin):
    """The run's --revised-cache-criterion (cache_check.evaluate_revised, torch tensors) and `revise` (numpy)
    go through one evaluation: the same per-prefix verdicts and the same summary."""
    import torch
    from safetensors.torch import load_file

    from inferlab.measure import cache_check

    assert revise(standin, "1e-7,0") == 0
    kept = document(standin)
    tensors = load_file(str(standin / "tensors/cache_logits.safetensors"))
    result = {"prefixes": [{"name": row["name"], "prefix_length": row["prefix_length"]} for row in kept["prefixes"]]}
    option = cache_check.evaluate_revised(result, tensors, RevisedCriterion(protocol.Tolerance(1e-7, 0.0),
                                                                            JUSTIFICATION))
    assert {row["name"]: row["revised"] for row in kept["prefixes"]} == option["per_prefix"]
    assert kept["revised_evaluation"] == option["summary"]
    assert isinstance(tensors["cached/" + kept["prefixes"][0]["name"]], torch.Tensor)


@pytest.mark.parametrize("special", [None, float("nan"), float("inf")])
def test_the_shared_judge_decides_as_the_declared_comparison_does(special):
    import torch

    from inferlab.measure.cache_check import compare_vectors

    generator = torch.Generator().manual_seed(3)
    uncached = torch.randn(257, generator=generator)
    cached = uncached + 3e-5 * torch.randn(257, generator=generator)
    if special is not None:
        cached[5] = special
    for tolerance in (protocol.CACHE_TOLERANCE, protocol.Tolerance(1e-4, 0.0), protocol.Tolerance(0.0, 0.0)):
        declared = compare_vectors(cached, uncached, tolerance)
        shared = judge(cached.numpy(), uncached.numpy(), tolerance)
        assert shared == {name: declared[name] for name in shared}


def test_a_strict_criterion_fails_prefixes_and_leaves_the_declared_verdict_as_recorded(run, capsys):
    aligned(run)
    records = (run / "records.jsonl").read_bytes()
    assert revise(run, "0,0") == 0
    out = capsys.readouterr().out
    assert "FAILED" in out and "every prefix is within it: no" in out
    kept = document(run)
    assert [row["revised"]["passed"] for row in kept["prefixes"]] == [True] + [False] * (len(kept["prefixes"]) - 1)
    assert all(row["declared"]["passed"] is True for row in kept["prefixes"])  # the fixture's records say passed
    assert kept["revised_evaluation"]["failing_prefix_lengths"] == [r["prefix_length"] for r in kept["prefixes"][1:]]
    assert (run / "records.jsonl").read_bytes() == records


def test_evaluate_names_the_failing_prefix_lengths():
    revised = RevisedCriterion(protocol.Tolerance(0.0, 0.0), "exact")
    same, off = numpy.zeros(4, dtype=numpy.float32), numpy.ones(4, dtype=numpy.float32)
    result = evaluate([("prefix_03", 3, same, same), ("prefix_04", 4, off, same)], revised)
    assert result["per_prefix"]["prefix_04"]["fail_fraction"] == 1.0
    assert result["summary"]["failing_prefix_lengths"] == [4] and result["summary"]["all_within_tolerance"] is False


# --- refused: nothing written ------------------------------------------------------------------------------


def test_a_tensor_that_fails_its_hash_refuses_the_whole_revision(run, capsys):
    aligned(run)
    from safetensors.numpy import load_file, save_file

    path = run / "tensors/cache_logits.safetensors"
    tensors = load_file(str(path))
    key = sorted(k for k in tensors if k.startswith("cached/"))[2]
    tensors[key] = tensors[key] + numpy.float32(1.0)
    save_file(tensors, str(path))
    before = tree(run)
    assert revise(run) == 1
    assert tree(run) == before
    err = capsys.readouterr().err
    assert f"tensors/cache_logits.safetensors[{key}] sha256" in err and "the record says" in err
    assert "1 saved tensor(s) do not match their records, so nothing was judged again" in err
    path.unlink()
    assert revise(run) == 1 and tree(run) == {k: v for k, v in before.items() if k != path.relative_to(run).as_posix()}
    assert "tensors/cache_logits.safetensors missing" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--cache-criterion", "1e-4,1e-3"], "the following arguments are required: --justification"),
    (["--justification", "why"], "the following arguments are required: --cache-criterion"),
    (["--cache-criterion", "1e-4", "--justification", "why"], "expected ATOL,RTOL"),
    (["--cache-criterion=-1,0", "--justification", "why"], "is not finite and >= 0"),
], ids=["no_justification", "no_criterion", "one_number", "negative"])
def test_usage_errors_exit_2_and_write_nothing(run, capsys, argv, words):
    before = tree(run)
    with pytest.raises(SystemExit) as stopped:
        main(["revise", str(run), *argv])
    assert stopped.value.code == 2 and words in capsys.readouterr().err
    assert tree(run) == before


def test_a_blank_justification_is_refused(run, capsys):
    before = tree(run)
    assert revise(run, justification="   ") == 2
    assert "--justification '   ': expected a sentence saying why" in capsys.readouterr().err
    assert tree(run) == before


@pytest.mark.parametrize("text", ["lorem ipsum dolor sit amet consectetur",
                                  "TODO TODO fixme tbd placeholder xxx because"])
def test_a_placeholder_justification_is_refused_by_the_list_every_learner_text_is_judged_by(run, capsys, text):
    before = tree(run)
    assert revise(run, justification=text) == 2
    err = capsys.readouterr().err
    assert "stand in for text without being any" in err and "nothing was written" in err
    assert tree(run) == before


def test_a_run_without_a_cache_comparison_and_a_folder_that_is_not_a_run_are_refused(runs, tmp_path, capsys):
    failed = runs.get("failed")
    before = tree(failed)
    assert revise(failed) == 1 and tree(failed) == before
    assert "no cache_comparison record (evidence), so there are no saved logits" in capsys.readouterr().err
    assert revise(tmp_path) == 2
    assert f"{tmp_path} is not a run's record dir" in capsys.readouterr().err


def test_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["revise", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out and "fails its recorded SHA-256" in out and "no or a blank --justification" in out


# --- verify recomputes a kept revision ----------------------------------------------------------------------


def test_a_revision_edited_together_with_its_ledger_entry_is_still_caught(run):
    aligned(run)
    assert revise(run, "0,0") == 0
    path = run / ledger(run)[0]["file"]
    kept = json.loads(path.read_text())
    kept["prefixes"][3]["revised"]["passed"] = True  # a failing prefix made to pass
    path.write_text(json.dumps(kept, indent=2) + "\n")
    entry = {**ledger(run)[0], "size": path.stat().st_size, "sha256": addenda.sha256_of_file(path)}
    (run / addenda.LEDGER_FILE).write_text(json.dumps(entry) + "\n")
    problems = verify_run(run)["problems"]
    assert len(problems) == 1
    assert problems[0].startswith(f"addenda/revised_criterion.json: {kept['prefixes'][3]['name']}: revised verdict")
    assert "recomputed from the tensors" in problems[0]
