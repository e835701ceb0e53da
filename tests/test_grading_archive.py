"""`pack` writes one reproducible archive of a run and its addenda; `grade` reads such archives directly, and
refuses an unsafe one (absolute paths, '..', links, devices, too many entries or bytes) without extracting
anything outside a temporary folder."""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path

import pytest

from inferlab.__main__ import main
from inferlab.submission import archive
from inferlab.grading.grade import grade_source
from inferlab.grading.rubric import load_rubric

from fixtures_records import copy_run
from grading_helpers import answered_explanation, attach_file, give_predictions, answered_predictions
from fixture_runs import fixture_runs


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = fixture_runs(tmp_path_factory).copy("honest", tmp_path_factory.mktemp("archive") / "run-2026")
    give_predictions(run, answered_predictions())
    attach_file(run, answered_explanation())
    return run


@pytest.fixture(scope="module")
def packed(run, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("archive") / "submission.tar.gz"
    assert main(["pack", str(run), "-o", str(target)]) in (0, 1)  # 1 only while verify lists the addenda (#23)
    return target


@pytest.fixture
def private_temp(tmp_path, monkeypatch) -> Path:
    """Where grade's temporary folders go during one test, to see that nothing is left and nothing else written."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_pack_holds_the_run_its_addenda_and_a_submission_json(packed, run):
    with tarfile.open(packed) as tar:
        names = tar.getnames()
        submission = json.loads(tar.extractfile("submission.json").read())
    assert names[0] == "submission.json" and f"{run.name}/records.jsonl" in names
    assert f"{run.name}/addenda.jsonl" in names and f"{run.name}/addenda/my_explanation.md" in names
    assert f"{run.name}/predictions.md" in names and any(n.startswith(f"{run.name}/tensors/") for n in names)
    manifest = json.loads((run / "manifest.json").read_text())
    assert submission["run"] == run.name and submission["inventory"] == manifest["files"]
    assert submission["git_commit"] == manifest["git"]["commit"] and len(submission["addenda"]) == 1


def test_packing_twice_gives_the_same_bytes_and_never_overwrites(run, packed, tmp_path, capsys):
    again = tmp_path / "again.tar.gz"
    main(["pack", str(run), "-o", str(again)])
    assert again.read_bytes() == packed.read_bytes()
    assert main(["pack", str(run), "-o", str(again)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["pack", str(run), "-o", str(run / "inside.tar.gz")]) == 2
    assert not (run / "inside.tar.gz").exists()
    assert main(["pack", str(tmp_path), "-o", str(tmp_path / "x.tar.gz")]) == 2


def test_grade_reads_the_archive_as_it_reads_the_folder(packed, run, private_temp):
    from_archive = grade_source(packed, load_rubric())
    from_folder = grade_source(run, load_rubric())
    assert [(i.number, i.status) for i in from_archive.items] == [(i.number, i.status) for i in from_folder.items]
    assert from_archive.facts["run_id"] == run.name and from_archive.facts["archive"] == str(packed)
    assert from_archive.exit_status == from_folder.exit_status
    assert not any(str(private_temp) in line for line in from_archive.integrity_problems)
    assert list(private_temp.iterdir()) == []  # the temporary folder is gone


def test_an_archive_whose_run_changed_after_packing_is_an_integrity_problem(packed, tmp_path):
    with tarfile.open(packed) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    edited = tmp_path / "edited.tar.gz"
    with tarfile.open(edited, "w:gz") as tar:
        for member, data in members:
            if member.name == "submission.json":
                submission = json.loads(data)
                submission["manifest_sha256"] = "0" * 64
                data = json.dumps(submission).encode()
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    grade = grade_source(edited, load_rubric())
    assert grade.exit_status == 3
    assert any("submission.json: manifest_sha256 does not match" in p for p in grade.integrity_problems)


def archive_with(path: Path, *entries) -> Path:
    """A .tar.gz of (TarInfo, bytes or None) entries, written as given."""
    with tarfile.open(path, "w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def entry(name: str, kind=tarfile.REGTYPE, data: bytes = b"x", link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("entries, message", [
    ([entry("run/records.jsonl"), entry("../outside.txt")], "a '..' part"),
    ([entry("run/records.jsonl"), entry("/tmp/inferlab-absolute.txt")], "an absolute path"),
    ([entry("run/records.jsonl"), entry("run/link", tarfile.SYMTYPE, link="/etc/passwd")], "a symbolic link"),
    ([entry("run/records.jsonl"), entry("run/hard", tarfile.LNKTYPE, link="run/records.jsonl")], "a hard link"),
    ([entry("run/records.jsonl"), entry("run/dev", tarfile.CHRTYPE)], "a device"),
    ([entry("run/records.jsonl"), entry("run/fifo", tarfile.FIFOTYPE)], "a FIFO"),
    ([entry("run/records.jsonl"), entry("run/records.jsonl")], "appears twice"),
    ([entry("run/a"), entry("run/a/b")], "below an entry that is a file"),
    ([entry("one/records.jsonl"), entry("two/records.jsonl")], "expected one run folder"),
])
def test_an_unsafe_archive_is_refused_and_nothing_is_extracted(tmp_path, private_temp, capsys, entries, message):
    bad = archive_with(tmp_path / "bad.tar.gz", *entries)
    assert main(["grade", str(bad)]) == 2
    out = capsys.readouterr().out
    assert "NOT A RUN (exit 2)" in out and message in out and "nothing was extracted" in out
    assert list(private_temp.iterdir()) == [] and not (tmp_path / "outside.txt").exists()
    assert not Path("/tmp/inferlab-absolute.txt").exists()


def test_too_many_entries_are_refused_before_any_is_written(tmp_path, private_temp, capsys):
    bad = archive_with(tmp_path / "many.tar.gz", *[entry(f"run/f{i}") for i in range(archive.MAX_ENTRIES + 1)])
    assert main(["grade", str(bad)]) == 2
    assert f"more than {archive.MAX_ENTRIES} entries" in capsys.readouterr().out
    assert list(private_temp.iterdir()) == []


def test_too_many_bytes_unpacked_are_refused(tmp_path, private_temp, monkeypatch, capsys):
    monkeypatch.setattr(archive, "MAX_UNPACKED_BYTES", 1024 * 1024)  # the rule at 1 MB instead of 100 MB
    bad = archive_with(tmp_path / "big.tar.gz", entry("run/a", data=b"0" * 600_000), entry("run/b", data=b"0" * 600_000))
    assert main(["grade", str(bad)]) == 2
    assert "MB unpacked" in capsys.readouterr().out and list(private_temp.iterdir()) == []


def test_an_archive_that_is_not_one_is_not_a_run(tmp_path, capsys):
    bad = tmp_path / "broken.tar.gz"
    bad.write_bytes(b"not gzip at all")
    assert main(["grade", str(bad)]) == 2
    assert "not a readable archive" in capsys.readouterr().out


def test_an_archive_of_a_folder_that_is_not_a_run_is_not_a_run(tmp_path, private_temp, capsys):
    bad = archive_with(tmp_path / "notes.tar.gz", entry("notes/readme.txt"))
    assert main(["grade", str(bad)]) == 2
    assert "is not a run" in capsys.readouterr().out and list(private_temp.iterdir()) == []


def test_pack_refuses_a_link_in_the_run_folder(run, tmp_path, capsys):
    linked = copy_run(run, tmp_path / "linked")
    (linked / "extra").symlink_to("/etc/hostname")
    assert main(["pack", str(linked), "-o", str(tmp_path / "linked.tar.gz")]) == 2
    assert "a symbolic link" in capsys.readouterr().err and not (tmp_path / "linked.tar.gz").exists()


def test_pack_refuses_a_plan_folder(tmp_path, tmp_path_factory, capsys):
    plan = fixture_runs(tmp_path_factory).get("plan")
    assert main(["pack", str(plan), "-o", str(tmp_path / "plan.tar.gz")]) == 2
    err = capsys.readouterr().err
    assert "is a plan folder (--plan): no test ran" in err and "without --plan" in err
    assert not (tmp_path / "plan.tar.gz").exists()


@pytest.mark.parametrize("where", ["under a file", "in a folder that refuses writing"])
def test_pack_into_a_place_that_cannot_be_written_exits_2_without_a_traceback(run, tmp_path, capsys, where):
    if where == "under a file":
        (tmp_path / "a-file").write_text("not a folder")
        target = tmp_path / "a-file" / "submission.tar.gz"
    else:
        target = Path("/proc/inferlab-cannot-write-here/submission.tar.gz")  # refused even to root
    assert main(["pack", str(run), "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pack: {target}: ") and "Traceback" not in err and not target.exists()
    assert "choose" in err  # says what to do


def test_a_read_only_folder_is_refused_before_anything_is_packed(run, tmp_path, capsys, monkeypatch):
    import os

    folder = tmp_path / "read-only"
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == folder else real_access(path, mode))
    assert main(["pack", str(run), "-o", str(folder / "submission.tar.gz")]) == 2
    assert "is not writable; choose a folder you can write to" in capsys.readouterr().err
    assert list(folder.iterdir()) == []


@pytest.mark.slow
def test_pack_records_the_learner_and_refuses_an_id_that_is_not_one(run, tmp_path, capsys):
    target = tmp_path / "ada.tar.gz"
    assert main(["pack", str(run), "-o", str(target), "--learner", "ada@example.edu"]) in (0, 1)
    with tarfile.open(target) as tar:
        assert json.loads(tar.extractfile("submission.json").read())["learner"] == "ada@example.edu"
    assert "learner ada@example.edu" in capsys.readouterr().out
    assert grade_source(target, load_rubric()).integrity_problems == grade_source(run, load_rubric()).integrity_problems
    assert main(["pack", str(run), "-o", str(tmp_path / "bad.tar.gz"), "--learner", "two\nlines"]) == 2
    assert "expected an id of 1 to 200 printable characters" in capsys.readouterr().err
    assert not (tmp_path / "bad.tar.gz").exists()


@pytest.mark.slow
def test_the_learner_of_one_packed_archive_is_in_every_output_format(run, tmp_path, capsys):
    import csv
    from xml.etree import ElementTree

    from inferlab.grading import formats

    target = tmp_path / "ada.tar.gz"
    assert main(["pack", str(run), "-o", str(target), "--learner", "ada@example.edu"]) in (0, 1)
    capsys.readouterr()
    grades = [grade_source(target, load_rubric())]  # one archive, no class
    assert "learner: ada@example.edu" in formats.render(grades, "text")
    data = json.loads(formats.render(grades, "json"))
    assert [x["id"] for x in data["runs"][0]["facts"]["learners"]] == ["ada@example.edu"]
    assert [row["learner"] for row in csv.DictReader(io.StringIO(formats.csv_text(grades)))] == ["ada@example.edu"]
    suite = ElementTree.fromstring(formats.render(grades, "junit")).find("testsuite")
    assert {p.get("name"): p.get("value") for p in suite.iter("property")}["learner"] == "ada@example.edu"
    results = json.loads(formats.render(grades, "gradescope"))
    assert results["extra_data"]["learner"] == "ada@example.edu" and "ada@example.edu" in results["output"]
    # and through the command, for the formats a course CI asks for
    out = tmp_path / "grade.xml"
    main(["grade", str(target), "--format", "junit", "--out", str(out), "--csv", str(tmp_path / "g.csv")])
    assert 'name="learner" value="ada@example.edu"' in out.read_text()
    assert "ada@example.edu" in (tmp_path / "g.csv").read_text()
    capsys.readouterr()


def test_an_archive_packed_without_a_learner_names_nobody(packed):
    from inferlab.grading import formats

    grades = [grade_source(packed, load_rubric())]
    assert grades[0].facts["learners"] == [] and "learner:" not in formats.render(grades, "text")
    assert json.loads(formats.render(grades, "gradescope"))["extra_data"]["learner"] is None
