"""A specimen's spec: artifacts/<name>.json read, checked against the protocol, and held as data.

The JSON format (every key is required except ``reference`` and ``architecture``):

    repo_id, revision      "owner/name" and the 40-hex commit that pins every byte
    files                  the protocol's six allowlisted names
    optional_files         the allowlisted files a run can do without (drawn from protocol.OPTIONAL_FILES)
    bundle_cap_bytes       at most protocol.BUNDLE_CAP_BYTES
    synthetic, description a specimen inferlab builds itself; one line
    expected               per file {"size": int|null, "sha256": hex|null}, or {"absent": true} for an optional
                           file the revision lacks; model.safetensors is always pinned by both
    reference              informational, never a reason to refuse: {"revision", "note", "files": {name: {size,
                           sha256}}, "weight_header": {size, sha256}} published for another revision
    architecture           config fields the loaded model must have (a config that is not pinned by hash could
                           otherwise change what the model computes unnoticed)
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Optional

from inferlab import protocol
from inferlab.files import PROJECT_ROOT

DEFAULT_ARTIFACTS_ROOT = PROJECT_ROOT / "artifacts"
WEIGHT_FILE = "model.safetensors"
SPEC_FIELDS = ("repo_id", "revision", "files", "optional_files", "bundle_cap_bytes", "synthetic", "description",
               "expected")
OPTIONAL_SPEC_FIELDS = ("reference", "architecture")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SpecimenError(Exception):
    """A spec, download or folder failed a check; the message names the file, the expected and the actual.

    An acquisition attaches what it learned before failing, for the record: ``acquisition`` (the path taken),
    ``verification`` (a check_specimen_files() report) and ``remote`` (the hub's metadata), each or None.
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
    reference: Optional[dict] = None
    architecture: Optional[dict] = None

    @property
    def required_files(self) -> tuple:
        """The allowlisted files a run cannot do without, in allowlist order."""
        return tuple(name for name in self.files if name not in self.optional_files)

    def pinned_absent(self, name: str) -> bool:
        """Whether the spec says this revision has no such file."""
        return self.expected.get(name, {}).get("absent") is True

    def pinned_present(self, name: str) -> bool:
        """Whether the spec pins a size or a hash for the file, which says the revision has it."""
        pin = self.expected.get(name, {})
        return pin.get("size") is not None or pin.get("sha256") is not None

    def reference_status(self, name: str, size: Optional[int], sha256: Optional[str]) -> Optional[dict]:
        """A file against the hashes published for another revision: informational, never a refusal."""
        published = ((self.reference or {}).get("files") or {}).get(name)
        if published is None:
            return None
        status = ("absent" if sha256 is None else
                  "matches" if (size, sha256) == (published["size"], published["sha256"]) else "differs")
        return {"revision": self.reference["revision"], "size": published["size"], "sha256": published["sha256"],
                "status": status}

    def as_dict(self) -> dict:
        """The spec as plain JSON-ready data."""
        return {**dataclasses.asdict(self), "files": list(self.files), "optional_files": list(self.optional_files)}


def load_spec(name: str, artifacts_root=None) -> SpecimenSpec:
    """Read and check artifacts_root/<name>.json; SpecimenError naming the file on any problem."""
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
        raise SpecimenError(f"{path}: expected only {list(SPEC_FIELDS + OPTIONAL_SPEC_FIELDS)}, actual extra {unknown}")
    as_tuple = {key: tuple(data[key]) if isinstance(data[key], list) else data[key]
                for key in ("files", "optional_files")}
    spec = SpecimenSpec(name=name, spec_file=str(path), **{**data, **as_tuple})
    problems = spec_problems(spec)
    if problems:
        raise SpecimenError(f"{path}: " + "; ".join(problems))
    return spec


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_hex(value, digits: int) -> bool:  # a commit is 40 lowercase hex digits, a sha256 64
    return isinstance(value, str) and re.fullmatch(f"[0-9a-f]{{{digits}}}", value) is not None


def spec_problems(spec: SpecimenSpec) -> list[str]:
    """What is wrong with a spec against the protocol: allowlist, optional files, cap, revision, pins."""
    problems = []
    if not isinstance(spec.repo_id, str) or spec.repo_id.count("/") != 1:
        problems.append(f"repo_id: expected 'owner/name', actual {spec.repo_id!r}")
    if not _is_hex(spec.revision, 40):  # a branch name could move; only a commit pins the bytes
        problems.append(f"revision: expected a 40-hex commit hash, actual {spec.revision!r}")
    if (not isinstance(spec.files, tuple) or len(spec.files) != len(set(spec.files))
            or set(spec.files) != set(protocol.ALLOWLISTED_FILES)):
        return problems + [f"files: expected the allowlist {list(protocol.ALLOWLISTED_FILES)}, actual {spec.files!r}"]
    optional = spec.optional_files
    if (not isinstance(optional, tuple) or len(optional) != len(set(optional))
            or not set(optional) <= set(protocol.OPTIONAL_FILES)):
        return problems + [f"optional_files: expected a list drawn from {list(protocol.OPTIONAL_FILES)} (the files "
                           f"a run can do without), actual {optional!r}"]
    cap = spec.bundle_cap_bytes
    if not _is_size(cap) or not 0 < cap <= protocol.BUNDLE_CAP_BYTES:
        problems.append(f"bundle_cap_bytes: expected an int in 1..{protocol.BUNDLE_CAP_BYTES}, actual {cap!r}")
    if not isinstance(spec.synthetic, bool):
        problems.append(f"synthetic: expected true or false, actual {spec.synthetic!r}")
    if not isinstance(spec.description, str) or not spec.description.strip():
        problems.append(f"description: expected a one-line text, actual {spec.description!r}")
    if not isinstance(spec.expected, dict) or set(spec.expected) != set(spec.files):
        keys = sorted(spec.expected) if isinstance(spec.expected, dict) else spec.expected
        return problems + [f"expected: expected one entry per allowlisted file, actual {keys!r}"]
    for name, pin in spec.expected.items():
        problems.extend(_pin_problems(name, pin, optional=name in optional))
    weight = spec.expected[WEIGHT_FILE]
    if isinstance(weight, dict) and not (_is_size(weight.get("size")) and _is_hex(weight.get("sha256"), 64)):
        problems.append(f"expected[{WEIGHT_FILE}]: expected a pinned size and sha256, actual {weight!r}")
    if spec.reference is not None:
        problems.extend(_reference_problems(spec.reference, spec.files))
    arch = spec.architecture
    if arch is not None and (not isinstance(arch, dict) or not arch or not all(
            isinstance(key, str) and (value is None or isinstance(value, (bool, int, float, str)))
            for key, value in arch.items())):
        problems.append(f"architecture: expected an object of config field -> JSON scalar, actual {arch!r}")
    return problems


def _pin_problems(name: str, pin, optional: bool) -> list[str]:
    if isinstance(pin, dict) and set(pin) == {"absent"}:
        if pin["absent"] is not True:
            return [f"expected[{name}].absent: expected true (omit the key otherwise), actual {pin['absent']!r}"]
        return [] if optional else [f"expected[{name}]: pinned absent, but {name} is required (not in optional_files)"]
    if not isinstance(pin, dict) or set(pin) != {"size", "sha256"}:
        return [f"expected[{name}]: expected {{size, sha256}} or {{absent: true}}, actual {pin!r}"]
    if not (pin["size"] is None or _is_size(pin["size"])) or not (pin["sha256"] is None or _is_hex(pin["sha256"], 64)):
        return [f"expected[{name}]: expected null or a byte count, and null or 64 lowercase hex digits, actual {pin!r}"]
    return []


def _reference_problems(reference, allowlist) -> list[str]:
    if not isinstance(reference, dict) or not {"revision", "note", "files"} <= set(reference) <= {
            "revision", "note", "files", "weight_header"}:
        return [f"reference: expected {{revision, note, files[, weight_header]}}, actual {reference!r}"]
    problems = [] if _is_hex(reference["revision"], 40) else [
        f"reference.revision: expected a 40-hex commit hash, actual {reference['revision']!r}"]
    files = reference["files"]
    if not isinstance(files, dict) or not set(files) <= set(allowlist):
        return problems + [f"reference.files: expected allowlisted names, actual {files!r}"]
    entries = {f"reference.files[{name}]": entry for name, entry in files.items()}
    if "weight_header" in reference:
        entries["reference.weight_header"] = reference["weight_header"]
    for where, entry in entries.items():
        if not (isinstance(entry, dict) and set(entry) == {"size", "sha256"} and _is_size(entry["size"])
                and _is_hex(entry["sha256"], 64)):
            problems.append(f"{where}: expected a byte count and 64 lowercase hex digits, actual {entry!r}")
    return problems


def cache_dir(spec: SpecimenSpec, cache_root=None) -> Path:
    """The project cache folder of a specimen: <cache_root>/<name>/<revision>/."""
    root = Path(cache_root) if cache_root is not None else DEFAULT_ARTIFACTS_ROOT / "cache"
    return root / spec.name / spec.revision


def builder_module(name: str, synthetic: bool) -> Optional[str]:
    """The command module that builds a synthetic specimen offline (inferlab.replica or inferlab.standin); None for
    a real one, which is downloaded."""
    return None if not synthetic else "inferlab.replica" if name.startswith("replica") else "inferlab.standin"
