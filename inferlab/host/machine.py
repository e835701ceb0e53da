"""This machine: its fingerprint and its CPU caches; and where benchmark results (benchmarks/overhead.py) go.

A benchmark writes its result outside every tracked file unless asked: by default it appends to
runs/benchmarks/overhead.jsonl (runs/ is git-ignored); `--record-to FILE` names another file, such as the
tracked benchmarks/results.jsonl. No experiment run reads these results: another run's figure, matched by a
CPU fingerprint, says nothing certain about this run, so a run's report quotes only what the run measured.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Optional

from inferlab.base.checkout import PROJECT_ROOT

RESULTS_FILE = PROJECT_ROOT / "runs" / "benchmarks" / "overhead.jsonl"  # untracked: the default destination
TRACKED_RESULTS_FILE = PROJECT_ROOT / "benchmarks" / "results.jsonl"  # only with --record-to
CPUINFO = Path("/proc/cpuinfo")
CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo on Linux, else what platform.processor() says."""
    if CPUINFO.is_file():
        for line in CPUINFO.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    return platform.processor() or "unknown"


def machine_fingerprint() -> dict:
    """What identifies the hardware a timing depends on: OS, architecture, CPU model, logical CPU count.

    No host name: two identical machines (or CI containers) share a fingerprint, which is what a
    benchmark reference needs.
    """
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
    }


def fingerprint_of(platform_record: dict) -> dict:
    """The same fingerprint, read from a run manifest's `platform` (inferlab.host.environment.platform_record, which
    names the system `os`): how grade's class view counts the machines of a class."""
    return {"system": platform_record.get("os"), "machine": platform_record.get("machine"),
            "cpu_model": platform_record.get("cpu_model"), "logical_cpus": platform_record.get("logical_cpus")}


def append_result(result: dict, path: Path = RESULTS_FILE) -> None:
    """Append one benchmark result as a JSON line, flushed and synced before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(result, ensure_ascii=True, sort_keys=True)
    with path.open("a", encoding="ascii") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_results(path: Path = RESULTS_FILE) -> list[dict]:
    """Every result in the file, oldest first; ValueError naming the file and line for one that is not JSON."""
    path = Path(path)
    results = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            result = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number}: expected one JSON object per line, actual unreadable ({error})") from None
        if not isinstance(result, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, actual {type(result).__name__}")
        results.append(result)
    return results


def benchmark_figures(path: Path = TRACKED_RESULTS_FILE) -> dict:
    """What a run quotes of the tracked benchmark results, as another run's figures (each with its date, commit,
    machine), never this run's: the newest overhead result that measured the per-forward hook, and the newest
    frame-placement timing of benchmarks/page_faults.py; {"found": False, "reason"} without the first."""
    try:
        results = read_results(path)
    except (OSError, ValueError) as error:
        return {"found": False, "reason": f"{Path(path).name}: {error}"}
    overhead = [r for r in results if isinstance(r.get("hook"), dict)]
    placement = [r for r in results if isinstance(r.get("placement_timing"), dict)]
    if not overhead:
        return {"found": False, "reason": f"{Path(path).name} holds no result that measured the per-forward hook"}
    newest, paired = overhead[-1], overhead[-1].get("paired") or {}
    found = {"found": True, "file": str(Path(path).relative_to(PROJECT_ROOT)) if Path(path).is_relative_to(PROJECT_ROOT)
             else str(path), "whose": "another run's: benchmarks/overhead.py, not this run",
             "recorded_utc": newest.get("recorded_utc"), "commit": (newest.get("git") or {}).get("commit"),
             "machine": newest.get("machine"), "python": (newest.get("software") or {}).get("python"),
             "rounds": newest.get("rounds"), "instrumented_over_bare": paired.get("overhead"),
             "instrumented_interval": paired.get("interval"), "aa": paired.get("aa"), "verdict": paired.get("verdict"),
             "hook": newest["hook"], "readings_without_hook": newest.get("readings_without_hook"),
             "usage_per_read_ns": (newest.get("usage_read_cost") or {}).get("usage_per_read_ns")}
    if placement:
        last = placement[-1]
        found["placement"] = {**last["placement_timing"], "recorded_utc": last.get("recorded_utc"),
                              "commit": (last.get("git") or {}).get("commit"), "python": last.get("python"),
                              "whose": "another run's: benchmarks/page_faults.py --timing, not this run"}
    return found


def _size_bytes(text: str) -> Optional[int]:
    """'32K' -> 32768, '32768K', '1M', '512' (bytes); None for anything else."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (text[:-1], text[-1]) if text[-1:] in SIZE_UNITS and text[-1:] else (text, "")
    return int(number) * SIZE_UNITS[unit] if number.isdigit() else None


def _sysfs_field(path: Path) -> str:
    """One sysfs attribute's text, stripped; empty when the file does not exist."""
    return path.read_text(encoding="ascii").strip() if path.is_file() else ""


def cache_sizes(directory: Path = CPU_CACHE_DIR) -> dict:
    """The CPU caches one core sees, as the kernel lists them (Linux sysfs): {source, levels, largest_bytes, note}.

    levels: [{level, type, bytes, size, shared_cpu_list}] in the kernel's order; largest_bytes the biggest
    data or unified level. Elsewhere, or when the folder cannot be read, levels is empty and largest_bytes
    "unknown".
    """
    directory, levels = Path(directory), []
    try:
        for index in sorted(directory.glob("index*")):
            fields = {name: _sysfs_field(index / name) for name in ("level", "type", "size", "shared_cpu_list")}
            levels.append({"level": int(fields["level"]) if fields["level"].isdigit() else fields["level"] or None,
                           "type": fields["type"] or None, "bytes": _size_bytes(fields["size"]),
                           "size": fields["size"] or None, "shared_cpu_list": fields["shared_cpu_list"] or None})
    except (OSError, ValueError) as error:
        return {"source": str(directory), "levels": [], "largest_bytes": "unknown",
                "note": f"the cache sizes could not be read: {error}"}
    data = [entry["bytes"] for entry in levels if entry["type"] != "Instruction" and isinstance(entry["bytes"], int)]
    if not data:
        return {"source": str(directory), "levels": levels, "largest_bytes": "unknown",
                "note": f"{directory} lists no cache size on this machine, so the cache sizes are unknown"}
    return {"source": str(directory), "levels": levels, "largest_bytes": max(data),
            "note": "as the kernel lists them for cpu0; a level may be shared with other cores (shared_cpu_list)"}
