"""The library never spells an experiment test's name: renaming a test leaves verify and the report unchanged."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from inferlab import report
from inferlab.read.verify import verify_run

from fixtures_records import build_rich_run, copy_run, refresh_manifest

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def experiment_names() -> frozenset[str]:
    """Every experiment file's name (with and without .py) and every test function's name, from experiments/."""
    names = set()
    for path in sorted((ROOT / "experiments").glob("test_*.py")):
        names |= {path.name, path.stem}
        names |= {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}
    assert "test_matched_prefix" in names and "test_40_cache.py" in names and len(names) > 40  # names to look for
    return frozenset(names)  # read once per process: every module's test asks


@pytest.mark.parametrize("module", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "inferlab").rglob("*.py")))
def test_no_library_module_spells_an_experiment_test_or_file_name(module):
    text = (ROOT / module).read_text(encoding="utf-8")
    found = sorted(name for name in experiment_names()  # the substring test first: most names are absent
                   if name in text and re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text))
    assert not found, f"{module} spells {found}: ask the plan (inferlab.read.runview) which test does what instead"


# --- renaming a test: a built run whose node ids are renamed consistently, re-hashed ---------------------------

OLD_NAME, NEW_NAME = "test_matched_prefix", "test_prefix_pairs_under_another_name"
SKIP = "not run: made to skip for the renaming test"


def skip_the_cache_test(records: list[dict]) -> list[dict]:
    """The matched-prefix test skipped, so every cache record is missing and its skip is the evidence."""
    kept = []
    for record in records:
        if OLD_NAME in (record.get("test") or "") and record["kind"] != "test_outcome":
            continue
        if record["kind"] == "test_outcome" and OLD_NAME in record["test"]:
            record = {**record, "outcome": "skipped", "phase": "setup", "skip_reason": SKIP,
                      "longrepr": f"('x', 1, 'Skipped: {SKIP}')"}
        kept.append(record)
    return kept


def test_a_renamed_test_leaves_verify_and_the_report_unchanged_but_for_the_name(tmp_path):
    original = build_rich_run(tmp_path / "original", transform=skip_the_cache_test)
    renamed = copy_run(original, tmp_path / "renamed")
    for name in ("records.jsonl", "plan.json", "report.md"):
        path = renamed / name
        text = path.read_text(encoding="utf-8")
        assert OLD_NAME in text or name == "report.md"  # the page names the skip's reason, not the test
        path.write_text(text.replace(OLD_NAME, NEW_NAME), encoding="utf-8")
    refresh_manifest(renamed)
    before, after = verify_run(original), verify_run(renamed)
    assert before["explained_gaps"] and any(f"no cache_comparison record: explained by experiments/test_40_cache.py::"
                                            f"{OLD_NAME}" in gap for gap in before["explained_gaps"])
    for field in ("problems", "explained_gaps"):
        assert after[field] == [line.replace(OLD_NAME, NEW_NAME) for line in before[field]], field
    assert (after["ok"], after["outcome_counts"]) == (before["ok"], before["outcome_counts"])
    assert "No `cache_comparison` record (skipped, R1)." in (original / "report.md").read_text(encoding="utf-8")
    # the renamed run's pages are the original's with the name replaced: regenerated, they are identical
    assert report.check(renamed).status == "identical", report.check(renamed).lines
