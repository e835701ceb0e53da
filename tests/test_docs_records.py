"""docs/records.md against the writers: every record kind, manifest field, envelope field and file a run writes
is documented, and nothing documented is gone. A failure says exactly which row to add or remove."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from fixtures_records import REPO_ROOT, RunBuilder, experiment_markers
from inferlab.run import records
from inferlab.host import environment
from inferlab.read import addenda
from inferlab.report import plots
from inferlab.run.plan import EXPERIMENTS_DIR

PAGE = REPO_ROOT / "docs" / "records.md"
KINDS, MANIFEST, ENVELOPE, FILES = ("Record kinds", "manifest.json", "The record envelope",
                                    "The files of a run folder")


def documented(heading: str) -> dict[str, str]:
    """{name: its table row} for every backticked name in the first cell of the table under `## heading`."""
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{PAGE}: expected a section '## {heading}'"
    rows = {}
    for line in match.group(1).splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2 and not set(cells[1].strip()) <= {"-"}:
            for name in re.findall(r"`([^`]+)`", cells[1]):
                rows[name] = line
    assert rows, f"{PAGE}: the section '## {heading}' has no table rows"
    return rows


def mismatch(heading: str, expected: dict[str, str], row_hint: str) -> list[str]:
    """What to add to and remove from the table under `heading`, one line each."""
    rows = documented(heading)
    lines = [f"{PAGE.relative_to(REPO_ROOT)}: '## {heading}' has no row for `{name}` ({why}); add: "
             + row_hint.format(name=name, why=why) for name, why in expected.items() if name not in rows]
    lines += [f"{PAGE.relative_to(REPO_ROOT)}: '## {heading}' documents `{name}`, which nothing writes any more; "
              f"remove it from: {row}" for name, row in rows.items() if name not in expected]
    return lines


def test_every_record_kind_a_run_writes_and_every_field_of_the_record_envelope_is_documented():
    expected = {kind: "written by the session itself (inferlab.run.records.HARNESS_KINDS)"
                for kind in records.HARNESS_KINDS}
    for test, marks in experiment_markers().items():
        for kind in marks["records"]:
            expected.setdefault(kind, f"declared by @pytest.mark.records on {test}")
    problems = mismatch(KINDS, expected, "| `{name}` | the experiment file | what one record holds |")
    envelope = {name: "inferlab.run.records.RESERVED_FIELDS" for name in records.RESERVED_FIELDS}
    problems += mismatch(ENVELOPE, envelope, "| `{name}` | what it holds |")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def written_run(tmp_path_factory) -> Path:
    """A run with no test, written by the real Run (claim, plan, records, report, final manifest)."""
    builder = RunBuilder(tmp_path_factory.mktemp("written") / "run", "standin", True, current_format=True)
    builder.write_plan([])
    return builder.finish()


def test_every_field_of_the_manifest_is_documented(written_run):
    """The environment record's fields are taken from this checkout (the fixture's machine is a stand-in)."""
    manifest = json.loads((written_run / records.MANIFEST_FILE).read_text(encoding="utf-8"))
    fields = {name: "inferlab.run.session.Run.write_manifest" for name in manifest}
    fields.update({name: "inferlab.host.environment.environment_record"
                   for name in environment.environment_record(REPO_ROOT)})
    fields["files"] = "the inventory the Run adds at the end"
    problems = mismatch(MANIFEST, fields, "| `{name}` | what it holds |   (it comes from {why})")
    assert not problems, "\n".join(problems)


def tensor_files() -> dict[str, str]:
    """tensors/<stem>.safetensors for every `*.put(STEM, ...)` in the experiments (STEM a constant of the module)."""
    found = {}
    for path in sorted((REPO_ROOT / EXPERIMENTS_DIR).glob("test_*.py")):
        module = ast.parse(path.read_text(encoding="utf-8"))
        constants = {target.id: node.value.value for node in module.body if isinstance(node, ast.Assign)
                     and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                     for target in node.targets if isinstance(target, ast.Name)}
        for call in ast.walk(module):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "put" \
                    and call.args:
                stem = call.args[0]
                stem = constants.get(stem.id) if isinstance(stem, ast.Name) else getattr(stem, "value", None)
                assert isinstance(stem, str), f"{path}: a tensor file whose name this test cannot read"
                found[f"{records.TENSOR_DIR}/{stem}.safetensors"] = f"stored by {path.name}"
    return found


def test_every_file_a_run_writes_is_documented(written_run):
    expected = {path.relative_to(written_run).as_posix(): "written by the Run" for path in written_run.rglob("*")
                if path.is_file()}
    expected.update({name: "a file inferlab.run.records names" for name in (
        records.CLAIM_FILE, records.MANIFEST_FILE, records.PLAN_FILE, records.RECORDS_FILE, records.PREDICTIONS_FILE,
        records.REPORT_FILE)})
    expected.update({name: "a plot inferlab.report.plots draws" for name in
                     (plots.TOKEN_TIMES_PNG, plots.TTFT_INTERVAL_PNG, plots.CPU_SHARE_PNG, plots.CACHE_DIFF_PNG)})
    expected.update({addenda.LEDGER_FILE: "the addenda ledger (inferlab.read.addenda)",
                     f"{addenda.ADDENDA_DIR}/": "the addenda's folder (inferlab.read.addenda)"})
    expected.update({records.RENAME_NOTE: "the note of whoever renamed a run -incomplete (inferlab.run.records)"})
    expected.update(tensor_files())
    assert len(tensor_files()) >= 4  # first-step logits and scores, cache logits, batching
    problems = mismatch(FILES, expected, "| `{name}` | what it holds |")
    assert not problems, "\n".join(problems)
