"""inferlab.grading.batch: a class graded in N processes does in each what the one process would have done, decided
from the copy it is given when it is called (never from a class captured when the module was imported)."""

from __future__ import annotations

import concurrent.futures
import importlib

import pytest

from inferlab.grading import batch, replayed


class Pool:
    """A ProcessPoolExecutor that starts nothing: it keeps what its workers would be set up with."""

    started: list = []

    def __init__(self, max_workers, mp_context, initializer, initargs):
        Pool.started.append(initargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, function, sources):
        return []


@pytest.fixture
def pool(monkeypatch):
    Pool.started = []
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    return Pool.started


def test_workers_replay_even_when_batch_was_imported_while_the_copy_class_was_patched(monkeypatch, pool):
    """A test that shares one grader's copy per process patches replayed.GraderCopy with a subclass; batch imported
    under that patch once took the subclass for the class, so a real GraderCopy given later with --jobs 2 was not
    recognised and the workers graded without a replay: a forged run passed (seen in make test)."""
    class Shared(replayed.GraderCopy):
        pass

    with monkeypatch.context() as patched:
        patched.setattr(replayed, "GraderCopy", Shared)
        importlib.reload(batch)  # imported under the patch
    batch.grade_sources(["a", "b"], None, copy=replayed.GraderCopy("standin", "/copy"), jobs=2)
    specimen, artifacts, replay = pool[-1][:3]
    assert (specimen, artifacts, replay) == ("standin", "/copy", True)


def test_a_copy_the_workers_could_not_reproduce_is_an_error_not_a_grade_without_it(pool):
    with pytest.raises(TypeError, match="neither a GraderCopy nor a CourseRun"):
        batch.grade_sources(["a", "b"], None, copy=replayed.MadeHere(), jobs=2)
    assert pool == []
    batch.grade_sources(["a", "b"], None, copy=None, jobs=2)
    assert pool[-1][2] is False  # no copy: no replay, as in one process
