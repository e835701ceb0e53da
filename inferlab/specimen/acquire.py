"""Getting a verified specimen folder by exactly one path, within one deadline, under one lock.

The paths, in the order they are tried:

1. ``reuse:artifacts_dir``  --artifacts DIR, verified; never a fallback to anything else.
2. ``reuse:project_cache``  artifacts/cache/<name>/<revision>/, verified; a damaged cache is
                            reported with the file that failed and is never repaired silently.
3. ``built_offline``        (the recorded name) a synthetic specimen built here, without a download:
                            into staging, verified, then published.
4. ``download``             metadata first (HEAD only; refused before any body if a required file
                            is missing, a size is unknown, over the cap or unlike the pin); then each
                            file the revision has, streamed into staging under the deadline; verified
                            there; only then published into the project cache by one rename.

Paths 2-4 hold the cache folder's lock (lock.py) so that two runs never build or download into one
cache at once: the second waits, then reuses what the first published. Staging is removed on every
way out, Ctrl-C included; staging left by a killed run is removed (and recorded) by the next one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.specimen import hub, lock
from inferlab.specimen.deadline import Deadline, DeadlineExpired
from inferlab.specimen.offline import offline_mode
from inferlab.specimen.spec import SpecimenError, SpecimenSpec, cache_dir, load_spec
from inferlab.specimen.verification import check_specimen_files, require_verified

ACQUISITIONS = ("reuse:artifacts_dir", "reuse:project_cache", "download", "built_offline")
# What each path is, in words, once it has succeeded (a failed path is described by its error instead).
ACQUISITION_LABELS = {
    "download": "fresh bounded download",
    "reuse:artifacts_dir": "verified local reuse (--artifacts)",
    "reuse:project_cache": "verified local reuse (project cache)",
    "built_offline": "built offline (a synthetic specimen; not a download)",
}
STAGING_PREFIX = ".staging-"


# --- the hub's metadata, before any body ---------------------------------------------------------


def remote_metadata(spec: SpecimenSpec, endpoint: Optional[str] = None, deadline: Optional[Deadline] = None,
                    watchdog: Optional[hub.Watchdog] = None) -> dict:
    """HEAD each allowlisted file at the pinned revision (no body): {endpoint, files, total_bytes, problems}.

    files maps name -> the hub's answer plus status "present", "absent_at_revision" (404
    EntryNotFound at the pinned commit) or "unavailable"; problems lists every reason to refuse
    the download before a body is requested.
    """
    endpoint = hub.resolve_endpoint(endpoint)
    deadline = deadline or Deadline()
    owned = watchdog is None
    watchdog = watchdog or hub.Watchdog(deadline)
    files, problems = {}, []
    where = f"{spec.repo_id}@{spec.revision}"
    try:
        for name in spec.files:
            meta = hub.file_metadata(hub.file_url(spec.repo_id, name, spec.revision, endpoint), deadline, watchdog, name)
            files[name] = meta
            problems.extend(_metadata_problems(spec, name, meta, where))
    finally:
        if owned:
            watchdog.close()
    total = sum(meta["size"] or 0 for meta in files.values() if meta["status"] == "present")
    if total > spec.bundle_cap_bytes:
        problems.append(f"bundle: expected at most {spec.bundle_cap_bytes} bytes, actual {total} bytes advertised")
    return {"endpoint": endpoint, "files": files, "total_bytes": total, "problems": problems,
            "absent_at_revision": [name for name, meta in files.items() if meta["status"] == "absent_at_revision"]}


def _metadata_problems(spec: SpecimenSpec, name: str, meta: dict, where: str) -> list[str]:
    status, code = meta["http_status"], meta["error_code"]
    # The URL names the pinned commit, so EntryNotFound means that commit has no such file (the hub
    # usually confirms the commit in X-Repo-Commit; a 404 naming another commit is not this case).
    if status == 404 and code == "EntryNotFound" and meta["commit"] in (spec.revision, None):
        meta["status"] = "absent_at_revision"
        if name in spec.required_files:
            return [f"{name} at {where}: expected a file, actual: HTTP 404 EntryNotFound (the revision has no such "
                    f"file, and the experiment requires it)"]
        if spec.pinned_present(name):
            return [f"{name} at {where}: the spec pins it present, actual: HTTP 404 EntryNotFound"]
        return []  # optional: recorded as absent at the revision, never substituted
    if not (status == 200 or 300 <= status < 400):
        meta["status"] = "unavailable"
        detail = f"HTTP {status}" + (f" {code}" if code else "")
        hint = " (a server error; nothing was retried or downloaded: try again later)" if status >= 500 else ""
        return [f"{name} at {where}: expected a file, actual: {detail}{hint} ({meta['url']})"]
    meta["status"] = "present"
    problems = []
    if meta["commit"] != spec.revision:
        problems.append(f"{name}: expected commit {spec.revision}, actual commit {meta['commit']}")
    pinned = spec.expected[name].get("size")
    if spec.pinned_absent(name):
        problems.append(f"{name}: the spec pins it absent at the revision, actual: the hub lists it "
                        f"({meta['size']} bytes)")
    if meta["size"] is None:
        problems.append(f"{name}: expected an advertised size, actual: none")
    elif meta["size"] > spec.bundle_cap_bytes:
        problems.append(f"{name}: expected at most {spec.bundle_cap_bytes} bytes (the bundle cap), "
                        f"actual {meta['size']} bytes advertised")
    elif pinned is not None and meta["size"] != pinned:
        problems.append(f"{name}: expected {pinned} bytes (pinned), actual {meta['size']} bytes advertised")
    return problems


# --- staging and publication ----------------------------------------------------------------------


def _staging_dir(target: Path) -> Path:
    return target.parent / f"{STAGING_PREFIX}{target.name}-{os.getpid()}"


def _remove_stale_staging(target: Path) -> list[str]:
    """Staging folders of this cache left by a killed run; only called under the lock, so none is live."""
    removed = []
    if target.parent.is_dir():
        for stale in sorted(target.parent.glob(f"{STAGING_PREFIX}{target.name}-*")):
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(str(stale))
    return removed


def _publish(staging: Path, target: Path) -> None:
    if target.exists():
        target.rmdir()  # only an empty folder can be here: a non-empty one is reused, never replaced
    os.replace(staging, target)


def download(spec: SpecimenSpec, target: Path, endpoint: Optional[str] = None,
             deadline: Optional[Deadline] = None) -> dict:
    """Bounded download of the revision's allowlisted files into target (absent or empty).

    Returns the metadata read before any body, with `fetched` (per file: bytes, sha256,
    etag_check, redirects). Files land in staging, are verified there, and only a passing set
    is moved into place; staging is removed whatever happens.
    """
    deadline = deadline or Deadline()
    with hub.Watchdog(deadline) as watchdog:
        remote = remote_metadata(spec, endpoint, deadline, watchdog)
        if remote["problems"]:
            error = SpecimenError(
                f"specimen {spec.name!r} ({spec.spec_file}): download refused before fetching any file:\n  "
                + "\n  ".join(remote["problems"]))
            error.remote = remote
            raise error
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = _staging_dir(target)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            fetched = {}
            for name in spec.files:
                meta = remote["files"][name]
                if meta["status"] == "present":
                    fetched[name] = hub.fetch(meta["url"], name, meta["size"], meta["etag"], staging / name,
                                              deadline, watchdog)
            remote["fetched"] = fetched
            require_verified(staging, spec, ABSENT_IN_HUB_LISTING)
            _publish(staging, target)
        except SpecimenError as error:
            error.remote = remote
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return remote


def local_builder(spec: SpecimenSpec):
    """The module that builds a synthetic spec here, without a download (inferlab.standin or inferlab.replica), or None.

    A builder is recognised by its revision (sha1 of its recipe), so a spec pins exactly one recipe.
    """
    from inferlab.synthetic import replica, standin

    if not spec.synthetic:
        return None
    return {module.revision(): module for module in (standin, replica)}.get(spec.revision)


def local_build_problem(spec: SpecimenSpec) -> Optional[str]:
    """Why this spec's local builder cannot run here (the replica without its reference folder), or None."""
    from inferlab.synthetic import replica

    if local_builder(spec) is replica:
        try:
            replica.require_reference()
        except replica.ReferenceUnavailable as error:
            return str(error)
    return None


def load_runnable_spec(name: str, artifacts_root=None) -> SpecimenSpec:
    """load_spec(), also refused (SpecimenError) when the spec's local build cannot run here: checked before a
    run writes anything, so that a replica without its reference folder is a usage error."""
    spec = load_spec(name, artifacts_root)
    problem = local_build_problem(spec)
    if problem:
        raise SpecimenError(problem)
    return spec


def _require_local_builder(spec: SpecimenSpec):
    from inferlab.synthetic import replica, standin

    builder = local_builder(spec)
    if builder is None:
        raise SpecimenError(
            f"{spec.spec_file}: synthetic, but revision {spec.revision} is no recipe inferlab can build offline "
            f"(the stand-in's is {standin.revision()}, sha1 of {standin.RECIPE!r}; the replica's is "
            f"{replica.revision()}, sha1 of {replica.RECIPE!r})")
    problem = local_build_problem(spec)
    if problem:
        raise SpecimenError(problem)
    return builder.build


def _build_locally(spec: SpecimenSpec, target: Path) -> None:
    """Build a synthetic specimen in staging, verify it there, and move it into target."""
    build = _require_local_builder(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _staging_dir(target)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        try:
            build(staging)
        except (SpecimenError, OSError):
            raise
        except Exception as error:  # a builder's own error (say, a changed reference header) is a refusal on record
            raise SpecimenError(f"specimen {spec.name!r} ({spec.spec_file}): building it offline failed: "
                                f"{type(error).__name__}: {error}") from error
        require_verified(staging, spec, ABSENT_PINNED_ONLY)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --- choosing and running one path --------------------------------------------------------------------


def _has_entries(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def choose_acquisition(spec: SpecimenSpec, artifacts_dir=None, cache_root=None) -> tuple[str, Path]:
    """Which path acquire() expects to take, and the folder it will verify: (acquisition, directory).

    Under the lock acquire() looks again: a cache another run published meanwhile is reused.
    """
    if artifacts_dir is not None:
        return "reuse:artifacts_dir", Path(artifacts_dir).expanduser()
    directory = cache_dir(spec, cache_root)
    if _has_entries(directory):
        return "reuse:project_cache", directory
    return ("built_offline" if spec.synthetic else "download"), directory


ABSENT_PINNED_ONLY = None  # a local build: only the spec's own pin can say a file is absent at the revision
ABSENT_IN_HUB_LISTING = "the hub's listing at the pinned commit has no such file (HTTP 404 EntryNotFound)"
ABSENT_IN_PROJECT_CACHE = ("missing from the project cache, which inferlab fills only with a set verified against "
                           "the hub's listing at the pinned commit (or builds offline)")


def _absence_known_from(acquisition: str) -> Optional[str]:
    """How a missing optional file is known to be absent at the revision on this path (None: it is not)."""
    return None if acquisition == "reuse:artifacts_dir" else ABSENT_IN_PROJECT_CACHE


def _verified(directory: Path, spec: SpecimenSpec, acquisition: str) -> dict:
    report = check_specimen_files(directory, spec, _absence_known_from(acquisition))
    if report["ok"]:
        return report
    problems = "\n  ".join(report["problems"])
    if acquisition == "reuse:project_cache":
        message = (f"specimen {spec.name!r}: the project cache {directory} failed verification:\n  {problems}\n"
                   f"It is not repaired or replaced automatically. To recover, delete that folder "
                   f"(rm -r '{directory}') and run again: the next run downloads (or rebuilds) it. "
                   f"Or pass --artifacts DIR with a verified copy.")
    elif acquisition == "reuse:artifacts_dir":
        message = (f"specimen {spec.name!r} ({spec.spec_file}): --artifacts {directory} failed verification:\n  "
                   f"{problems}\nNothing was loaded, and nothing else is tried instead.")
    else:
        message = f"specimen {spec.name!r} ({spec.spec_file}) failed verification in {directory}:\n  {problems}"
    error = SpecimenError(message)
    error.verification = report
    raise error


def acquire(spec: SpecimenSpec, artifacts_dir=None, cache_root=None, offline: bool = False,
            endpoint: Optional[str] = None, deadline_s: Optional[float] = None) -> dict:
    """Obtain a verified specimen folder by exactly one path (see the module docstring).

    Returns {specimen, acquisition, directory, elapsed_s, deadline_s, lock, stale_staging_removed,
    remote, verification}; remote holds the hub metadata of a download (None otherwise).
    Raises SpecimenError (DeadlineExpired when the deadline is the reason), with `acquisition`
    set to the path that failed.
    """
    start = time.perf_counter()
    deadline = Deadline(deadline_s if deadline_s is not None else protocol.ACQUISITION_DEADLINE_S)
    acquisition, directory = choose_acquisition(spec, artifacts_dir, cache_root)
    result = {"specimen": spec.name, "directory": str(directory), "deadline_s": deadline.seconds, "lock": None,
              "stale_staging_removed": [], "remote": None}
    context = offline_mode() if offline else contextlib.nullcontext()
    try:
        with context:
            if acquisition == "reuse:artifacts_dir":
                verification = _verified(directory, spec, acquisition)
            else:
                with lock.held(directory, deadline) as lock_info:
                    result["lock"] = lock_info
                    result["stale_staging_removed"] = _remove_stale_staging(directory)
                    acquisition = _fill_cache(spec, directory, offline, endpoint, deadline, result)
                    verification = _verified(directory, spec, acquisition)
    except SpecimenError as error:
        error.acquisition = acquisition
        raise
    return {**result, "acquisition": acquisition, "elapsed_s": time.perf_counter() - start,
            "verification": verification}


def _fill_cache(spec, directory: Path, offline: bool, endpoint, deadline: Deadline, result: dict) -> str:
    """Under the lock: reuse what is there, or build or download it; returns the path taken."""
    if _has_entries(directory):
        return "reuse:project_cache"
    if spec.synthetic:
        _build_locally(spec, directory)
        return "built_offline"
    if offline:
        error = SpecimenError(
            f"specimen {spec.name!r} ({spec.spec_file}): offline, and the project cache {directory} is empty; "
            f"expected the required files {list(spec.required_files)}. Pass --artifacts DIR with a verified "
            f"copy, or run once without --offline for the bounded download.")
        error.acquisition = "download"
        raise error
    result["remote"] = download(spec, directory, endpoint, deadline)
    return "download"


def acquisition_outcome(spec: SpecimenSpec, artifacts_dir=None, cache_root=None, offline: bool = False,
                        endpoint: Optional[str] = None, deadline_s: Optional[float] = None) -> dict:
    """acquire(), but a failed acquisition is returned as data, never raised: the artifact_acquisition record.

    Always: ok, specimen, acquisition, offline, directory (None when no folder is left to
    examine), error, deadline_s, deadline_expired, remote and verification (the per-file report of
    the folder examined, or None); on failure also other_specimen (the folder is a valid copy of another
    specimen: verification's other_specimen, else None). On success also elapsed_s, lock and stale_staging_removed.
    """
    seconds = float(deadline_s if deadline_s is not None else protocol.ACQUISITION_DEADLINE_S)
    try:
        result = acquire(spec, artifacts_dir, cache_root, offline, endpoint, deadline_s=seconds)
    except (SpecimenError, OSError) as error:
        method, directory = choose_acquisition(spec, artifacts_dir, cache_root)
        verification = getattr(error, "verification", None)
        if verification is None and directory.is_dir():
            verification = check_specimen_files(directory, spec, _absence_known_from(method))
        return {"ok": False, "specimen": spec.name, "acquisition": getattr(error, "acquisition", None) or method,
                "offline": offline, "directory": str(directory) if directory.is_dir() else None,
                "error": str(error) or type(error).__name__, "deadline_s": seconds,
                "deadline_expired": isinstance(error, DeadlineExpired), "remote": getattr(error, "remote", None),
                "verification": verification,
                # a valid copy of another specimen this checkout knows: named, with the flag that uses it
                "other_specimen": (verification or {}).get("other_specimen")}
    return {"ok": True, "offline": offline, "error": None, "deadline_expired": False, **result}
