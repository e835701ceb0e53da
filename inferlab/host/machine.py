"""This machine: its CPU, its fingerprint and its caches; and the file benchmark results are appended to.

A benchmark (benchmarks/*.py) appends to runs/benchmarks/overhead.jsonl, which git ignores, unless --record-to names
another file (the tracked benchmarks/results.jsonl, say). No run reads these results: a figure from another run says
nothing certain about this one, so a report quotes only what its run measured.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from inferlab.base.checkout import PROJECT_ROOT

RESULTS_FILE = PROJECT_ROOT / "runs" / "benchmarks" / "overhead.jsonl"
TRACKED_RESULTS_FILE = PROJECT_ROOT / "benchmarks" / "results.jsonl"
CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform.processor() says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip().lower() in ("model name", "hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_fingerprint() -> dict:
    """What a timing depends on in the hardware: OS, architecture, CPU model, logical CPUs. No host name: two
    identical machines share a fingerprint."""
    return {"system": platform.system(), "machine": platform.machine(), "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count()}


def append_result(result: dict, path: Path = RESULTS_FILE) -> None:
    """Append one benchmark result as a JSON line, synced before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(result, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _bytes(size: str):
    """'32K' -> 32768, '1M', '512' (bytes); None for anything else."""
    number, unit = (size[:-1], SIZE_UNITS[size[-1]]) if size[-1:] in SIZE_UNITS else (size, 1)
    return int(number) * unit if number.isdigit() else None


def cache_sizes(directory: Path = CPU_CACHE_DIR) -> dict:
    """The CPU caches one core sees, as Linux lists them: {source, levels: [{level, type, size, bytes}],
    largest_bytes (of a data or unified level), note}; no levels and largest_bytes "unknown" where none is listed."""
    levels = []
    try:
        for index in sorted(Path(directory).glob("index*")):
            level, kind, size = ((index / name).read_text(encoding="ascii").strip()
                                 for name in ("level", "type", "size"))
            levels.append({"level": int(level) if level.isdigit() else level, "type": kind, "size": size,
                           "bytes": _bytes(size)})
    except (OSError, ValueError) as error:
        return {"source": str(directory), "levels": [], "largest_bytes": "unknown",
                "note": f"the cache sizes could not be read: {error}"}
    data = [entry["bytes"] for entry in levels if entry["type"] != "Instruction" and entry["bytes"] is not None]
    if not data:
        return {"source": str(directory), "levels": levels, "largest_bytes": "unknown",
                "note": f"{directory} lists no cache size here, so the cache sizes are unknown"}
    return {"source": str(directory), "levels": levels, "largest_bytes": max(data),
            "note": "as Linux lists them for cpu0; a level may be shared with other cores"}
