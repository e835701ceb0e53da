"""Every command's exit codes are listed in one table (docs/records.md), and that table is the code's: the command
table's statuses, which each command's --help shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferlab import cli

DOCS = Path(__file__).resolve().parents[1] / "docs" / "records.md"


def test_the_docs_table_is_the_code_s():
    assert cli.exit_code_table() in DOCS.read_text(encoding="utf-8"), "docs/records.md: regenerate its exit-code table"


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_command_s_help_names_each_of_its_statuses(name, capsys):
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    shown = capsys.readouterr().out
    exits = cli.COMMANDS[name][1]
    assert not [code for code in exits if not re.search(rf"(^|\s){code}(\s|$)", shown)], shown
