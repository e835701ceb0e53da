"""A class of runs graded in one call (`grade DIR...`, `--jobs N`): in this process with one grader's copy for all of
them, or in N processes, each loading its own copy once. It sits above grade.py and replayed.py (it calls the one
and holds the other's GraderCopy), so neither imports it."""

from __future__ import annotations

from typing import Optional

from inferlab import protocol
from inferlab.grading import replayed
from inferlab.grading.grade import grade_source

_WORKER: dict = {}  # in a worker process: the grader's copy, the rubric and the reference, set once


def _start_worker(specimen, artifacts, replay: bool, rubric, reference, reference_file, against=None) -> None:
    import torch

    torch.set_num_threads(protocol.INTRA_OP_THREADS)
    copy = replayed.CourseRun(against) if against is not None else replayed.GraderCopy(specimen, artifacts) \
        if replay else None
    _WORKER.update(copy=copy, rubric=rubric, reference=reference, reference_file=reference_file)


def _grade_in_worker(source):
    return grade_source(source, _WORKER["rubric"], _WORKER["reference"], reference_file=_WORKER["reference_file"],
                        replay=_WORKER["copy"])


def grade_sources(sources: list, rubric, reference=None, reference_file=None, copy: Optional[object] = None,
                  jobs: int = 1) -> list:
    """Every source graded, in order: in this process with `copy` (a GraderCopy, one model per specimen for all of
    them, or a CourseRun, read once), or,
    with jobs > 1, in that many processes, each loading its own copy once and grading its share one after another."""
    if jobs <= 1 or len(sources) <= 1:
        return [grade_source(s, rubric, reference, reference_file=reference_file, replay=copy) for s in sources]
    import concurrent.futures
    import multiprocessing

    # The classes are looked up now, not at import: whatever `copy` is, a worker must do what it would have done.
    replay = isinstance(copy, replayed.GraderCopy)
    against = copy.directory if isinstance(copy, replayed.CourseRun) else None  # each worker reads it once
    if copy is not None and not replay and against is None:
        raise TypeError(f"grade_sources: copy is a {type(copy).__name__}, neither a GraderCopy nor a CourseRun; "
                        "its workers could not do what it does")
    specimen, artifacts = (copy.specimen, copy.artifacts) if replay else (None, None)
    # spawn, not fork: a forked child would inherit torch's thread pools from this process
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=min(jobs, len(sources)), mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(specimen, artifacts, replay, rubric, reference, reference_file, against)) as pool:
        return list(pool.map(_grade_in_worker, sources))
