"""The rough edges a learner or a grader hit (issue 32, item 4), each reproduced here:
  a. no addendum while the run's session is still running (claim.json names a live process);
  b. `grade` on a folder of runs says what it is;
  c. `replay` checks the run (verify) and the specimen before it acquires or loads anything;
  d. `attach` refuses the run's own files, and anything inside the run folder;
  e. an edited attachment's message says how to restore it (the SHA-256 it must have) and how to add a version;
  f. `report --after` exits 1 when an addendum changed;
  g. `revise` refuses a criterion that cannot fail, a throwaway justification, and misaligned prefixes;
  h. `grade` runs `report --check` and names a stale report.md as an integrity problem."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest

from inferlab import protocol
from inferlab.__main__ import main
from inferlab.base.records import CLAIM_FILE, MANIFEST_FILE, RECORDS_FILE, REPORT_FILE, utc_now
from inferlab.measure import revised_criterion as criteria
from inferlab.measure.revised_criterion import RevisedCriterionError, check_options, parse_criterion
from inferlab.reading import addenda_store
from inferlab.reading.runview import RunView
from inferlab.verify import verify_run

from fixtures_records import abandon_finish, copy_run, kill_after
from fixture_runs import runs  # noqa: F401 (a fixture)
from forging import rehash
from test_attach import answered_explanation, built, explanation, ledger, run, tree  # noqa: F401 (fixtures)
from test_revise import JUSTIFICATION, aligned


class LiveClaim:
    """inferlab.run.live_claim, imported when a test uses it (so that each test here fails on its own without it)."""

    def __getattr__(self, name):
        import importlib

        return getattr(importlib.import_module("inferlab.run.live_claim"), name)


live_claim = LiveClaim()


def claimed_by(run: Path, **fields) -> Path:
    """The run's claim.json rewritten to name a process (this one by default, with its start) on this host."""
    claim = json.loads((run / CLAIM_FILE).read_text())
    claim.update(pid=os.getpid(), hostname=socket.gethostname(), claimed_utc=utc_now(),
                 process_start=live_claim.start_identity(os.getpid()))
    claim.update(fields)
    (run / CLAIM_FILE).write_text(json.dumps(claim, indent=2) + "\n")
    return run


def refused(argv: list[str], run: Path, capsys, code: int) -> str:
    """The command's exit code is `code`, the run folder is unchanged; the error text."""
    before = tree(run)
    assert main(argv) == code
    assert tree(run) == before
    return capsys.readouterr().err


# --- a. no addendum while the session is live ------------------------------------------------------------


def test_attach_and_revise_refuse_a_run_whose_session_is_still_running(run, explanation, capsys):
    claimed_by(kill_after(run, 10))  # no session_end yet, and the claim names this (running) process
    err = refused(["attach", str(run), str(explanation)], run, capsys, 2)
    assert f"{run} is still being written by its session: pid {os.getpid()} is running, and it is the process " \
           "that claimed the folder" in err
    assert "it has no session_end record yet" in err and "swept into the session's own inventory" in err
    assert err.endswith("nothing was written\n") and "killed or crashed" not in err
    err = refused(["revise", str(run), "--cache-criterion", "1e-4,1e-3", "--justification", JUSTIFICATION], run,
                  capsys, 2)
    assert "is still being written by its session" in err


def test_report_does_not_call_a_running_session_killed(run, capsys):
    claimed_by(kill_after(run, 10))
    assert main(["report", str(run)]) == 0
    assert "has no session_end record: it is still running. The report shows" in capsys.readouterr().err
    claimed_by(run, pid=4242, hostname="elsewhere")
    assert main(["report", str(run)]) == 0
    assert "it never reached its end: it was killed or crashed" in capsys.readouterr().err


def test_a_session_in_its_final_writes_is_still_running_too(run, explanation, capsys):
    claimed_by(abandon_finish(run))  # session_end written, the final manifest not yet
    err = refused(["attach", str(run), str(explanation)], run, capsys, 2)
    assert "it has recorded its end but not yet written its final manifest.json" in err


def test_a_run_that_has_ended_takes_an_addendum_whoever_has_its_pid_now(run, explanation, capsys):
    claimed_by(run)  # finished: the session wrote its end and final manifest, so it adds nothing to its inventory
    assert main(["attach", str(run), str(explanation)]) == 0
    assert ledger(run)[-1]["run_finished"] is True


def test_a_reused_pid_is_not_taken_for_the_session(run, explanation, capsys):
    start = live_claim.start_identity(os.getpid())
    claimed_by(kill_after(run, 10), process_start={**start, "start_ticks": start["start_ticks"] + 1})
    assert main(["attach", str(run), str(explanation)]) == 0
    (entry,) = ledger(run)
    assert entry["run_state"] == ("unfinished: no session_end record: the session never reached its end (it was "
                                  "killed or crashed)")


def test_a_claim_of_a_process_that_has_exited_is_a_killed_run(run, explanation, capsys):
    child = subprocess.Popen(["true"])
    child.wait()  # exited and reaped: no process has its pid (until the kernel hands it out again)
    claimed_by(kill_after(run, 10), pid=child.pid)
    assert live_claim.claimant(json.loads((run / CLAIM_FILE).read_text())).state == "gone"
    assert main(["attach", str(run), str(explanation)]) == 0
    assert "it was killed or crashed" in ledger(run)[0]["run_state"]


def test_an_older_claim_without_the_process_start_is_judged_by_the_claim_time(run, explanation, capsys):
    """This process started before a claim made now (it may be the session: refused), and after a claim of 2001
    (it is another process given the same pid: allowed)."""
    claimed_by(kill_after(run, 10), process_start=None)
    err = refused(["attach", str(run), str(explanation)], run, capsys, 2)
    assert "does not record its process's start (an older run), and this process started before the claim" in err
    claimed_by(run, process_start=None, claimed_utc="2001-01-01T00:00:00+00:00")
    assert main(["attach", str(run), str(explanation)]) == 0


def test_a_claim_made_on_another_host_is_allowed_and_says_it_was_not_checked(run, explanation, capsys):
    kill_after(run, 10)  # the fixture's claim: pid 4242 on fixture-host
    assert main(["attach", str(run), str(explanation)]) == 0
    assert "on host 'fixture-host'" in ledger(run)[0]["run_state"]
    assert "cannot be checked from here" in ledger(run)[0]["run_state"]


def test_where_proc_cannot_say_a_running_pid_is_taken_for_the_session(monkeypatch, tmp_path):
    import inferlab.run.live_claim as module

    claim = {"pid": os.getpid(), "hostname": socket.gethostname(), "claimed_utc": utc_now(),
             "process_start": module.start_identity(os.getpid())}
    monkeypatch.setattr(module, "boot_id", lambda: None)  # the start of the process with the pid cannot be read
    assert module.claimant(claim).state == "live"
    monkeypatch.setattr(module, "PROC", tmp_path / "no-proc")  # no /proc at all: only whether the pid exists
    assert module.claimant(claim).state == "live"
    assert module.claimant({**claim, "pid": 2**22 + 12345}).state == "gone"  # above Linux's largest pid


def test_a_session_records_its_process_start_in_its_claim_and_its_report_is_not_stale(standin_run):
    claim = json.loads((standin_run / CLAIM_FILE).read_text())
    assert set(claim["process_start"]) == {"boot_id", "start_ticks"}
    assert claim["process_start"]["boot_id"] == live_claim.boot_id()


def test_the_start_identity_of_this_process_is_read_from_proc():
    start = live_claim.start_identity(os.getpid())
    ticks = int(Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert start == {"boot_id": live_claim.boot_id(), "start_ticks": ticks}
    started = live_claim._started_utc(ticks)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()) < 24 * 3600


# --- d. attach refuses the run's own files ----------------------------------------------------------------


@pytest.mark.parametrize("name", [REPORT_FILE, MANIFEST_FILE, RECORDS_FILE, "tensors/cache_logits.safetensors"])
def test_attach_refuses_a_file_of_the_run(run, capsys, name):
    err = refused(["attach", str(run), str(run / name), "--kind", "notes"], run, capsys, 2)
    assert f"FILE {run / name} is {run}/{name}, one of the run's own files, written by its session, not an " \
           f"explanation of it; expected a file you wrote after the run, from outside {run}" in err


def test_attach_refuses_any_file_inside_the_run_folder_and_links_to_one(run, tmp_path, capsys):
    (run / "conclusions.md").write_text(answered_explanation())
    err = refused(["attach", str(run), str(run / "conclusions.md")], run, capsys, 2)
    assert (f"is {run}/conclusions.md, inside the run folder, where verify calls every file the session did not "
            f"write added after it") in err
    (tmp_path / "linked.md").symlink_to(run / REPORT_FILE)
    err = refused(["attach", str(run), str(tmp_path / "linked.md")], run, capsys, 2)
    assert f"is {run}/{REPORT_FILE}, one of the run's own files" in err
    os.link(run / REPORT_FILE, tmp_path / "hard.md")
    err = refused(["attach", str(run), str(tmp_path / "hard.md")], run, capsys, 2)
    assert f"is {run}/{REPORT_FILE} (a hard link to it), one of the run's own files" in err


def test_attach_refuses_a_kept_addendum_and_says_how_to_add_a_version(run, explanation, capsys):
    assert main(["attach", str(run), str(explanation)]) == 0
    capsys.readouterr()
    err = refused(["attach", str(run), str(run / "addenda/my_explanation.md")], run, capsys, 2)
    assert "an addendum kept already (to attach a new version, attach it from a copy outside the run folder)" in err


def test_the_session_files_named_are_the_report_s():
    from inferlab import report

    assert addenda_store.DETAILS_FILE == report.DETAILS_FILE


# --- e. an edited attachment: how to restore it ------------------------------------------------------------


@pytest.mark.slow
def test_an_attachment_edited_in_place_says_the_sha256_to_restore_and_can_be_restored(run, explanation, capsys):
    assert main(["attach", str(run), str(explanation)]) == 0
    (entry,) = ledger(run)
    kept = run / entry["file"]
    kept.write_text(answered_explanation() + "fixed in place\n")
    problems = verify_run(run)["problems"]
    assert len(problems) == 2 and problems[1].startswith(f"{entry['file']}: sha256 ")
    assert (f"to repair it, put back the very bytes that were attached ({entry['size']} bytes, sha256 "
            f"{entry['sha256']}: your file {str(explanation)!r} as it was then, or a backup)") in problems[1]
    assert f"attach it as a new version beside it (`.venv/bin/inferlab attach {run} FILE`" in problems[1]
    kept.write_bytes(explanation.read_bytes())  # restored as the message says
    assert verify_run(run)["problems"] == []
    newer = explanation.parent / "newer.md"
    newer.write_text(answered_explanation() + "a later thought\n")
    assert main(["attach", str(run), str(newer)]) == 0 and verify_run(run)["problems"] == []


def test_a_removed_revision_says_to_revise_again(run, capsys):
    aligned(run)
    assert main(["revise", str(run), "--cache-criterion", "1e-4,1e-3", "--justification", JUSTIFICATION]) == 0
    (run / ledger(run)[0]["file"]).unlink()
    (problem,) = verify_run(run)["problems"]
    assert "removed after it was attached?" in problem and ledger(run)[0]["sha256"] in problem
    assert f"run `.venv/bin/inferlab revise {run} --cache-criterion ATOL,RTOL --justification TEXT` again" in problem


# --- f. report --after exits 1 when an addendum changed ---------------------------------------------------------


def test_report_after_exits_1_when_an_addendum_changed(run, explanation, capsys):
    assert main(["attach", str(run), str(explanation)]) == 0
    assert main(["report", str(run), "--after"]) == 0
    capsys.readouterr()
    (run / "addenda/my_explanation.md").write_text("replaced\n")
    assert main(["report", str(run), "--after"]) == 1
    out, err = capsys.readouterr()
    assert "now: **changed since it was attached**" in out and "put back the very bytes" in out
    assert f"report: 2 problem(s) with the addenda of {run}" in err and err.rstrip().endswith("exit 1")


# --- g. revise: a criterion that cannot fail, a throwaway justification, misaligned prefixes ----------------


def revise_argv(run: Path, criterion: str, justification: str = JUSTIFICATION) -> list[str]:
    return ["revise", str(run), "--cache-criterion", criterion, "--justification", justification]


def test_revise_refuses_an_rtol_of_1_or_more_in_the_parser_the_run_option_shares(run, capsys):
    aligned(run)
    with pytest.raises(SystemExit) as stopped:
        main(revise_argv(run, "1e300,1e300"))
    assert stopped.value.code == 2 and "expected RTOL below 1" in capsys.readouterr().err
    for text in ("0,1", "1e300,1e300"):
        with pytest.raises(RevisedCriterionError, match="a cached vector of zeros passes against any uncached one"):
            parse_criterion(text)
    assert parse_criterion("0,0.999").rtol == 0.999


def test_revise_refuses_a_criterion_under_which_the_run_s_logits_could_not_fail(run, capsys):
    aligned(run)
    err = refused(revise_argv(run, "1e300,0"), run, capsys, 2)
    assert "--cache-criterion 1e+300,0: under |a-b| <= 1e+300 + 0*|b|" in err
    assert "every cached vector whose values lie within the range the run's own saved logits span" in err
    assert "could not detect any cache fault" in err and err.endswith("nothing was written\n")


def test_the_vacuity_rule_is_exact_at_its_boundary():
    uncached = numpy.array([-2.0, 0.5, 3.0])  # range [-2, 3], 5 wide: the farthest value is 5 away
    cached = uncached + 1e-6
    span = float(max(cached.max(), uncached.max()) - min(cached.min(), uncached.min()))
    assert criteria.vacuous_reason([(cached, uncached)], protocol.Tolerance(atol=span, rtol=0.0)) is not None
    assert criteria.vacuous_reason([(cached, uncached)], protocol.Tolerance(atol=span * (1 - 1e-9), rtol=0.0)) is None
    # rtol widens the bound only where |b| is large: at b=0.5 the farthest value (-2) is 2.5 away, over 1 + 0.9*0.5
    assert criteria.vacuous_reason([(cached, uncached)], protocol.Tolerance(atol=1.0, rtol=0.9)) is None


@pytest.mark.parametrize("text", ["x", "because", "it is fine", "ok ok ok ok ok ok ok", "1e-3 1e-3 1e-3 1e-3 x y"])
def test_a_throwaway_justification_is_refused_by_revise_and_by_the_run_option(run, capsys, text):
    aligned(run)
    err = refused(revise_argv(run, "1e-4,1e-3", text), run, capsys, 2)
    assert f"--justification: expected a sentence saying why the criterion is justified, at least 6 words" in err
    with pytest.raises(RevisedCriterionError, match="at least 6 words of two letters or more, 4 of them different"):
        check_options(parse_criterion("1e-4,1e-3"), text)
    assert criteria.justification_problem(JUSTIFICATION) is None


def test_revise_requires_every_prefix_s_alignment_checks_to_have_passed(run, capsys):
    err = refused(revise_argv(run, "1e-4,1e-3"), run, capsys, 1)  # the fixture's records hold no checks
    assert "the matched-prefix alignment checks did not all pass" in err and "records no alignment checks" in err

    def misalign(record):
        if record["kind"] == "cache_comparison" and record["prefix_length"] == 10:
            record["checks"]["fed_positions_aligned"] = False

    aligned(run, misalign)
    err = refused(revise_argv(run, "1e-4,1e-3"), run, capsys, 1)
    assert "(prefix length 10): failed fed_positions_aligned" in err
    assert "no tolerance can make their logits comparable" in err


# --- h. grade names a stale report ------------------------------------------------------------------------
