"""verify's checks of the files themselves: every file against the manifest's inventory, records.jsonl as
written (one ASCII JSON object per line, envelope fields, seq 0..n-1), report.md, and every tensor against
the SHA-256 and shape its record holds."""

from __future__ import annotations

from inferlab.base.records import MANIFEST_FILE, RECORDS_FILE, REPORT_FILE, TENSOR_DIR, sha256_file
from inferlab.reading.addenda import is_addenda_path
from inferlab.reading.runview import tensor_references
from inferlab.verify.checker import Checker


def check_records_file(checker: Checker) -> bool:
    """State records.jsonl's reading problems and its seq order; whether any record could be read from it."""
    problems = checker.view.problems_of(RECORDS_FILE)
    for problem in problems:
        checker.reading_problem(problem)
    if any(p.line is None and p.code == "unreadable" for p in problems):
        return False
    seqs = [r.get("seq") for r in checker.records]
    if seqs != list(range(len(seqs))):
        first = next((i for i, s in enumerate(seqs) if s != i), None)
        checker.problem(f"{RECORDS_FILE}: seq is not 0..{len(seqs) - 1} in order; record {first + 1} has seq "
                        f"{seqs[first]!r}, expected {first}")
    for line in checker.view.schema_problems:
        checker.problem(f"schema: {line}")
    return bool(checker.records) or not any(p.lost for p in problems)


def check_manifest_and_files(checker: Checker) -> None:
    """Each file's size and SHA-256 against the final manifest's inventory, and no file it does not list."""
    manifest = checker.manifest
    if manifest is None or checker.final_records_missing:  # the latter is said once, in the unfinished line
        return
    if manifest.get("exit_status") is None:
        checker.problem(f"{MANIFEST_FILE}: exit_status is null, expected the session's exit status")
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        checker.problem(f"{MANIFEST_FILE}: no 'files' inventory (it is written at session end), so no file "
                        f"hash can be checked")
        return
    directory = checker.view.directory
    if directory is None:  # a view built from data has no files to check
        return
    for relative, expected in sorted(listed.items()):
        target = directory / relative
        if not target.is_file():
            checker.problem(f"{relative}: listed in the manifest but missing")
            continue
        checker.files_checked += 1
        size = target.stat().st_size
        expected = expected if isinstance(expected, dict) else {}
        if size != expected.get("size"):
            checker.problem(f"{relative}: size {size} bytes, manifest says {expected.get('size')}")
        digest = sha256_file(target)
        if digest != expected.get("sha256"):
            checker.problem(f"{relative}: sha256 {digest}, manifest says {expected.get('sha256')} (file changed)")
    present = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    for relative in present:
        if relative != MANIFEST_FILE and relative not in listed and not is_addenda_path(relative):  # verify.addenda
            checker.problem(f"{relative}: present but not listed in the manifest (added after the session)")


def check_report(checker: Checker) -> None:
    """report.md exists (it is written at session end, failures included) and was written without error."""
    directory = checker.view.directory
    if directory is not None and not (directory / REPORT_FILE).is_file() and not checker.final_records_missing:
        checker.problem(f"{REPORT_FILE}: missing (it is written at session end, also after failures)")
    for record in checker.of_kind("report_error"):
        checker.problem(f"{REPORT_FILE}: the session could not write it (seq {record.get('seq')}): "
                        f"{record.get('error')}")


def check_tensors(checker: Checker) -> None:
    """Every tensor reference in every record: its file (in tensors/), its key, its shape and its SHA-256."""
    unreadable: set = set()
    for record in checker.records:
        for field_path, reference in tensor_references(record):
            where = f"{record.get('kind')} seq {record.get('seq')} {field_path}"
            relative, key = reference["file"], reference["key"]
            check = checker.view.check_tensor(reference)
            error = check.file_error
            if error is not None and error.code == "missing":
                checker.problem(f"{where}: tensor file {relative} is missing")
            elif error is not None and error.code == "outside":
                checker.problem(f"{where}: tensor file {relative} is not in {TENSOR_DIR}/, where a run keeps its "
                                f"tensors")
            elif error is not None:
                if relative not in unreadable:  # said once per file
                    unreadable.add(relative)
                    checker.problem(f"{relative}: not a readable safetensors file ({error.reason})")
            elif check.key_missing:
                checker.problem(f"{where}: key {key!r} not in {relative}")
            else:
                if check.shape is not None:
                    checker.problem(f"{where}: {relative}[{key}] has shape {check.shape}, record says "
                                    f"{reference['shape']}")
                if check.sha256 is not None:
                    checker.problem(f"{where}: {relative}[{key}] sha256 {check.sha256}, record says "
                                    f"{reference['sha256']}")
