"""Install requirements.lock into this Python environment, with a CPU-only build of torch wherever one exists.

    .venv/bin/python -m inferlab.host.installation --lock requirements.lock --editable .

Run it with the virtual environment's own Python (the Makefile does). Two steps, and a third with --editable:

1) torch alone (--no-deps), from PyTorch's CPU wheel index, with a short timeout and no retries.
   pip still consults any extra index or find-links the machine's pip configuration names.
2) the whole lock, from the default package index, so every other package comes at its pinned
   version. When step 1 installed torch, the lock's `torch==X` line is already satisfied (a local
   label such as +cpu does not break `==X`).
3) with --editable DIR, the project itself (pyproject.toml), editable and with --no-deps: the lock already
   holds its dependencies at their pinned versions, so this adds only the `inferlab` distribution and its
   console script. That distribution (PROJECT_DISTRIBUTION) is the one installed package the lock does not pin.

When the CPU index cannot be reached, step 2 installs torch from the default index instead, and one line
says so and names the packages that build brought beyond the lock's pins (PyPI's torch for Linux is a CUDA
build with nvidia-*, cuda-* and triton), and whether they are exactly the lock's known variant: the lock's
header lists that variant's pins (`# variant torch-cuda: NAME==VERSION`), so that such an environment is
checked exactly rather than called wrong. What happened, and the URL the torch wheel came from (from pip's
installation report), is written to <venv>/inferlab-install.json, which the manifest reads.

Standard library only (and inferlab.base.outputs, which is too): it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from inferlab.base.outputs import write_text_atomic

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
RECORD_FILE = "inferlab-install.json"
TIMEOUT_S = 10
# The lock's header line that names the Python it was made with, as data: "# python: 3.11.7".
PYTHON_HEADER = "# python:"
# A header line that pins one package of a known variant of the environment, as data:
# "# variant torch-cuda: nvidia-cublas==13.1.1.3". A variant counts only when every one of its pins is installed.
VARIANT_HEADER = re.compile(r"^# variant ([A-Za-z0-9][A-Za-z0-9._-]*): *(\S+)\s*$")
BOOTSTRAP = ("pip", "setuptools", "wheel")  # what `python -m venv` brings; never pinned in the lock
PROJECT_DISTRIBUTION = "inferlab"  # the project itself (installed editable): never pinned, never a difference
NOT_LOCKED = (*BOOTSTRAP, PROJECT_DISTRIBUTION)


def torch_requirement(lock_text: str) -> str:
    """The lock's torch line ('torch==2.13.0'); ValueError when the lock pins no torch."""
    for line in lock_text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.lower().startswith("torch=="):
            return line
    raise ValueError("the lock has no 'torch==VERSION' line")


def normalized_name(name: str) -> str:
    """A distribution's name as the package index compares names (PEP 503): 'Huggingface_Hub' -> 'huggingface-hub'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pin(line: str, number: int) -> tuple[str, str]:
    name, separator, version = line.partition("==")
    if not separator or not name.strip() or not version.strip():
        raise ValueError(f"line {number}: expected NAME==VERSION, actual {line!r}")
    return name.strip(), version.strip()


def read_lock(text: str) -> dict:
    """The lock as data: {"pins": {normalized name: (name, version)}, "python": the version its header names or
    None, "variants": {variant: {normalized name: (name, version)}} from its `# variant NAME: PIN` lines}.
    ValueError names the line of a requirement that is not NAME==VERSION."""
    pins, python, variants = {}, None, {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.startswith(PYTHON_HEADER):
            python = raw[len(PYTHON_HEADER):].strip() or None
        variant = VARIANT_HEADER.match(raw)
        if variant:
            name, version = _pin(variant.group(2), number)
            variants.setdefault(variant.group(1), {})[normalized_name(name)] = (name, version)
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, version = _pin(line, number)
        pins[normalized_name(name)] = (name, version)
    return {"pins": pins, "python": python, "variants": variants}


def unpinned(locked: dict, distributions: dict) -> dict:
    """{normalized name: (name, version)} of the installed distributions the lock does not pin (pip's bootstrap
    and the project itself aside)."""
    found = {}
    for name, version in distributions.items():
        key = normalized_name(name)
        if key not in locked["pins"] and key not in NOT_LOCKED:
            found[key] = (name, version)
    return found


def matching_variant(locked: dict, extra: dict) -> Optional[str]:
    """The lock's variant whose pins are exactly the installed unpinned distributions `extra` (every one of them,
    each at its version, nothing more), or None."""
    have = {key: version for key, (_, version) in extra.items()}
    for variant, pins in sorted(locked.get("variants", {}).items()):
        if have and have == {key: version for key, (_, version) in pins.items()}:
            return variant
    return None


def extra_line(locked: dict, distributions: dict) -> Optional[str]:
    """What the environment holds beyond the lock's pins, said in a few words, or None when nothing."""
    extra = unpinned(locked, distributions)
    if not extra:
        return None
    names = ", ".join(f"{name}=={version}" for name, version in sorted(extra.values(), key=lambda p: p[0].lower()))
    variant = matching_variant(locked, extra)
    verdict = (f"exactly the lock's known variant '{variant}'" if variant else
               "not a variant the lock lists, so the lock check will name them")
    return f"{len(extra)} package(s) the lock does not pin came with it: {names} ({verdict})"


def lock_text(frozen: list[str], python_version: str, comments: list[str]) -> str:
    """A lock's text: its comment lines (any old python line replaced), the python line, then the frozen pins
    in pip's order, torch without the +cpu local label so that the same line resolves to each platform's build. A
    package of a variant the comments list (`# variant NAME: PIN`) stays in its variant line, never a pin."""
    kept = [line for line in comments if line.startswith("#") and not line.startswith(PYTHON_HEADER)]
    in_variant = {key for pins in read_lock("\n".join(kept))["variants"].values() for key in pins}
    pins = [re.sub(r"^(torch==[^+\s]+)\+cpu$", r"\1", line.strip()) for line in frozen if line.strip()
            and not line.startswith("#") and normalized_name(line.split("==")[0].strip()) not in in_variant]
    return "\n".join([*kept, f"{PYTHON_HEADER} {python_version}", *pins]) + "\n"


def write_lock(lock: Path) -> Path:
    """Re-pin the lock from this environment (pip freeze, editable installs such as the project itself left out),
    with the running Python's version as its python line; replaced atomically."""
    import platform

    lock = Path(lock)
    comments = lock.read_text(encoding="utf-8").splitlines() if lock.is_file() else []
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    frozen = [line for line in frozen if normalized_name(line.split("==")[0]) not in NOT_LOCKED]
    write_text_atomic(lock, lock_text(frozen, platform.python_version(), comments))
    return lock


def installed_from_report(report_path: Path, name: str = "torch") -> Optional[dict]:
    """{version, download_url} of `name` in a pip --report file, or None if pip installed no such package."""
    try:
        report = json.loads(Path(report_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for item in report.get("install") or []:
        metadata = item.get("metadata") or {}
        if str(metadata.get("name", "")).lower() == name:
            return {"version": metadata.get("version"), "download_url": (item.get("download_info") or {}).get("url")}
    return None


def pip_install(args: list[str], report_path: Path) -> subprocess.CompletedProcess:
    """pip install ARGS --report REPORT with this interpreter; output captured and returned."""
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--report", str(report_path),
               *args]
    return subprocess.run(command, capture_output=True, text=True)


def _installed_distributions() -> dict:
    """{name: version} of every distribution installed in this environment now."""
    import importlib

    importlib.invalidate_caches()  # pip just installed into this environment from another process
    import importlib.metadata

    return {dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions() if dist.metadata["Name"]}


def _installed(name: str) -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def install(lock: Path, cpu_index: str = CPU_INDEX, timeout_s: int = TIMEOUT_S, quiet: bool = True,
            editable: Optional[Path] = None) -> dict:
    """Install the lock into this environment (CPU torch first), then the project at `editable` (if given);
    returns the record it also writes."""
    lock = Path(lock)
    lock_text = lock.read_text(encoding="utf-8")
    requirement = torch_requirement(lock_text)
    record_path = Path(sys.prefix) / RECORD_FILE
    previous = {}
    if record_path.is_file():
        try:
            previous = json.loads(record_path.read_text(encoding="utf-8")).get("torch") or {}
        except ValueError:
            previous = {}
    quiet_args = ["--quiet"] if quiet else []
    with tempfile.TemporaryDirectory() as scratch:
        cpu_report, lock_report = Path(scratch) / "cpu.json", Path(scratch) / "lock.json"
        # 1) torch from the CPU index: a short timeout and no retries, so an unreachable index costs seconds.
        cpu = pip_install([*quiet_args, "--no-deps", "--index-url", cpu_index, "--timeout", str(timeout_s),
                           "--retries", "0", requirement], cpu_report)
        # 2) the whole lock, from the default index.
        everything = pip_install([*quiet_args, "-r", str(lock)], lock_report)
        sys.stdout.write(everything.stdout)
        sys.stderr.write(everything.stderr)
        came_with = None
        if cpu.returncode != 0:
            came_with = extra_line(read_lock(lock_text), _installed_distributions())
            print(f"inferlab: PyTorch's CPU wheel index ({cpu_index}) gave no {requirement} for this machine "
                  f"(unreachable, or no such wheel); torch now comes from your default package index"
                  f"{'; ' + came_with if came_with else ''} (see docs/environment.md, 'CPU-only torch').", flush=True)
        from_cpu, from_default = installed_from_report(cpu_report), installed_from_report(lock_report)
        project = None
        if editable is not None and everything.returncode == 0:
            # 3) the project, editable, nothing else: --no-deps, because the lock brought every dependency.
            project = pip_install([*quiet_args, "--no-deps", "--editable", str(editable)],
                                  Path(scratch) / "project.json")
            sys.stdout.write(project.stdout)
            sys.stderr.write(project.stderr)
    # The route names the step; download_url names the source (the CPU index, or a local source that
    # the machine's pip configuration adds, such as find-links).
    if cpu.returncode == 0 and from_cpu is not None:
        route, torch = "cpu_index_step", from_cpu
    elif from_default is not None:
        route, torch = ("default_index_fallback" if cpu.returncode != 0 else "default_index_step"), from_default
    else:  # neither step installed torch: it was there before (where from is known only if recorded then)
        route, torch = "already_installed", {"version": previous.get("installed_version") or _installed("torch"),
                                             "download_url": previous.get("download_url")}
    record = {
        "written_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lock": str(lock),
        "lock_sha256": hashlib.sha256(lock_text.encode("utf-8")).hexdigest(),
        "lock_install_returncode": everything.returncode,
        "project": None if project is None else {
            "distribution": PROJECT_DISTRIBUTION, "editable": str(Path(editable).resolve()),
            "returncode": project.returncode, "output_tail": _tail(project.stdout + project.stderr)},
        "torch": {
            "requirement": requirement,
            "route": route,
            "installed_version": torch.get("version"),
            "download_url": torch.get("download_url"),
            "earlier_route": previous.get("route") if route == "already_installed" else None,
            "beyond_the_lock": came_with,
            "cpu_index": cpu_index,
            "cpu_index_attempt": {"ok": cpu.returncode == 0, "returncode": cpu.returncode,
                                  "output_tail": _tail(cpu.stdout + cpu.stderr)},
        },
    }
    if install_returncode(record) == 0:
        write_record(record_path, record)
    return record


def install_returncode(record: dict) -> int:
    """The installer's exit status: pip's for the lock, else pip's for the project (0 when both succeeded)."""
    return record["lock_install_returncode"] or (record["project"] or {}).get("returncode") or 0


def write_record(path: Path, record: dict) -> None:
    """Write the install record atomically (a temporary sibling, fsynced, then os.replace), so that an
    interrupted install leaves the previous record or the new one, never a torn file."""
    write_text_atomic(path, json.dumps(record, indent=2) + "\n")


def main(argv=None) -> int:
    """Command line: install the lock; exit with pip's status for the lock."""
    # Spelled as the Makefile runs it; not through inferlab.base.commands.spelled, so the installer needs no other
    # module.
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m inferlab.host.installation",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=Path("requirements.lock"), help="the lock file")
    parser.add_argument("--cpu-index", default=CPU_INDEX, help=f"PyTorch's CPU wheel index (default {CPU_INDEX})")
    parser.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds pip waits for the CPU index")
    parser.add_argument("--editable", type=Path, default=None, metavar="DIR",
                        help="then install the project in DIR (its pyproject.toml) editable, without dependencies")
    parser.add_argument("--verbose", action="store_true", help="show pip's own output")
    parser.add_argument("--write-lock", action="store_true",
                        help="instead of installing, re-pin --lock from this environment (pip freeze, editable "
                             "installs left out) with this Python's version as its '# python:' line")
    args = parser.parse_args(argv)
    if args.write_lock:
        print(f"inferlab: wrote {write_lock(args.lock)}")
        return 0
    record = install(args.lock, args.cpu_index, args.timeout, quiet=not args.verbose, editable=args.editable)
    torch = record["torch"]
    source = f" from {torch['download_url']}" if torch["download_url"] else ""
    print(f"inferlab: torch {torch['installed_version']} ({torch['route'].replace('_', ' ')}){source}")
    project = record["project"]
    if project is not None and project["returncode"] == 0:
        print(f"inferlab: the project is installed editable from {project['editable']}: "
              f"{Path(sys.prefix) / 'bin' / 'inferlab'} is its command")
    elif project is not None:
        print(f"inferlab: installing the project from {project['editable']} failed (pip exit "
              f"{project['returncode']}):\n{project['output_tail']}", file=sys.stderr)
    return install_returncode(record)


if __name__ == "__main__":
    sys.exit(main())
