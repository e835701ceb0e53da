"""Fixture runs built once per test session and shared, and the same runs in memory.

Building a fixture run (tests/fixtures_records.py) takes about a second, and drawing its plots as long again;
most tests only read one. So each configuration is built once per session (by the first xdist worker that asks,
under a file lock, into the folder every worker of the session shares: shared_runs.session_folder), by the
builders the tests always used, and handed to every test that reads it:

    runs.get("rich")              the shared folder: never change it
    runs.copy("rich", tmp_path / "x")   a private copy to change
    runs.data("complete").rich(transform=...).view()   a variant in memory, no folder at all

A shared folder is checked on every get against what it held when it was built (each file's name, size and
modification time, taken by the builder under the lock), so a test that changes one fails the next test that asks
for it, in any worker, naming it.

RunData holds a run's records, manifest, plan and tensors as read from its files; .changed() does to them what
rewrite_records and edit_manifest do to a folder (seq renumbered, outcome counts recounted), .rich() what
build_rich_run does (the same rich_change), and .view() is RunView.from_data of the result: the pages and
verdict of a variant, rendered by the report's own functions, with nothing written.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

from inferlab.run.records import MANIFEST_FILE, PLAN_FILE, RECORDS_FILE, TENSOR_DIR
from inferlab.read.runview import RunView

import fixtures_records as fixtures
import shared_runs


@dataclass(frozen=True)
class RunData:
    """A run's records, manifest, plan and tensors ({'tensors/NAME': {key: array}}), in memory."""

    records: list
    manifest: dict
    plan: Optional[dict]
    tensors: dict

    @classmethod
    def read(cls, directory: Path) -> "RunData":
        """The files of a built run, as written."""
        from safetensors.numpy import load_file

        directory = Path(directory)
        records = [json.loads(line) for line in (directory / RECORDS_FILE).read_text().splitlines()]
        plan = json.loads((directory / PLAN_FILE).read_text()) if (directory / PLAN_FILE).exists() else None
        tensors = {f"{TENSOR_DIR}/{path.name}": load_file(str(path))
                   for path in sorted((directory / TENSOR_DIR).glob("*.safetensors"))}
        return cls(records, json.loads((directory / MANIFEST_FILE).read_text()), plan, tensors)

    def changed(self, change: Optional[Callable] = None, plan: Optional[Callable] = None,
                **manifest_fields) -> "RunData":
        """A copy whose records are change(records) (renumbered, as rewrite_records leaves them), whose manifest
        has manifest_fields set and its outcome counts recounted, and whose plan is plan(plan) if given."""
        records = copy.deepcopy(self.records)
        records = fixtures.renumbered(change(records) if change is not None else records)
        manifest = {**copy.deepcopy(self.manifest), **manifest_fields,
                    "outcome_counts": fixtures.outcome_counts(records)}
        new_plan = copy.deepcopy(self.plan)
        if plan is not None:
            new_plan = plan(new_plan)
        return RunData(records, manifest, new_plan, self.tensors)

    def rich(self, session_end: Optional[dict] = None, transform=None, **evidence) -> "RunData":
        """What build_rich_run makes of this complete run (the same change), in memory."""
        return self.changed(fixtures.rich_change(session_end, transform, **evidence), command=fixtures.TYPED_COMMAND)

    def view(self) -> RunView:
        """RunView.from_data of a copy (the view may upgrade what it is given in place)."""
        return RunView.from_data(copy.deepcopy(self.records), copy.deepcopy(self.manifest), copy.deepcopy(self.plan),
                                 self.tensors)


# --- the shared builds -------------------------------------------------------------------------------------

BUILDS: dict[str, Callable[[Path, "SharedRuns"], Path]] = {
    # as a session writes it, its report rendered and no plot drawn
    "complete": lambda directory, runs: fixtures.build_complete_run(directory),
    "rich": lambda directory, runs: fixtures.build_rich_run(directory, base=runs.get("complete")),
    # with the plots its report drew, for the tests that read a PNG
    "rich_plots": lambda directory, runs: fixtures.build_rich_run(directory, plots=True, base=runs.get("complete")),
    "failed": lambda directory, runs: fixtures.build_failed_run(directory),
    "failed_ended": lambda directory, runs: fixtures.build_failed_run_ended(directory),
    "plan": lambda directory, runs: fixtures.build_plan_folder(directory),
    "honest": lambda directory, runs: fixtures.build_rich_run(directory, base=runs.get("complete")),
}


def _fingerprint(directory: Path) -> list[list]:
    return [[path.relative_to(directory).as_posix(), stat.st_size, stat.st_mtime_ns]
            for path in sorted(directory.rglob("*")) for stat in [path.lstat()]]


class SharedRuns:
    """The builds of BUILDS, each made on first use under root and shared; see the module docstring."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._built: dict[str, tuple[Path, list]] = {}
        self._data: dict[str, RunData] = {}

    def _build_once(self, name: str) -> tuple[Path, list]:
        """(the folder of a build, what it held when built), made by whichever process of the session asks first
        (the others wait for it and read the same answer)."""
        def build(folder: Path) -> dict:
            path = Path(BUILDS[name](folder / "run", self))
            return {"path": str(path), "fingerprint": _fingerprint(path)}

        made = shared_runs.made_once_in(self.root, name, build)
        return Path(made["path"]), made["fingerprint"]

    def get(self, name: str) -> Path:
        """The shared folder of a build (built now if it is the session's first ask); never change it."""
        if name not in self._built:
            self._built[name] = self._build_once(name)
        path, built = self._built[name]
        assert _fingerprint(path) == built, (f"{path}: the shared '{name}' run was changed by a test; a test that "
                                             f"changes a run must work on runs.copy('{name}', ...)")
        return path

    def copy(self, name: str, target: Path) -> Path:
        """A private copy of a shared build that a test may change."""
        return fixtures.copy_run(self.get(name), target)

    def data(self, name: str) -> RunData:
        """A shared build's files in memory (read once); RunData is never changed in place, only copied."""
        if name not in self._data:
            self._data[name] = RunData.read(self.get(name))
        return self._data[name]


_STORES: dict[str, SharedRuns] = {}


def fixture_runs(tmp_path_factory) -> SharedRuns:
    """The process's store, in the folder this session's workers share."""
    key = str(tmp_path_factory.getbasetemp())
    if key not in _STORES:
        root = shared_runs.session_folder(tmp_path_factory) / "fixture-runs"
        root.mkdir(exist_ok=True)
        _STORES[key] = SharedRuns(root)
    return _STORES[key]


@pytest.fixture
def runs(tmp_path_factory) -> SharedRuns:
    """The shared fixture runs (import this fixture into a test module to use it)."""
    return fixture_runs(tmp_path_factory)


def shared(name: str, build: str, doc: str, in_memory: bool = False):
    """A fixture called `name` that hands a test the shared folder of one build (its RunData if in_memory):
    `rich_run = shared("rich_run", "rich", "...")` in a test module."""
    def fixture(runs):
        return runs.data(build) if in_memory else runs.get(build)

    fixture.__doc__ = doc
    return pytest.fixture(fixture, name=name)


@pytest.fixture
def plots_not_drawn(monkeypatch) -> list:
    """During the test, write_report (and so `report --write`) renders and writes both pages as it does when every
    plot is drawn, and draws none: for the tests of pages and commands that read no PNG (tests/test_plots.py
    draws them). The list holds the keyword arguments of each write_plots call."""
    from inferlab.report import plots

    calls = []

    def not_drawn(record_dir, records, partial=None, bound_ratios=None):
        calls.append({"record_dir": Path(record_dir), "partial": partial})
        return [{**spec, "written": False, "error": None} for spec in plots.plot_specs(records)]

    monkeypatch.setattr(plots, "write_plots", not_drawn)
    return calls
