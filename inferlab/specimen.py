"""The pinned specimen: its spec as data, its acquisition (reuse or bounded download), its verification.

A specimen is described by one JSON file, artifacts/<name>.json (repo_id, pinned revision,
the six allowlisted files, the bundle cap and the expected sizes/hashes). Acquisition takes
exactly one of four paths, in this order:

1. ``reuse:artifacts_dir``  an explicit directory (``--artifacts DIR``), verified; never a fallback.
2. ``reuse:project_cache``  artifacts/cache/<name>/<revision>/, verified.
3. ``built_offline``        the synthetic stand-in only, built by inferlab.standin when its cache is empty.
4. ``download``             remote sizes read first (HEAD metadata only), refused before any body is
                            fetched if a file is missing, the bundle exceeds the cap or a pinned size
                            differs; then exactly the six files at the pinned revision, verified in
                            a staging directory and only then moved into the project cache.

Nothing may be loaded from a directory that has not passed ``require_verified``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

from inferlab import netguard, protocol
from inferlab.records import sha256_file

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARTIFACTS_ROOT = PROJECT_ROOT / "artifacts"
WEIGHT_FILE = "model.safetensors"
# Files that could hold other weights, pickled objects or code: never accepted beside the specimen.
# huggingface_hub's local_dir downloads keep their bookkeeping here; it is metadata, never loaded.
HUB_METADATA_DIR = ".cache/huggingface/"
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code")
ACQUISITIONS = ("reuse:artifacts_dir", "reuse:project_cache", "download", "built_offline")
DEFAULT_ENDPOINT = "https://huggingface.co"
SPEC_FIELDS = ("repo_id", "revision", "files", "bundle_cap_bytes", "synthetic", "description", "expected")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SpecimenError(Exception):
    """A specimen spec, download or directory failed a check; the message names file, expected and actual."""


@dataclasses.dataclass(frozen=True)
class SpecimenSpec:
    """One specimen as pinned in artifacts/<name>.json."""

    name: str
    spec_file: str
    repo_id: str
    revision: str
    files: tuple
    bundle_cap_bytes: int
    synthetic: bool
    description: str
    expected: dict  # file name -> {"size": int | None, "sha256": str | None}

    def as_dict(self) -> dict:
        """The spec as plain JSON-ready data."""
        data = dataclasses.asdict(self)
        data["files"] = list(self.files)
        return data


# --- the spec --------------------------------------------------------------------------------


def load_spec(name: str, artifacts_root=None) -> SpecimenSpec:
    """Read and check artifacts_root/<name>.json; raise SpecimenError naming the file on any problem."""
    root = Path(artifacts_root) if artifacts_root is not None else DEFAULT_ARTIFACTS_ROOT
    if not _NAME.match(name or ""):
        raise SpecimenError(f"specimen name {name!r}: expected letters, digits, '.', '_' or '-'")
    path = root / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in root.glob("*.json"))
        raise SpecimenError(f"{path}: expected a specimen spec file, actual: missing (known specimens: {known})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpecimenError(f"{path}: expected a JSON object, actual: unreadable ({error})") from error
    if not isinstance(data, dict):
        raise SpecimenError(f"{path}: expected a JSON object, actual: {type(data).__name__}")
    missing = [field for field in SPEC_FIELDS if field not in data]
    if missing:
        raise SpecimenError(f"{path}: expected fields {list(SPEC_FIELDS)}, actual: missing {missing}")
    spec = SpecimenSpec(
        name=name,
        spec_file=str(path),
        repo_id=data["repo_id"],
        revision=data["revision"],
        files=tuple(data["files"]),
        bundle_cap_bytes=data["bundle_cap_bytes"],
        synthetic=data["synthetic"],
        description=data["description"],
        expected=data["expected"],
    )
    problems = spec_problems(spec)
    if problems:
        raise SpecimenError(f"{path}: " + "; ".join(problems))
    return spec


def spec_problems(spec: SpecimenSpec) -> list[str]:
    """What is wrong with a spec against the protocol: allowlist, cap, commit-hash revision, pins."""
    problems = []
    if not isinstance(spec.repo_id, str) or spec.repo_id.count("/") != 1:
        problems.append(f"repo_id: expected 'owner/name', actual {spec.repo_id!r}")
    # A branch name could move; only a commit hash pins the bytes.
    if not isinstance(spec.revision, str) or not _COMMIT.match(spec.revision):
        problems.append(f"revision: expected a 40-hex commit hash, actual {spec.revision!r}")
    if len(spec.files) != len(set(spec.files)) or set(spec.files) != set(protocol.ALLOWLISTED_FILES):
        problems.append(f"files: expected the allowlist {list(protocol.ALLOWLISTED_FILES)}, actual {list(spec.files)}")
    cap = spec.bundle_cap_bytes
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 < cap <= protocol.BUNDLE_CAP_BYTES:
        problems.append(f"bundle_cap_bytes: expected an int in 1..{protocol.BUNDLE_CAP_BYTES}, actual {cap!r}")
    if not isinstance(spec.synthetic, bool):
        problems.append(f"synthetic: expected true or false, actual {spec.synthetic!r}")
    if not isinstance(spec.description, str) or not spec.description.strip():
        problems.append(f"description: expected a one-line text, actual {spec.description!r}")
    if not isinstance(spec.expected, dict) or set(spec.expected) != set(spec.files):
        keys = sorted(spec.expected) if isinstance(spec.expected, dict) else spec.expected
        problems.append(f"expected: expected one entry per allowlisted file, actual {keys!r}")
        return problems
    for name, pin in spec.expected.items():
        if not isinstance(pin, dict) or set(pin) != {"size", "sha256"}:
            problems.append(f"expected[{name}]: expected {{size, sha256}}, actual {pin!r}")
            continue
        size, digest = pin["size"], pin["sha256"]
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            problems.append(f"expected[{name}].size: expected null or a byte count, actual {size!r}")
        if digest is not None and (not isinstance(digest, str) or not _SHA256.match(digest)):
            problems.append(f"expected[{name}].sha256: expected null or 64 lowercase hex digits, actual {digest!r}")
    weight = spec.expected.get(WEIGHT_FILE, {})
    if isinstance(weight, dict) and (weight.get("size") is None or weight.get("sha256") is None):
        problems.append(f"expected[{WEIGHT_FILE}]: expected a pinned size and sha256, actual {weight!r}")
    return problems


def cache_dir(spec: SpecimenSpec, cache_root=None) -> Path:
    """The project cache directory of a specimen: <cache_root>/<name>/<revision>/."""
    root = Path(cache_root) if cache_root is not None else DEFAULT_ARTIFACTS_ROOT / "cache"
    return root / spec.name / spec.revision


# --- verification ------------------------------------------------------------------------------


def _verify_file(directory: Path, name: str, pin: dict) -> dict:
    path = directory / name
    row = {
        "name": name,
        "size": None,
        "sha256": None,
        "expected_size": pin["size"],
        "expected_sha256": pin["sha256"],
        "ok": False,
        "problem": None,
    }
    if not path.is_file():
        row["problem"] = f"{name} in {directory}: expected an allowlisted file, actual: missing"
        return row
    try:
        row["size"] = path.stat().st_size
        row["sha256"] = sha256_file(path)
    except OSError as error:
        row["problem"] = f"{name} in {directory}: expected a readable file, actual: {error}"
        return row
    problems = []
    if pin["size"] is not None and row["size"] != pin["size"]:
        problems.append(f"size expected {pin['size']} bytes, actual {row['size']} bytes")
    if pin["sha256"] is not None and row["sha256"] != pin["sha256"]:
        problems.append(f"sha256 expected {pin['sha256']}, actual {row['sha256']}")
    if name.endswith(".json"):
        problems.extend(_json_problems(path))
    if problems:
        row["problem"] = f"{name} in {directory}: " + "; ".join(problems)
    row["ok"] = not problems
    return row


def _json_problems(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"expected readable JSON, actual: {error}"]
    if not isinstance(data, dict):
        return [f"expected a JSON object, actual {type(data).__name__}"]
    # auto_map points transformers at repository Python code; the lab allows built-in classes only.
    asks = [key for key in REMOTE_CODE_KEYS if key in data and data[key] not in (None, False, {})]
    if asks:
        return [f"expected no remote-code request, actual keys {asks} ({ {k: data[k] for k in asks} })"]
    return []


def _extra_files(directory: Path, allowlist) -> list[str]:
    """Relative paths of every file besides the allowlisted ones (hub download metadata excepted).

    Anything else could be read by a loader (an added_tokens.json, a second weight file, code),
    so an unlisted file fails verification whatever its name.
    """
    found = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            relative = (Path(root) / name).relative_to(directory).as_posix()
            if relative not in allowlist and not relative.startswith(HUB_METADATA_DIR):
                found.append(relative)
    return found


def verify(directory, spec: SpecimenSpec) -> dict:
    """Check a directory against a spec: {directory, ok, files: [per-file rows], extra_files, problems}.

    Each file row holds name, size, sha256, expected_size, expected_sha256, ok and problem (or None).
    Directory-level problems: a missing directory, and any file besides the allowlist.
    """
    directory = Path(directory)
    if not directory.is_dir():
        problem = f"{directory}: expected a specimen directory with {list(spec.files)}, actual: no such directory"
        return {"directory": str(directory), "ok": False, "files": [], "extra_files": [], "problems": [problem]}
    rows = [_verify_file(directory, name, spec.expected[name]) for name in spec.files]
    extra = _extra_files(directory, spec.files)
    problems = [row["problem"] for row in rows if row["problem"]]
    problems += [
        f"{name} in {directory}: expected only the allowlisted files {list(spec.files)}, actual: an extra file"
        for name in extra
    ]
    return {
        "directory": str(directory),
        "ok": not problems,
        "files": rows,
        "extra_files": extra,
        "problems": problems,
    }


def require_verified(directory, spec: SpecimenSpec) -> dict:
    """verify(), raising SpecimenError listing every problem unless the directory passed."""
    report = verify(directory, spec)
    if not report["ok"]:
        raise SpecimenError(
            f"specimen {spec.name!r} ({spec.spec_file}) failed verification in {directory}:\n  "
            + "\n  ".join(report["problems"])
        )
    return report


# --- offline mode and the endpoint -------------------------------------------------------------


@contextlib.contextmanager
def offline_mode():
    """Hub offline flags on and every network connection refused (netguard) inside the block.

    huggingface_hub reads HF_HUB_OFFLINE at import time into huggingface_hub.constants, and
    transformers copies it into transformers.utils.hub._is_offline_mode, so the environment
    variable alone is too late once they are imported: patch both, and restore them after.
    huggingface_hub also caches one HTTP session per thread, built for the flag's value at
    creation, so the sessions are reset on entry and on exit.
    """
    previous_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    patched = []
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        patched.append((hub_constants, "HF_HUB_OFFLINE", hub_constants.HF_HUB_OFFLINE))
        hub_constants.HF_HUB_OFFLINE = True
    transformers_hub = sys.modules.get("transformers.utils.hub")
    if transformers_hub is not None and hasattr(transformers_hub, "_is_offline_mode"):
        patched.append((transformers_hub, "_is_offline_mode", transformers_hub._is_offline_mode))
        transformers_hub._is_offline_mode = True
    _reset_hub_sessions()
    try:
        with netguard.block_network():
            yield
    finally:
        for module, attribute, value in reversed(patched):
            setattr(module, attribute, value)
        _reset_hub_sessions()
        if previous_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous_env


def _reset_hub_sessions() -> None:
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import reset_sessions

        reset_sessions()


def resolve_endpoint(endpoint: Optional[str] = None) -> str:
    """The hub endpoint: the argument, else HF_ENDPOINT read now, else huggingface.co."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


# --- the bounded download ----------------------------------------------------------------------


REACHABILITY_TIMEOUT_S = 5.0


def check_reachable(endpoint: str, timeout_s: float = REACHABILITY_TIMEOUT_S) -> None:
    """One bounded TCP connect to the endpoint; SpecimenError at once when it cannot be reached.

    huggingface_hub retries a failed connection with back-off (about 20 s in all); a machine
    without the hub should fail in seconds and say why, so we look before we ask.
    """
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except OSError as error:
        raise SpecimenError(
            f"{endpoint}: expected the hub endpoint to accept a connection (host {parts.hostname}, port {port}, "
            f"within {timeout_s:g} s), actual: {type(error).__name__}: {error}. Nothing was downloaded. "
            f"Offline? Pass --artifacts DIR with the six verified files."
        ) from error


def remote_metadata(spec: SpecimenSpec, endpoint: Optional[str] = None) -> dict:
    """HEAD each allowlisted file at the pinned revision (no body): {endpoint, files, total_bytes, problems}.

    files maps name -> {size, etag, commit} or {error}; problems lists every reason to refuse
    the download (missing file, unknown size, other commit, pinned size differs, over the cap).
    """
    import requests
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import HfHubHTTPError

    endpoint = resolve_endpoint(endpoint)
    check_reachable(endpoint)
    files, problems = {}, []
    for name in spec.files:
        url = hf_hub_url(spec.repo_id, name, revision=spec.revision, endpoint=endpoint)
        try:
            meta = get_hf_file_metadata(url, token=False, endpoint=endpoint)
        except HfHubHTTPError as error:
            status = error.response.status_code if error.response is not None else None
            files[name] = {"error": f"HTTP {status}"}
            problems.append(f"{name} at {spec.repo_id}@{spec.revision}: expected a file, actual: HTTP {status} ({url})")
            continue
        except requests.exceptions.RequestException as error:
            raise SpecimenError(
                f"{url}: expected the hub endpoint {endpoint} to answer, actual: {type(error).__name__}: {error}. "
                f"Offline? Pass --artifacts DIR with the six verified files."
            ) from error
        files[name] = {"size": meta.size, "etag": meta.etag, "commit": meta.commit_hash}
        if meta.commit_hash != spec.revision:
            problems.append(f"{name}: expected commit {spec.revision}, actual commit {meta.commit_hash}")
        pinned = spec.expected[name]["size"]
        if meta.size is None:
            problems.append(f"{name}: expected an advertised size, actual: none")
        elif pinned is not None and meta.size != pinned:
            problems.append(f"{name}: expected {pinned} bytes (pinned), actual {meta.size} bytes advertised")
    total = sum(entry.get("size") or 0 for entry in files.values())
    if total > spec.bundle_cap_bytes:
        problems.append(f"bundle: expected at most {spec.bundle_cap_bytes} bytes, actual {total} bytes advertised")
    return {"endpoint": endpoint, "files": files, "total_bytes": total, "problems": problems}


def download(spec: SpecimenSpec, target: Path, endpoint: Optional[str] = None) -> dict:
    """Bounded download of exactly the six files at the pinned revision into target (must not exist).

    Returns the remote metadata read before any body was fetched. Files land in a staging
    directory beside target, are verified there, and only a passing set is moved into place.
    """
    from huggingface_hub import hf_hub_download

    remote = remote_metadata(spec, endpoint)
    if remote["problems"]:
        raise SpecimenError(
            f"specimen {spec.name!r} ({spec.spec_file}): download refused before fetching any file:\n  "
            + "\n  ".join(remote["problems"])
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".staging-{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    fetched, accepted = staging / "fetched", staging / "accepted"
    accepted.mkdir(parents=True)
    try:
        for name in spec.files:
            # An empty private cache_dir keeps the user's global hub cache out of it.
            path = hf_hub_download(
                spec.repo_id,
                name,
                revision=spec.revision,
                local_dir=fetched,
                cache_dir=staging / "hub-cache",
                endpoint=remote["endpoint"],
                token=False,
            )
            os.replace(path, accepted / name)
        require_verified(accepted, spec)
        if target.exists():
            target.rmdir()  # only an empty directory can be here (acquire checked)
        os.replace(accepted, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return remote


def _has_entries(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def choose_acquisition(spec: SpecimenSpec, artifacts_dir=None, cache_root=None) -> tuple[str, Path]:
    """Which one of the four paths acquire() takes, and the directory it will verify: (acquisition, directory)."""
    if artifacts_dir is not None:
        return "reuse:artifacts_dir", Path(artifacts_dir)
    directory = cache_dir(spec, cache_root)
    if _has_entries(directory):
        return "reuse:project_cache", directory
    return ("built_offline" if spec.synthetic else "download"), directory


def acquire(
    spec: SpecimenSpec,
    artifacts_dir=None,
    cache_root=None,
    offline: bool = False,
    endpoint: Optional[str] = None,
) -> dict:
    """Obtain a verified specimen directory by exactly one path (see the module docstring).

    Returns {specimen, acquisition, directory, elapsed_s, remote, verification}; remote holds
    the advertised sizes read before a download (None otherwise). Raises SpecimenError.
    """
    start = time.perf_counter()
    remote = None
    acquisition, directory = choose_acquisition(spec, artifacts_dir, cache_root)
    context = offline_mode() if offline else contextlib.nullcontext()
    with context:
        if acquisition == "built_offline":
            _build_standin(spec, directory)
        elif acquisition == "download":
            if offline:
                missing = [name for name in spec.files if not (directory / name).is_file()]
                raise SpecimenError(
                    f"specimen {spec.name!r} ({spec.spec_file}): offline, and the project cache {directory} "
                    f"lacks {missing}; expected all six allowlisted files. Pass --artifacts DIR with a "
                    f"verified copy, or run once without --offline for the bounded download."
                )
            remote = download(spec, directory, endpoint)
        verification = require_verified(directory, spec)
    return {
        "specimen": spec.name,
        "acquisition": acquisition,
        "directory": str(directory),
        "elapsed_s": time.perf_counter() - start,
        "remote": remote,
        "verification": verification,
    }


def offline_builder(spec: SpecimenSpec):
    """The module that builds a synthetic spec offline (inferlab.standin or inferlab.replica), or None.

    A builder is recognised by its revision (sha1 of its recipe), so a spec pins exactly one recipe.
    """
    from inferlab import replica, standin

    if not spec.synthetic:
        return None
    return {module.revision(): module for module in (standin, replica)}.get(spec.revision)


def offline_build_problem(spec: SpecimenSpec) -> Optional[str]:
    """Why this spec's offline builder cannot run here (the replica without its reference folder), or None."""
    from inferlab import replica

    if offline_builder(spec) is replica:
        try:
            replica.require_reference()
        except replica.ReferenceUnavailable as error:
            return str(error)
    return None


def _build_standin(spec: SpecimenSpec, target: Path) -> None:
    """Build a synthetic specimen (stand-in or replica) in a staging directory and move it into target."""
    from inferlab import replica, standin

    builder = offline_builder(spec)
    if builder is None:
        raise SpecimenError(
            f"{spec.spec_file}: revision expected {standin.revision()} (sha1 of {standin.RECIPE!r}) or "
            f"{replica.revision()} (sha1 of {replica.RECIPE!r}), actual {spec.revision}"
        )
    problem = offline_build_problem(spec)
    if problem:
        raise SpecimenError(problem)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".staging-{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        builder.build(staging)
        require_verified(staging, spec)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
