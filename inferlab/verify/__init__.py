"""Check a finished record directory from its files alone (no model, no torch): `python -m inferlab verify`.

verify_run(DIR) re-hashes every file against the manifest and checks that the records are complete
for the protocol: counts per kind, the schedule, the budgets, the tensor references, and that every
failure or gap has its evidence (a recorded failed, errored or skipped test with its message). Which
test should have written a missing record is asked of the plan (inferlab.reading.runview), never spelled here.

A run that did not finish (interrupted, stopped early, killed) or that ran only part of the protocol
(-k, -m, one file) says so once: "unfinished: ..." and "partial: ...". The records such a run could
never have written (for tests it deselected, or never reached) are then not listed one by one; every
other problem (a hash, a seq gap, a record that contradicts its outcome) still is.

The checks live in small modules over one Checker (checker.py), walked in order by walk.py: the files and the
records file (files.py), how the session ended and the plan (ending.py), the protocol's completeness
(completeness.py), and the consistency of every derived number with its source and of the recorded protocol
with this checkout's (consistency*.py; what the files do not allow to check is listed in `not_checked`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from inferlab.reading.runview import RunView
from inferlab.verify.checker import Checker
from inferlab.verify.walk import walk

__all__ = ["Checker", "integrity_problems", "verify_run"]


def verify_run(run: Union[Path, str, RunView]) -> dict:
    """Check a record dir (or a view of one): {ok, problems: [one line each], explained_gaps, records,
    files_checked, outcome_counts, all_tests_passed, plan_folder, unfinished, partial, complete (the one
    definition of a complete run: verify.ending.is_complete), completeness (the unfinished and partial lines, also
    in problems), not_listed, schema, notes, not_checked}."""
    view = run if isinstance(run, RunView) else RunView.read(Path(run))
    return walk(Checker(view))


def integrity_problems(result: dict) -> list[str]:
    """verify's problems that say the files are not as the session wrote them: every problem but the lines that
    only say the run is unfinished or partial (its completeness)."""
    completeness = set(result.get("completeness") or [])
    return [line for line in result.get("problems") or [] if line not in completeness]
