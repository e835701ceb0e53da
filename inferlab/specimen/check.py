"""Verification of a specimen folder against its spec, in an order that never reads what it should not (the rule
in words: docs/specimens.md): every entry judged from its metadata (scan), sizes against the cap, each allowlisted
file read once (read_stable), then the pins, a failing weight file named from its header (diagnose: Lab 05's wrong
copies). Nothing is loaded from a folder that has not passed require_verified().
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import stat
import struct
from collections import Counter
from pathlib import Path
from typing import Optional

from inferlab.files import spelled
from inferlab.specimen.spec import WEIGHT_FILE, SpecimenError, SpecimenSpec, builder_module, load_spec

INERT_FILES = ("README.md", ".gitattributes")
DESKTOP_BOOKKEEPING = (".DS_Store", "Thumbs.db", "desktop.ini")  # what a file manager leaves in a folder it opens
HUB_BOOKKEEPING_DIR, HUB_BOOKKEEPING_SUFFIXES = (".cache", "huggingface"), (".gitignore", ".metadata", ".lock")
REFUSED_PATTERNS = {
    "weights": ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf",
                "*.ot", "*.tflite", "*.npz", "*.npy"),
    "a pickle": ("*.pkl", "*.pickle", "*.joblib", "*.dill"),
    "code": ("*.py", "*.pyc", "*.pyo", "*.pyd", "*.so", "*.dylib", "*.dll", "*.sh", "*.ipynb"),
}
MAX_ENTRIES = 1000  # a specimen folder holds a handful; a mistaken --artifacts ~ is not walked whole
EXTRA_SHOWN = 10  # refused entries listed one per line; the rest are counted
CHUNK_BYTES = 1 << 20
MAX_HEADER_BYTES = 1_000_000  # pythia-14m's safetensors header is 8,488 bytes; safetensors itself allows 100 MB
DEDUPED_REPO = "EleutherAI/pythia-14m-deduped"
ABSENT_FROM_COPY = "missing from this folder; whether the pinned revision has it was not checked (no hub was asked)"
_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "fifo"),
          (stat.S_ISCHR, "char_device"), (stat.S_ISBLK, "block_device"), (stat.S_ISSOCK, "socket"))


# --- 1. every entry judged from its metadata ----------------------------------------------------------------


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "unknown")


def _file_verdict(parts: tuple, allowlist) -> tuple[str, str]:
    name, top = parts[-1], len(parts) == 1
    refused = next((label for label, patterns in REFUSED_PATTERNS.items()
                    if any(fnmatch.fnmatchcase(name.lower(), pattern) for pattern in patterns)), None)
    if top and name in allowlist:
        return "allowlisted", "a specimen file; checked against its pin"
    if refused:
        return "refused", f"{refused} (name matches a refused pattern): never accepted beside the specimen"
    if top and name in INERT_FILES + DESKTOP_BOOKKEEPING:
        return "inert", "documentation or a file manager's bookkeeping; no loader reads it"
    if parts[:2] == HUB_BOOKKEEPING_DIR and len(parts) > 2 and name.endswith(HUB_BOOKKEEPING_SUFFIXES):
        return "hub_bookkeeping", "huggingface_hub's record of a --local-dir download; no loader reads it"
    return "refused", ("not part of the specimen: a loader reads files by name from this folder, so only the "
                       "allowlisted files, README.md, .gitattributes and a file manager's .DS_Store, Thumbs.db or "
                       "desktop.ini may sit here")


def _judge(path: Path, parts: tuple, allowlist) -> dict:
    entry = {"path": "/".join(parts), "type": "unknown", "size": None, "target": None, "target_type": None,
             "verdict": "refused", "reason": None}
    try:
        own = os.lstat(path)
        entry["type"] = _kind(own.st_mode)
        if entry["type"] == "symlink":
            entry.update(target=os.readlink(path), target_type="missing")
            own = os.stat(path)  # follows the link without opening what it points to
            entry["target_type"] = _kind(own.st_mode)
    except OSError as error:
        what = "a symlink to nothing" if entry["target_type"] == "missing" else "cannot be examined"
        return {**entry, "reason": f"{what} ({error.strerror or error})"}
    if entry["type"] == "directory":
        return {**entry, "verdict": "directory", "reason": "walked; each entry inside is judged"}
    if entry["target_type"] not in (None, "file"):
        return {**entry, "reason": f"a symlink to a {entry['target_type']}: only a symlink to a regular file is "
                                   f"accepted, and it is judged as that file"}
    if entry["type"] not in ("file", "symlink"):
        return {**entry, "reason": f"a {entry['type']}, not a regular file: refused without being opened"}
    verdict, reason = _file_verdict(parts, allowlist)
    link = "symlink to a regular file; " if entry["target"] is not None else ""
    return {**entry, "size": own.st_size, "verdict": verdict, "reason": link + reason}


def scan(directory: Path, allowlist) -> dict:
    """Every entry under directory, breadth first, to MAX_ENTRIES: {entries, refused, truncated}; an entry is {path
    (relative, POSIX), type, size, target, target_type (a symlink's), verdict, reason}."""
    entries, pending = [], [(Path(directory), ())]
    while pending:
        folder, prefix = pending.pop(0)
        try:
            with os.scandir(folder) as listing:
                children = sorted(listing, key=lambda child: child.name)
        except OSError as error:
            entries.append({"path": "/".join(prefix) or ".", "type": "directory", "size": None, "target": None,
                            "target_type": None, "verdict": "refused", "reason": f"cannot be listed: {error}"})
            continue
        for child in children:
            if len(entries) >= MAX_ENTRIES:
                pending = None
                break
            entries.append(_judge(Path(child.path), prefix + (child.name,), allowlist))
            if entries[-1]["verdict"] == "directory":
                pending.append((Path(child.path), prefix + (child.name,)))
    return {"entries": entries, "refused": [e["path"] for e in entries if e["verdict"] == "refused"],
            "truncated": pending is None}


# --- 3. one stable read of a file ------------------------------------------------------------------------------


class FileCheckError(Exception):
    """The file could not be read as a stable regular file; the message says why (without the path)."""


def _chunks(handle):
    while chunk := handle.read(CHUNK_BYTES):
        yield chunk


def read_stable(path: Path, keep_bytes: bool = False) -> dict:
    """Hash a regular file: {size, sha256, data (the bytes when keep_bytes)}; FileCheckError when it is not the
    regular file that was listed once opened (non-blocking, so a FIFO swapped in cannot hang it), or it changed while
    being read (a copy still being written)."""
    listed = os.stat(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # an OSError: "expected a readable file"
    with os.fdopen(fd, "rb") as handle:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or (before.st_dev, before.st_ino) != (listed.st_dev, listed.st_ino):
            raise FileCheckError("expected the regular file that was listed, actual: it was replaced before it was "
                                 "read")
        digest, kept, count = hashlib.sha256(), [], 0
        for chunk in _chunks(handle):
            digest.update(chunk)
            count += len(chunk)
            kept += [chunk] if keep_bytes else []
        after = os.fstat(fd)
    now = os.stat(path)
    same = lambda s: (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)  # noqa: E731
    if same(before) != same(after) or same(now) != same(after) or count != before.st_size:
        raise FileCheckError(f"changed while being read (size {before.st_size} -> {now.st_size} bytes, {count} "
                             f"read): another program is writing it. Wait until the copy has finished, then run again")
    return {"size": count, "sha256": digest.hexdigest(), "data": b"".join(kept) if keep_bytes else None}


def json_problems(name: str, data: bytes) -> list[str]:
    """Why bytes are not an acceptable specimen JSON file: not UTF-8 JSON, not an object, too deep, remote code."""
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        return [f"expected UTF-8 JSON, actual: undecodable bytes ({error.reason} at byte {error.start})"]
    except ValueError as error:
        return [f"expected readable JSON, actual: {error}"]
    except RecursionError:
        return ["expected readable JSON, actual: nested too deeply to parse (a malformed or hostile file)"]
    if not isinstance(value, dict):
        return [f"expected a JSON object, actual {type(value).__name__}"]
    problems = []
    # auto_map points transformers at repository Python code; the lab allows built-in classes only.
    asks = {key: value[key] for key in ("auto_map", "trust_remote_code") if value.get(key) not in (None, False, {})}
    if asks:
        problems.append(f"expected no remote-code request, actual keys {list(asks)} ({asks})")
    if name == "config.json" and value.get("model_type") != "gpt_neox":
        problems.append(f"expected model_type 'gpt_neox' (the built-in GPTNeoXForCausalLM), actual "
                        f"{value.get('model_type')!r}")
    if name == "tokenizer.json" and not isinstance(value.get("model"), dict):
        problems.append(f"expected a tokenizer with a 'model' object, actual {type(value.get('model')).__name__}")
    return problems


# --- 4. the Lab 05 wrong copies, named from the weights' header ---------------------------------------------------


def diagnose(path: Path, spec: SpecimenSpec) -> dict:
    """Which known wrong copy a weight file that failed its pin looks like, from its safetensors header alone (a
    bounded read, never the tensors), most specific first: {case (truncated, older_generation, float32_conversion,
    same_layout_other_values, not_safetensors, unreadable or unrecognised), summary, advice, evidence}."""
    pin, built_by = spec.expected[WEIGHT_FILE], builder_module(spec.name, spec.synthetic)
    wanted = f"model.safetensors is {pin['size']:,} bytes with SHA-256 {pin['sha256']}"
    fetch = (f"Get a verified copy instead: run without --artifacts and inferlab builds one itself, or build a fresh "
             f"copy with `{spelled(f'-m {built_by} NEWDIR', 'python')}` (NEWDIR new or empty); its {wanted}."
             if built_by else f"Get {spec.repo_id} at revision {spec.revision} instead: run without --artifacts for "
                              f"the bounded download, or pass --artifacts with a copy whose {wanted}.")

    def unread(case: str, what: str, advice: str = f"Delete it. {fetch}") -> dict:
        return {"case": case, "summary": what, "advice": advice, "evidence": {"error": what}}

    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            size, prefix = os.fstat(handle.fileno()).st_size, handle.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
            raw = handle.read(length) if length is not None and length <= MAX_HEADER_BYTES else b""
    except OSError as error:
        return unread("unreadable", f"its header could not be read ({error.strerror})", fetch)
    if length is None:
        return unread("truncated", f"a truncated file: {size} bytes: too short to hold the 8-byte header length")
    if length > MAX_HEADER_BYTES:
        return unread("not_safetensors", f"not a safetensors weight file: the first 8 bytes give a header of {length} "
                                         f"bytes, over the {MAX_HEADER_BYTES} this check reads")
    if len(raw) < length:
        return unread("truncated", f"a truncated file: the header needs {length} bytes after the length, the file "
                                   f"has {len(raw)}")
    try:
        tensors = {name: (entry["dtype"] + "", list(entry["shape"]), int(entry["data_offsets"][1]))
                   for name, entry in json.loads(raw.decode("utf-8")).items() if name != "__metadata__"}
    except (ValueError, RecursionError, AttributeError, TypeError, KeyError, IndexError) as error:
        return unread("not_safetensors", f"not a safetensors weight file: the header is not a safetensors header "
                                         f"({type(error).__name__})")
    dtypes, needed = dict(Counter(dtype for dtype, _, _ in tensors.values())), max(
        (end for _, _, end in tensors.values()), default=0)
    masks = sorted(name for name, (dtype, _, _) in tensors.items() if dtype == "BOOL")
    evidence = {"header_bytes": length, "header_sha256": hashlib.sha256(raw).hexdigest(), "dtypes": dtypes,
                "data_bytes_needed": needed, "file_bytes": size, "tensor_count": len(tensors),
                **({"bool_tensors": masks} if masks else {})}
    needed += 8 + length
    cases = (  # (applies, case, summary, advice): the first that applies names the file
        (size < needed, "truncated", f"a truncated file: its header needs {needed:,} bytes, the file has {size:,} "
                                     f"(an interrupted download or copy)", f"Delete it. {fetch}"),
        (bool(masks), "older_generation", f"the repository's contents before 2026-02-27, now published as "
                                          f"{DEDUPED_REPO}: {len(masks)} bool attention-mask buffers sit beside the "
                                          f"weights ({size / 1e6:.1f} MB; that generation's file is about 53.3 MB)",
         f"That is another model (trained on the deduplicated Pile); the lab's model is not in it. {fetch}"),
        ({d for d in dtypes if d.startswith(("F", "BF"))} == {"F32"}, "float32_conversion",
         f"a float32 conversion: every floating tensor is F32 ({size / 1e6:.1f} MB, about twice the pinned "
         f"{pin['size'] / 1e6:.1f} MB float16 file); the loader upcasts to float32 itself",
         f"Use the original float16 file, not one saved again after loading. {fetch}"),
        (evidence["header_sha256"] == ((spec.reference or {}).get("weight_header") or {}).get("sha256"),
         "same_layout_other_values", "the published header byte for byte (same tensors, dtypes, shapes and offsets) "
                                     "with other bytes after it: a damaged copy, or other weights in the same layout",
         f"Delete it. {fetch}"),
        (True, "unrecognised", f"not a known copy: {len(tensors)} tensors, dtypes {dtypes}, {size:,} bytes", fetch))
    _, case, summary, advice = next(entry for entry in cases if entry[0])
    return {"case": case, "summary": summary, "advice": advice, "evidence": evidence}


# --- the folder against the spec ----------------------------------------------------------------------------------


def _row(name: str, spec: SpecimenSpec) -> dict:
    pin = spec.expected[name]
    return {"name": name, "required": name not in spec.optional_files, "present": False, "size": None,
            "sha256": None, "expected_size": pin.get("size"), "expected_sha256": pin.get("sha256"),
            "expected_absent": spec.pinned_absent(name), "absent_at_revision": False, "absence": None,
            "link_target": None, "reference": None, "diagnosis": None, "ok": False, "problem": None}


def _missing(row: dict, spec: SpecimenSpec, where: str, absence_known_from: Optional[str]) -> None:
    if row["required"]:
        row["problem"] = f"{where}: expected a required allowlisted file, actual: missing"
    elif spec.pinned_present(row["name"]):
        row["problem"] = (f"{where}: the spec pins it present at revision {spec.revision} ({row['expected_size']} "
                          f"bytes), actual: missing")
    else:  # optional: the run goes on without it, and nothing is put in its place
        # "absent at the revision" is said only where something knows it: the spec's pin, or the hub's listing
        known = f"the spec pins it absent at revision {spec.revision}" if row["expected_absent"] else absence_known_from
        row.update(ok=True, absent_at_revision=bool(known), absence=known or ABSENT_FROM_COPY)


def _check_read(row: dict, path: Path, spec: SpecimenSpec, where: str) -> None:
    try:
        read = read_stable(path, keep_bytes=row["name"].endswith(".json"))
    except (FileCheckError, OSError) as error:
        readable = isinstance(error, FileCheckError)
        row["problem"] = f"{where}: {error}" if readable else f"{where}: expected a readable file, actual: {error}"
        return
    row["size"], row["sha256"] = read["size"], read["sha256"]
    problems = []
    if row["expected_absent"]:
        problems.append(f"the spec pins it absent at revision {spec.revision}, actual: present ({row['size']} bytes)")
    if row["expected_size"] is not None and row["size"] != row["expected_size"]:
        problems.append(f"size expected {row['expected_size']} bytes, actual {row['size']} bytes")
    if row["expected_sha256"] is not None and row["sha256"] != row["expected_sha256"]:
        problems.append(f"sha256 expected {row['expected_sha256']}, actual {row['sha256']}")
    problems += json_problems(row["name"], read["data"]) if read["data"] is not None else []
    row.update(ok=not problems, problem=f"{where}: " + "; ".join(problems) if problems else None)


def check_specimen_files(directory, spec: SpecimenSpec, absence_known_from: Optional[str] = None,
                         others: bool = True) -> dict:
    """Check a folder against a spec, never raising for what it finds: {directory, ok, files (a row per allowlisted
    file), entries (scan), extra_files (refused entries but the allowlisted names), bundle_bytes, problems,
    other_specimen}. A missing optional file is absent at the revision only when the spec pins it so or
    absence_known_from says how that is known (the hub's listing). A failing folder that is a valid copy of another
    specimen this checkout knows (others) is named as that, with one problem, and nothing says to delete it."""
    directory = Path(directory).expanduser()
    report = {"directory": str(directory), "ok": False, "files": [], "entries": [], "extra_files": [],
              "bundle_bytes": None, "problems": [], "other_specimen": None}
    if not directory.is_dir():
        report["problems"].append(f"{directory}: expected a specimen directory with {list(spec.files)}, actual: no "
                                  f"such directory")
        return report
    listing = scan(directory, spec.files)
    by_path = {entry["path"]: entry for entry in listing["entries"]}
    rows, readable = [_row(name, spec) for name in spec.files], []
    for row in rows:
        entry, where = by_path.get(row["name"]), f"{row['name']} in {directory}"
        if entry is None and listing["truncated"]:
            row["problem"] = f"{where}: not examined (the listing stopped early)"
        elif entry is None:
            _missing(row, spec, where, absence_known_from)
        elif entry["verdict"] != "allowlisted":
            row.update(present=True, link_target=entry["target"], problem=f"{where}: {entry['reason']}")
        else:
            row.update(present=True, link_target=entry["target"], size=entry["size"])
            readable.append(row)
    bundle = report["bundle_bytes"] = sum(row["size"] for row in readable)
    first = []  # what matters most, said before the per-file lines: the wrong folder, the one cause over the cap
    if listing["truncated"]:
        first.append(f"{directory}: expected a specimen folder of a few files, actual: more than {MAX_ENTRIES} entries "
                     f"(listing stopped); is this the right folder?")
    over_cap = bundle > spec.bundle_cap_bytes
    if over_cap:
        largest = max(readable, key=lambda r: r["size"])
        pinned = spec.expected[largest["name"]].get("size")
        cause = f"{largest['name']} is {largest['size']:,} bytes"
        first.append(f"{directory}: expected the allowlisted files to total at most {spec.bundle_cap_bytes} bytes "
                     f"(the bundle cap), actual {bundle:,} bytes: {cause}"
                     f"{f' (its pin is {pinned:,} bytes)' if pinned else ''}; nothing was read")
        for row in readable:  # one cause, said once above; each row says it was not read, and why
            row["problem"] = (f"{row['name']} in {directory}: not read ({row['size']:,} bytes listed): the "
                              f"allowlisted files are over the bundle cap, {cause}")
    for row in rows:
        if not over_cap and row in readable:
            _check_read(row, directory / row["name"], spec, f"{row['name']} in {directory}")
        row["reference"] = spec.reference_status(row["name"], row["size"], row["sha256"])
        wrong = (row["expected_size"] is not None and row["size"] != row["expected_size"]) or (
            row["sha256"] is not None and row["expected_sha256"] not in (None, row["sha256"]))
        if row["name"] == WEIGHT_FILE and row in readable and wrong:  # a bounded read of the header, even over the cap
            row["diagnosis"] = diagnose(directory / row["name"], spec)
            row["problem"] += f"; this looks like {row['diagnosis']['summary']}. {row['diagnosis']['advice']}"
    problems = first + [row["problem"] for row in rows  # a row not read over the cap adds only its diagnosis
                        if row["problem"] and not (over_cap and row in readable and row["diagnosis"] is None)]
    report["extra_files"] = [path for path in listing["refused"] if path not in spec.files]
    extra = [f"{path} in {directory}: {by_path[path]['reason']}" for path in report["extra_files"]]
    problems += extra[:EXTRA_SHOWN] + ([f"... and {len(extra) - EXTRA_SHOWN} more entries of {directory} refused "
                                        f"(every one is in the report's extra_files; {len(extra)} in all)"]
                                       if len(extra) > EXTRA_SHOWN else [])
    report.update(files=rows, entries=listing["entries"], ok=not problems, problems=problems)
    other = _other_specimen(directory, spec) if problems and others and not listing["truncated"] else None
    if other is not None:
        for row in rows:
            if not row["ok"]:
                row.update(diagnosis=None, problem=f"{row['name']} in {directory}: not as {spec.name}'s pin "
                                                   f"(artifacts/{spec.name}.json), but as {other['name']}'s: "
                                                   f"{other['words']}")
        report.update(problems=[other["words"]], other_specimen=other)
    return report


def _other_specimen(directory: Path, spec: SpecimenSpec) -> Optional[dict]:
    """Another specimen this checkout knows (a *.json beside spec's own) that the folder is a valid copy of, with
    what that means in the words the run and check-artifacts both use; or None."""
    root = Path(spec.spec_file).parent
    for name in sorted(path.stem for path in root.glob("*.json") if path.stem != spec.name):
        with contextlib.suppress(SpecimenError):
            other = load_spec(name, root)
            if check_specimen_files(directory, other, others=False)["ok"]:
                words = (f"{directory} is NOT a copy of {spec.repo_id} at {spec.revision} (specimen {spec.name}): it "
                         f"is a valid copy of {'the SYNTHETIC' if other.synthetic else 'the'} {other.name} specimen "
                         f"({other.repo_id} at {other.revision}), every file as artifacts/{other.name}.json pins it"
                         f"{', so it is not Pythia' if other.synthetic else ''}. Keep it; use it with --specimen "
                         f"{other.name} --artifacts {directory}")
                return {"name": other.name, "repo_id": other.repo_id, "revision": other.revision,
                        "synthetic": other.synthetic, "words": words}
    return None
