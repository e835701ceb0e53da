"""`check-artifacts DIR`: a folder of specimen files against the specimen's pins, before a run uses it."""

from __future__ import annotations

import sys

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


def artifact_row_line(row: dict) -> str:
    """One line per specimen file: its size and hash, or, for an optional file that is absent, why that is fine."""
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


def other_specimen_match(artifacts_dir, asked: str):
    """The spec of another known specimen (artifacts/*.json) that the folder is a valid copy of, with its check;
    None when it is no other specimen's copy either. A stand-in copy checked against Pythia is named, not called
    a damaged Pythia."""
    from inferlab import specimen
    from inferlab.specimen.spec import DEFAULT_ARTIFACTS_ROOT

    for path in sorted(DEFAULT_ARTIFACTS_ROOT.glob("*.json")):
        if path.stem == asked:
            continue
        try:
            other = specimen.load_spec(path.stem)
        except specimen.SpecimenError:
            continue
        result = specimen.check_specimen_files(artifacts_dir, other)
        if result["ok"]:
            return other, result
    return None


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
    match = None if result["ok"] else other_specimen_match(artifacts_dir, name)
    if match is not None:
        other, other_result = match
        for row in other_result["files"]:
            print(artifact_row_line(row))
        kind = "the SYNTHETIC" if other.synthetic else "the"
        print(f"check-artifacts: {artifacts_dir} is NOT a copy of {spec.repo_id} at {spec.revision} (specimen "
              f"{name}): it is a valid copy of {kind} {other.name} specimen ({other.repo_id} at {other.revision}), "
              f"every file as artifacts/{other.name}.json pins it"
              + (", so it is not Pythia" if other.synthetic else "") +
              f". Use it with --specimen {other.name} --artifacts {artifacts_dir}")
        return EXIT_PROBLEMS
    for row in result["files"]:
        print(artifact_row_line(row))
    for line in result["problems"]:
        print(f"problem: {line}")
    if not result["ok"]:
        print(f"check-artifacts: {artifacts_dir} is NOT a valid copy of {spec.repo_id} at {spec.revision} "
              f"({len(result['problems'])} problem(s)); --artifacts would refuse it")
        return EXIT_PROBLEMS
    print(f"check-artifacts: {artifacts_dir} is a valid copy of {spec.repo_id} at {spec.revision}: use "
          f"--artifacts {artifacts_dir}")
    return EXIT_OK
