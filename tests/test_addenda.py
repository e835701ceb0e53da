"""What is kept beside a run after its session: `attach` (the explanation) and `revise` (a justified revised cache
criterion). Nothing the session wrote changes, nothing partial is left, verify checks every addendum."""

from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.run.records import CLAIM_FILE, MANIFEST_FILE, RECORDS_FILE, REPORT_FILE, utc_now
from inferlab.read import addenda
from inferlab.read.verify import verify_run

from fixtures_records import copy_run, kill_after, rewrite_records
from fixture_runs import runs, shared  # noqa: F401 (runs is a fixture)
from grading_helpers import answered_explanation

JUSTIFICATION = "the one-token path sums in another order; errors near 1e-6 are rounding, not a cache fault"
ALIGNMENT = ("same_prefix", "vocab_dim_cached", "vocab_dim_uncached", "finite", "cache_length_matches_prefix",
             "fed_masks_aligned", "fed_positions_aligned")  # a real run's cache_comparison checks
built = shared("built", "complete", "The shared complete run (never change it: `run` is a copy).")


def tree(directory: Path) -> dict[str, bytes]:
    """Every file below a folder with its bytes (hidden and temporary files included)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def ledger(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / addenda.LEDGER_FILE).read_text().splitlines()]


def claimed_by(run: Path, **fields) -> Path:
    """The run's claim.json rewritten to name a process (this one by default) on this host."""
    claim = {**json.loads((run / CLAIM_FILE).read_text()), "pid": os.getpid(), "hostname": socket.gethostname(),
             "claimed_utc": utc_now(), **fields}
    (run / CLAIM_FILE).write_text(json.dumps(claim, indent=2) + "\n")
    return run


def aligned(run: Path, change=None) -> Path:
    """The alignment checks revise requires, as a real run records them: all pass unless change(record) alters them."""
    def transform(records):
        for record in [r for r in records if r["kind"] == "cache_comparison"]:
            record["checks"] = {**{name: True for name in ALIGNMENT}, "within_tolerance": True}
            if change is not None:
                change(record)
        return records

    rewrite_records(run, transform)
    return run


@pytest.fixture
def run(built, tmp_path) -> Path:
    return copy_run(built, tmp_path / "run")


@pytest.fixture
def explanation(tmp_path) -> Path:
    path = tmp_path / "my_explanation.md"
    path.write_text(answered_explanation(), encoding="utf-8")
    return path


def refused(argv: list, run: Path, capsys, code: int) -> str:
    """The command exits `code` and leaves the run folder byte for byte; its error text."""
    before = tree(run)
    assert main([str(a) for a in argv]) == code
    assert tree(run) == before
    return capsys.readouterr().err


def test_attach_keeps_a_copy_and_verify_names_it_edited_removed_stray_or_bound_to_another_run(run, explanation, capsys):
    session = tree(run)
    assert main(["attach", str(run), str(explanation)]) == 0
    assert "addenda.jsonl seq 0" in capsys.readouterr().out
    after = tree(run)
    assert {name: after[name] for name in session} == session
    assert set(after) - set(session) == {"addenda.jsonl", "addenda/my_explanation.md"}
    [entry] = ledger(run)
    assert entry["kind"] == "explanation" and entry["structure"]["ok"] is True and entry["run_finished"] is True
    explanation.write_text(answered_explanation() + "A second thought.\n")
    assert main(["attach", str(run), str(explanation)]) == 0 and ledger(run)[1]["file"] == "addenda/my_explanation.2.md"
    assert verify_run(run)["problems"] == []
    (run / "addenda/my_explanation.md").write_text("edited afterwards\n")
    (run / "addenda/stray.md").write_text("put here by hand\n")
    problems = verify_run(run)["problems"]
    assert any(p.startswith("addenda/my_explanation.md: sha256 ") and "edited after it was attached" in p
               for p in problems)
    assert any(p.startswith("addenda/stray.md: under addenda/ but no entry") for p in problems)
    (run / "addenda/my_explanation.md").unlink()
    manifest = json.loads((run / MANIFEST_FILE).read_text())
    (run / MANIFEST_FILE).write_text(json.dumps({**manifest, "command": "something else"}))
    problems = verify_run(run)["problems"]
    assert any(p.startswith("addenda/my_explanation.md: missing") for p in problems)
    assert any("binds it to manifest.json sha256" in p and "attached to another run" in p for p in problems)


@pytest.mark.parametrize("name", [REPORT_FILE, MANIFEST_FILE, RECORDS_FILE])
def test_attach_refuses_a_file_of_the_run_itself(run, capsys, name):
    err = refused(["attach", run, run / name], run, capsys, 2)
    assert "one of the run's own files" in err and err.endswith("nothing was written\n")


def test_attach_refuses_a_link_into_the_run_a_binary_file_and_a_damaged_ledger(run, explanation, tmp_path, capsys):
    os.link(run / REPORT_FILE, tmp_path / "looks_mine.md")
    assert "one of the run's own files" in refused(["attach", run, tmp_path / "looks_mine.md"], run, capsys, 2)
    (tmp_path / "binary.md").write_bytes(b"text\x00more")
    assert "is binary (a NUL byte at offset 4)" in refused(["attach", run, tmp_path / "binary.md"], run, capsys, 1)
    assert main(["attach", str(run), str(explanation)]) == 0
    with open(run / addenda.LEDGER_FILE, "ab") as handle:
        handle.write(b'{"schema": 1, "seq": 1')  # a torn last line
    explanation.write_text(answered_explanation() + "more\n")
    assert f"{run / addenda.LEDGER_FILE} is damaged (line 2" in refused(["attach", run, explanation], run, capsys, 1)


def test_attach_and_revise_refuse_a_run_whose_session_still_runs(run, explanation, capsys):
    claimed_by(kill_after(run, 10))  # no session_end yet, and the claim names this (running) process
    assert "is still being written by its session" in refused(["attach", run, explanation], run, capsys, 2)
    argv = ["revise", run, "--cache-criterion", "1e-4,1e-3", "--justification", JUSTIFICATION]
    assert "is still being written by its session" in refused(argv, run, capsys, 2)
    claimed_by(run, pid=4242, hostname="elsewhere")  # another machine's session: cannot be asked, kept and labelled
    assert main(["attach", str(run), str(explanation)]) == 0 and ledger(run)[0]["run_finished"] is False


def test_a_failure_half_way_leaves_nothing(run, explanation, monkeypatch, capsys):
    def half_a_line_then_a_full_disk(fd, data):
        os.ftruncate(fd, os.fstat(fd).st_size)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(addenda.os, "write", half_a_line_then_a_full_disk)  # only the ledger uses os.write
    assert "No space left on device" in refused(["attach", run, explanation], run, capsys, 2)


def test_revise_keeps_both_verdicts_and_the_justification_and_verify_rechecks_them(runs, tmp_path, capsys):
    run = aligned(runs.copy("complete", tmp_path / "run"))
    assert main(["revise", str(run), "--cache-criterion", "1e-4,1e-3", "--justification", JUSTIFICATION]) == 0
    out = capsys.readouterr().out
    assert "the declared criterion and its verdict stay as recorded" in out
    [entry] = ledger(run)
    document = json.loads((run / entry["file"]).read_text())
    assert entry["kind"] == addenda.REVISED_KIND and document["justification"] == JUSTIFICATION
    assert all(row["declared"]["recomputed"]["passed"] is not None for row in document["prefixes"])
    assert verify_run(run)["problems"] == []
    document["prefixes"][0]["revised"]["passed"] = not document["prefixes"][0]["revised"]["passed"]
    data = json.dumps(document).encode()
    (run / entry["file"]).write_bytes(data)  # a forger who redoes the ledger's size and hash too
    (run / addenda.LEDGER_FILE).write_text(json.dumps({**entry, "size": len(data), "sha256": __import__(
        "hashlib").sha256(data).hexdigest()}) + "\n")
    assert any("revised verdict" in p for p in verify_run(run)["problems"])


@pytest.mark.parametrize("criterion, justification, said", [
    ("1e-4,1", JUSTIFICATION, "expected RTOL below 1"),
    ("1e-4,x", JUSTIFICATION, "expected ATOL,RTOL"),
    ("1e-4,1e-3", "because", "expected a sentence saying why"),
    ("1e-4,1e-3", "lorem ipsum dolor sit amet consectetur adipiscing elit", "expected a sentence saying why"),
    ("1000,0.5", JUSTIFICATION, "could not detect any cache fault"),
    ("1e-4,1e-3", JUSTIFICATION, "alignment checks did not all pass"),  # a run whose prefixes are not aligned
])
def test_revise_refuses_a_criterion_that_cannot_fail_a_thin_justification_or_an_unaligned_run(
        runs, tmp_path, capsys, criterion, justification, said):
    unaligned = said.startswith("alignment")
    run = aligned(runs.copy("complete", tmp_path / "run"), lambda r: r["checks"].update(same_prefix=not unaligned))
    argv = ["revise", run, "--cache-criterion", criterion, "--justification", justification]
    assert said in refused(argv, run, capsys, 1 if unaligned else 2)
