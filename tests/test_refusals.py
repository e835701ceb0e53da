"""Commands refuse what they cannot judge (issue 45, item 3): `pack` of a run its session is still writing, and
`compare` of a run that fails verify as unfinished (said at the top, exit non-zero); each refusal says what to do.
A plan folder: tests/test_cli.py."""

from __future__ import annotations


from inferlab.__main__ import main

from fixtures_records import kill_after
from fixture_runs import runs  # noqa: F401 (a fixture)
from test_addenda import built, run, tree  # noqa: F401 (fixtures)
from test_addenda import claimed_by


def test_pack_refuses_a_run_its_session_is_still_writing_and_leaves_nothing(run, tmp_path, capsys):
    claimed_by(kill_after(run, 10))  # no session_end yet, and the claim names this (running) process
    before = tree(run)
    target = tmp_path / "out" / "submission.tar.gz"
    assert main(["pack", str(run), "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{run} is still being written" in err and "wait for it to end" in err
    assert tree(run) == before and not target.exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_pack_still_packs_a_killed_run_whose_session_is_gone(run, tmp_path, capsys):
    claimed_by(kill_after(run, 10), pid=4242, hostname="elsewhere")
    target = tmp_path / "submission.tar.gz"
    assert main(["pack", str(run), "-o", str(target)]) == 1  # packed, and verify names it unfinished
    assert target.is_file() and "unfinished: " in capsys.readouterr().out


def test_compare_of_a_killed_run_says_so_first_and_exits_1(runs, tmp_path, capsys):
    killed = kill_after(runs.copy("complete", tmp_path / "killed"), 10)
    assert main(["compare", str(runs.get("complete")), str(killed)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("compare: DIR2 fails verify as unfinished or partial: unfinished: ")
    assert "the exit is 1" in lines[1]
