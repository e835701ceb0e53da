"""The rest of a new user's list (issue 45, item 5), each reproduced: a message that names the real cause (the
interpreter), a test file a system pytest cannot import, a live run named as live by verify, report.md checked
by verify as grade checks it, a class recognised by what its folders hold, the docs' suffix table, `replay` of a
`pack` archive."""

from __future__ import annotations

import os

from inferlab.run.records import REPORT_FILE

from fixtures_records import copy_run, kill_after
from fixture_runs import runs  # noqa: F401 (a fixture)
from test_addenda import built, run  # noqa: F401 (fixtures)
from test_addenda import claimed_by


def test_a_python_without_pytest_timeout_is_named_as_the_cause_not_a_p_option(monkeypatch):
    import types

    from inferlab.run import plan

    config = types.SimpleNamespace(option=types.SimpleNamespace(), getoption=lambda name, default=None: default,
                                   pluginmanager=types.SimpleNamespace(has_plugin=lambda name: False,
                                                                       get_plugin=lambda name: None))
    monkeypatch.setattr(plan, "importlib", types.SimpleNamespace(util=types.SimpleNamespace(find_spec=lambda n: None)))
    message = plan.refusal(config, "standin")
    assert "is not the project's environment" in message and "-p no:" not in message
    assert ".venv/bin/python -m pytest experiments" in message
    monkeypatch.undo()  # installed, but not loaded: then the option is the cause
    assert "-p no:timeout" in plan.refusal(config, "standin")


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
    from inferlab.read.verify import integrity_problems, verify_run

    claimed_by(kill_after(run, 10))  # no session_end yet, and the claim names this (running) process
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "the run is LIVE, its session still running" in out
    assert "killed or crashed" not in out and "STILL RUNNING" not in out
    result = verify_run(run)  # still unfinished, never an integrity problem
    assert integrity_problems(result) == []
    assert result["completeness"][0].startswith("unfinished: no session_end record yet: the run is LIVE")


def test_the_docs_suffix_table_says_co_makes_no_folder(suite):
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith("| `-incomplete` |"))
    assert "--co" not in row and "it makes no folder at all" in docs
    (suite.path / "experiments" / "test_exp.py").write_text("def test_a():\n    pass\n")
    result = suite.runpytest("experiments", "--runs-dir", "runs", "--co")
    assert result.ret == 0 and not (suite.path / "runs").exists()  # what the docs say is what a --co does


