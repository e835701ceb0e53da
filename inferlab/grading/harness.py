"""The run's harness against the grader's own copy: the per-file SHA-256 of the source a run recorded in its
manifest (`source_sha256`), compared file by file with the same files of the inferlab package this process
imported and the project folder it came from.

The harness is what decides what a run records: inferlab/ (the library and the plugin, its TOML data too),
experiments/, conftest.py, pytest.ini and the specimen specs artifacts/*.json (HARNESS_PARTS). Every file that
differs, or is hashed on one side only, is named; a part the run hashes nothing of is named once, with how many
files the grader's copy has there. The other hashed files (tests/, benchmarks/, analytic_tests/, the Makefile,
the templates, ...) take no part in a run's records; they are not compared (requirements.lock is the lock
check's: inferlab.grading.recompute).

What a difference means is the rubric's `grader_source` (inferlab.grading.rubric): an integrity problem by
default. The inferlab version the run recorded (manifest.json distributions) is said beside the grader's when
they differ.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from inferlab.reading.runview import RunView

HARNESS_PARTS = ("inferlab/", "experiments/", "artifacts/", "conftest.py", "pytest.ini")
SHOWN = 12  # files named one by one; the count says how many more


# Where the modules were before the layout by stage (docs/architecture.md, "Moved"): a run made before it hashes
# them under their old paths. A file that moved unchanged is the same file; one whose text changed (most: their
# import lines did) still differs, and is named on both sides.
MOVED_FROM = {f"inferlab/{part}/{name}.py": f"inferlab/{name}.py" for part, names in {
    "base": ("records",),
    "host": ("environment", "installation", "machine"),
    "synthetic": ("recipe", "standin", "replica", "tiny_model"),
    "specimen": ("netguard", "guidance"),
    "measure": ("inputs", "sampling", "decode_loop", "loop_check", "cache_check", "revised_criterion", "memory",
                "sizes", "batching", "messages", "forward_mode", "loading", "contention", "summaries", "near_tie"),
    "run": ("plan", "checks", "session_status", "interrupts", "terminal", "live_claim", "predictions", "docgen"),
    "reading": ("runview", "schema", "addenda", "addenda_store", "deterministic"),
    "recheck": ("replay", "revise"),
    "report": ("compare", "plots"),
}.items() for name in names}
# Moved on 2026-12-04 out of grading/, which scores and formats: what a run hands in, and the Gradescope bundle.
MOVED_FROM.update({f"inferlab/{part}/{name}.py": f"inferlab/grading/{name}.py" for part, names in {
    "submission": ("pack", "archive"), "gradescope": ("autograder", "autograder_scripts")}.items() for name in names})


def unmoved(run_hashes: dict, grader: dict) -> dict:
    """The run's hashes with each file that moved unchanged named by its present path (MOVED_FROM)."""
    hashes = dict(run_hashes)
    for path, former in MOVED_FROM.items():
        if (path not in hashes and former in hashes and former not in grader  # not the standin/replica shims
                and path in grader and hashes[former] == grader[path]):
            hashes[path] = hashes.pop(former)
    return hashes


def in_harness(path: str) -> bool:
    """Whether a hashed path is part of the harness."""
    return any(path == part or (part.endswith("/") and path.startswith(part)) for part in HARNESS_PARTS)


def part_of(path: str) -> str:
    return next(part for part in HARNESS_PARTS if path == part or (part.endswith("/") and path.startswith(part)))


def grader_root() -> Path:
    """The project folder of the inferlab package this process imported (its parent folder)."""
    import inferlab

    return Path(inferlab.__file__).resolve().parent.parent


@functools.lru_cache(maxsize=4)
def _hashes_of(root: str) -> tuple[tuple[str, str], ...]:
    from inferlab.host.environment import source_hashes

    return tuple((path, digest) for path, digest in source_hashes(Path(root)).items() if in_harness(path))


def grader_hashes(root: Optional[Path] = None) -> dict[str, str]:
    """SHA-256 of every harness file of the grader's copy (hashed once per process and folder)."""
    return dict(_hashes_of(str(Path(root) if root is not None else grader_root())))


def grader_version() -> str:
    import inferlab

    return str(getattr(inferlab, "__version__", "unknown"))


@dataclass
class HarnessComparison:
    """What differs between the run's harness and the grader's copy."""

    grader_root: str
    compared: int = 0
    differs: list[str] = field(default_factory=list)  # one line per file or uncovered part
    files: list[str] = field(default_factory=list)  # every path named, for a reader that wants them
    version_line: Optional[str] = None
    not_checked: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differs

    def same_files(self, *paths: str) -> bool:
        """Whether every one of these harness files is the grader's (hashed alike on both sides)."""
        return not any(path in self.files for path in paths)

    def lines(self) -> list[str]:
        """The differences, the version line first, each starting 'source: '."""
        head = [f"source: {self.version_line}"] if self.version_line and self.differs else []
        shown = [f"source: {line}" for line in self.differs[:SHOWN]]
        more = len(self.differs) - SHOWN
        return head + shown + ([f"source: and {more} more file(s) differ"] if more > 0 else [])


def _short(digest) -> str:
    return str(digest)[:12] + "…" if isinstance(digest, str) and len(digest) > 12 else repr(digest)


def compare_harness(view: RunView, root: Optional[Path] = None) -> HarnessComparison:
    """The run's recorded harness hashes against the grader's copy at `root` (the imported inferlab's project)."""
    root = Path(root) if root is not None else grader_root()
    result = HarnessComparison(grader_root=str(root))
    recorded = view.manifest.get("source_sha256")
    if not isinstance(recorded, dict):
        result.differs.append("the run's manifest.json records no source_sha256: its harness cannot be compared "
                              "with the grader's")
        return result
    theirs = {path: digest for path, digest in recorded.items() if isinstance(path, str) and in_harness(path)}
    ours = grader_hashes(root)
    theirs = unmoved(theirs, ours)
    absent_parts = [part for part in HARNESS_PARTS if not any(p == part or p.startswith(part) for p in ours)]
    for part in absent_parts:
        result.not_checked.append(f"the run's {part} against the grader's: the grader's copy ({root}) has no {part} "
                                  "(inferlab installed without its project folder)")
    for part in HARNESS_PARTS:
        if part in absent_parts:
            continue
        mine = sorted(p for p in ours if part_of(p) == part)
        run = sorted(p for p in theirs if part_of(p) == part)
        if not run and part.endswith("/"):
            result.differs.append(f"{part}: the run's manifest hashes none of its files; the grader's copy has "
                                  f"{len(mine)}")
            result.files += mine
            continue
        for path in sorted(set(mine) | set(run)):
            result.compared += 1
            if path not in theirs:
                result.differs.append(f"{path}: in the grader's copy, not in the run's source hashes")
            elif path not in ours:
                result.differs.append(f"{path}: in the run's source hashes, not in the grader's copy")
            elif theirs[path] != ours[path]:
                result.differs.append(f"{path}: sha256 {_short(theirs[path])} in the run, {_short(ours[path])} in "
                                      "the grader's copy")
            else:
                continue
            result.files.append(path)
    distributions = view.manifest.get("distributions") if isinstance(view.manifest.get("distributions"), dict) else {}
    recorded_version = distributions.get("inferlab")
    if recorded_version is None:
        result.not_checked.append("the inferlab version that made the run: manifest.json distributions names none")
    elif str(recorded_version) != grader_version():
        result.version_line = (f"the run was made with inferlab {recorded_version}; the grader's copy is inferlab "
                               f"{grader_version()} ({root})")
    return result
