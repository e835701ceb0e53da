"""A verified specimen folder by exactly one path (reuse of --artifacts DIR, reuse of the project cache, an offline
build, or the bounded download), within one deadline, under the cache's lock; and what to do next when none could be
had. The paths and their rules, in the order they are tried: docs/specimens.md, "Exactly one way to get them"."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.files import spelled
from inferlab.specimen import hub
from inferlab.specimen.check import check_specimen_files
from inferlab.specimen.hub import Deadline, DeadlineExpired
from inferlab.specimen.netguard import offline_mode
from inferlab.specimen.spec import SpecimenError, SpecimenSpec, builder_module, cache_dir, load_spec

ACQUISITION_LABELS = {  # what each path is, in words, once it has succeeded (a failed one is told by its error)
    "download": "fresh bounded download",
    "reuse:artifacts_dir": "verified local reuse (--artifacts)",
    "reuse:project_cache": "verified local reuse (project cache)",
    "built_offline": "built offline (a synthetic specimen; not a download)",
}
STAGING_PREFIX = ".staging-"
# How a missing optional file is known to be absent at the revision (None: only the spec's own pin can say so).
ABSENT_IN_HUB_LISTING = "the hub's listing at the pinned commit has no such file (HTTP 404 EntryNotFound)"
ABSENT_IN_PROJECT_CACHE = ("missing from the project cache, which inferlab fills only with a set verified against "
                           "the hub's listing at the pinned commit (or builds offline)")


def require_verified(directory, spec: SpecimenSpec, acquisition: Optional[str] = None,
                     absence_known_from: Optional[str] = None) -> dict:
    """check_specimen_files(), raising SpecimenError listing every problem, and what to do about the path it came by
    (acquisition), unless the folder passed."""
    report = check_specimen_files(directory, spec, absence_known_from)
    if report["ok"]:
        return report
    problems = "\n  ".join(report["problems"])
    message = f"specimen {spec.name!r} ({spec.spec_file}) failed verification in {directory}:\n  {problems}"
    if acquisition == "reuse:project_cache":
        message = (f"specimen {spec.name!r}: the project cache {directory} failed verification:\n  {problems}\n"
                   f"It is not repaired or replaced automatically. To recover, delete that folder "
                   f"(rm -r '{directory}') and run again: the next run downloads (or rebuilds) it. Or pass "
                   f"--artifacts DIR with a verified copy.")
    elif acquisition == "reuse:artifacts_dir":
        message = (f"specimen {spec.name!r} ({spec.spec_file}): --artifacts {directory} failed verification:\n  "
                   f"{problems}\nNothing was loaded, and nothing else is tried instead.")
    error = SpecimenError(message)
    error.verification = report
    raise error


# --- the lock, staging and publication ----------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(directory: Path, deadline: Deadline):
    """Hold the cache folder's lock (<revision>.lock beside it) for the block, waiting at most until the deadline:
    yields {path, contended, waited_s}."""
    from filelock import FileLock, Timeout

    path = directory.with_name(directory.name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock, start, contended = FileLock(path), time.monotonic(), False
    try:
        lock.acquire(blocking=False)
    except Timeout:
        contended = True
        try:
            lock.acquire(timeout=max(deadline.remaining(), 0.001), poll_interval=0.1)
        except Timeout:
            raise deadline.error(f"waiting for another run, which holds {path} while it acquires the same specimen "
                                 f"into {directory}") from None
    try:
        yield {"path": str(path), "contended": contended, "waited_s": time.monotonic() - start}
    finally:
        lock.release()


@contextlib.contextmanager
def _staged(target: Path, spec: SpecimenSpec, absence_known_from: Optional[str] = None):
    """A new staging folder's path beside target for the block to fill; then verified there and published as target
    (absent or empty) by one rename. Removed on every way out."""
    staging = target.parent / f"{STAGING_PREFIX}{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield staging
        require_verified(staging, spec, absence_known_from=absence_known_from)
        if target.exists():
            target.rmdir()  # only an empty folder can be here: a non-empty one is reused, never replaced
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def download(spec: SpecimenSpec, target: Path, endpoint: Optional[str], deadline: Deadline) -> dict:
    """Bounded download of the revision's allowlisted files into target (absent or empty): the hub's metadata, with
    `fetched` (per file: bytes, sha256, etag_check, redirects). Only a verified set is moved into place."""
    remote = hub.remote_metadata(spec, endpoint, deadline)
    try:
        if remote["problems"]:
            raise SpecimenError(f"specimen {spec.name!r} ({spec.spec_file}): download refused before fetching any "
                                f"file:\n  " + "\n  ".join(remote["problems"]))
        with _staged(target, spec, ABSENT_IN_HUB_LISTING) as staging:
            staging.mkdir()
            remote["fetched"] = {name: hub.fetch(meta["url"], name, meta["size"], meta["etag"], staging / name,
                                                 deadline)
                                 for name, meta in remote["files"].items() if meta["status"] == "present"}
    except SpecimenError as error:
        error.remote = remote
        raise
    return remote


def local_builder(spec: SpecimenSpec):
    """The builder of a synthetic spec (build.STANDIN or build.REPLICA), known by its revision (sha1 of its recipe),
    or None."""
    from inferlab.specimen import build

    return build.BUILDERS.get(spec.revision) if spec.synthetic else None


def load_runnable_spec(name: str, artifacts_root=None) -> SpecimenSpec:
    """load_spec(), also refused (SpecimenError) when its local build cannot run here: checked before a run writes
    anything, so that a replica without its reference folder is a usage error."""
    from inferlab.specimen import build

    spec = load_spec(name, artifacts_root)
    if local_builder(spec) is build.REPLICA:
        build.require_reference()
    return spec


def _build_locally(spec: SpecimenSpec, target: Path) -> None:
    """Build a synthetic specimen in staging, verify it there, and move it into target."""
    builder = local_builder(spec)
    if builder is None:
        raise SpecimenError(f"{spec.spec_file}: synthetic, but revision {spec.revision} is no recipe inferlab can "
                            f"build offline")
    with _staged(target, spec) as staging:  # a local build: only the spec's own pin says a file is absent
        try:
            builder.build(staging)
        except (SpecimenError, OSError):
            raise
        except Exception as error:  # a builder's own error (say, a changed reference header) is a refusal on record
            raise SpecimenError(f"specimen {spec.name!r} ({spec.spec_file}): building it offline failed: "
                                f"{type(error).__name__}: {error}") from error


# --- choosing and running one path --------------------------------------------------------------------------------


def _has_entries(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def choose_acquisition(spec: SpecimenSpec, artifacts_dir=None, cache_root=None) -> tuple[str, Path]:
    """The path acquire() expects to take and the folder it will verify (under the lock it looks again: a cache
    another run published meanwhile is reused)."""
    if artifacts_dir is not None:
        return "reuse:artifacts_dir", Path(artifacts_dir).expanduser()
    directory = cache_dir(spec, cache_root)
    if _has_entries(directory):
        return "reuse:project_cache", directory
    return ("built_offline" if spec.synthetic else "download"), directory


def acquire(spec: SpecimenSpec, artifacts_dir=None, cache_root=None, offline: bool = False,
            endpoint: Optional[str] = None, deadline_s: Optional[float] = None) -> dict:
    """Obtain a verified specimen folder by exactly one path (the module's docstring); remote holds the hub's
    metadata of a download. SpecimenError (DeadlineExpired for the deadline) names the path that failed."""
    start = time.perf_counter()
    deadline = Deadline(deadline_s if deadline_s is not None else protocol.ACQUISITION_DEADLINE_S)
    acquisition, directory = choose_acquisition(spec, artifacts_dir, cache_root)
    result = {"specimen": spec.name, "directory": str(directory), "deadline_s": deadline.seconds, "lock": None,
              "stale_staging_removed": [], "remote": None}
    try:
        with offline_mode() if offline else contextlib.nullcontext():
            if acquisition == "reuse:artifacts_dir":
                verification = require_verified(directory, spec, acquisition)
            else:
                with _locked(directory, deadline) as result["lock"]:
                    # under the lock no other run's staging is live: any left here is a killed run's
                    stale = sorted(directory.parent.glob(f"{STAGING_PREFIX}{directory.name}-*"))
                    for path in stale:
                        shutil.rmtree(path, ignore_errors=True)
                    result["stale_staging_removed"] = [str(path) for path in stale]
                    if _has_entries(directory):  # another run published it meanwhile
                        acquisition = "reuse:project_cache"
                    elif spec.synthetic:
                        _build_locally(spec, directory)
                    elif offline:
                        raise SpecimenError(
                            f"specimen {spec.name!r} ({spec.spec_file}): offline, and the project cache {directory} "
                            f"is empty; expected the required files {list(spec.required_files)}. Pass --artifacts "
                            f"DIR with a verified copy, or run once without --offline for the bounded download.")
                    else:
                        result["remote"] = download(spec, directory, endpoint, deadline)
                    verification = require_verified(directory, spec, acquisition, ABSENT_IN_PROJECT_CACHE)
    except SpecimenError as error:
        error.acquisition = acquisition
        raise
    return {**result, "acquisition": acquisition, "elapsed_s": time.perf_counter() - start,
            "verification": verification}


def acquisition_outcome(spec: SpecimenSpec, artifacts_dir=None, cache_root=None, offline: bool = False,
                        endpoint: Optional[str] = None, deadline_s: Optional[float] = None) -> dict:
    """acquire(), with a failure returned as data, never raised: the artifact_acquisition record (on failure with
    the per-file report of the folder examined, and other_specimen when it is another specimen's valid copy)."""
    seconds = float(deadline_s if deadline_s is not None else protocol.ACQUISITION_DEADLINE_S)
    try:
        result = acquire(spec, artifacts_dir, cache_root, offline, endpoint, deadline_s=seconds)
    except (SpecimenError, OSError) as error:
        method, directory = choose_acquisition(spec, artifacts_dir, cache_root)
        verification = getattr(error, "verification", None)
        if verification is None and directory.is_dir():
            absence = None if method == "reuse:artifacts_dir" else ABSENT_IN_PROJECT_CACHE
            verification = check_specimen_files(directory, spec, absence)
        return {"ok": False, "specimen": spec.name, "acquisition": getattr(error, "acquisition", None) or method,
                "offline": offline, "directory": str(directory) if directory.is_dir() else None,
                "error": str(error) or type(error).__name__, "deadline_s": seconds,
                "deadline_expired": isinstance(error, DeadlineExpired), "remote": getattr(error, "remote", None),
                "verification": verification, "other_specimen": (verification or {}).get("other_specimen")}
    return {"ok": True, "offline": offline, "error": None, "deadline_expired": False, **result}


# --- what to do next: one text for the terminal summary and the report -----------------------------------------


def acquisition_cause(record: dict, offline: bool = False) -> str:
    """What could not happen, in a few words, from the artifact_acquisition record (its path and error)."""
    path, error = record.get("acquisition"), str(record.get("error") or "")
    causes = {"reuse:artifacts_dir": "your --artifacts copy was refused",
              "reuse:project_cache": "the copy in artifacts/cache/ was refused",
              "built_offline": "inferlab could not build the synthetic specimen"}
    if path in causes:
        return causes[path]
    if offline:
        return "--offline, and no verified copy was found"
    return "no connection to the hub" if "connection" in error.lower() else "the download from the hub failed"


def acquisition_next_steps(specimen: Optional[dict], acquisition: Optional[str] = None,
                           other_copy: Optional[dict] = None) -> list[str]:
    """The ways forward after a failed acquisition, one step per line: specimen is the spec as a dict, acquisition
    the path that failed, other_copy the verification's other_specimen (then the first step is to use that copy as
    what it is, never to replace or delete it)."""
    specimen = specimen or {}
    name = specimen.get("name", protocol.DEFAULT_SPECIMEN)
    new_dir = "Every run needs a new record dir; `make run` makes one under runs/ for you."
    if isinstance(other_copy, dict) and isinstance(other_copy.get("words"), str):
        return [f"{other_copy['words']}.",
                f"For {name} itself, pass --artifacts with a copy of {name}, or leave --artifacts out.", new_dir]
    if specimen.get("synthetic") and acquisition == "reuse:artifacts_dir":
        build = spelled(f"-m {builder_module(name, True)} NEWDIR", "python")
        return [f"Your --artifacts copy of the synthetic {name} specimen failed verification: the error above names "
                f"the file. Leave --artifacts out and inferlab builds a verified {name} itself, or build a fresh copy "
                f"with `{build}` (NEWDIR new or empty).", new_dir]
    if specimen.get("synthetic"):
        return [f"The {name} specimen is built offline by inferlab itself, so its failure is a problem of this "
                f"checkout or environment, not of the network: read the error above, then run `make test` to check "
                f"the harness.", new_dir]
    revision = specimen.get("revision", protocol.PINNED_REVISION)
    weight = (specimen.get("expected") or {}).get("model.safetensors") or {}
    optional = specimen.get("optional_files") or list(protocol.OPTIONAL_FILES)
    required = [f for f in specimen.get("files") or protocol.ALLOWLISTED_FILES if f not in optional]
    pin = (f"{weight['size']:,} bytes with SHA-256 {weight['sha256']}" if weight.get("sha256") and weight.get("size")
           else "its pinned size and SHA-256")
    check = spelled("check-artifacts DIR") + ("" if name == protocol.DEFAULT_SPECIMEN else f" --specimen {name}")
    valid = (f"A valid copy is a directory holding {specimen.get('repo_id', protocol.PINNED_REPO_ID)} at revision "
             f"{revision}, for example your Lab 05 download: the required files ({', '.join(required)}), "
             f"{' and '.join(optional)} only if that revision has it (it very probably has none), and no other file "
             f"but a README.md or .gitattributes. Its model.safetensors must be {pin}.")
    first = (f"Your --artifacts copy failed verification: the error above names each file that differs, is missing "
             f"or is extra. Replace those files (or pass --artifacts with another copy). {valid}"
             if acquisition == "reuse:artifacts_dir" else  # the copy was given: it is the copy that must change
             f"Use a verified copy of the files: add --artifacts DIR (with make: make run ARGS=\"--artifacts DIR "
             f"--offline\"). {valid}")
    return [first,
            f"Check a copy before you run: `{check}` hashes every file against artifacts/{name}.json and names any "
            f"that differs, is missing or is extra (the weight file alone: `sha256sum DIR/model.safetensors`, on macOS "
            f"`shasum -a 256`). A machine that reaches the hub gets a verified copy with one `make run`: it lands in "
            f"artifacts/cache/{name}/{revision}/.",
            "Or check the harness offline: add --specimen standin (with make: make run ARGS=\"--specimen standin\"). "
            "It runs the whole experiment on a synthetic checkpoint that inferlab builds itself. It is not Pythia, and "
            "its records and report say so.",
            new_dir]
