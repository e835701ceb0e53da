"""A specimen's spec: artifacts/<name>.json read, checked against the protocol, and held as data.

The JSON format (every key at the top level is required except ``reference``):

    repo_id            "owner/name"
    revision           the 40-hex commit that pins every byte
    files              the protocol's six allowlisted file names
    optional_files     the allowlisted files the experiment can run without (a subset of
                       protocol.OPTIONAL_FILES); every other file is required
    bundle_cap_bytes   at most protocol.BUNDLE_CAP_BYTES
    synthetic          true for a checkpoint inferlab builds itself
    description        one line
    expected           one entry per file: {"size": int|null, "sha256": hex|null}, or
                       {"absent": true} for an optional file pinned absent at this revision
                       (a present copy then fails verification). model.safetensors is always
                       pinned by size and sha256.
    reference          optional, informational only, never a reason to refuse:
                       {"revision": hex, "note": str,
                        "files": {name: {"size": int, "sha256": hex}},
                        "weight_header": {"size": int, "sha256": hex}}   (weight_header optional)
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.base.checkout import PROJECT_ROOT

DEFAULT_ARTIFACTS_ROOT = PROJECT_ROOT / "artifacts"
WEIGHT_FILE = "model.safetensors"
SPEC_FIELDS = (
    "repo_id", "revision", "files", "optional_files", "bundle_cap_bytes", "synthetic", "description", "expected",
)
OPTIONAL_SPEC_FIELDS = ("reference", "architecture")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SpecimenError(Exception):
    """A specimen spec, download or directory failed a check; the message names file, expected and actual.

    Acquisition attaches what it learned before failing, for the record: ``acquisition`` (the path
    taken), ``verification`` (a check_specimen_files() report) and ``remote`` (the hub metadata), each or None.
    """

    acquisition: Optional[str] = None
    verification: Optional[dict] = None
    remote: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class SpecimenSpec:
    """One specimen as pinned in artifacts/<name>.json."""

    name: str
    spec_file: str
    repo_id: str
    revision: str
    files: tuple
    optional_files: tuple
    bundle_cap_bytes: int
    synthetic: bool
    description: str
    expected: dict  # file name -> {"size": int | None, "sha256": str | None} or {"absent": True}
    reference: Optional[dict] = None  # informational hashes published for another revision
    # config fields that decide what the model computes, as the loaded model must have them; files that are
    # not pinned by hash (pythia-14m's config.json) could otherwise change the architecture unnoticed
    architecture: Optional[dict] = None

    @property
    def required_files(self) -> tuple:
        """The allowlisted files the experiment cannot run without, in allowlist order."""
        return tuple(name for name in self.files if name not in self.optional_files)

    def pinned_absent(self, name: str) -> bool:
        """Whether the spec says this revision has no such file."""
        return self.expected.get(name, {}).get("absent") is True

    def pinned_present(self, name: str) -> bool:
        """Whether the spec pins a size or hash for the file, which says the revision has it."""
        pin = self.expected.get(name, {})
        return pin.get("size") is not None or pin.get("sha256") is not None

    def as_dict(self) -> dict:
        """The spec as plain JSON-ready data."""
        data = dataclasses.asdict(self)
        data["files"] = list(self.files)
        data["optional_files"] = list(self.optional_files)
        data["required_files"] = list(self.required_files)
        return data


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
    except (OSError, ValueError, RecursionError) as error:
        raise SpecimenError(f"{path}: expected a JSON object, actual: unreadable ({error})") from error
    if not isinstance(data, dict):
        raise SpecimenError(f"{path}: expected a JSON object, actual: {type(data).__name__}")
    missing = [field for field in SPEC_FIELDS if field not in data]
    if missing:
        raise SpecimenError(f"{path}: expected fields {list(SPEC_FIELDS)}, actual: missing {missing}")
    unknown = sorted(set(data) - set(SPEC_FIELDS) - set(OPTIONAL_SPEC_FIELDS))
    if unknown:
        raise SpecimenError(f"{path}: expected only the fields {list(SPEC_FIELDS) + list(OPTIONAL_SPEC_FIELDS)}, "
                            f"actual extra {unknown}")
    files, optional = data["files"], data["optional_files"]
    spec = SpecimenSpec(
        name=name,
        spec_file=str(path),
        repo_id=data["repo_id"],
        revision=data["revision"],
        files=tuple(files) if isinstance(files, list) else files,
        optional_files=tuple(optional) if isinstance(optional, list) else optional,
        bundle_cap_bytes=data["bundle_cap_bytes"],
        synthetic=data["synthetic"],
        description=data["description"],
        expected=data["expected"],
        reference=data.get("reference"),
        architecture=data.get("architecture"),
    )
    problems = spec_problems(spec)
    if problems:
        raise SpecimenError(f"{path}: " + "; ".join(problems))
    return spec


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_sha256(value) -> bool:
    return isinstance(value, str) and bool(_SHA256.match(value))


def spec_problems(spec: SpecimenSpec) -> list[str]:
    """What is wrong with a spec against the protocol: allowlist, optional files, cap, revision, pins."""
    problems = []
    if not isinstance(spec.repo_id, str) or spec.repo_id.count("/") != 1:
        problems.append(f"repo_id: expected 'owner/name', actual {spec.repo_id!r}")
    # A branch name could move; only a commit hash pins the bytes.
    if not isinstance(spec.revision, str) or not _COMMIT.match(spec.revision):
        problems.append(f"revision: expected a 40-hex commit hash, actual {spec.revision!r}")
    if (not isinstance(spec.files, tuple) or len(spec.files) != len(set(spec.files))
            or set(spec.files) != set(protocol.ALLOWLISTED_FILES)):
        problems.append(f"files: expected the allowlist {list(protocol.ALLOWLISTED_FILES)}, actual {spec.files!r}")
        return problems
    optional = spec.optional_files
    if (not isinstance(optional, tuple) or len(optional) != len(set(optional))
            or not set(optional) <= set(protocol.OPTIONAL_FILES)):
        problems.append(f"optional_files: expected a list drawn from {list(protocol.OPTIONAL_FILES)} "
                        f"(the files the experiment can run without), actual {optional!r}")
        return problems
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
        problems.extend(_pin_problems(name, pin, optional=name in optional))
    weight = spec.expected.get(WEIGHT_FILE, {})
    if isinstance(weight, dict) and not (_is_size(weight.get("size")) and _is_sha256(weight.get("sha256"))):
        problems.append(f"expected[{WEIGHT_FILE}]: expected a pinned size and sha256, actual {weight!r}")
    if spec.reference is not None:
        problems.extend(_reference_problems(spec.reference, spec.files))
    architecture = spec.architecture
    if architecture is not None and (not isinstance(architecture, dict) or not architecture or not all(
            isinstance(key, str) and (value is None or isinstance(value, (bool, int, float, str)))
            for key, value in architecture.items())):
        problems.append(f"architecture: expected an object of config field -> JSON scalar, actual {architecture!r}")
    return problems


def _pin_problems(name: str, pin, optional: bool) -> list[str]:
    if isinstance(pin, dict) and set(pin) == {"absent"}:
        if pin["absent"] is not True:
            return [f"expected[{name}].absent: expected true (omit the key otherwise), actual {pin['absent']!r}"]
        if not optional:
            return [f"expected[{name}]: pinned absent, but {name} is required (not in optional_files)"]
        return []
    if not isinstance(pin, dict) or set(pin) != {"size", "sha256"}:
        return [f"expected[{name}]: expected {{size, sha256}} or {{absent: true}}, actual {pin!r}"]
    problems = []
    if pin["size"] is not None and not _is_size(pin["size"]):
        problems.append(f"expected[{name}].size: expected null or a byte count, actual {pin['size']!r}")
    if pin["sha256"] is not None and not _is_sha256(pin["sha256"]):
        problems.append(f"expected[{name}].sha256: expected null or 64 lowercase hex digits, actual {pin['sha256']!r}")
    return problems


def _size_and_hash_problems(where: str, entry) -> list[str]:
    if not isinstance(entry, dict) or set(entry) != {"size", "sha256"}:
        return [f"{where}: expected {{size, sha256}}, actual {entry!r}"]
    if not _is_size(entry["size"]) or not _is_sha256(entry["sha256"]):
        return [f"{where}: expected a byte count and 64 lowercase hex digits, actual {entry!r}"]
    return []


def _reference_problems(reference, allowlist) -> list[str]:
    if not isinstance(reference, dict) or not {"revision", "note", "files"} <= set(reference):
        return [f"reference: expected {{revision, note, files[, weight_header]}}, actual {reference!r}"]
    problems = []
    extra = sorted(set(reference) - {"revision", "note", "files", "weight_header"})
    if extra:
        problems.append(f"reference: unknown keys {extra}")
    if not isinstance(reference["revision"], str) or not _COMMIT.match(reference["revision"]):
        problems.append(f"reference.revision: expected a 40-hex commit hash, actual {reference['revision']!r}")
    if not isinstance(reference["note"], str):
        problems.append(f"reference.note: expected a text, actual {reference['note']!r}")
    files = reference["files"]
    if not isinstance(files, dict) or not set(files) <= set(allowlist):
        problems.append(f"reference.files: expected allowlisted names, actual {files!r}")
    else:
        for name, entry in files.items():
            problems.extend(_size_and_hash_problems(f"reference.files[{name}]", entry))
    if "weight_header" in reference:
        problems.extend(_size_and_hash_problems("reference.weight_header", reference["weight_header"]))
    return problems


def cache_dir(spec: SpecimenSpec, cache_root=None) -> Path:
    """The project cache directory of a specimen: <cache_root>/<name>/<revision>/."""
    root = Path(cache_root) if cache_root is not None else DEFAULT_ARTIFACTS_ROOT / "cache"
    return root / spec.name / spec.revision
