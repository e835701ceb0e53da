"""The rest of a new user's list (issue 45, item 5), each reproduced: a message that names the real cause (the
interpreter), a test file a system pytest cannot import, a live run named as live by verify, report.md checked
by verify as grade checks it, a class recognised by what its folders hold, the docs' suffix table, `replay` of a
`pack` archive."""

from __future__ import annotations

import os

from inferlab.base.records import REPORT_FILE
from inferlab.run import options

from fixtures_records import copy_run, kill_after
from forging import rehash
from fixture_runs import runs  # noqa: F401 (a fixture)
from test_attach import built, run  # noqa: F401 (fixtures)
from test_rough_edges import claimed_by


def test_a_python_without_pytest_timeout_is_named_as_the_cause_not_a_p_option():
    message = options.trial_bound_refusal("linux", True, False, plugin_installed=False, executable="/usr/bin/python3")
    assert "this Python (/usr/bin/python3) is not the project's environment" in message
    assert ".venv/bin/python -m pytest experiments" in message and "-p no:" not in message
    given = options.trial_bound_refusal("linux", True, False, plugin_installed=True, executable="/x/python")
    assert "-p no:timeout" in given  # installed but not loaded: then the option is the cause


def test_a_test_file_this_python_cannot_import_gets_one_line_naming_the_interpreter(suite):
    (suite.path / "analytic_tests").mkdir()
    (suite.path / "analytic_tests" / "test_a.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    (suite.path / "analytic_tests" / "test_b.py").write_text("import not_a_module_of_the_project\n")
    result = suite.runpytest("analytic_tests")
    out = result.stdout.str()
    assert "analytic_tests/test_a.py: this Python (" in out and "cannot import torch: it is not the project's " \
           "environment. Run the tests with .venv/bin/python -m pytest analytic_tests" in out
    assert "raise ModuleNotFoundError" not in out  # test_a.py's raw ImportError is replaced by the one line
    assert "No module named 'not_a_module_of_the_project'" in out  # any other import error is left as it is


def test_verify_calls_a_run_whose_session_still_runs_live_not_killed(run, capsys):
    from inferlab.__main__ import main
    from inferlab.grading.grade import split_verify
    from inferlab.verify import verify_run

    claimed_by(kill_after(run, 10))  # no session_end yet, and the claim names this (running) process
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "the run is LIVE, its session still running" in out
    assert "killed or crashed" not in out and "STILL RUNNING" not in out
    integrity, short = split_verify(verify_run(run))  # still unfinished, never an integrity problem
    assert integrity == [] and short[0].startswith("unfinished: no session_end record yet: the run is LIVE")


def test_verify_fails_a_report_rewritten_with_its_hash_redone_as_grade_does(runs, tmp_path, capsys):
    from inferlab.__main__ import main

    stale = copy_run(runs.get("complete"), tmp_path / "stale")
    page = (stale / REPORT_FILE).read_text()
    (stale / REPORT_FILE).write_text(page.replace("\n\n", "\n\nEvery check passed on the real model.\n\n", 1))
    rehash(stale)  # the manifest's inventory agrees with the edited page
    assert main(["verify", str(stale)]) == 1
    out = capsys.readouterr().out
    assert "the report is stale, it says what the records do not" in out
    assert main(["verify", str(runs.get("complete"))]) == 0


def test_the_docs_suffix_table_says_co_makes_no_folder(suite):
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith("| `-incomplete` |"))
    assert "--co" not in row and "it makes no folder at all" in docs
    (suite.path / "experiments" / "test_exp.py").write_text("def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--runs-dir", "runs", "--co")
    assert result.ret == 0 and not (suite.path / "runs").exists()  # what the docs say is what a --co does


def test_a_project_folder_is_no_class_but_a_folder_of_submissions_is(runs, tmp_path, capsys):
    from inferlab.__main__ import main
    from inferlab.grading.grade import submissions_in

    project = tmp_path / "project"
    for name in ("docs", "tests", "experiments", "inferlab", "artifacts"):
        (project / name).mkdir(parents=True)
        (project / name / "README.md").write_text("not a run\n")
    assert submissions_in(project) is None
    assert main(["grade", str(project)]) == 2
    out = capsys.readouterr().out
    assert "NOT A RUN" in out and "a folder of submissions" not in out
    course = tmp_path / "class"
    copy_run(runs.get("complete"), course / "alice" / "run")
    copy_run(runs.get("failed"), course / "bob")
    (course / "carol").mkdir()  # a learner who submitted no run is still a member, graded as such
    assert [p.name for p in submissions_in(course)] == ["alice", "bob", "carol"]


def test_replay_reads_a_pack_archive_as_grade_does(standin_run, standin_dir, tmp_path, capsys, monkeypatch):
    from inferlab.__main__ import main

    from shared_runs import share_loaded_models

    share_loaded_models(monkeypatch)  # the process's one load of the copy

    archive = tmp_path / "submission.tar.gz"
    assert main(["pack", str(standin_run), "-o", str(archive)]) == 0
    capsys.readouterr()
    assert main(["replay", str(archive), "--artifacts", str(standin_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"replay: {archive}: the `pack` archive of run {standin_run.name}")
    assert lines[-1].startswith("replay: the run agrees with the replay in every compared output")
    unpacked = lines[0].split("unpacked into ")[1].removesuffix(" (removed afterwards)")
    assert not os.path.exists(unpacked)  # the temporary folder is gone
