"""Shared fixtures for the harness's own tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inferlab import specimen, standin


def pytest_configure(config):
    # pytester runs the plugin's own test suites. It is loaded here, for tests/ only and never for
    # --help, so that a learner's `pytest --help` lists inferlab's options and not pytester's.
    if not config.option.help and not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")


@pytest.fixture(scope="session")
def standin_spec():
    """The stand-in's spec as pinned in artifacts/standin.json."""
    return specimen.load_spec("standin")


@pytest.fixture(scope="session")
def standin_build(tmp_path_factory):
    """One offline build of the stand-in for the whole session: the build() record."""
    return standin.build(tmp_path_factory.mktemp("standin-build"))


@pytest.fixture(scope="session")
def standin_dir(standin_build):
    """The session's built stand-in directory; shared, so never modify it (use standin_copy)."""
    return Path(standin_build["directory"])


@pytest.fixture
def standin_copy(standin_dir, tmp_path):
    """A private copy of the built stand-in that a test may damage."""
    return Path(shutil.copytree(standin_dir, tmp_path / "standin-copy"))
