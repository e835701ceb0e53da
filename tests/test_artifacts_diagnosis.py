"""One diagnosis of a specimen folder, for a run's --artifacts and `check-artifacts` (issue 45, items 4 and 5):
a valid copy of another specimen this checkout knows is named as such, with the flag that uses it, in the same
words by both, and no advice says to delete it; per-file lines say whose pin they match; a bundle over the cap is
one problem, not one per file; a huge folder's listing is cut to what matters, with a count."""

from __future__ import annotations

import os

import pytest

from inferlab import protocol, specimen
from inferlab.synthetic import replica

from shared_runs import experiment_here, inferlab_command


@pytest.fixture(scope="module")
def replica_dir(tmp_path_factory):
    """A replica copy, built from pythia-14m's published small files; skipped, saying where they are expected, in a
    clone without them (as every replica test is)."""
    from pathlib import Path

    from conftest import require_reference_dir

    reference = require_reference_dir()
    return Path(replica.build(tmp_path_factory.mktemp("replica") / "built", reference)["directory"])


def check_artifacts_words(directory) -> tuple[int, list[str]]:
    status, printed = inferlab_command("check-artifacts", directory)
    return status, printed.splitlines()


@pytest.mark.process
@pytest.mark.parametrize("which", ["standin", "replica"])
def test_a_run_given_another_specimen_s_good_copy_names_it_as_check_artifacts_does(which, request, tmp_path):
    directory = request.getfixturevalue(f"{which}_dir")
    status, lines = check_artifacts_words(directory)
    assert status == 1 and lines[-1].startswith(f"check-artifacts: {directory} is NOT a copy of "
                                                f"{protocol.PINNED_REPO_ID}")
    words = lines[-1].removeprefix("check-artifacts: ")
    assert f"valid copy of the SYNTHETIC {which} specimen" in words
    assert f"use it with --specimen {which} --artifacts {directory}" in words
    made = experiment_here(tmp_path, "--artifacts", str(directory))
    assert made.returncode == 1
    assert "Delete" not in made.stdout and "Delete" not in (made.run / "report.md").read_text()
    assert words in made.stdout  # the run's reason and its first next step: the same words
    assert made.stdout.count(words) >= 2 and "Replace those files" not in made.stdout


def test_per_file_lines_say_whose_pin_each_file_matches(standin_dir):
    _, lines = check_artifacts_words(standin_dir)
    weight = next(line for line in lines if " model.safetensors: " in line)
    assert weight.endswith(f"(as standin's pin, not {protocol.DEFAULT_SPECIMEN}'s)")
    config = next(line for line in lines if " config.json: " in line)
    assert config.endswith(f"(as the pins of both {protocol.DEFAULT_SPECIMEN} and standin)")


def test_a_damaged_copy_of_no_known_specimen_is_still_told_what_to_do(standin_copy):
    with open(standin_copy / "model.safetensors", "r+b") as handle:
        handle.seek(-4, os.SEEK_END)
        handle.write(b"\xff\xff\xff\xff")
    report = specimen.check_specimen_files(standin_copy, specimen.load_spec(protocol.DEFAULT_SPECIMEN))
    assert report["other_specimen"] is None and not report["ok"]
    assert any("Delete it." in line for line in report["problems"])  # a damaged copy of nothing: the old advice


def test_one_file_over_the_bundle_cap_is_one_problem(standin_copy):
    os.truncate(standin_copy / "tokenizer_config.json", 40_000_000)
    report = specimen.check_specimen_files(standin_copy, specimen.load_spec("standin"))
    assert len(report["problems"]) == 1, report["problems"]
    assert "tokenizer_config.json is 40,000,000 bytes" in report["problems"][0]
    assert "(the bundle cap)" in report["problems"][0]
    rows = {row["name"]: row for row in report["files"]}
    assert all(not row["ok"] and "not read" in row["problem"] for row in rows.values() if row["present"])


def test_a_huge_folder_says_it_is_probably_the_wrong_one_first_and_counts_the_rest(tmp_path):
    for number in range(1100):
        (tmp_path / f"f{number:04d}").write_bytes(b"")
    status, lines = check_artifacts_words(tmp_path)
    problems = [line for line in lines if line.startswith("problem: ")]
    assert status == 1 and lines[0] == problems[0] and problems[0].endswith("is this the right folder?")
    assert len(lines) < 30, len(lines)
    assert problems[-1].startswith(f"problem: ... and ") and "refused" in problems[-1]
