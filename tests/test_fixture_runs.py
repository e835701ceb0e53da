"""The shared fixture runs (tests/fixture_runs.py) are built once per session and guarded in every process."""

from __future__ import annotations

import pytest

from fixture_runs import SharedRuns


def test_a_shared_run_changed_in_one_worker_is_caught_by_another_workers_first_get(tmp_path):
    """Two stores on one folder stand for two xdist workers: the second reads the first's build (no second build)
    and checks it against what the builder saw, so a change made before its first get is still named."""
    first, second = SharedRuns(tmp_path), SharedRuns(tmp_path)
    built = first.get("plan")
    (built / "plan.json").write_text("{}")
    with pytest.raises(AssertionError, match="the shared 'plan' run was changed by a test"):
        second.get("plan")
    with pytest.raises(AssertionError, match="runs.copy"):
        first.get("plan")


def test_a_second_worker_reads_the_first_workers_build(tmp_path):
    first, second = SharedRuns(tmp_path), SharedRuns(tmp_path)
    assert second.get("plan") == first.get("plan")
    assert len(list(tmp_path.glob("plan*.json"))) == 1  # one result, read by both
