"""`attach RUN_DIR FILE`: a file written after the run kept beside its records (addenda/ and addenda.jsonl), checked by
verify; refusals write nothing; two attaches at once are serialised (two real processes)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.reading import addenda, addenda_store
from inferlab.verify import verify_run

from fixtures_records import copy_run, edit_manifest, kill_after
from fixture_runs import runs, shared  # noqa: F401 (runs is a fixture)

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = (ROOT / addenda.EXPLANATION_TEMPLATE).read_text(encoding="utf-8")


def tree(directory: Path) -> dict[str, bytes]:
    """Every file below a folder with its bytes (hidden and temporary files included)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def ledger(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / addenda.LEDGER_FILE).read_text().splitlines()]


def answered_explanation() -> str:
    """The template with every section answered in a line of its own."""
    lines = []
    for line in TEMPLATE.splitlines():
        lines.append(line)
        if line.startswith("### ") or line.startswith("## A conclusion"):
            lines.append("My answer, resting on records.jsonl seq 139.")
    return "\n".join(lines) + "\n"


built = shared("built", "complete", "The shared complete run (never change it: `run` is a copy).")


@pytest.fixture
def run(built, tmp_path) -> Path:
    return copy_run(built, tmp_path / "run")


@pytest.fixture
def explanation(tmp_path) -> Path:
    path = tmp_path / "my_explanation.md"
    path.write_text(answered_explanation(), encoding="utf-8")
    return path


# --- done when: a finished stand-in run ---------------------------------------------------------------------


@pytest.mark.process
def test_on_a_finished_stand_in_run_attach_keeps_every_session_file_and_verify_names_the_addendum(
        standin_run, tmp_path, explanation, capsys):
    run = copy_run(standin_run, tmp_path / "standin")
    session = tree(run)
    assert main(["attach", str(run), str(explanation)]) == 0
    out = capsys.readouterr()
    assert f"kept {run / 'addenda/my_explanation.md'}" in out.out and "addenda.jsonl seq 0" in out.out
    assert "has every heading of explanation.md" in out.out and "warning" not in out.err
    after = tree(run)
    assert {name: after[name] for name in session} == session  # every file of the session's, byte for byte
    assert set(after) - set(session) == {"addenda.jsonl", "addenda/my_explanation.md"}
    assert after["addenda/my_explanation.md"] == explanation.read_bytes()
    assert main(["verify", str(run)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("verify: OK (") and last.endswith("1 addendum added after the session, intact"), last
    (run / "addenda/my_explanation.md").write_text(answered_explanation() + "an afterthought\n")
    assert main(["verify", str(run)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("addenda/my_explanation.md: size") and "changed after it was attached" in lines[0]
    assert lines[1].startswith("addenda/my_explanation.md: sha256") and "edited after it was attached" in lines[1]
    assert lines[-1] == f"verify: 2 problem(s) in {run}"


def test_the_ledger_entry_holds_what_the_contract_names(run, explanation):
    assert main(["attach", str(run), str(explanation)]) == 0
    (entry,) = ledger(run)
    data = explanation.read_bytes()
    assert set(addenda.ENTRY_FIELDS) <= set(entry)
    assert entry["seq"] == 0 and entry["kind"] == "explanation" and entry["file"] == "addenda/my_explanation.md"
    assert entry["original_name"] == str(explanation) and entry["size"] == len(data)
    assert entry["sha256"] == addenda.sha256_of_file(explanation)
    assert entry["manifest_sha256"] == addenda.sha256_of_file(run / "manifest.json")
    assert entry["structure"]["ok"] is True and entry["tool"] == "inferlab attach"
    assert entry["run_finished"] is True and entry["run_state"] == "finished"
    assert entry["attached_utc"].endswith("+00:00")
    assert (run / addenda.LEDGER_FILE).read_bytes().endswith(b"}\n")


def test_attaching_again_keeps_every_version(run, explanation, capsys):
    first = explanation.read_bytes()
    assert main(["attach", str(run), str(explanation)]) == 0
    explanation.write_text(answered_explanation().replace("My answer", "My revised answer"))
    assert main(["attach", str(run), str(explanation)]) == 0
    assert main(["attach", str(run), str(explanation), "--kind", "notes"]) == 0
    assert [(e["seq"], e["file"], e["kind"]) for e in ledger(run)] == [
        (0, "addenda/my_explanation.md", "explanation"), (1, "addenda/my_explanation.2.md", "explanation"),
        (2, "addenda/my_explanation.3.md", "notes")]
    assert ledger(run)[2]["structure"] is None  # only an explanation's headings are checked
    assert (run / "addenda/my_explanation.md").read_bytes() == first
    capsys.readouterr()
    assert main(["verify", str(run)]) == 0
    assert capsys.readouterr().out.endswith("; 3 addenda added after the session, intact\n")


def test_an_incomplete_explanation_is_kept_with_a_warning_and_its_structure_recorded(run, tmp_path, capsys):
    draft = tmp_path / "draft.md"
    draft.write_text(TEMPLATE.replace("### Limitation 2\n", ""))  # the blank template, one heading fewer
    assert main(["attach", str(run), str(draft)]) == 0
    err = capsys.readouterr().err
    assert "warning: the explanation does not have explanation.md's structure" in err
    assert "missing heading(s): Limitation 2" in err and "A conclusion about selection" in err
    structure = ledger(run)[0]["structure"]
    assert structure["ok"] is False and structure["headings_missing"] == ["Limitation 2"]


# --- what verify says of the addenda ---------------------------------------------------------------------


def test_verify_names_a_removed_addendum_a_stray_file_and_a_changed_manifest(run, explanation, capsys):
    assert main(["attach", str(run), str(explanation)]) == 0
    explanation.write_text(answered_explanation() + "A second thought.\n")
    assert main(["attach", str(run), str(explanation)]) == 0
    (run / "addenda/my_explanation.md").unlink()
    (run / "addenda/stray.md").write_text("put here by hand\n")
    (run / "addenda/.my_explanation.md.x1.tmp").write_text("half")
    problems = verify_run(run)["problems"]
    assert any(p.startswith("addenda/my_explanation.md: missing") and "seq 0 lists it" in p for p in problems)
    assert any(p.startswith("addenda/stray.md: under addenda/ but no entry") for p in problems)
    assert any(p.startswith("addenda/.my_explanation.md.x1.tmp:") and "temporary file" in p for p in problems)
    assert not any("added after the session" in p for p in problems)  # the ledger is not the session's file
    edit_manifest(run, command="something else")
    problems = verify_run(run)["problems"]
    bound = [p for p in problems if "binds it to manifest.json" in p]
    assert [p.split(":")[0] for p in bound] == ["addenda/my_explanation.md", "addenda/my_explanation.2.md"]
    assert all("(attached to another run, or the manifest changed since)" in p for p in bound)


def test_verify_states_a_hand_edited_ledger_line_by_line(run, explanation):
    assert main(["attach", str(run), str(explanation)]) == 0
    entry = ledger(run)[0]
    lines = [json.dumps(entry), "not json", json.dumps({**entry, "seq": 7, "file": "../outside.md"})]
    (run / addenda.LEDGER_FILE).write_text("\n".join(lines) + "\n")
    problems = verify_run(run)["problems"]
    assert any(p.startswith("addenda.jsonl:2: not a JSON object") for p in problems)
    assert any("entry 2 has seq 7, expected 1" in p for p in problems)
    assert any("file '../outside.md', expected 'addenda/<stored name>'" in p for p in problems)


# --- bad input: refused, nothing written ------------------------------------------------------------------


def refused(argv: list[str], run: Path, capsys, code: int) -> str:
    """Run attach, expect the exit code and an unchanged run folder; the error text."""
    before = tree(run)
    assert main(argv) == code
    assert tree(run) == before
    err = capsys.readouterr().err
    assert err.endswith("nothing was written\n")
    return err


def test_a_missing_file_a_folder_and_a_fifo_are_usage_errors(run, tmp_path, capsys):
    err = refused(["attach", str(run), str(tmp_path / "nope.md")], run, capsys, 2)
    assert f"FILE {tmp_path / 'nope.md'} does not exist; expected a regular UTF-8 text file" in err
    err = refused(["attach", str(run), str(tmp_path)], run, capsys, 2)
    assert f"FILE {tmp_path} is a directory; expected a regular" in err
    os.mkfifo(tmp_path / "pipe")
    err = refused(["attach", str(run), str(tmp_path / "pipe")], run, capsys, 2)
    assert "is a FIFO (named pipe); expected a regular" in err


@pytest.mark.parametrize("content, words", [
    (b"", "is empty (0 bytes)"), (b"text\x00more", "is binary (a NUL byte at offset 4)"),
    ("caf\u00e9".encode("latin-1"), "is not UTF-8 text (byte 3"),
    (b"a" * (addenda_store.MAX_BYTES + 1), f"is {addenda_store.MAX_BYTES + 1:,} bytes, over the limit of 1,000,000; expected"),
], ids=["empty", "binary", "latin1", "over_1MB"])
def test_content_that_cannot_be_kept_is_refused(run, tmp_path, capsys, content, words):
    path = tmp_path / "file.md"
    path.write_bytes(content)
    err = refused(["attach", str(run), str(path)], run, capsys, 1)
    assert f"FILE {path} {words}" in err and "at most 1,000,000 bytes (1 MB)" in err


def test_exactly_1_MB_of_text_is_kept(run, tmp_path):
    path = tmp_path / "long.txt"
    path.write_bytes(b"a" * addenda_store.MAX_BYTES)
    assert main(["attach", str(run), str(path), "--kind", "notes"]) == 0
    assert (run / "addenda/long.txt").stat().st_size == addenda_store.MAX_BYTES


def test_a_folder_that_is_not_a_run_and_a_plan_folder_are_refused(runs, tmp_path, explanation, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    err = refused(["attach", str(empty), str(explanation)], empty, capsys, 2)
    assert f"{empty} is not a run's record dir: it has no records.jsonl" in err
    err = refused(["attach", str(explanation), str(explanation)], tmp_path, capsys, 2)
    assert f"RUN_DIR {explanation} is a regular file; expected a run's record dir" in err
    plan = runs.get("plan")
    err = refused(["attach", str(plan), str(explanation)], plan, capsys, 1)
    assert f"{plan} is a plan folder (written by --plan): no test ran" in err


def test_a_damaged_ledger_is_not_appended_to(run, explanation, capsys):
    assert main(["attach", str(run), str(explanation)]) == 0
    with open(run / addenda.LEDGER_FILE, "ab") as handle:
        handle.write(b'{"schema": 1, "seq": 1')  # a torn last line
    err = refused(["attach", str(run), str(explanation)], run, capsys, 1)
    assert f"{run / addenda.LEDGER_FILE} is damaged (line 2" in err


def test_a_session_inventory_that_lists_addenda_is_not_added_to(run, explanation, capsys):
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["files"]["addenda.jsonl"] = {"size": 0, "sha256": "0" * 64}  # attached while the session ran
    edit_manifest(run, files=manifest["files"])
    err = refused(["attach", str(run), str(explanation)], run, capsys, 1)
    assert "the session's inventory in manifest.json lists addenda.jsonl" in err
    assert "adding to it would change a file the session wrote" in err


def test_a_bad_kind_and_the_kind_only_revise_writes_are_usage_errors(run, explanation, capsys):
    before = tree(run)
    for kind, words in (("Notes!", "expected a lower-case word"), ("revised_criterion", "written by `revise")):
        with pytest.raises(SystemExit) as stopped:
            main(["attach", str(run), str(explanation), "--kind", kind])
        assert stopped.value.code == 2 and words in capsys.readouterr().err
    assert tree(run) == before


def test_an_unfinished_run_is_allowed_and_labelled(run, explanation, capsys):
    kill_after(run, 10)
    assert main(["attach", str(run), str(explanation)]) == 0
    out = capsys.readouterr().out
    assert "the run is unfinished: no session_end record" in out
    (entry,) = ledger(run)
    assert entry["run_finished"] is False and entry["run_state"].startswith("unfinished: no session_end record")
    assert not [p for p in verify_run(run)["problems"] if "addenda" in p]


def test_a_failure_half_way_leaves_nothing(run, explanation, monkeypatch, capsys):
    assert main(["attach", str(run), str(explanation)]) == 0
    explanation.write_text(answered_explanation() + "A second thought.\n")
    before = tree(run)
    real_write = os.write

    def half_a_line_then_a_full_disk(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(addenda_store.os, "write", half_a_line_then_a_full_disk)  # only the ledger uses os.write
    code = main(["attach", str(run), str(explanation)])
    monkeypatch.undo()
    assert code == 2 and "could not be written (No space left on device (ENOSPC)); nothing was kept" in (
        capsys.readouterr().err)
    assert tree(run) == before  # the copy removed, the ledger cut back to its length before


def test_a_file_inside_the_run_folder_is_refused_and_the_learner_told_to_keep_it_outside(run, capsys):
    """(Before issue 32 it was copied with a warning; the run's own files are refused: tests/test_rough_edges.py.)"""
    (run / "conclusions.md").write_text(answered_explanation())
    err = refused(["attach", str(run), str(run / "conclusions.md")], run, capsys, 2)
    assert "inside the run folder" in err and f"expected a file you wrote after the run, from outside {run}" in err


def test_stored_names_are_safe_and_never_start_with_a_dot():
    assert addenda_store.stored_name("../../My Explanation (final).md") == "My_Explanation_final_.md"
    assert addenda_store.stored_name(".hidden") == "hidden" and addenda_store.stored_name("...") == "addendum"
    assert len(addenda_store.stored_name("x" * 300 + ".md")) == addenda_store.NAME_LIMIT
    assert list(addenda_store.name_versions("notes"))[:3] == ["notes", "notes.2", "notes.3"]


def test_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["attach", "--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out and "1  refused, nothing written" in out and "2  usage, nothing written" in out


# --- two at once -----------------------------------------------------------------------------------------


@pytest.mark.process
def test_two_attaches_at_once_in_two_processes_are_serialised(run, tmp_path):
    files = []
    for name in ("a.md", "b.md"):
        files.append(tmp_path / name)
        files[-1].write_text(f"# notes {name}\n\nWritten after the run.\n")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    with addenda_store.locked(run):  # held here, so both must wait for it, and then for each other
        processes = [subprocess.Popen([sys.executable, "-m", "inferlab", "attach", str(run), str(f), "--kind", "notes"],
                                      cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for f in files]
        for process in processes:  # each says it waits: both have read the run and reached the lock
            assert "waiting for another attach or revise" in process.stderr.readline()
        assert not (run / addenda.LEDGER_FILE).exists()
    for process in processes:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0, out
    entries = ledger(run)
    assert [e["seq"] for e in entries] == [0, 1]
    assert sorted(e["file"] for e in entries) == ["addenda/a.md", "addenda/b.md"]
    assert verify_run(run)["problems"] == []
