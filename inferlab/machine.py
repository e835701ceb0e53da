"""This machine's fingerprint, and the benchmark results (benchmarks/overhead.py) recorded under it.

benchmarks/overhead.py appends one JSON line per run to benchmarks/results.jsonl with the fingerprint
of the machine it ran on. An experiment run looks there for the latest result from its own machine, so
the report can quote it, or say plainly that this machine has none.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Optional

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = PROJECT_ROOT / "benchmarks" / "results.jsonl"
CPUINFO = Path("/proc/cpuinfo")


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


def _display(path: Path) -> str:
    try:
        return path.resolve().relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return str(path)


def benchmark_reference(path: Path = RESULTS_FILE, fingerprint: Optional[dict] = None) -> dict:
    """The benchmark_reference record's fields: {found, file, machine, result, note}.

    result is the latest result whose machine equals this machine's fingerprint; file is null when the
    results file does not exist.
    """
    path = Path(path)
    fingerprint = machine_fingerprint() if fingerprint is None else fingerprint
    if not path.is_file():
        return {"found": False, "file": None, "machine": fingerprint, "result": None,
                "note": f"no benchmark results file ({_display(path)}): benchmarks/overhead.py has not been run "
                        f"here, so no full overhead comparison exists for this machine"}
    results = read_results(path)
    mine = [r for r in results if r.get("machine") == fingerprint]
    if not mine:
        return {"found": False, "file": _display(path), "machine": fingerprint, "result": None,
                "note": f"{len(results)} result(s) in {_display(path)}, none recorded on a machine with this "
                        f"fingerprint (OS, architecture, CPU model, CPU count); run "
                        f"python -m benchmarks.overhead here for the full overhead comparison"}
    return {"found": True, "file": _display(path), "machine": fingerprint, "result": mine[-1],
            "note": f"the latest of {len(mine)} result(s) recorded on a machine with this fingerprint (OS, "
                    f"architecture, CPU model, CPU count; not necessarily this very machine) in {_display(path)}, recorded "
                    f"{mine[-1].get('recorded_utc', 'at an unrecorded time')}; it may come from other software "
                    f"versions (see result.software)"}
