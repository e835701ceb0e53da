"""The instructor's reference (`reference RUN_DIR -o REF.json`) and `grade --reference`: an honest run of the same
specimen agrees with it; edited ids, a relabelled specimen, changed source or logits contradict it (exit 3).
Runs are built with the harness's writers (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.grading.grade import grade_source
from inferlab.grading.reference import REFERENCE_FORMAT, REFERENCE_SCHEMA, experiment_source, load_reference, \
    make_reference
from inferlab.base.records import MANIFEST_FILE, write_json_atomic
from inferlab.grading.rubric import load_rubric
from inferlab.reading.runview import RunView, tensor_sha256
from inferlab.verify import verify_run

from fixtures_records import NEAR_TIE_PROMPT, NEAR_TIE_STEP, build_complete_run, copy_run, edit_manifest, kill_after, \
    refresh_manifest, rerender, rewrite_records
from grading_helpers import submit_ready, verify_reads_addenda
from fixture_runs import fixture_runs


@pytest.fixture(scope="module")
def instructor(tmp_path_factory) -> Path:
    """The instructor's honest run (stand-in), shared: never change it."""
    return fixture_runs(tmp_path_factory).get("honest")


@pytest.fixture(scope="module")
def reference_file(instructor, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("reference") / "REF.json"
    assert main(["reference", str(instructor), "-o", str(target)]) == 0
    return target


@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> Path:
    """Another honest run of the same specimen on another machine, shared: never change it."""
    return fixture_runs(tmp_path_factory).get("honest_elsewhere")


@pytest.fixture
def learner_copy(learner, tmp_path) -> Path:
    return copy_run(learner, tmp_path / "learner")


def grade_against(run: Path, reference_path: Path):
    return grade_source(run, load_rubric(), load_reference(reference_path), reference_file=str(reference_path))


def contradictions(grade) -> list[str]:
    return grade.reference["contradictions"]


# --- the reference file ----------------------------------------------------------------------------


def test_the_reference_holds_pins_sources_outputs_and_a_declared_tolerance(reference_file, instructor):
    reference = json.loads(reference_file.read_text())
    assert (reference["format"], reference["schema"]) == (REFERENCE_FORMAT, REFERENCE_SCHEMA)
    assert reference["specimen"]["name"] == "standin" and reference["specimen"]["synthetic"] is True
    assert set(reference["specimen"]["files"]) == set(protocol.ALLOWLISTED_FILES)
    assert reference["sources"] and all(experiment_source(p) for p in reference["sources"])
    assert "inferlab/protocol.py" in reference["sources"] and "conftest.py" in reference["sources"]
    assert not any(p.startswith(("tests/", "analytic_tests/", "benchmarks/")) for p in reference["sources"])
    outputs = reference["outputs"]
    assert len(outputs["generation"]) == 26 and len(outputs["timing"]) == 24 and outputs["first_step"]
    assert reference["tolerance"]["atol"] > 0 and "near tie" in reference["tolerance"]["rule"]
    assert reference["from_run"]["record_dir"] == instructor.name


def test_reference_refuses_a_run_verify_does_not_trust_and_an_existing_file(instructor, reference_file, tmp_path,
                                                                           capsys):
    assert main(["reference", str(instructor), "-o", str(reference_file)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["reference", str(instructor), "-o", str(instructor / "REF.json")]) == 2
    damaged = copy_run(instructor, tmp_path / "damaged")
    (damaged / "plan.json").write_text("{}")
    assert main(["reference", str(damaged), "-o", str(tmp_path / "REF.json")]) == 1
    assert "not a run to trust" in capsys.readouterr().out and not (tmp_path / "REF.json").exists()
    assert main(["reference", str(tmp_path), "-o", str(tmp_path / "R.json")]) == 2


@pytest.mark.parametrize("content, message", [("not json", "not JSON"), ('{"format": "x"}', "not an inferlab reference"),
                                              (json.dumps({"format": REFERENCE_FORMAT, "schema": 9}), "schema 9")])
def test_a_reference_that_cannot_be_used_exits_2(learner, tmp_path, capsys, content, message):
    bad = tmp_path / "REF.json"
    bad.write_text(content)
    assert main(["grade", str(learner), "--reference", str(bad)]) == 2
    assert message in capsys.readouterr().err


# --- honest runs agree ------------------------------------------------------------------------------


def test_another_honest_run_of_the_same_specimen_agrees_with_the_reference(learner, reference_file):
    grade = grade_against(learner, reference_file)
    assert contradictions(grade) == [] and grade.integrity_problems == []
    assert grade.reference["compared"]["generation"] == 26 and grade.reference["compared"]["timing"] == 24
    assert grade.exit_status == grade_source(learner, load_rubric()).exit_status  # the reference adds nothing


def test_an_honest_submitted_run_graded_against_the_reference_exits_0(learner_copy, reference_file, capsys):
    submit_ready(learner_copy)
    if not verify_reads_addenda(learner_copy):
        pytest.skip("verify on this branch lists addenda.jsonl as a file the manifest does not list (issue 23 "
                    "teaches it the layout); runs once that is merged")
    assert main(["grade", str(learner_copy), "--reference", str(reference_file)]) == 0
    assert "and the run agrees with the reference" in capsys.readouterr().out


def test_sampled_ids_drawn_by_another_torch_are_not_compared_but_mentioned(learner_copy, reference_file):
    manifest = json.loads((learner_copy / MANIFEST_FILE).read_text())
    edit_manifest(learner_copy, distributions={**manifest["distributions"], "torch": "2.14.0"})

    def other_draw(records):  # another torch may draw other tokens from the same seed
        for record in records:
            if record["kind"] == "generation" and record["trial_id"] == "P1-S1-seed23":
                record["generated_ids"] = [1] * len(record["generated_ids"])
        return records

    rewrite_records(learner_copy, other_draw)
    grade = grade_against(learner_copy, reference_file)
    assert contradictions(grade) == []
    assert any("seeded sampling trials not compared" in n and "torch 2.14.0" in n for n in grade.reference["notes"])


# --- forgeries contradict it -------------------------------------------------------------------------


def edit_greedy_ids(run: Path, trial_prefix: str = "P2-G-") -> None:
    """Change every greedy repetition's 5th id (so that they still agree with each other) and re-hash."""
    def edit(records):
        for record in records:
            if record["kind"] == "generation" and record["trial_id"].startswith(trial_prefix):
                ids = list(record["generated_ids"])
                ids[4] = (ids[4] + 1) % 64
                record["generated_ids"] = ids
                record["sequence_ids"] = record["prompt_ids"] + ids
        return records

    rewrite_records(run, edit)


def test_greedy_ids_edited_and_rehashed_contradict_the_reference(learner_copy, reference_file, capsys):
    edit_greedy_ids(learner_copy)
    grade = grade_against(learner_copy, reference_file)
    found = [c for c in contradictions(grade) if c.startswith("generation P2-G-rep")]
    assert len(found) == 3 and "first differ at step 4" in found[0]
    assert main(["grade", str(learner_copy), "--reference", str(reference_file)]) == 3
    assert "generation P2-G-rep1: ids first differ at step 4" in capsys.readouterr().out


def flip_greedy(run: Path, prompt_id: str, step: int, values=None, runner_up=None) -> None:
    """What another CPU's honest run would record where greedy step `step` of every `prompt_id` repetition took
    the runner-up: that id selected, its old top the runner-up, the top two `values` (default: within the
    tolerance of both old values), every later id another; and every record derived from the ids redone, as a
    forger re-hashing a copy would."""
    from inferlab.measure import summaries

    def edit(records):
        for record in records:
            if record["kind"] == "generation" and record["trial_id"].startswith(f"{prompt_id}-G-"):
                ids, pairs = list(record["generated_ids"]), [list(p) for p in record["step_top2_ids"]]
                tops = [list(v) for v in record["step_top2_logits"]]
                old, new = ids[step], pairs[step][1] if runner_up is None else runner_up
                top, second = tops[step]
                margin = top - second
                ids[step], pairs[step] = new, [new, old]
                tops[step] = values or [top - 0.4 * margin, top - 0.6 * margin]
                for later in range(step + 1, len(ids)):
                    ids[later] = 1 + (ids[later] + 6) % 63
                    pairs[later] = [ids[later], pairs[later][1] if pairs[later][1] != ids[later] else 0]
                record.update(generated_ids=ids, sequence_ids=record["prompt_ids"] + ids, step_top2_ids=pairs,
                              step_top2_logits=tops, text=" ".join(f"w{i}" for i in ids))
        generations = [r for r in records if r["kind"] == "generation"]
        for record in records:
            if record["kind"] == "sampling_summary" and record["prompt_id"] == prompt_id:
                record.update(summaries.sampling_summary(generations, prompt_id))
        return records

    rewrite_records(run, edit)
    rerender(run)  # the pages say what the edited records say, as a forger would leave them


def test_a_near_tie_that_flips_is_a_noted_divergence_not_a_contradiction(learner_copy, reference_file, capsys):
    """Must show: the fixtures' P2 step 9 is a near tie (margin 1e-3, top ~ 11: the limit is 2*(1e-4 + 1e-4*11)).
    A copy that took the runner-up there, as another CPU may, with its later ids other ones, is a near-tie
    divergence noted with the step and both margins, not exit 3."""
    flip_greedy(learner_copy, NEAR_TIE_PROMPT, NEAR_TIE_STEP)
    assert verify_run(learner_copy)["problems"] == [] or not verify_reads_addenda(learner_copy)
    grade = grade_against(learner_copy, reference_file)
    assert contradictions(grade) == [], contradictions(grade)
    noted = [n for n in grade.reference["notes"] if n.startswith(f"generation {NEAR_TIE_PROMPT}-G-rep")]
    assert len(noted) == 3 and f"a near-tie divergence at step {NEAR_TIE_STEP}" in noted[0]
    assert "top-two margin 0.0002 in the run, 0.001 in the reference" in noted[0]
    assert grade.reference["compared"]["near_tie_divergences"] == 3
    assert main(["grade", str(learner_copy), "--reference", str(reference_file)]) != 3
    assert "a near-tie divergence at step 9" in capsys.readouterr().out


def test_a_flip_where_the_margin_is_wide_still_contradicts_even_with_a_forged_tiny_margin(learner_copy,
                                                                                         reference_file):
    """Must show: edited greedy ids at a step of a wide margin (P2 step 4) are exit 3, also when the copy claims a
    near tie there itself (its top two values then disagree with the reference's at a step both computed from the
    same ids), and when it claims the reference's values but picks an id that is not the runner-up."""
    flip_greedy(learner_copy, "P2", 4, values=[11.0, 11.0 - 1e-6])
    found = [c for c in contradictions(grade_against(learner_copy, reference_file)) if c.startswith("generation P2-G-")]
    assert any("top two raw logits beyond the tolerance at step 4" in c for c in found)
    assert any("ids first differ at step 4" in c and "not a near tie" in c for c in found)
    assert main(["grade", str(learner_copy), "--reference", str(reference_file)]) == 3


def test_a_near_tie_only_excuses_the_runner_up(learner_copy, reference_file):
    view = RunView.read(learner_copy)
    record = next(r for r in view.kind("generation") if r.get("trial_id") == "P2-G-rep1")
    other = next(i for i in range(1, 64) if i not in record["step_top2_ids"][NEAR_TIE_STEP])
    flip_greedy(learner_copy, NEAR_TIE_PROMPT, NEAR_TIE_STEP, runner_up=other)
    found = contradictions(grade_against(learner_copy, reference_file))
    assert any(c.startswith("generation P2-G-rep1: ids first differ at step 9") for c in found), found


@pytest.mark.parametrize("part, trials", [("test_10_specimen", 0), ("test_30_sampling", 10), ("test_40_cache", 2),
                                          ("test_50_timing", 7)])
def test_an_honest_partial_run_fails_its_missing_items_with_no_integrity_problem(learner, reference_file, tmp_path,
                                                                                 part, trials):
    """Must show: a run killed part way (before its specimen was verified: no pins and no prompts yet, which gave 8
    contradictions before; ten generation trials in; in the cache test; seven timing trials in), graded against
    the full reference: what it lacks is not compared, its items fail for it, and the reference adds no
    integrity problem."""
    partial = copy_run(learner, tmp_path / "partial")
    outcomes = [r for r in RunView.read(partial).records if r["kind"] == "test_outcome"]
    first = next(i for i, r in enumerate(outcomes) if part in r["test"])
    kill_after(partial, max(first + trials, 1))
    grade = grade_against(partial, reference_file)
    assert contradictions(grade) == [], contradictions(grade)
    alone = grade_source(partial, load_rubric())
    assert grade.integrity_problems == alone.integrity_problems and grade.exit_status == alone.exit_status
    if part != "test_10_specimen":  # (there the fixture's truncated plan is a problem of verify's own)
        assert grade.integrity_problems == [] and grade.exit_status == 1
    assert any(i.status == "fail" for i in grade.items)
    compared = grade.reference["compared"]
    assert compared["generation"] < 26 or compared["timing"] < 24


def test_a_reference_of_another_specimen_is_a_usage_error_naming_both(learner, reference_file, tmp_path, capsys):
    """Must show (in files): a stand-in run against a reference of another specimen is exit 2 with both names; of
    several references, grade takes the one of the run's specimen; two of one specimen are a usage error."""
    other = build_complete_run(tmp_path / "pythia", synthetic=False, seed=1, report=False)
    other_ref = tmp_path / "REF-pythia.json"
    write_json_atomic(other_ref, make_reference(RunView.read(other)))
    assert main(["grade", str(learner), "--reference", str(other_ref)]) == 2
    out = capsys.readouterr().out
    assert f"is of specimen {protocol.DEFAULT_SPECIMEN!r}, the run of specimen 'standin'" in out, out
    assert "contradict" not in out
    alone = main(["grade", str(learner)])
    capsys.readouterr()
    assert main(["grade", str(learner), "--reference", str(other_ref), "--reference", str(reference_file)]) == alone
    assert "and the run agrees with the reference" in capsys.readouterr().out
    assert main(["grade", str(learner), "--reference", str(reference_file), "--reference", str(reference_file)]) == 2
    assert "two references of specimen 'standin'" in capsys.readouterr().err


def test_a_reference_of_another_protocol_is_a_usage_error(learner, reference_file, tmp_path, capsys):
    reference = json.loads(reference_file.read_text())
    reference["protocol"]["fields"]["seeds"] = [1, 2, 3]
    reference["protocol"]["sha256"] = "0" * 64
    other = tmp_path / "REF-other-protocol.json"
    write_json_atomic(other, reference)
    assert main(["grade", str(learner), "--reference", str(other)]) == 2
    assert "differing: seeds" in capsys.readouterr().out


def test_a_run_that_records_another_protocol_is_no_usage_error_but_an_integrity_problem(learner_copy,
                                                                                      reference_file, capsys):
    """A run cannot turn its exit 3 into a wrong-reference exit 2 by recording another protocol: verify names the
    protocol this checkout does not have, and the reference is said not to apply."""
    manifest = json.loads((learner_copy / MANIFEST_FILE).read_text())
    edit_manifest(learner_copy, protocol={**manifest["protocol"], "seeds": [1, 2, 3]})
    refresh_manifest(learner_copy)
    assert main(["grade", str(learner_copy), "--reference", str(reference_file)]) == 3
    assert "the reference does not apply to this run, so it was not compared" in capsys.readouterr().out


def test_a_schema_1_reference_is_refused_with_how_to_make_it_again(learner, reference_file, tmp_path, capsys):
    old = json.loads(reference_file.read_text())
    old["schema"] = 1
    path = tmp_path / "REF-old.json"
    write_json_atomic(path, old)
    assert main(["grade", str(learner), "--reference", str(path)]) == 2
    assert "knows no greedy step's margins" in capsys.readouterr().err


def test_grade_and_the_reference_show_the_cpu_kernels(learner, reference_file):
    grade = grade_against(learner, reference_file)
    assert any(n.startswith("CPU kernels: ") for n in grade.notes)
    assert any(n.startswith("CPU kernels: the run ") and "the reference's run" in n for n in grade.reference["notes"])


def test_changed_source_is_listed_by_file(learner_copy, reference_file):
    manifest = json.loads((learner_copy / MANIFEST_FILE).read_text())
    hashes = dict(manifest["source_sha256"])
    hashes["inferlab/protocol.py"] = "0" * 64  # the tolerance loosened in protocol.py
    hashes["experiments/test_99_extra.py"] = "1" * 64
    del hashes["pytest.ini"]
    edit_manifest(learner_copy, source_sha256=hashes)
    refresh_manifest(learner_copy)
    found = [c for c in contradictions(grade_against(learner_copy, reference_file)) if c.startswith("source ")]
    assert found == ["source experiments/test_99_extra.py: recorded by the run, not in the reference",
                     f"source inferlab/protocol.py: sha256 {'0' * 64} in the run, "
                     f"{manifest['source_sha256']['inferlab/protocol.py']} in the reference",
                     "source pytest.ini: in the reference, not recorded by the run"]


def test_first_step_logits_beyond_the_tolerance_contradict_it(learner_copy, reference_file):
    from safetensors.numpy import save_file

    view = RunView.read(learner_copy)
    record = next(r for r in view.kind("generation") if r.get("trial_id") == "P2-G-rep1")
    reference = record["first_step_logits"]
    tensors = dict(view.tensor_file(reference["file"]))
    tensors[reference["key"]] = (tensors[reference["key"]] * 1.01).astype(numpy.float32)  # other weights
    save_file(tensors, str(learner_copy / reference["file"]))
    digest = tensor_sha256(tensors[reference["key"]])

    def rehash(records):
        for changed in records:
            if isinstance(changed.get("first_step_logits"), dict) and changed["first_step_logits"]["key"] == "P2/G":
                changed["first_step_logits"]["sha256"] = digest
        return records

    rewrite_records(learner_copy, rehash)
    found = [c for c in contradictions(grade_against(learner_copy, reference_file)) if "first-step logits P2/G" in c]
    assert found and "beyond the tolerance" in found[0]


@pytest.mark.slow
def test_a_replica_run_relabelled_as_pythia_contradicts_a_reference_of_pythia(tmp_path):
    """No real pythia-14m run exists here, so the instructor's run is a fixture labelled as that specimen (as the
    harness writes a pythia-14m run: name, repository, pinned revision, not synthetic; its numbers are invented,
    from seed 1). The forged run is a synthetic run of other weights (here: other invented numbers, seed 2, as a
    replica run's would be), relabelled the way a cheating learner would: specimen fields and every artifact
    file's hash and size set to the pins, synthetic flags cleared, everything re-hashed. Its pins then agree with
    the reference; what it computed does not."""
    pythia = build_complete_run(tmp_path / "pythia", synthetic=False, seed=1)
    ref = tmp_path / "REF.json"
    write_json_atomic(ref, make_reference(RunView.read(pythia)))
    forged = build_complete_run(tmp_path / "replica", synthetic=True, seed=2)
    honest_manifest = json.loads((pythia / MANIFEST_FILE).read_text())
    pinned = {r["name"]: r for r in RunView.read(pythia).kind("artifact_file")}
    honest_specimen = RunView.read(pythia).first("specimen")

    def relabel(records):
        for record in records:
            if record["kind"] == "specimen":
                record.update({k: honest_specimen[k] for k in ("name", "synthetic", "description", "repo_id",
                                                              "revision")})
            elif record["kind"] == "artifact_file":
                record.update({k: pinned[record["name"]][k] for k in ("size", "sha256", "expected_sha256",
                                                                      "expected_size")})
            record.pop("synthetic", None)
        return records

    rewrite_records(forged, relabel)
    edit_manifest(forged, specimen=honest_manifest["specimen"])
    refresh_manifest(forged)
    alone = grade_source(forged, load_rubric())
    assert alone.facts["synthetic"] is False and alone.facts["specimen"] == protocol.DEFAULT_SPECIMEN
    grade = grade_against(forged, ref)
    assert grade.exit_status == 3
    found = contradictions(grade)
    assert not any(c.startswith("specimen ") for c in found)  # the labels were forged to agree
    assert found[0].startswith("prompt P1 token ids")
    assert any(c.startswith("generation P1-G-rep1: ids first differ at step ") for c in found)


@pytest.mark.parametrize("moved, contradicts", [(0.9, False), (1.1, True)])
def test_a_prefix_margin_may_move_by_the_tolerance_at_its_top_value(learner, reference_file, tmp_path, moved,
                                                                    contradicts):
    """The cache prefixes' margins agree within 2*(atol + rtol*|top|) with the true top value (not |margin|): a
    reference margin moved by 0.9 of that is no contradiction, by 1.1 of it is."""
    reference = json.loads(reference_file.read_text())
    prefix = reference["outputs"]["cache"]["prefixes"][3]
    top = prefix["top2_uncached"]["values"][0]
    limit = 2 * (reference["tolerance"]["atol"] + reference["tolerance"]["rtol"] * abs(top))
    assert limit > 2 * (reference["tolerance"]["atol"] + reference["tolerance"]["rtol"] * prefix["top2_margin_uncached"])
    prefix["top2_margin_uncached"] += moved * limit
    moved_ref = tmp_path / "REF-moved.json"
    write_json_atomic(moved_ref, reference)
    found = [c for c in contradictions(grade_against(learner, moved_ref)) if c.startswith("cache prefix")]
    assert bool(found) == contradicts, found
