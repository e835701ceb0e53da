"""`check-artifacts DIR`: a folder of specimen files against the specimen's pins, before a run uses it."""

from __future__ import annotations

import sys
from pathlib import Path

from inferlab.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE, directory

NAME = "check-artifacts"
# What each exit status means (docs/records.md's table of every command's exit codes is checked against it).
EXITS = {0: "a valid copy of the asked specimen", 1: "not a valid copy of it (a valid copy of another specimen this "
                                                                 "checkout knows is named, with the flag that uses it)",
         2: "a specimen this checkout does not know, or a folder that does not exist"}
HELP = "check a directory of specimen files (for --artifacts) against the specimen's pinned hashes, before a run"


def add_arguments(parser) -> None:
    parser.add_argument("artifacts_dir", type=directory, metavar="DIR")
    parser.add_argument("--specimen", default=None, metavar="NAME",
                        help="the specimen spec in artifacts/NAME.json (default: pythia-14m)")


def run(args) -> int:
    return run_check_artifacts(args.artifacts_dir, args.specimen)


def pins_of(row: dict, asked_row, asked: str, other: str) -> str:
    """Which specimen's pin a file of another specimen's valid copy matches: both, only the other's, or the other's
    where the asked specimen pins none (pythia-14m pins only the weights: an unpinned file matches no pin of it)."""
    pinned = asked_row is not None and (asked_row.get("expected_size"), asked_row.get("expected_sha256")) != (None, None)
    if pinned and asked_row.get("ok"):
        return f"as the pins of both {asked} and {other}"
    if asked_row is not None and not pinned:
        return f"as {other}'s pin; {asked} pins none for it"
    return f"as {other}'s pin, not {asked}'s"


def artifact_row_line(row: dict, pins: str = "") -> str:
    """One line per specimen file: its size and hash, or, for an optional file that is absent, why that is fine;
    pins, when given, says which specimen's pin it matches."""
    if pins:
        return f"{artifact_row_line(row)} ({pins})"
    state = "ok     " if row["ok"] else "PROBLEM"
    if not row.get("present") and row["ok"]:
        return f"{state} {row['name']}: absent (optional): {row.get('absence') or 'no reason recorded'}"
    if not row.get("present"):
        return f"{state} {row['name']}: missing"
    if row.get("size") is None:  # present, but refused before it was read (a link, a folder, a device)
        return f"{state} {row['name']}: present, not read ({row.get('problem') or 'refused'})"
    if row.get("sha256") is None:  # listed, not hashed (the bundle cap)
        return f"{state} {row['name']}: {row['size']:,} bytes, not hashed ({row.get('problem') or 'not read'})"
    return f"{state} {row['name']}: {row['size']} bytes, sha256 {row['sha256']}"


def run_check_artifacts(artifacts_dir, specimen_name) -> int:
    """`check-artifacts DIR`: each specimen file against its pins; the exit code."""
    from inferlab import protocol, specimen

    name = specimen_name or protocol.DEFAULT_SPECIMEN
    try:
        spec = specimen.load_spec(name)
    except specimen.SpecimenError as error:
        print(f"check-artifacts: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    result = specimen.check_specimen_files(artifacts_dir, spec)
    other = result.get("other_specimen")
    if other is not None:  # the same diagnosis, in the same words, as a run with --artifacts DIR
        from inferlab.specimen.check import check_specimen_files

        other_spec = specimen.load_spec(other["name"], Path(spec.spec_file).parent)
        asked = {row["name"]: row for row in result["files"]}
        for row in check_specimen_files(artifacts_dir, other_spec, others=False)["files"]:
            print(artifact_row_line(row, pins_of(row, asked.get(row["name"]), spec.name, other["name"])))
        print(f"check-artifacts: {other['words']}")
        return EXIT_PROBLEMS
    problems = list(result["problems"])
    if problems and problems[0].endswith("is this the right folder?"):
        print(f"problem: {problems.pop(0)}")  # what matters most, before any per-file line
    for row in result["files"]:
        print(artifact_row_line(row))
    for line in problems:
        print(f"problem: {line}")
    if not result["ok"]:
        print(f"check-artifacts: {artifacts_dir} is NOT a valid copy of {spec.repo_id} at {spec.revision} "
              f"({len(result['problems'])} problem(s)); --artifacts would refuse it")
        return EXIT_PROBLEMS
    print(f"check-artifacts: {artifacts_dir} is a valid copy of {spec.repo_id} at {spec.revision}: use "
          f"--artifacts {artifacts_dir}")
    return EXIT_OK
