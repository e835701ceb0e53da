"""A class: `grade CLASS_DIR --out DIR` over a folder of submissions (each subfolder or archive one learner)
writes a class page with every submission's items and one plot of a measurement across their machines."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.grading.classview import CLASS_PAGE, SPREAD_PLOT, ratio_points
from inferlab.grading.grade import grade_source
from inferlab.grading.rubric import load_rubric

from fixtures_records import copy_run
from grading_helpers import answered_predictions, change_one_character, give_predictions
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
