"""Naming a model.safetensors that fails its pin: its header is read safely and matched to known wrong copies.

Only the 8-byte length and a bounded header are read (never the tensor data), so a hostile or
huge file cannot exhaust memory. The known cases, most specific first:

- truncated:            the header needs more bytes than the file has (an interrupted copy);
- older_generation:     bool attention-mask buffers beside the weights: the repository's contents
                        before 2026-02-27, now published as EleutherAI/pythia-14m-deduped (53.3 MB);
- float32_conversion:   every floating tensor stored as F32, about twice the pinned size;
- same_layout_other_values: the pinned file's exact header with other bytes after it;
- not_safetensors / unrecognised.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections import Counter
from pathlib import Path
from typing import Optional

from inferlab.base.commands import spelled

MAX_HEADER_BYTES = 1_000_000  # pythia-14m's is 8,488; safetensors itself allows 100 MB
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2")
DEDUPED_REPO = "EleutherAI/pythia-14m-deduped"


class HeaderError(Exception):
    """The file's first bytes are not a safetensors header; `truncated` says whether it is merely cut short."""

    def __init__(self, message: str, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated


def read_header(path: Path) -> dict:
    """The safetensors header of path: {header_bytes, header_sha256, tensors, dtypes, data_bytes_needed, file_bytes}.

    tensors maps name -> {dtype, shape, data_offsets}; data_bytes_needed is the largest end offset.
    Raises HeaderError when the header is missing, oversized, cut short or not the expected JSON.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        file_bytes = os.fstat(fd).st_size
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise HeaderError(f"{file_bytes} bytes: too short to hold the 8-byte header length", truncated=True)
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise HeaderError(f"the first 8 bytes give a header of {length} bytes, over the {MAX_HEADER_BYTES} "
                              f"this check reads: not a safetensors file of this model")
        raw = handle.read(length)
    if len(raw) < length:
        raise HeaderError(f"the header needs {length} bytes after the length, the file has {len(raw)}", truncated=True)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as error:
        raise HeaderError(f"the header is not readable JSON ({type(error).__name__})") from error
    if not isinstance(header, dict):
        raise HeaderError(f"the header is a JSON {type(header).__name__}, not an object")
    tensors, ends = {}, [0]
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(v, int) for v in offsets)
                or not isinstance(entry.get("dtype"), str) or not isinstance(entry.get("shape"), list)):
            raise HeaderError(f"tensor {name!r}: expected dtype, shape and two data_offsets, actual {entry!r}")
        tensors[name] = {"dtype": entry["dtype"], "shape": entry["shape"], "data_offsets": offsets}
        ends.append(offsets[1])
    return {
        "header_bytes": length,
        "header_sha256": hashlib.sha256(raw).hexdigest(),
        "tensors": tensors,
        "dtypes": dict(Counter(t["dtype"] for t in tensors.values())),
        "data_bytes_needed": max(ends),
        "file_bytes": file_bytes,
    }


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def diagnose(path: Path, *, repo_id: str, revision: str, pinned_size: int, pinned_sha256: str,
             reference_header: Optional[dict] = None, built_by: Optional[str] = None) -> dict:
    """Which known wrong copy a weight file that failed its pin looks like: {case, summary, advice, evidence}.

    built_by names the module that builds a synthetic specimen (inferlab.standin, inferlab.replica): such a
    specimen is built offline, never downloaded, and the advice says so."""
    if built_by is not None:
        build = spelled(f"-m {built_by} NEWDIR", "python")
        fetch = (f"Get a verified copy instead: run without --artifacts and inferlab builds one itself, or build "
                 f"a fresh copy with `{build}` (NEWDIR new or empty); its model.safetensors "
                 f"is {pinned_size:,} bytes with SHA-256 {pinned_sha256}.")
    else:
        fetch = (f"Get {repo_id} at revision {revision} instead: run without --artifacts "
                 f"for the bounded download, or pass --artifacts with a copy whose model.safetensors is "
                 f"{pinned_size:,} bytes with SHA-256 {pinned_sha256}.")
    try:
        header = read_header(path)
    except HeaderError as error:
        case = "truncated" if error.truncated else "not_safetensors"
        summary = ("a truncated file: " if error.truncated else "not a safetensors weight file: ") + str(error)
        return {"case": case, "summary": summary, "advice": f"Delete it. {fetch}", "evidence": {"error": str(error)}}
    except OSError as error:
        return {"case": "unreadable", "summary": f"its header could not be read ({error.strerror})",
                "advice": fetch, "evidence": {"error": str(error)}}
    needed = 8 + header["header_bytes"] + header["data_bytes_needed"]
    evidence = {key: header[key] for key in ("header_bytes", "header_sha256", "dtypes", "data_bytes_needed",
                                             "file_bytes")}
    evidence["tensor_count"] = len(header["tensors"])
    floats = {dtype for dtype in header["dtypes"] if dtype in FLOAT_DTYPES}
    if header["file_bytes"] < needed:
        return {"case": "truncated",
                "summary": f"a truncated file: its header needs {needed:,} bytes, the file has "
                           f"{header['file_bytes']:,} (an interrupted download or copy)",
                "advice": f"Delete it. {fetch}", "evidence": evidence}
    bool_buffers = sorted(name for name, t in header["tensors"].items() if t["dtype"] == "BOOL")
    if bool_buffers:
        evidence["bool_tensors"] = bool_buffers
        return {"case": "older_generation",
                "summary": f"the repository's contents before 2026-02-27, now published as {DEDUPED_REPO}: "
                           f"{len(bool_buffers)} bool attention-mask buffers sit beside the weights "
                           f"({_mb(header['file_bytes'])}; that generation's file is about 53.3 MB)",
                "advice": f"That is another model (trained on the deduplicated Pile); the lab's model is not in it. "
                          f"{fetch}",
                "evidence": evidence}
    if floats == {"F32"}:
        return {"case": "float32_conversion",
                "summary": f"a float32 conversion: every floating tensor is F32 ({_mb(header['file_bytes'])}, about "
                           f"twice the pinned {_mb(pinned_size)} float16 file); the loader upcasts to float32 itself",
                "advice": f"Use the original float16 file, not one saved again after loading. {fetch}",
                "evidence": evidence}
    if reference_header and header["header_sha256"] == reference_header.get("sha256"):
        return {"case": "same_layout_other_values",
                "summary": "the published header byte for byte (same tensors, dtypes, shapes and offsets) with other "
                           "bytes after it: a damaged copy, or other weights in the same layout",
                "advice": f"Delete it. {fetch}", "evidence": evidence}
    return {"case": "unrecognised",
            "summary": f"not a known copy: {len(header['tensors'])} tensors, dtypes {header['dtypes']}, "
                       f"{header['file_bytes']:,} bytes",
            "advice": fetch, "evidence": evidence}
