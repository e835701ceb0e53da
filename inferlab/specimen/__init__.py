"""The pinned specimen: its spec as data, one bounded way to a verified copy of its files, and the offline builds
(one module each: docs/architecture.md, "Layout"); here, what the rest of inferlab imports of it."""

from __future__ import annotations

import sys

from inferlab.files import sha256_file
from inferlab.specimen.acquire import (
    ACQUISITION_LABELS, acquire, acquisition_cause, acquisition_next_steps, acquisition_outcome, load_runnable_spec,
    local_builder, require_verified,
)
from inferlab.specimen.check import check_specimen_files
from inferlab.specimen.hub import DeadlineExpired
from inferlab.specimen.netguard import offline_mode
from inferlab.specimen.spec import (
    DEFAULT_ARTIFACTS_ROOT, WEIGHT_FILE, SpecimenError, SpecimenSpec, cache_dir, load_spec,
)

__all__ = [
    "ACQUISITION_LABELS", "DEFAULT_ARTIFACTS_ROOT", "WEIGHT_FILE", "DeadlineExpired", "SpecimenError", "SpecimenSpec",
    "acquire", "acquisition_cause", "acquisition_next_steps", "acquisition_outcome", "build_command", "cache_dir",
    "check_specimen_files", "checked_copy_lines", "load_runnable_spec", "load_spec", "local_builder", "offline_mode",
    "require_verified", "sha256_file",
]


def build_command(name: str, argv=None) -> int:
    """`python -m inferlab.<name> DIR` (standin or replica): under a Python that lacks what a build imports, one line
    naming the Python to use and exit 2, never a traceback; else the build's own command."""
    from inferlab.files import require_environment

    require_environment(f"inferlab.{name}")  # exit 2, one line naming the Python to use
    from inferlab.specimen import build

    return getattr(build, name.upper()).main(argv)


def checked_copy_lines(artifacts_dir, name=None) -> tuple[list[str], bool]:
    """`inferlab check-artifacts DIR`'s lines, and whether DIR is a valid copy of the specimen `name` (default
    pythia-14m); when it is another specimen's valid copy, each file says whose pin it matches."""
    from pathlib import Path

    from inferlab import protocol

    spec = load_spec(name or protocol.DEFAULT_SPECIMEN)
    result = check_specimen_files(artifacts_dir, spec)
    other = result.get("other_specimen")
    if other is not None:  # the same diagnosis, in the same words, as a run with --artifacts DIR
        ok, lines = {row["name"]: row["ok"] for row in result["files"]}, []
        other_spec = load_spec(other["name"], Path(spec.spec_file).parent)
        for row in check_specimen_files(artifacts_dir, other_spec, others=False)["files"]:
            pins = (f"as {other['name']}'s pin; {spec.name} pins none for it" if not spec.pinned_present(row["name"])
                    else f"as the pins of both {spec.name} and {other['name']}" if ok[row["name"]]
                    else f"as {other['name']}'s pin, not {spec.name}'s")
            lines.append(f"{_file_line(row)} ({pins})")
        return lines + [f"check-artifacts: {other['words']}"], False
    problems = list(result["problems"])
    first = [f"problem: {problems.pop(0)}"] if problems and problems[0].endswith("is this the right folder?") else []
    lines = first + [_file_line(row) for row in result["files"]] + [f"problem: {p}" for p in problems]
    if not result["ok"]:
        return lines + [f"check-artifacts: {artifacts_dir} is NOT a valid copy of {spec.repo_id} at {spec.revision} "
                        f"({len(result['problems'])} problem(s)); --artifacts would refuse it"], False
    return lines + [f"check-artifacts: {artifacts_dir} is a valid copy of {spec.repo_id} at {spec.revision}: use "
                    f"--artifacts {artifacts_dir}"], True


def _file_line(row: dict) -> str:
    state = "ok     " if row["ok"] else "PROBLEM"
    if not row.get("present"):
        return (f"{state} {row['name']}: absent (optional): {row.get('absence') or 'no reason recorded'}"
                if row["ok"] else f"{state} {row['name']}: missing")
    if row.get("size") is None or row.get("sha256") is None:  # refused before it was read, or beyond the cap
        return f"{state} {row['name']}: present, not hashed ({row.get('problem') or 'not read'})"
    return f"{state} {row['name']}: {row['size']} bytes, sha256 {row['sha256']}"
