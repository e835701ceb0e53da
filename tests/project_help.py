"""`pytest --help` as a learner gets it in the project folder, run in process (a fresh interpreter costs seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

import inner_session

REPO_ROOT = Path(__file__).resolve().parents[1]

inner_session.preload("torch")  # analytic_tests/conftest.py imports torch


def project_help(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """The text of `pytest --help ARGS` read with the project's own pytest.ini and conftests; fails unless it exits 0."""
    monkeypatch.chdir(REPO_ROOT)
    shown = pytester.runpytest_inprocess("--help", *args)
    assert shown.ret == pytest.ExitCode.OK, shown.stderr.str()
    return shown.stdout.str()
