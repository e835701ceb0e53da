"""Verification of a specimen folder against its spec, in an order that never reads what it should not.

1. List every entry from its metadata alone and judge it (entries.py); nothing is opened.
2. Check sizes against the bundle cap before reading a byte (a 50 MB tokenizer.json is never read).
3. Read each present allowlisted regular file once (files.py): hash it, refuse it if it changed
   while being read, parse JSON files safely.
4. Compare with the pins; a weight file that fails its pin is named by its header (weights.py);
   compare the small files with the informational reference hashes (never a refusal).

Nothing may be loaded from a folder that has not passed ``require_verified``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from inferlab.specimen import entries as entry_rules
from inferlab.specimen import weights
from inferlab.specimen.files import FileCheckError, json_problems, read_stable
from inferlab.specimen.spec import WEIGHT_FILE, SpecimenError, SpecimenSpec, load_spec


def _empty_row(name: str, spec: SpecimenSpec) -> dict:
    pin = spec.expected[name]
    return {
        "name": name,
        "required": name not in spec.optional_files,
        "present": False,
        "size": None,
        "sha256": None,
        "expected_size": pin.get("size"),
        "expected_sha256": pin.get("sha256"),
        "expected_absent": spec.pinned_absent(name),
        "absent_at_revision": False,
        "absence": None,
        "link_target": None,
        "reference": None,
        "diagnosis": None,
        "ok": False,
        "problem": None,
    }


def _reference(spec: SpecimenSpec, name: str, row: dict) -> Optional[dict]:
    published = ((spec.reference or {}).get("files") or {}).get(name)
    if published is None:
        return None
    if not row["present"] or row["sha256"] is None:
        status = "absent"
    elif (row["size"], row["sha256"]) == (published["size"], published["sha256"]):
        status = "matches"
    else:
        status = "differs"
    return {"revision": spec.reference["revision"], "size": published["size"], "sha256": published["sha256"],
            "status": status}


ABSENT_FROM_COPY = "missing from this folder; whether the pinned revision has it was not checked (no hub was asked)"


def _missing(row: dict, spec: SpecimenSpec, directory: Path, absence_known_from: Optional[str]) -> None:
    name = row["name"]
    if row["required"]:
        row["problem"] = f"{name} in {directory}: expected a required allowlisted file, actual: missing"
    elif spec.pinned_present(name):
        row["problem"] = (f"{name} in {directory}: the spec pins it present at revision {spec.revision} "
                          f"({row['expected_size']} bytes), actual: missing")
    else:
        # Optional and not pinned present: the run goes on without it, and nothing is put in its place.
        # "Absent at the revision" is claimed only where something knows it: the spec's pin or the hub.
        row["ok"] = True
        if spec.pinned_absent(name):
            row["absent_at_revision"], row["absence"] = True, f"the spec pins it absent at revision {spec.revision}"
        elif absence_known_from:
            row["absent_at_revision"], row["absence"] = True, absence_known_from
        else:
            row["absence"] = ABSENT_FROM_COPY


def _check_present(row: dict, path: Path, spec: SpecimenSpec, directory: Path) -> None:
    name = row["name"]
    where = f"{name} in {directory}"
    try:
        read = read_stable(path, keep_bytes=name.endswith(".json"))
    except FileCheckError as error:
        row["problem"] = f"{where}: {error}"
        return
    except OSError as error:
        row["problem"] = f"{where}: expected a readable file, actual: {error}"
        return
    row["size"], row["sha256"] = read["size"], read["sha256"]
    problems = []
    if row["expected_absent"]:
        problems.append(f"the spec pins it absent at revision {spec.revision}, actual: present ({row['size']} bytes)")
    if row["expected_size"] is not None and row["size"] != row["expected_size"]:
        problems.append(f"size expected {row['expected_size']} bytes, actual {row['size']} bytes")
    if row["expected_sha256"] is not None and row["sha256"] != row["expected_sha256"]:
        problems.append(f"sha256 expected {row['expected_sha256']}, actual {row['sha256']}")
    if read["data"] is not None:
        problems.extend(json_problems(name, read["data"]))
    if problems:
        row["problem"] = f"{where}: " + "; ".join(problems)
    row["ok"] = not problems


def _fails_its_pin(row: dict) -> bool:
    """Whether what is known of a file (its listed size, its hash if read) contradicts its pin."""
    wrong_size = row["expected_size"] is not None and row["size"] != row["expected_size"]
    wrong_hash = row["sha256"] is not None and row["expected_sha256"] not in (None, row["sha256"])
    return wrong_size or wrong_hash


def builder_module(name: str, synthetic: bool) -> Optional[str]:
    """The module that builds a synthetic specimen offline (inferlab.replica or inferlab.standin); None for a real
    one, which is downloaded."""
    if not synthetic:
        return None
    return "inferlab.replica" if name.startswith("replica") else "inferlab.standin"


def _diagnose_weight(row: dict, path: Path, spec: SpecimenSpec) -> None:
    """Name a present weight file that failed (its header only: a bounded read, even over the cap)."""
    row["diagnosis"] = weights.diagnose(
        path, repo_id=spec.repo_id, revision=spec.revision, pinned_size=row["expected_size"],
        pinned_sha256=row["expected_sha256"], reference_header=(spec.reference or {}).get("weight_header"),
        built_by=builder_module(spec.name, spec.synthetic))
    row["problem"] += f"; this looks like {row['diagnosis']['summary']}. {row['diagnosis']['advice']}"


def check_specimen_files(directory, spec: SpecimenSpec, absence_known_from: Optional[str] = None,
                         others: bool = True) -> dict:
    """Check a folder against a spec; never raises for what it finds, never opens a non-regular file.

    Returns {directory, ok, files, entries, extra_files, bundle_bytes, problems}: one row per
    allowlisted file (name, required, present, size, sha256, expected_size, expected_sha256,
    expected_absent, absent_at_revision, absence, link_target, reference, diagnosis, ok, problem), every
    entry seen with its verdict (entries.scan), the paths of the refused entries other than the
    allowlisted names (extra_files), and the byte total of the allowlisted files present.
    A missing optional file counts as absent at the revision only when the spec pins it absent or
    `absence_known_from` says how that is known (the hub's listing); otherwise it is absent from this copy.
    A folder that fails is checked against every other specimen this checkout knows (others=True): a valid copy
    of one is named as such (report["other_specimen"], one problem in other_specimen_words), and no advice says
    to delete it.
    """
    directory = Path(directory).expanduser()
    report = {"directory": str(directory), "ok": False, "files": [], "entries": [], "extra_files": [],
              "bundle_bytes": None, "problems": []}
    if not directory.is_dir():
        report["problems"].append(
            f"{directory}: expected a specimen directory with {list(spec.files)}, actual: no such directory")
        return report
    scan = entry_rules.scan(directory, spec.files)
    report["entries"] = scan["entries"]
    report["extra_files"] = [path for path in scan["refused"] if path not in spec.files]
    by_path = {entry["path"]: entry for entry in scan["entries"]}
    rows = [_empty_row(name, spec) for name in spec.files]
    readable = []
    for row in rows:
        entry = by_path.get(row["name"])
        if entry is None:
            if not scan["truncated"]:
                _missing(row, spec, directory, absence_known_from)
            else:
                row["problem"] = f"{row['name']} in {directory}: not examined (the listing stopped early)"
            continue
        row["present"] = True
        row["link_target"] = entry["target"]
        if entry["verdict"] != "allowlisted":
            row["problem"] = f"{row['name']} in {directory}: {entry['reason']}"
            continue
        row["size"] = entry["size"]
        readable.append(row)
    report["bundle_bytes"] = sum(row["size"] for row in readable)
    first = []  # what matters most, said before the per-file lines: the wrong folder, the one cause over the cap
    if scan["truncated"]:
        first.append(f"{directory}: expected a specimen folder of a few files, actual: more than "
                     f"{entry_rules.MAX_ENTRIES} entries (listing stopped); is this the right folder?")
    over_cap = report["bundle_bytes"] > spec.bundle_cap_bytes
    if over_cap:
        first.append(_over_cap_problem(directory, spec, readable))
        for row in readable:  # one cause, said once above; each row says it was not read, and why
            row["problem"] = (f"{row['name']} in {directory}: not read ({row['size']:,} bytes listed): the "
                              f"allowlisted files are over the bundle cap, {_largest(readable)}")
    else:
        for row in readable:
            _check_present(row, directory / row["name"], spec, directory)
    for row in rows:
        row["reference"] = _reference(spec, row["name"], row)
        if row["name"] == WEIGHT_FILE and row in readable and _fails_its_pin(row):
            _diagnose_weight(row, directory / row["name"], spec)
    problems = first + [row["problem"] for row in rows  # a row not read over the cap adds only its diagnosis
                        if row["problem"] and not (over_cap and row in readable and row["diagnosis"] is None)]
    by_path_reason = {entry["path"]: entry["reason"] for entry in scan["entries"]}
    extra = [f"{path} in {directory}: {by_path_reason[path]}" for path in report["extra_files"]]
    problems += extra[:EXTRA_SHOWN]
    if len(extra) > EXTRA_SHOWN:
        problems.append(f"... and {len(extra) - EXTRA_SHOWN} more entries of {directory} refused (every one is in the "
                        f"report's extra_files; {len(extra)} in all)")
    report.update(files=rows, ok=not problems, problems=problems, other_specimen=None)
    match = other_specimen_copy(directory, spec) if problems and others and not scan["truncated"] else None
    if match is not None:
        other, _ = match
        words = other_specimen_words(directory, spec, other)
        for row in rows:
            if not row["ok"]:
                row.update(diagnosis=None, problem=f"{row['name']} in {directory}: not as {spec.name}'s pin "
                                                   f"(artifacts/{spec.name}.json), but as {other.name}'s: {words}")
        report.update(problems=[words], other_specimen={
            "name": other.name, "repo_id": other.repo_id, "revision": other.revision, "synthetic": other.synthetic,
            "words": words})
    return report


def other_specimen_copy(directory, spec: SpecimenSpec) -> Optional[tuple[SpecimenSpec, dict]]:
    """(the spec, the check) of another specimen this checkout knows (the *.json beside spec's own file) that the
    folder is a valid copy of; None when it is no other specimen's copy either."""
    root = Path(spec.spec_file).parent
    for path in sorted(root.glob("*.json")) if root.is_dir() else ():
        if path.stem == spec.name:
            continue
        try:
            other = load_spec(path.stem, root)
        except SpecimenError:
            continue
        result = check_specimen_files(directory, other, others=False)
        if result["ok"]:
            return other, result
    return None


def other_specimen_words(directory, spec: SpecimenSpec, other: SpecimenSpec) -> str:
    """What a valid copy of another specimen is, in the words the run and check-artifacts both use."""
    kind = "the SYNTHETIC" if other.synthetic else "the"
    return (f"{directory} is NOT a copy of {spec.repo_id} at {spec.revision} (specimen {spec.name}): it is a valid "
            f"copy of {kind} {other.name} specimen ({other.repo_id} at {other.revision}), every file as "
            f"artifacts/{other.name}.json pins it" + (", so it is not Pythia" if other.synthetic else "") +
            f". Keep it; use it with --specimen {other.name} --artifacts {directory}")


EXTRA_SHOWN = 10  # refused entries listed one per line; the rest are counted (a mistaken --artifacts ~ has many)


def _largest(readable: list[dict]) -> str:
    """'tokenizer_config.json is 40,000,000 bytes': the largest allowlisted file, the likely cause over the cap."""
    row = max(readable, key=lambda r: r["size"])
    return f"{row['name']} is {row['size']:,} bytes"


def _over_cap_problem(directory: Path, spec: SpecimenSpec, readable: list[dict]) -> str:
    """The one problem of a folder whose allowlisted files are over the bundle cap, naming the largest file."""
    pinned = spec.expected.get(max(readable, key=lambda r: r["size"])["name"]) or {}
    expected = f" (its pin is {pinned['size']:,} bytes)" if isinstance(pinned.get("size"), int) else ""
    return (f"{directory}: expected the allowlisted files to total at most {spec.bundle_cap_bytes} bytes (the "
            f"bundle cap), actual {sum(r['size'] for r in readable):,} bytes: {_largest(readable)}{expected}; "
            f"nothing was read")


def require_verified(directory, spec: SpecimenSpec, absence_known_from: Optional[str] = None) -> dict:
    """check_specimen_files(), raising SpecimenError listing every problem unless the directory passed."""
    report = check_specimen_files(directory, spec, absence_known_from)
    if not report["ok"]:
        error = SpecimenError(
            f"specimen {spec.name!r} ({spec.spec_file}) failed verification in {directory}:\n  "
            + "\n  ".join(report["problems"])
        )
        error.verification = report
        raise error
    return report
