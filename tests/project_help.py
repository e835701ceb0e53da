"""`pytest --help` as a learner gets it in the project folder, run in process (a fresh interpreter costs seconds)."""

from __future__ import annotations

from pathlib import Path

# Imported when this module is, before any pytester fixture takes its snapshot of sys.modules, as a learner's own
# `pytest --help` has them: pytester drops, when its test ends, every module imported during the test;
# hypothesis is slow to import again, and torch (analytic_tests/conftest.py imports it) cannot be imported
# twice in one process.
import hypothesis  # noqa: F401
import pytest
import torch  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[1]


def project_help(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """The text of `pytest --help ARGS` read with the project's own pytest.ini and conftests; fails unless it exits 0."""
    monkeypatch.chdir(REPO_ROOT)
    shown = pytester.runpytest_inprocess("--help", *args)
    assert shown.ret == pytest.ExitCode.OK, shown.stderr.str()
    return shown.stdout.str()
