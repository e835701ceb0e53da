"""Records of a shape no inferlab writer makes (a list where a prompt id belongs, a dict for a condition),
re-hashed so that every file verifies: verify names them as problems instead of crashing, grade gives its
integrity verdict, and the commands that only read (compare) stop with one line, never a traceback."""

from __future__ import annotations


import pytest

from inferlab.cli import EXIT_UNREADABLE, main
from inferlab.grade.grade import EXIT_INTEGRITY
from inferlab.read.verify import verify_run

from fixture_runs import fixture_runs
from forging import find, forge


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """An honest fixture run, and a copy whose ids are given shapes no writer makes."""
    base = tmp_path_factory.mktemp("malformed")
    honest = fixture_runs(tmp_path_factory).get("complete")

    def damage(records):
        find(records, "generation")["prompt_id"] = ["P1"]
        find(records, "generation", trial_id="P1-G-rep2")["condition"] = {"name": "G"}
        find(records, "timing_trial")["prompt_id"] = [1, 2]

    return {"honest": honest, "damaged": forge(honest, base / "damaged", damage)}


def test_verify_names_each_check_the_malformed_records_stopped_and_runs_the_others(runs):
    result = verify_run(runs["damaged"])
    assert not result["ok"]
    malformed = [p for p in result["problems"] if p.startswith("malformed records: ")]
    assert any("could not read them (TypeError: unhashable type" in p for p in malformed) or any(
        "(prompt_id, condition, seed) = [['P1']" in p for p in result["problems"]), result["problems"]
    # the checks after the one that stopped still ran: the tensors are checked
    assert verify_run(runs["honest"])["ok"]


def test_grade_gives_the_integrity_verdict_on_malformed_records(runs, capsys):
    assert main(["grade", str(runs["damaged"])]) == EXIT_INTEGRITY
    out = capsys.readouterr().out
    assert "(exit 3)" in out and "the protocol says" in out


def test_a_reading_command_stops_on_malformed_records_with_one_line(runs, capsys):
    assert main(["compare", str(runs["damaged"]), str(runs["honest"])]) == EXIT_UNREADABLE
    err = capsys.readouterr().err
    assert err.startswith("inferlab compare: stopped on a record it cannot read (TypeError: unhashable type")
    assert "verify DIR` names the malformed records" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
