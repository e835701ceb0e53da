"""What the manifest says about the machine, the software and the suite's own source."""

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

from inferlab.base.records import sha256_file

REFERENCE_ENVIRONMENT = {
    "python": "CPython 3.13.13",
    "transformers": "4.57.1",
}
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TORCH_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
)
SOURCE_GLOBS = ("inferlab/**/*.py", "experiments/**/*.py", "analytic_tests/**/*.py", "tests/**/*.py",
                "benchmarks/**/*.py", "artifacts/*.json", "conftest.py", "pytest.ini", "Makefile",
                "requirements.in", "requirements.lock", "predictions.md", ".ci/run", "pyproject.toml",
                "explanation.md", "inferlab/**/*.toml")


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or platform.processor() elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def platform_record() -> dict:
    """Python, operating system, kernel, architecture and CPU."""
    return {
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "os": platform.system(),
        "os_release": platform.release(),
        "kernel": platform.version(),
        "libc": " ".join(platform.libc_ver()).strip(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
    }


def installed_distributions() -> dict:
    """Every installed distribution and its version, sorted by name."""
    versions = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            versions[name] = dist.version
    return dict(sorted(versions.items(), key=lambda item: item[0].lower()))


def git_state(root: Path) -> dict:
    """The commit and dirty flag when run from a git checkout; nulls otherwise."""
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
    hashes = {}
    for pattern in SOURCE_GLOBS:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                hashes[path.relative_to(root).as_posix()] = sha256_file(path)
    return dict(sorted(hashes.items()))


def thread_environment() -> dict:
    """Threading-related environment variables, null where unset."""
    return {name: os.environ.get(name) for name in THREAD_ENV_VARS}


def torch_threads(requested: dict | None) -> dict:
    """Requested and effective torch thread counts; effective only once torch is imported."""
    effective = None
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        effective = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    return {"requested": requested, "effective": effective}


def deviations(distributions: dict) -> list[str]:
    """Differences between this environment and the protocol's reference, stated plainly."""
    found = []
    python = f"{platform.python_implementation()} {platform.python_version()}"
    if python != REFERENCE_ENVIRONMENT["python"]:
        found.append(f"Python is {python}; the protocol's reference is {REFERENCE_ENVIRONMENT['python']}")
    transformers_version = distributions.get("transformers")
    if transformers_version != REFERENCE_ENVIRONMENT["transformers"]:
        found.append(
            f"transformers is {transformers_version}; the interface reference is {REFERENCE_ENVIRONMENT['transformers']}"
        )
    torch_version = distributions.get("torch")
    if torch_version is not None:
        # From the distribution alone, so the text is the same at session start (torch not yet imported) and
        # at its end; torch_build() in the manifest adds what the imported build itself says.
        cpu_only, how = _build_from_metadata(torch_version.split("+", 1)[1] if "+" in torch_version else None)
        kind = {True: "a CPU-only build", False: "NOT a CPU-only build"}.get(cpu_only, "build unknown")
        found.append(
            f"torch {torch_version} ({kind}; {how}): this lab tested 2.13.0+cpu; the protocol names "
            f"no torch version, so it is recorded rather than compared"
        )
    return found


INSTALL_RECORD_FILE = "inferlab-install.json"  # written into the venv by `python -m inferlab.host.installation`


def install_record(prefix: Optional[str] = None) -> Optional[dict]:
    """What inferlab.host.installation recorded when it built this environment, or None (built another way)."""
    path = Path(prefix or sys.prefix) / INSTALL_RECORD_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _build_from_metadata(local_label: Optional[str]) -> tuple[Optional[bool], str]:
    """(cpu_only, how known) from the installed distribution alone, without importing torch."""
    if local_label == "cpu":
        return True, "its version carries the +cpu label"
    requires = importlib.metadata.requires("torch") or []
    gpu = sorted({r.split()[0].split(";")[0] for r in requires if r.lower().startswith(("nvidia-", "triton"))})
    if gpu:
        return False, f"its metadata requires {', '.join(gpu[:3])}"
    return None, "no +cpu label and no GPU packages required"


def torch_build() -> dict:
    """Which torch build is installed (CPU-only or not, and how that is known) and where it came from."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return {"version": None, "local_label": None, "cpu_only": None, "how_known": "torch is not installed",
                "cuda": None, "installed_from": None, "install_route": None, "cpu_kernels": None}
    local_label = version.split("+", 1)[1] if "+" in version else None
    cpu_only, how = _build_from_metadata(local_label)
    cuda = None
    if "torch" in sys.modules:  # imported by the run: the build itself says, and it overrides the metadata
        torch_version = sys.modules["torch"].version
        cuda, hip = getattr(torch_version, "cuda", None), getattr(torch_version, "hip", None)
        cpu_only, how = cuda is None and hip is None, f"torch.version.cuda={cuda!r}, torch.version.hip={hip!r}"
    record = install_record() or {}
    torch_install = record.get("torch") or {}
    return {
        "version": version,
        "local_label": local_label,
        "cpu_only": cpu_only,
        "how_known": how,
        "cuda": cuda,
        "installed_from": torch_install.get("download_url"),
        "install_route": torch_install.get("route"),
        "install_record": str(Path(sys.prefix) / INSTALL_RECORD_FILE) if record else None,
        "cpu_kernels": cpu_kernels(),
    }


KERNEL_ENV_VAR = "ATEN_CPU_CAPABILITY"  # torch's switch of its CPU kernel set (default, avx2, avx512, ...)
# Every setting read once, before the first kernel runs, that selects the code paths a CPU computes with: torch's
# own kernel set, MKL's conditional numerical reproducibility (MKL_CBWR) and instruction limit, and oneDNN's ISA
# limit. Each is recorded as env_NAME in cpu_kernels(), and a replay sets the run's own before torch is imported.
KERNEL_ENV_VARS = (KERNEL_ENV_VAR, "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_kernels() -> Optional[dict]:
    """Which CPU kernels this torch uses here, asked of torch itself once it is imported (None before): the kernel
    set torch.backends.cpu.get_cpu_capability() dispatches to, ATEN_CPU_CAPABILITY as set, whether MKL and oneDNN
    (mkldnn) are available and enabled, and the lines of torch.__config__.show() that name the capability, MKL and
    oneDNN. Two machines' logits differ by rounding when these differ."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    found: dict = {"env_" + name: os.environ.get(name) for name in KERNEL_ENV_VARS}
    for name, ask in (("capability", lambda: torch.backends.cpu.get_cpu_capability()),
                      ("mkl_available", lambda: bool(torch.backends.mkl.is_available())),
                      ("mkldnn_available", lambda: bool(torch.backends.mkldnn.is_available())),
                      ("mkldnn_enabled", lambda: bool(torch.backends.mkldnn.enabled))):
        try:
            found[name] = ask()
        except (AttributeError, RuntimeError) as error:  # a build without the backend
            found[name] = None
            found.setdefault("errors", []).append(f"{name}: {type(error).__name__}: {error}")
    try:
        shown = torch.__config__.show()
    except (AttributeError, RuntimeError):
        shown = ""
    found["config_lines"] = [line.strip(" -") for line in shown.splitlines() if "Build settings" not in line
                             and any(word in line for word in ("CPU capability", "MKL", "oneDNN", "Math Kernel"))]
    return found


def describe_kernels(kernels: Optional[dict]) -> str:
    """A few words for cpu_kernels(): 'AVX512 kernels (ATEN_CPU_CAPABILITY unset), MKL yes, oneDNN yes'."""
    if not isinstance(kernels, dict):
        return "did not record its CPU kernels"
    def yes(value):
        return {True: "yes", False: "no"}.get(value, "unknown")
    env = kernels.get("env_" + KERNEL_ENV_VAR)
    return (f"{kernels.get('capability') or 'unknown'} kernels ({KERNEL_ENV_VAR}="
            f"{env if env is not None else 'unset'}), MKL {yes(kernels.get('mkl_available'))}, oneDNN "
            f"{yes(kernels.get('mkldnn_available'))}")


def typed_command(orig_argv: Optional[Sequence[str]], argv: Sequence[str], invocation_args: Sequence[str],
                  invocation_dir: Path) -> tuple[str, str]:
    """The command as the learner typed it, and how it was reconstructed.

    orig_argv is the interpreter's own command line (sys.orig_argv); argv is sys.argv, whose first
    entry is pytest's __main__.py or its console script. The launcher is what orig_argv holds before
    argv's arguments; the arguments are the ones pytest actually received.
    """
    args = list(invocation_args)
    if orig_argv and list(orig_argv[len(orig_argv) - (len(argv) - 1):]) == list(argv[1:]) \
            and list(argv[1:]) == args:
        launcher = list(orig_argv[:len(orig_argv) - (len(argv) - 1)])
        # A console script runs as "<python> <venv>/bin/pytest": the learner typed the script.
        if len(launcher) == 2 and Path(launcher[1]).name in ("pytest", "py.test") and "-m" not in launcher:
            launcher = [_relative(launcher[1], invocation_dir)]
        return shlex.join(launcher + args), "sys.orig_argv (the interpreter's command line)"
    return shlex.join(["python", "-m", "pytest", *args]), (
        "pytest.main() was called in-process, so the launcher is not known; these are the arguments it received")


def _relative(path: str, base: Path) -> str:
    try:
        return os.path.relpath(path, base) if Path(path).is_absolute() else path
    except ValueError:  # another drive on Windows
        return path


LOCK_FILE = "requirements.lock"


def lock_check(lock: Path, distributions: dict, python_version: str) -> dict:
    """The installed distributions against the lock, and this Python against the one the lock was made with.

    differences: one {name, locked, installed} per distribution that is pinned and not installed at that
    version, installed and not pinned (locked None), or pinned and missing (installed None); and one for
    python when the lock names another. pip, setuptools and wheel (the venv's own) and the project's own
    distribution are not compared. torch's local label (+cpu) is not a difference: the lock leaves it out so
    that one line resolves to each platform's build. Unpinned distributions that are exactly one of the lock's
    known variants (its `# variant NAME: PIN` header lines, every pin at its version) are no difference either:
    `variant` names it.
    """
    from inferlab.host import installation

    if not lock.is_file():
        return {"file": lock.name, "found": False, "differences": [], "python_locked": None,
                "python_running": python_version, "pins": 0}
    try:
        locked = installation.read_lock(lock.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return {"file": lock.name, "found": True, "error": f"{lock.name}: {error}", "differences": [],
                "python_locked": None, "python_running": python_version, "pins": 0}
    installed = {installation.normalized_name(name): (name, version) for name, version in distributions.items()
                 if installation.normalized_name(name) not in installation.NOT_LOCKED}
    variant = installation.matching_variant(locked, installation.unpinned(locked, distributions))
    for key in locked["variants"].get(variant, {}):  # the lock's known variant, present exactly: checked, no difference
        installed.pop(key)
    differences = []
    for key in sorted(set(locked["pins"]) | set(installed)):
        pin, have = locked["pins"].get(key), installed.get(key)
        public = have[1].split("+", 1)[0] if have and key == "torch" else have and have[1]
        if pin is None or have is None or pin[1] != public:
            differences.append({"name": (pin or have)[0], "locked": pin and pin[1], "installed": have and have[1]})
    if locked["python"] != python_version:
        differences.append({"name": "python", "locked": locked["python"], "installed": python_version})
    check = {"file": lock.name, "found": True, "pins": len(locked["pins"]), "python_locked": locked["python"],
             "python_running": python_version, "differences": differences,
             "not_compared": sorted(installation.NOT_LOCKED)}
    if variant is not None:
        check["variant"] = {"name": variant, "pins": len(locked["variants"][variant])}
    return check


def environment_record(root: Path) -> dict:
    """Everything the manifest records about the environment (torch threads are added by the caller)."""
    distributions = installed_distributions()
    lock = root / LOCK_FILE
    return {
        "platform": platform_record(),
        "distributions": distributions,
        "requirements_lock_sha256": sha256_file(lock) if lock.is_file() else None,
        "lock_check": lock_check(lock, distributions, platform.python_version()),
        "git": git_state(root),
        "source_sha256": source_hashes(root),
        "thread_environment": thread_environment(),
        "deviations_from_reference": deviations(distributions),
    }


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two environment records, one line per changed field (source files by name)."""
    found = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            names = sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))
            found.append(f"{key}: {', '.join(map(str, names[:10]))}{' ...' if len(names) > 10 else ''}")
        else:
            found.append(f"{key}: {old!r} -> {new!r}")
    return found
