"""Every command's exit codes are listed in one table (docs/records.md), and that table is the code's: each
command module's EXITS, and every exit status a command returns by name or number is one its EXITS explains."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from inferlab import cli

DOCS = Path(__file__).resolve().parents[1] / "docs" / "records.md"
ROW = re.compile(r"^\| `?([a-z-]+(?: command)?)`? \| (\d+) \| (.+) \|$")


def returned_codes(module) -> dict[int, int]:
    """exit status -> the line of a `return` in the module that returns it by name (EXIT_...) or as a number."""
    found = {}
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        value = node.value
        if isinstance(value, ast.Constant) and type(value.value) is int:
            found.setdefault(value.value, node.lineno)
        elif isinstance(value, ast.Name) and value.id.startswith("EXIT_"):
            found.setdefault(getattr(module, value.id), node.lineno)
    return found


def test_the_docs_table_is_the_code_s():
    table = cli.exit_code_table()
    assert table in DOCS.read_text(encoding="utf-8"), "docs/records.md: regenerate its exit-code table"
    rows = [ROW.match(line).groups() for line in table.splitlines()[2:]]
    documented = {(name, int(code)) for name, code, _ in rows}
    expected = {(m.NAME, code) for m in cli.command_modules() for code in m.EXITS} | {("every command", 141)}
    assert documented == expected


@pytest.mark.parametrize("module", cli.command_modules(), ids=lambda m: m.NAME)
def test_every_status_a_command_returns_is_in_its_table(module):
    unexplained = {code: line for code, line in returned_codes(module).items() if code not in module.EXITS}
    assert not unexplained, f"{module.__name__} returns {unexplained} (status: line) with no EXITS entry"


@pytest.mark.parametrize("module", cli.command_modules(), ids=lambda m: m.NAME)
def test_every_command_s_help_names_each_of_its_statuses(module, capsys):
    with pytest.raises(SystemExit):
        cli.main([module.NAME, "--help"])
    shown = capsys.readouterr().out
    missing = [code for code in module.EXITS if not re.search(rf"(^|\s){code}(\s|$)", shown)]
    assert not missing, f"{module.NAME} --help does not show exit status {missing}"
