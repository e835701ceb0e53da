"""A class: `grade CLASS_DIR --out DIR` over a folder of submissions (each subfolder or archive one learner)
writes a class page with every submission's items, the pairs of submissions that share evidence, and one plot of
a measurement across their machines; the CSV has one row per learner."""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.grading.classview import CLASS_PAGE, SPREAD_PLOT, ratio_points
from inferlab.grading.grade import grade_source
from inferlab.grading.rubric import load_rubric

from inferlab.grading.likeness import SHARED_FINDING
from inferlab.host import environment

from fixtures_records import REPO_ROOT, build_rich_run, copy_run, edit_manifest, refresh_manifest
from grading_helpers import (
    add_tokenization_phases,
    answered_explanation,
    answered_predictions,
    attach_file,
    change_one_character,
    give_predictions,
    ADA_PARAGRAPHS,
    BEA_PARAGRAPHS,
    own_predictions,
    reworded,
    own_words,
    written_explanation,
)
from fixture_runs import fixture_runs


@pytest.fixture(scope="module")
def class_dir(tmp_path_factory) -> Path:
    """Four learners: an honest run, an archive of another honest run on a slower machine, an edited run and a
    folder that holds no run."""
    base = tmp_path_factory.mktemp("class")
    runs = fixture_runs(tmp_path_factory)
    honest = runs.copy("honest", base / "build" / "honest")
    give_predictions(honest, answered_predictions())
    submissions = base / "submissions"
    copy_run(honest, submissions / "ada")
    slower = runs.get("honest_elsewhere")
    assert main(["pack", str(slower), "-o", str(submissions / "grace.tar.gz")]) == 0
    change_one_character(copy_run(honest, submissions / "mallory"))
    (submissions / "notes").mkdir()
    (submissions / "notes" / "todo.txt").write_text("nothing here")
    return submissions


@pytest.mark.slow
def test_the_class_page_has_a_row_per_submission_and_a_plot(class_dir, tmp_path, capsys):
    out = tmp_path / "page"
    csv = tmp_path / "class.csv"
    assert main(["grade", str(class_dir), "--out", str(out), "--csv", str(csv)]) == 3  # the worst: mallory
    page = (out / CLASS_PAGE).read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    assert [row.split(" | ")[1] for row in rows] == ["ada", "grace.tar.gz", "mallory", "notes"]
    assert [row.split(" | ")[2] for row in rows] == ["failed", "failed", "integrity", "not_a_run"]
    assert (out / SPREAD_PLOT).read_bytes().startswith(b"\x89PNG")
    assert f"![decode interval ratio per submission]({SPREAD_PLOT})" in page
    assert len(csv.read_text().splitlines()) == 5
    assert "grade: 4 runs:" in capsys.readouterr().out
    assert not any(p.name in (CLASS_PAGE, SPREAD_PLOT) for p in class_dir.rglob("*"))


def test_the_plot_has_one_point_per_submission_and_prompt_length(class_dir):
    grades = [grade_source(p, load_rubric()) for p in sorted(class_dir.iterdir())]
    points = ratio_points(grades)
    # ada, grace and mallory measured both timing prompts; the folder without a run measured nothing
    assert sorted({(n, prompt) for n, prompt, _, _ in points}) == [(n, p) for n in (1, 2, 3) for p in ("P1", "P1x8")]
    assert {length for _, prompt, length, _ in points if prompt == "P1x8"} == {72}


def test_the_class_page_never_goes_inside_a_run_folder(class_dir, capsys):
    assert main(["grade", str(class_dir), "--out", str(class_dir / "ada" / "page")]) == 2
    assert "grade never writes there" in capsys.readouterr().err and not (class_dir / "ada" / "page").exists()


def test_a_folder_of_submissions_needs_out(class_dir, capsys):
    assert main(["grade", str(class_dir)]) == 2
    assert "give --out DIR for the class page" in capsys.readouterr().err


def test_an_empty_class_folder_is_not_a_run(tmp_path):
    (tmp_path / "empty-class").mkdir()
    assert main(["grade", str(tmp_path / "empty-class"), "--out", str(tmp_path / "page")]) == 2
    shutil.rmtree(tmp_path / "empty-class")


# --- copies across a class ------------------------------------------------------------------------------------


def own_run(directory: Path, runs, seed: int, cpu: str) -> Path:
    """Another learner's honest run: timings and weight-read samples of its own (timing seed `seed`), another
    CPU; built as build_honest_run builds one, with the weight reads its machine measured."""
    noise = random.Random(seed)

    def own_weight_reads(records: list[dict]) -> list[dict]:
        for record in records:
            if record["kind"] == "weight_read":
                record["seconds"] = [s * (1 + noise.random() / 10) for s in record["seconds"]]
                record["median_s"] = sorted(record["seconds"])[len(record["seconds"]) // 2]
        return add_tokenization_phases(records)

    build_rich_run(directory, transform=own_weight_reads, timing_seed=seed)
    manifest = json.loads((directory / "manifest.json").read_text())
    edit_manifest(directory, source_sha256=environment.source_hashes(REPO_ROOT),
                  platform={**manifest["platform"], "cpu_model": cpu})
    refresh_manifest(directory)
    return directory


def own_work(run: Path, name: str, explanation: str = None) -> Path:
    """Predictions and an explanation in the learner's own words (words of their own, seeded by the name, that
    another learner's never repeat three at a time: independent writing, which the class view must not flag)."""
    seed = sum(map(ord, name))
    give_predictions(run, own_predictions(seed))
    attach_file(run, explanation or written_explanation([own_words(seed * 100 + k, 30) for k in range(10)]))
    return run


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Path:
    """A class where ann and bea hand in one run (each packs it with her own --learner), cy and dee hand in one
    explanation with runs of their own, and eve and fay (a Gradescope group: their folder holds
    submission_metadata.json beside the archive) did their own work."""
    base = tmp_path_factory.mktemp("copies")
    runs = fixture_runs(tmp_path_factory)
    build, submissions = base / "build", base / "submissions"
    submissions.mkdir()
    shared_run = own_work(runs.copy("honest", build / "2026-12-01T09-00-00Z-standin"), "ann")
    shared_text = answered_explanation().replace("My own words", "Words cy and dee both handed in")
    made = {"cy": own_run(build / "2026-12-01T09-10-00Z-standin", runs, 11, "CPU of cy"),
            "dee": own_run(build / "2026-12-01T09-20-00Z-standin", runs, 12, "CPU of dee"),
            "eve": own_run(build / "2026-12-01T09-30-00Z-standin", runs, 13, "CPU of eve")}
    own_work(made["cy"], "cy", shared_text)
    own_work(made["dee"], "dee", shared_text)
    own_work(made["eve"], "eve")
    for learner, run in (("ann", shared_run), ("bea", shared_run), ("cy", made["cy"]), ("dee", made["dee"])):
        assert main(["pack", str(run), "-o", str(submissions / f"{learner}.tar.gz"), "--learner", learner]) in (0, 1)
    group = submissions / "group-eve-fay"
    assert main(["pack", str(made["eve"]), "-o", str(group / "submission.tar.gz")]) in (0, 1)
    (group / "submission_metadata.json").write_text(json.dumps({
        "id": 123456, "created_at": "2026-12-01T10:00:00+00:00", "submission_method": "upload",
        "users": [{"email": "eve@example.edu", "id": 1001, "name": "Eve E."},
                  {"email": "fay@example.edu", "id": 1002, "name": "Fay F."}]}))
    return submissions


@pytest.fixture(scope="module")
def copies_graded(copies, tmp_path_factory) -> dict:
    """grade over the class: its page, CSV and JSON."""
    out = tmp_path_factory.mktemp("copies-out")
    json_out = out / "class.json"
    import contextlib

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = main(["grade", str(copies), "--out", str(out / "page"), "--csv", str(out / "class.csv"),
                       "--format", "json"])
    json_out.write_text(buffer.getvalue())
    return {"status": status, "page": (out / "page" / CLASS_PAGE).read_text(),
            "csv": list(csv.DictReader(io.StringIO((out / "class.csv").read_text()))),
            "json": json.loads(json_out.read_text())}


@pytest.mark.slow
def test_two_learners_with_one_run_and_two_with_one_explanation_are_flagged_pair_by_pair(copies_graded):
    page = copies_graded["page"]
    section = page.split("## Submissions that share evidence")[1].split("\n## ")[0]
    flagged = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(flagged) == 2, section
    assert flagged[0].startswith("- 1. ann.tar.gz and 2. bea.tar.gz: ")
    for words in ("the same run id (run 2026-12-01T09-00-00Z-standin)", "the same records.jsonl",
                  "the same timing stamps", "the same weight-read samples", "the same explanation"):
        assert words in flagged[0], words
    assert flagged[1].startswith("- 3. cy.tar.gz and 4. dee.tar.gz: the same explanation (")
    assert "records" not in flagged[1] and "timing" not in flagged[1]  # their runs are their own
    assert "group-eve-fay" not in section
    # the table's last column names the other submission; the honest group shares nothing
    rows = {row.split(" | ")[1]: row for row in page.splitlines() if row.startswith("| ") and " | " in row
            and not row.startswith("| #")}
    assert rows["ann.tar.gz"].endswith("| **2** |") and rows["dee.tar.gz"].endswith("| **3** |")
    assert rows["group-eve-fay"].endswith("| - |")


@pytest.mark.slow
def test_the_csv_has_a_row_per_learner_and_says_what_each_shares(copies_graded):
    rows = {row["learner"]: row for row in copies_graded["csv"]}
    assert list(rows) == ["ann", "bea", "cy", "dee", "1001", "1002"]
    assert (rows["1001"]["learner_name"], rows["1002"]["learner_email"]) == ("Eve E.", "fay@example.edu")
    assert rows["ann"]["shared_with"].startswith("2 bea.tar.gz (") and "the same records.jsonl" in \
        rows["ann"]["shared_with"]
    assert rows["cy"]["shared_with"] == "4 dee.tar.gz (the same explanation)"
    assert rows["1001"]["shared_with"] == rows["1002"]["shared_with"] == ""
    # a flag is for a person: the copied submissions' items and score are what they would be alone
    assert rows["ann"]["score"] == rows["1001"]["score"] and rows["ann"]["exit_status"] == rows["1001"]["exit_status"]


@pytest.mark.slow
def test_the_json_lists_the_pairs_and_each_grade_carries_its_finding(copies_graded):
    data = copies_graded["json"]
    shared = data["class"]["shared"]
    assert [(p["a"], p["b"]) for p in shared] == [(1, 2), (3, 4)]
    assert [s["what"] for s in shared[1]["shared"]] == ["explanation"]
    assert {"run_id", "records", "timing", "weight_read", "explanation", "predictions"} <= \
        {s["what"] for s in shared[0]["shared"]}
    findings = [[f for f in run["findings"] if f["kind"] == SHARED_FINDING] for run in data["runs"]]
    assert [len(f) for f in findings] == [1, 1, 1, 1, 0]
    assert findings[0][0]["other"] == 2 and "no point was taken" in findings[0][0]["meaning"]
    assert [run["facts"]["learners"][0]["id"] for run in data["runs"]] == ["ann", "bea", "cy", "dee", "1001"]


@pytest.mark.slow
def test_the_caption_counts_distinct_machines_by_fingerprint(copies_graded):
    assert copies_graded["json"]["class"]["machines"] == 4  # ann and bea's one run, and three CPUs of their own
    assert "The same protocol in 5 submissions from 4 distinct machines (by fingerprint)." in copies_graded["page"]


@pytest.fixture(scope="module")
def alike_graded(tmp_path_factory) -> dict:
    """A class of three runs of their own: lee hands in kim's explanation and predictions with a handful of words
    changed and every paragraph wrapped anew; max writes independently on the same questions. Graded: the page,
    CSV and JSON."""
    import contextlib

    base = tmp_path_factory.mktemp("alike")
    runs = fixture_runs(tmp_path_factory)
    submissions, out = base / "submissions", base / "out"
    kim_explanation = written_explanation(ADA_PARAGRAPHS)
    kim_predictions = own_predictions(7)
    answers = [w for line in kim_predictions.splitlines() if line.startswith("Why:") for w in line.split()[1:3]]
    lee_work = (reworded(kim_explanation, {"expected": "believed", "shows": "showed", "unsure": "doubtful",
                                           "leave": "omit", "cannot": "can't"}, width=58),
                reworded(kim_predictions, {answers[0]: "indeed", answers[3]: "perhaps", answers[6]: "surely"}))
    for number, (name, (explanation, predictions_text)) in enumerate({
            "kim": (kim_explanation, kim_predictions), "lee": lee_work,
            "max": (written_explanation(BEA_PARAGRAPHS), own_predictions(8))}.items()):
        run = own_run(base / "build" / f"2026-12-02T10-0{number}-00Z-standin", runs, 21 + number, f"CPU of {name}")
        give_predictions(run, predictions_text)
        attach_file(run, explanation)
        copy_run(run, submissions / name)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        main(["grade", str(submissions), "--out", str(out), "--csv", str(out / "class.csv"), "--format", "json"])
    return {"page": (out / CLASS_PAGE).read_text(), "json": json.loads(buffer.getvalue()),
            "csv": {row["source"].rsplit("/", 1)[-1]: row
                    for row in csv.DictReader(io.StringIO((out / "class.csv").read_text()))}}


@pytest.mark.slow
def test_a_near_copy_is_flagged_with_its_figure_and_independent_writing_is_not(alike_graded):
    shared = alike_graded["json"]["class"]["shared"]
    assert [(p["a"], p["b"]) for p in shared] == [(1, 2)], shared  # kim and lee only
    alike = {s["what"]: s for s in shared[0]["shared"]}
    assert set(alike) == {"explanation_alike", "predictions_alike"}  # not the same text: worded alike
    assert all(0.5 <= s["similarity"] < 1 for s in alike.values())
    figures = {(p["a"], p["b"]): p for p in alike_graded["json"]["class"]["wording"]["pairs"]}
    assert figures[(1, 3)]["explanation"] < 0.1 and figures[(2, 3)]["predictions"] < 0.1  # max wrote her own
    assert alike_graded["json"]["class"]["wording"]["threshold"] == 0.5
    finding = next(f for f in alike_graded["json"]["runs"][1]["findings"] if f["kind"] == SHARED_FINDING)
    assert finding["other"] == 1 and finding["similarity"] == {k: v["similarity"] for k, v in alike.items()}
    assert alike_graded["json"]["runs"][2]["findings"] == [] or not any(
        f["kind"] == SHARED_FINDING for f in alike_graded["json"]["runs"][2]["findings"])
    rows = alike_graded["csv"]
    assert rows["kim"]["shared_with"].startswith("2 lee (an explanation worded alike ")
    assert "predictions worded alike" in rows["lee"]["shared_with"] and rows["max"]["shared_with"] == ""
    section = alike_graded["page"].split("## Submissions that share evidence")[1].split("\n## ")[0]
    flagged = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(flagged) == 1 and flagged[0].startswith("- 1. kim and 2. lee: an explanation worded alike (")
    assert "3-word shingles" in section and "flagged at 50% or more" in section


def test_blank_templates_and_a_shared_machine_are_never_a_flag(class_dir):
    from inferlab.grading.likeness import Traits, _read_traits, shared_pairs
    from grading_helpers import PREDICTIONS_TEMPLATE, TEMPLATE

    records = (class_dir / "ada" / "records.jsonl").read_bytes()
    manifest = (class_dir / "ada" / "manifest.json").read_bytes()
    blank = []
    for label, (predictions_text, explanation) in {"one": (PREDICTIONS_TEMPLATE, TEMPLATE),
                                                   "two": (PREDICTIONS_TEMPLATE.replace("\n", "\r\n") + "\n  ",
                                                           TEMPLATE + "\n\n")}.items():
        traits = Traits(label, run_id=label)
        ledger = json.dumps({"seq": 0, "kind": "explanation", "file": "addenda/e.md"}).encode() + b"\n"
        _read_traits(traits, {"records.jsonl": records, "manifest.json": manifest,
                              "predictions.md": predictions_text.encode(),
                              "addenda.jsonl": ledger, "addenda/e.md": explanation.encode()})
        assert traits.predictions is None and traits.explanation is None
        traits.records_sha256, traits.timing, traits.weight_read = label, {}, {}  # their own runs
        blank.append(traits)
    assert blank[0].machine is not None and blank[0].machine == blank[1].machine  # one lab machine: no flag
    assert shared_pairs(blank) == []


@pytest.mark.slow
def test_gradescope_metadata_that_is_not_readable_is_a_note_not_a_failure(class_dir, tmp_path, capsys):
    submissions = tmp_path / "submissions"
    for name in ("sub-1", "sub-2"):
        (submissions / name).mkdir(parents=True)
        shutil.copy(class_dir / "grace.tar.gz", submissions / name / "submission.tar.gz")
    (submissions / "sub-1" / "submission_metadata.json").write_text("{not json")
    (submissions / "sub-2" / "submission_metadata.json").write_text(json.dumps({"users": []}))
    csv_file = tmp_path / "class.csv"
    assert main(["grade", str(submissions), "--out", str(tmp_path / "page"), "--csv", str(csv_file)]) == 1
    page = (tmp_path / "page" / CLASS_PAGE).read_text()
    assert "- 1. sub-1 and 2. sub-2: the same run id" in page  # one archive handed in twice
    assert "shares evidence with 2 (a finding for a person)" in capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO(csv_file.read_text())))
    assert [row["learner"] for row in rows] == ["", ""]
    grade = json.loads(main_json(submissions, tmp_path))["runs"][0]
    assert any("the learner is not known" in note and "submission_metadata.json" in note for note in grade["notes"])


def main_json(submissions: Path, tmp_path: Path) -> str:
    import contextlib

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        main(["grade", str(submissions), "--out", str(tmp_path / "page-json"), "--format", "json"])
    return buffer.getvalue()
