"""This machine: its CPU, its fingerprint, its caches and its load now; and the file benchmark results are appended to
(runs/benchmarks/overhead.jsonl, git-ignored, unless a benchmark's --record-to names another: docs/environment.md).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Optional

from inferlab.files import PROJECT_ROOT

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


def benchmark_figures() -> dict:
    """What a run quotes of the tracked benchmark results, as another run's figures (with their date, commit and
    machine), never this run's: the newest overhead result that measured the per-forward hook; {"found": False,
    "reason"} without one."""
    try:
        text = TRACKED_RESULTS_FILE.read_text(encoding="utf-8")
        results = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError) as error:
        return {"found": False, "reason": f"{TRACKED_RESULTS_FILE.name}: {error}"}
    overhead = [r for r in results if isinstance(r, dict) and isinstance(r.get("hook"), dict)]
    if not overhead:
        return {"found": False, "reason": f"{TRACKED_RESULTS_FILE.name}: no result measured the per-forward hook"}
    newest, paired = overhead[-1], overhead[-1].get("paired") or {}
    return {"found": True, "file": str(TRACKED_RESULTS_FILE.relative_to(PROJECT_ROOT)),
            "whose": "another run's: benchmarks/overhead.py, not this run",
            "recorded_utc": newest.get("recorded_utc"), "commit": (newest.get("git") or {}).get("commit"),
            "machine": newest.get("machine"), "rounds": newest.get("rounds"),
            "instrumented_over_bare": paired.get("overhead"), "instrumented_interval": paired.get("interval")}


def cache_sizes(directory: Path = CPU_CACHE_DIR) -> dict:
    """The CPU caches one core sees, as Linux lists them: {source, levels: [{level, type, size, bytes}],
    largest_bytes (of a data or unified level), note}; no levels and largest_bytes "unknown" where none is listed."""
    levels = []
    try:
        for index in sorted(Path(directory).glob("index*")):
            level, kind, size = ((index / name).read_text(encoding="ascii").strip()
                                 for name in ("level", "type", "size"))
            number, unit = (size[:-1], SIZE_UNITS[size[-1]]) if size[-1:] in SIZE_UNITS else (size, 1)  # '32K'
            levels.append({"level": int(level) if level.isdigit() else level, "type": kind, "size": size,
                           "bytes": int(number) * unit if number.isdigit() else None})
    except (OSError, ValueError) as error:
        return {"source": str(directory), "levels": [], "largest_bytes": "unknown",
                "note": f"the cache sizes could not be read: {error}"}
    data = [entry["bytes"] for entry in levels if entry["type"] != "Instruction" and entry["bytes"] is not None]
    if not data:
        return {"source": str(directory), "levels": levels, "largest_bytes": "unknown",
                "note": f"{directory} lists no cache size here, so the cache sizes are unknown"}
    return {"source": str(directory), "levels": levels, "largest_bytes": max(data),
            "note": "as Linux lists them for cpu0; a level may be shared with other cores"}


# --- its load now, around the timing block (each reading said unavailable, with why, never made up) -----------------

PROC = Path("/proc")
CPU_SYS = Path("/sys/devices/system/cpu")
MACHINE_READINGS = ("load_average", "running_processes", "cpu_pressure", "cpu_frequency", "affinity")


def _read(path: Path) -> tuple[Optional[str], Optional[str]]:
    try:
        return path.read_text(encoding="utf-8", errors="replace"), None
    except OSError as error:
        return None, f"{path}: {type(error).__name__}: {error.strerror or error}"


def _unavailable(reason: str) -> dict:
    return {"available": False, "reason": reason}


def _load_average() -> dict:
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError) as error:
        return _unavailable(f"os.getloadavg: {type(error).__name__}: {error}")
    return {"available": True, "1m": one, "5m": five, "15m": fifteen, "source": "os.getloadavg"}


def _running_processes() -> dict:
    text, problem = _read(PROC / "loadavg")
    fields = (text or "").split()
    running, _, total = fields[3].partition("/") if len(fields) >= 4 else ("", "", "")
    if running.isdigit() and total.isdigit():
        return {"available": True, "running": int(running), "total": int(total),
                "source": "/proc/loadavg (running/total scheduling entities, this process included)"}
    return _unavailable(problem or "/proc/loadavg holds no running count")


def _cpu_pressure() -> dict:
    text, problem = _read(PROC / "pressure" / "cpu")
    if text is None:
        return _unavailable(f"no CPU pressure information ({problem})")
    parsed = {}
    for kind, *pairs in (line.split() for line in text.splitlines() if line.strip()):
        values = dict(pair.partition("=")[::2] for pair in pairs)
        try:
            parsed[kind] = {key: int(value) if key == "total" else float(value) for key, value in values.items()}
        except ValueError:
            continue
    if "some" not in parsed:
        return _unavailable(f"{PROC / 'pressure' / 'cpu'}: no 'some' line in {text!r}")
    return {"available": True, **parsed,
            "source": "/proc/pressure/cpu (share of time some runnable task waited for a CPU; total in µs)"}


def _cpu_frequency() -> dict:
    found = {}
    for folder in sorted(CPU_SYS.glob("cpu[0-9]*/cpufreq")):
        text, _ = _read(folder / "scaling_cur_freq")
        if text is not None and text.strip().isdigit():
            found[folder.parent.name] = int(text.strip()) / 1000
    if found:
        return {"available": True, "mhz": found, "source": f"{CPU_SYS}/cpu*/cpufreq/scaling_cur_freq"}
    # /proc/cpuinfo's 'cpu MHz' is no substitute: on a virtual machine it is the nominal rate, not a reading
    return _unavailable(f"no {CPU_SYS}/cpu*/cpufreq/scaling_cur_freq to read")


def _affinity() -> dict:
    try:
        return {"available": True, "cpus": sorted(os.sched_getaffinity(0)), "source": "os.sched_getaffinity"}
    except (AttributeError, OSError) as error:
        return _unavailable(f"os.sched_getaffinity: {type(error).__name__}: {error}")


def machine_state() -> dict:
    """The machine now: each reading with `available` and its source, or the reason it is unavailable."""
    return {"read_at_ns": time.perf_counter_ns(), "load_average": _load_average(),
            "running_processes": _running_processes(), "cpu_pressure": _cpu_pressure(),
            "cpu_frequency": _cpu_frequency(), "affinity": _affinity(), "cpu_count": os.cpu_count()}


def unexplained_readings(state: dict) -> list[str]:
    """The machine readings that are neither available nor said unavailable with a reason."""
    return [name for name in MACHINE_READINGS if not isinstance(state.get(name), dict)
            or not (state[name].get("available") is True or state[name].get("reason"))]


def pressure_between(before: dict, after: dict) -> Optional[float]:
    """The share of the time between two machine_state readings in which some task waited for a CPU, or None."""
    try:
        stalled_us = after["cpu_pressure"]["some"]["total"] - before["cpu_pressure"]["some"]["total"]
        wall_us = (after["read_at_ns"] - before["read_at_ns"]) / 1e3
    except (KeyError, TypeError):
        return None
    return stalled_us / wall_us if wall_us > 0 else None
