"""Every command the terminal, the guidance, the report and the errors print works when typed as printed in the
project folder: all of them are spelled by inferlab.files.spelled, and the ones a report prints run."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from inferlab import cli, protocol, specimen
from inferlab.files import VENV_BIN
from inferlab.run.records import REPORT_FILE

from fixture_runs import runs  # noqa: F401 (a fixture)

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_a_command_is_spelled_with_the_environments_own_programs():
    assert cli.spelled("verify DIR") == ".venv/bin/inferlab verify DIR"
    assert cli.spelled("-m inferlab.standin NEWDIR", "python") == ".venv/bin/python -m inferlab.standin NEWDIR"
    assert cli.build_parser().prog == cli.PROG == "inferlab"


def printed_commands(runs, tmp_path) -> tuple[Path, set[str]]:
    """A failed run (its report prints the next steps and the checks), and every `.venv/bin/...` command its
    report and the guidance for each kind of specimen print."""
    run = runs.copy("failed", tmp_path / "run")
    texts = [(run / REPORT_FILE).read_text(encoding="utf-8")]
    for name, failed_path in ((protocol.DEFAULT_SPECIMEN, None), ("standin", "reuse:artifacts_dir"),
                              ("replica", "reuse:artifacts_dir")):
        texts += specimen.acquisition_next_steps(specimen.load_spec(name).as_dict(), failed_path)
    return run, {command for text in texts for command in re.findall(r"`(\.venv/bin/[^`]+)`", text)}


@pytest.mark.process
def test_every_command_a_report_and_the_guidance_print_runs_typed_as_printed(runs, tmp_path):
    run, commands = printed_commands(runs, tmp_path)
    assert {"verify", "report", "check-artifacts", "inferlab.standin", "inferlab.replica"} <= {
        shlex.split(c)[1] if c.startswith(".venv/bin/inferlab") else shlex.split(c)[2] for c in commands}, commands
    assert (REPO_ROOT / VENV_BIN / "inferlab").is_file(), "no .venv/bin/inferlab: run `make` (it installs it)"
    empty, occupied = tmp_path / "empty", tmp_path / "occupied"
    empty.mkdir()
    occupied.mkdir()
    (occupied / "something").write_text("x")
    for command in sorted(commands):
        # DIR: the run, or (for check-artifacts) a folder that is no specimen copy; NEWDIR: a folder the builder
        # refuses at once, so the command runs without building anything.
        target = empty if " check-artifacts " in command else run
        typed = command.replace("NEWDIR", str(occupied)).replace(" DIR", f" {target}")
        done = subprocess.run(typed, shell=True, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        said = done.stdout + done.stderr
        assert done.returncode not in (126, 127) and "No module named" not in said and "usage:" not in said, \
            f"{command!r} typed as {typed!r} in {REPO_ROOT} did not run: exit {done.returncode}\n{said[-2000:]}"
        if " verify " in command or " report " in command:
            assert done.returncode == 0, said[-2000:]


@pytest.mark.parametrize("builder", ["standin", "replica"])
def test_the_builders_name_themselves_as_they_are_typed(builder, capsys):
    module = __import__(f"inferlab.{builder}", fromlist=["main"])
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert capsys.readouterr().out.startswith(f"usage: {cli.spelled(f'-m inferlab.{builder}', 'python')} ")
