"""inferlab's imports run one way, read from the source (tests/layering.py): each part directly in inferlab/ has a
layer, no module imports from a higher layer or from another part of its own, no module imports one that imports it
(directly or in a cycle); and the sizes issue 57 sets."""

from __future__ import annotations

import importlib
import re
import textwrap
from pathlib import Path

import pytest

import layering


def test_every_part_directly_in_inferlab_has_exactly_one_layer():
    declared = [part for layer in layering.LAYERS for part in layer]
    assert len(declared) == len(set(declared)), "a part is named in two layers"
    assert set(declared) == layering.parts(), (
        f"not in a layer: {sorted(layering.parts() - set(declared))}; "
        f"in a layer but not in inferlab/: {sorted(set(declared) - layering.parts())}")


def test_at_most_ten_files_lie_directly_in_inferlab():
    """The plan's shape: __init__, __main__, protocol, hookspec, plugin, cli, files and writing, and the two command
    shims standin and replica."""
    files = sorted(p.name for p in layering.PACKAGE.iterdir() if p.is_file() and p.suffix == ".py")
    assert len(files) <= 10, files


@pytest.mark.slow  # one read of every module of inferlab (about half a second here)
def test_imports_run_one_way_and_no_module_imports_a_module_that_imports_it():
    """Nothing imports from a higher layer (so nothing below the command line imports inferlab.cli), and no cycle."""
    found = layering.imports()
    upward = layering.upward_imports(found)
    assert not upward, "\n".join(upward)
    cycle = layering.cycles(found)
    assert not cycle, "an import cycle: " + " -> ".join(cycle)


def test_the_checks_find_an_upward_import_a_cycle_and_a_relative_one(tmp_path):
    package = tmp_path / "inferlab"
    files = {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from inferlab.high import b  # a lazy import counts too\n",
        "high/__init__.py": "",
        "high/b.py": "from inferlab.low.a import f\nfrom . import c\n",
        "high/c.py": "from .b import f\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(textwrap.dedent(text))
    planted = layering.imports(package)
    upward = layering.upward_imports(planted, layers=(("low",), ("high",)))
    assert len(upward) == 1 and "inferlab.low.a imports inferlab.high.b, from a higher layer" in upward[0], upward
    cycle = layering.cycles(planted)
    assert cycle[0] == cycle[-1] and len(cycle) > 2, cycle
    assert set(cycle) <= {"inferlab.high.b", "inferlab.high.c", "inferlab.low.a"}, cycle
    across = layering.upward_imports(planted, layers=(("low", "high"),))
    assert len(across) == 2 and all("from the same layer" in line for line in across), across


def test_the_old_import_paths_still_work():
    """What a course's conftest.py or script may name: the hook specs, the stand-in and replica commands (python -m
    inferlab.standin DIR: tests/test_specimen_build.py; imported, the shim builds nothing), and spelled's old home."""
    assert hasattr(importlib.import_module("inferlab.hookspec"), "pytest_inferlab_record")
    for name in ("standin", "replica"):
        assert importlib.import_module(f"inferlab.{name}").build_command is importlib.import_module(
            "inferlab.specimen").build_command
    from inferlab.cli import spelled as old_spelled
    from inferlab.files import spelled

    assert old_spelled is spelled


# --- what must not grow back (issue 46, item 4) ------------------------------------------------------------

PLUGIN_MAX_LINES, MODULE_MAX_LINES, RUN_MAX_LINES, RUN_MAX_MODULES = 300, 400, 1550, 5  # run/: issue 57
# issue 57's budgets, counted as `wc -l` counts them over every *.py.
LIBRARY_MAX_LINES, LIBRARY_MAX_MODULES, TESTS_MAX_LINES = 12_000, 60, 10_000
READS_RECORDS = re.compile(r"RECORDS_FILE\)?\.(read_bytes|read_text|open)\(|open\([^)\n]*RECORDS_FILE")
PARSES_JSON_LINES = re.compile(r"for \w+ in [^\n]*splitlines\(\)[^\n]*:\n(?:[^\n]*\n){0,3}?[^\n]*json\.loads\(")


def line_counts(folder: Path) -> dict[str, int]:
    """Each *.py below folder (its path from the checkout) and its number of lines, as `wc -l` counts them."""
    return {str(path.relative_to(folder.parent)): path.read_text(encoding="utf-8").count("\n")
            for path in sorted(folder.rglob("*.py"))}


def test_the_plugin_only_wires_the_run_stays_small_and_the_library_and_its_tests_keep_to_issue_57s_budgets():
    sizes = line_counts(layering.PACKAGE)
    assert sizes["inferlab/plugin.py"] <= PLUGIN_MAX_LINES, (
        f"inferlab/plugin.py has {sizes['inferlab/plugin.py']} lines, over {PLUGIN_MAX_LINES}: move what a hook "
        "does into the run (inferlab/run/session.py)")
    run = {name: lines for name, lines in sizes.items() if name.startswith("inferlab/run/")}
    assert len(run) <= RUN_MAX_MODULES and sum(run.values()) <= RUN_MAX_LINES, run
    over = {name: lines for name, lines in sizes.items() if lines > MODULE_MAX_LINES}
    assert not over, f"library modules over {MODULE_MAX_LINES} lines: {over}"
    tests = line_counts(Path(__file__).resolve().parent)
    found = {"inferlab/ lines": sum(sizes.values()), "inferlab/ modules": len(sizes),
             "tests/ lines": sum(tests.values())}
    budgets = {"inferlab/ lines": LIBRARY_MAX_LINES, "inferlab/ modules": LIBRARY_MAX_MODULES,
               "tests/ lines": TESTS_MAX_LINES}
    assert all(found[name] <= budgets[name] for name in budgets), f"found {found}, budgets {budgets}"


def test_records_jsonl_is_parsed_by_the_one_reader_only():
    """A module that reads records.jsonl's content hands it to inferlab.read.parse.parse_records: no second
    parser (a byte search for a kind was one), and no loop that json-parses lines one by one, whatever path it
    opened (the session's RecordLog.catch_up read its own file so)."""
    texts = {str(path.relative_to(layering.PACKAGE.parent)): path.read_text(encoding="utf-8")
             for path in sorted(layering.PACKAGE.rglob("*.py"))}
    readers = {name: text for name, text in texts.items() if READS_RECORDS.search(text)}
    assert "inferlab/read/parse.py" in readers  # the pattern finds the one reader itself
    second = [name for name, text in readers.items()
              if name != "inferlab/read/parse.py" and "parse_records(" not in text]
    assert not second, f"records.jsonl read without the one parser (inferlab.read.parse) in: {second}"
    loops = [name for name, text in texts.items() if PARSES_JSON_LINES.search(text)]
    assert not loops, f"lines parsed as JSON one by one outside inferlab.read.parse in: {loops}"
