"""What the manifest says about the machine, the installed software and the suite's own source, read from the
running environment itself (never from a note the installer left): docs/environment.md."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from packaging.specifiers import InvalidSpecifier, Specifier
from packaging.utils import canonicalize_name

from inferlab.files import sha256_file
from inferlab.host.machine import cpu_model

REFERENCE_ENVIRONMENT = {"python": "CPython 3.13.13", "transformers": "4.57.1"}
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                   "NUMEXPR_NUM_THREADS", "TORCH_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# The settings, read once before the first kernel runs, that choose the code paths a CPU computes with: torch's kernel
# set, MKL's reproducibility mode and instruction limit, oneDNN's ISA limit.
KERNEL_ENV_VAR = "ATEN_CPU_CAPABILITY"
KERNEL_ENV_VARS = (KERNEL_ENV_VAR, "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
SOURCE_GLOBS = ("inferlab/**/*.py", "experiments/**/*.py", "analytic_tests/**/*.py", "tests/**/*.py",
                "benchmarks/**/*.py", "artifacts/*.json", "conftest.py", "pytest.ini", "Makefile",
                "requirements.in", "requirements.lock", "predictions.md", ".ci/run", "pyproject.toml",
                "explanation.md", "inferlab/**/*.toml")
LOCK_FILE = "requirements.lock"
PYTHON_LINE = "# python:"  # the lock's line naming the Python it was made with
NOT_LOCKED = ("inferlab", "pip", "setuptools", "wheel")  # the project (editable) and what `python -m venv` brings


def installed_distributions() -> dict:
    """Every installed distribution and its version, sorted by name."""
    versions = {dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions()
                if dist.metadata["Name"]}
    return dict(sorted(versions.items(), key=lambda item: item[0].lower()))


def git_state(root: Path) -> dict:
    """The commit and dirty flag when run from a git checkout; nulls and a note otherwise."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None, "note": head.stderr.strip() or "not a git checkout"}
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError) as error:
        return {"commit": None, "dirty": None, "note": f"git unavailable: {error}"}


def source_hashes(root: Path) -> dict:
    """SHA-256 of every source file of the suite, keyed by path relative to the root."""
    return dict(sorted((path.relative_to(root).as_posix(), sha256_file(path)) for pattern in SOURCE_GLOBS
                       for path in root.glob(pattern) if path.is_file() and "__pycache__" not in path.parts))


def torch_threads(requested: Optional[dict]) -> dict:
    """Requested and effective torch thread counts; effective only once torch is imported."""
    torch = sys.modules.get("torch")
    effective = None if torch is None else {"intra_op": torch.get_num_threads(),
                                            "inter_op": torch.get_num_interop_threads()}
    return {"requested": requested, "effective": effective}


def _build_from_metadata(version: str) -> tuple[Optional[bool], str]:
    """(cpu_only, how that is known) from the installed torch distribution alone, without importing it."""
    if version.endswith("+cpu"):
        return True, "its version carries the +cpu label"
    gpu = sorted({line.split(";")[0].split()[0] for line in importlib.metadata.requires("torch") or []
                  if line.lower().startswith(("nvidia-", "triton"))})
    if gpu:
        return False, f"its metadata requires {', '.join(gpu[:3])}"
    return None, "no +cpu label and no GPU packages required"


def deviations(distributions: dict) -> list[str]:
    """Differences between this environment and the protocol's reference, stated plainly."""
    found = []
    python = f"{platform.python_implementation()} {platform.python_version()}"
    if python != REFERENCE_ENVIRONMENT["python"]:
        found.append(f"Python is {python}; the protocol's reference is {REFERENCE_ENVIRONMENT['python']}")
    transformers = distributions.get("transformers")
    if transformers != REFERENCE_ENVIRONMENT["transformers"]:
        found.append(f"transformers is {transformers}; the interface reference is "
                     f"{REFERENCE_ENVIRONMENT['transformers']}")
    torch = distributions.get("torch")
    if torch is not None:
        # From the distribution alone, so that the text is the same before torch is imported and after.
        cpu_only, how = _build_from_metadata(torch)
        kind = {True: "a CPU-only build", False: "NOT a CPU-only build"}.get(cpu_only, "build unknown")
        found.append(f"torch {torch} ({kind}; {how}): this lab tested 2.13.0+cpu; the protocol names no torch "
                     f"version, so it is recorded rather than compared")
    return found


def torch_build() -> dict:
    """Which torch is installed: CPU-only or not and how that is known (the imported build's own answer once torch
    is imported), the wheel's URL where pip installed it from a file or URL (direct_url.json), its CPU kernels."""
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return {"version": None, "cpu_only": None, "how_known": "torch is not installed",
                "cuda": None, "installed_from": None, "cpu_kernels": None}
    version, cuda = dist.version, None
    cpu_only, how = _build_from_metadata(dist.version)
    if "torch" in sys.modules:  # its own word: PyPI's CUDA wheel says 2.13.0+cu130 where its metadata says 2.13.0
        torch = sys.modules["torch"]
        cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
        version, cpu_only = torch.__version__, cuda is None and hip is None
        how = f"torch.version.cuda={cuda!r}, torch.version.hip={hip!r}"
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    return {"version": version, "cpu_only": cpu_only, "how_known": how, "cuda": cuda,
            "installed_from": direct.get("url"), "cpu_kernels": cpu_kernels()}


def cpu_kernels() -> Optional[dict]:
    """Which CPU kernels this torch uses here, asked of torch once imported (None before): the kernel set it
    dispatches to, the settings that choose it (env_NAME), MKL and oneDNN. Two machines' logits differ by rounding
    when these differ."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    found: dict = {"env_" + name: os.environ.get(name) for name in KERNEL_ENV_VARS}
    for name, ask in (("capability", lambda: torch.backends.cpu.get_cpu_capability()),
                      ("mkl_available", lambda: bool(torch.backends.mkl.is_available())),
                      ("mkldnn_available", lambda: bool(torch.backends.mkldnn.is_available()))):
        try:
            found[name] = ask()
        except (AttributeError, RuntimeError):  # a build without that backend
            found[name] = None
    return found


def typed_command(orig_argv: Optional[Sequence[str]], argv: Sequence[str], invocation_args: Sequence[str],
                  invocation_dir: Path) -> tuple[str, str]:
    """The command as the learner typed it, and how it was reconstructed.

    orig_argv is the interpreter's own command line (sys.orig_argv); argv is sys.argv, whose first entry is pytest's
    __main__.py or its console script. The launcher is what orig_argv holds before argv's arguments; the arguments
    are the ones pytest actually received.
    """
    args = list(invocation_args)
    tail = len(argv) - 1
    if orig_argv and list(orig_argv[len(orig_argv) - tail:]) == list(argv[1:]) == args:
        launcher = list(orig_argv[:len(orig_argv) - tail])
        # A console script runs as "<python> <venv>/bin/pytest": the learner typed the script.
        if len(launcher) == 2 and Path(launcher[1]).name in ("pytest", "py.test") and "-m" not in launcher:
            script = launcher[1]
            launcher = [os.path.relpath(script, invocation_dir) if Path(script).is_absolute() else script]
        return shlex.join(launcher + args), "sys.orig_argv (the interpreter's command line)"
    return shlex.join(["python", "-m", "pytest", *args]), (
        "pytest.main() was called in-process, so the launcher is not known; these are the arguments it received")


def lock_check(lock: Path, distributions: dict, python_version: str) -> dict:
    """The installed distributions against the lock, and this Python against the lock's `# python:` line.

    differences: one {name, locked, installed} per pin not installed at its version (installed None: missing), per
    installed distribution the lock does not pin (locked None), and for python when the lock names another.
    "At its version" is pip's reading of NAME==VERSION, so a local label (torch's +cpu) is no difference. The
    project itself and pip's own bootstrap packages are not compared.
    """
    check = {"file": lock.name, "found": lock.is_file(), "pins": 0, "python_locked": None,
             "python_running": python_version, "differences": [], "not_compared": sorted(NOT_LOCKED)}
    if not check["found"]:
        return check
    pins = {}
    try:
        for number, line in enumerate(lock.read_text(encoding="utf-8").splitlines(), start=1):
            if line.startswith(PYTHON_LINE):
                check["python_locked"] = line[len(PYTHON_LINE):].strip() or None
            name, equals, version = line.split("#", 1)[0].strip().partition("==")
            if name and not (equals and version):
                raise ValueError(f"line {number}: expected NAME==VERSION, actual {line!r}")
            if name:
                pins[canonicalize_name(name)] = (name.strip(), version.strip(), Specifier(f"=={version.strip()}"))
    except (OSError, UnicodeDecodeError, ValueError, InvalidSpecifier) as error:
        return {**check, "error": f"{lock.name}: {error}"}
    installed = {canonicalize_name(name): (name, version) for name, version in distributions.items()
                 if canonicalize_name(name) not in NOT_LOCKED}
    for key in sorted(pins.keys() | installed.keys()):
        pin, have = pins.get(key), installed.get(key)
        if pin is None or have is None or not pin[2].contains(have[1], prereleases=True):
            check["differences"].append({"name": (pin or have)[0], "locked": pin and pin[1],
                                         "installed": have and have[1]})
    if check["python_locked"] != python_version:
        check["differences"].append({"name": "python", "locked": check["python_locked"], "installed": python_version})
    return {**check, "pins": len(pins)}


def environment_record(root: Path) -> dict:
    """Everything the manifest records about the environment (torch's threads and build are added by the caller)."""
    distributions, lock = installed_distributions(), root / LOCK_FILE
    threads = {name: os.environ.get(name) for name in THREAD_ENV_VARS}
    platform_facts = {  # Python, operating system, kernel, architecture and CPU
        "python_version": platform.python_version(), "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable, "os": platform.system(), "os_release": platform.release(),
        "kernel": platform.version(), "libc": " ".join(platform.libc_ver()).strip(), "machine": platform.machine(),
        "cpu_model": cpu_model(), "logical_cpus": os.cpu_count()}
    return {"platform": platform_facts, "distributions": distributions,
            "requirements_lock_sha256": sha256_file(lock) if lock.is_file() else None,
            "lock_check": lock_check(lock, distributions, platform.python_version()), "git": git_state(root),
            "source_sha256": source_hashes(root), "thread_environment": threads,
            "deviations_from_reference": deviations(distributions)}


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two environment records, one line per changed field (source files by name)."""
    found = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            names = sorted(str(name) for name in old.keys() | new.keys() if old.get(name) != new.get(name))
            found.append(f"{key}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}")
        else:
            found.append(f"{key}: {old!r} -> {new!r}")
    return found
