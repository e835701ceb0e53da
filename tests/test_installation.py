"""The environment `make` builds: torch from the CPU index first, the lock exactly, the project editable; and what
the manifest says of it (the lock check, the torch build)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from inferlab.host import environment

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK = REPO_ROOT / "requirements.lock"


def make(*args: str, cwd: Path = REPO_ROOT, env: dict = None) -> subprocess.CompletedProcess:
    """make in `cwd`, never under the settings of a make this session may run in (MAKEFLAGS carries its variables)."""
    env = {key: value for key, value in (env or os.environ).items() if not key.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(["make", "--no-print-directory", "-C", str(cwd), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def wheel(folder: Path, name: str, version: str, requires: tuple = ()) -> Path:
    """A tiny pure-Python wheel, so that pip installs a 'torch' without a network or gigabytes."""
    dist_info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "",
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                      + "".join(f"Requires-Dist: {line}\n" for line in requires),
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{dist_info}/RECORD": ""}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def installed_as_wheel(name: str, folder: Path) -> Path:
    """An installed distribution (setuptools, to build the project offline) packed again as a wheel."""
    dist = importlib.metadata.distribution(name)
    path = folder / f"{name}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for file in dist.files:
            if not str(file).startswith("..") and "__pycache__" not in file.parts:
                archive.write(file.locate(), str(file))
    return path


def index(root: Path, *wheels: Path) -> str:
    """A PEP 503 index on disk offering these wheels; its file:// URL."""
    for path in wheels:
        project = root / path.name.split("-")[0]
        project.mkdir(parents=True, exist_ok=True)
        (project / "index.html").write_text(f'<a href="{path.as_uri()}">{path.name}</a>\n')
    return root.as_uri()


@pytest.mark.slow
@pytest.mark.process
def test_make_takes_torch_from_the_cpu_index_first_and_says_so_when_it_cannot(tmp_path):
    """The install rule as written, on a copy of the project with a one-line lock, against indexes on disk and no
    pip configuration: an unreachable CPU index is named and the default index's torch (which brings one package
    more, as PyPI's CUDA build does) installed; a reachable one gives the +cpu build, which the lock's step keeps."""
    project = tmp_path / "project"
    (project / "inferlab").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "requirements.in", "inferlab/__init__.py"):
        shutil.copy(REPO_ROOT / name, project / name)
    (project / "requirements.lock").write_text("# python: 3\ntorch==2.13.0\n")
    files = tmp_path / "files"
    default = index(tmp_path / "default", wheel(files, "torch", "2.13.0", ("cudalike==1.0",)),
                    wheel(files, "cudalike", "1.0"), installed_as_wheel("setuptools", files))
    cpu = index(tmp_path / "cpu", wheel(files / "cpu", "torch", "2.13.0+cpu"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/whl/cpu"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=default, PIP_NO_CACHE_DIR="1")
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"

    def torch_and_extras() -> tuple:
        listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True,
                                text=True, check=True).stdout
        have = {item["name"]: item["version"] for item in json.loads(listed)}
        return have.get("torch"), "cudalike" in have, (venv / "bin" / "inferlab").is_file()

    done = make(f"VENV={venv}", f"PYTHON={sys.executable}", f"TORCH_CPU_INDEX={closed}", cwd=project, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("make: no torch from")]
    assert said == [f"make: no torch from {closed}; the lock's step takes your default index's (for Linux a CUDA "
                    "build)"], done.stdout
    assert torch_and_extras() == ("2.13.0", True, True)
    assert (venv / ".lock-installed").read_text() == "# python: 3\ntorch==2.13.0\n"

    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "torch", "cudalike"], check=True)
    (venv / ".lock-installed").unlink()
    done = make(f"VENV={venv}", f"TORCH_CPU_INDEX={cpu}", cwd=project, env=env)
    assert done.returncode == 0 and "\nmake: no torch from" not in done.stdout, done.stdout + done.stderr
    assert torch_and_extras() == ("2.13.0+cpu", False, True)


def test_make_installs_again_only_when_the_lock_or_the_install_rule_changes(tmp_path):
    (tmp_path / ".lock-installed").touch()

    def up_to_date(*changed: str) -> bool:
        flags = [f"--what-if={name}" for name in changed]
        return make("-q", f"VENV={tmp_path}", *flags, str(tmp_path / ".lock-installed")).returncode == 0

    assert up_to_date() and up_to_date("explanation.md") and up_to_date("inferlab/host/environment.py")
    for name in ("requirements.lock", "requirements.in", "pyproject.toml", "Makefile"):
        assert not up_to_date(name), name


@pytest.mark.parametrize("given, where", [([], "--runs-dir runs"), (["RUN_DIR=d"], "--record-dir d"),
                                          (["ARGS=--record-dir d"], "--record-dir d")])
def test_make_run_puts_the_run_where_it_is_told_and_nowhere_else(tmp_path, given, where):
    (tmp_path / ".lock-installed").touch()  # up to date: make -n prints the run's command alone
    done = make("-n", "run", f"VENV={tmp_path}", *given)
    assert done.returncode == 0 and done.stdout.split()[-2:] == where.split(), done.stdout + done.stderr
    assert done.stdout.count("--record-dir") + done.stdout.count("--runs-dir") == 1, done.stdout


@pytest.mark.process
def test_make_lock_pins_every_installed_package_and_keeps_the_header(tmp_path):
    """On a copy of the lock: the header's comments kept, this Python's version, every installed distribution but
    the project and pip's own pinned at its version, torch without +cpu."""
    (tmp_path / "requirements.lock").write_text("# a header\n# python: 2.7\nstale==0\n")
    shutil.copy(REPO_ROOT / "Makefile", tmp_path / "Makefile")
    done = make("lock", f"VENV={tmp_path}", f"PY={sys.executable}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    head, python, *pins = (tmp_path / "requirements.lock").read_text().splitlines()
    assert (head, python) == ("# a header", f"# python: {platform.python_version()}")
    expected = {canonicalize_name(name): version.removesuffix("+cpu") if name == "torch" else version
                for name, version in environment.installed_distributions().items()
                if canonicalize_name(name) not in environment.NOT_LOCKED}
    assert {canonicalize_name(line.split("==")[0]): line.split("==")[1] for line in pins} == expected


def test_this_environment_holds_the_lock_exactly():
    """Every pin at its version, nothing else; but a torch that is not the CPU build (PyPI's CUDA build, where the CPU
    index could not be reached, as in a Debian 13 root) brings what it requires, which the lock check names."""
    check = environment.lock_check(LOCK, environment.installed_distributions(), platform.python_version())
    assert check["found"] and not check.get("error")
    extra = {canonicalize_name(d["name"]) for d in check["differences"] if d["name"] != "python" and not d["locked"]}
    assert [d for d in check["differences"] if d["name"] != "python" and d["locked"]] == []
    if extra and not importlib.metadata.version("torch").endswith("+cpu"):
        extra -= {canonicalize_name(Requirement(line).name) for name in ("torch", *extra)
                  for line in importlib.metadata.requires(name) or []}  # what torch, or what it brought, requires
    assert extra == set()


LOCK_TEXT = "# python: 3.11.7\nnumpy==2.4.6\ntorch==2.13.0\n"


@pytest.mark.parametrize("installed, python, differences", [
    ({"numpy": "2.4.6", "torch": "2.13.0+cpu", "pip": "25", "inferlab": "0"}, "3.11.7", []),
    ({"numpy": "2.4.7", "torch": "2.13.0"}, "3.11.7", [("numpy", "2.4.6", "2.4.7")]),
    ({"numpy": "2.4.6"}, "3.11.7", [("torch", "2.13.0", None)]),
    ({"numpy": "2.4.6", "torch": "2.13.0", "Triton": "3.7.1"}, "3.11.7", [("Triton", None, "3.7.1")]),
    ({"numpy": "2.4.6", "torch": "2.13.1+cpu"}, "3.13.5", [("torch", "2.13.0", "2.13.1+cpu"),
                                                             ("python", "3.11.7", "3.13.5")]),
], ids=["the-lock", "another-version", "missing", "not-pinned", "python-and-torch"])
def test_the_lock_check_names_every_difference_and_no_local_label(tmp_path, installed, python, differences):
    lock = tmp_path / "requirements.lock"
    lock.write_text(LOCK_TEXT)
    check = environment.lock_check(lock, installed, python)
    assert [(d["name"], d["locked"], d["installed"]) for d in check["differences"]] == differences
    assert (check["pins"], check["python_locked"]) == (2, "3.11.7")


def test_a_lock_that_cannot_be_read_is_said_and_a_missing_one_compares_nothing(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("numpy>=2\n")
    assert environment.lock_check(lock, {}, "3.11.7")["error"] == (
        "requirements.lock: line 1: expected NAME==VERSION, actual 'numpy>=2'")
    missing = environment.lock_check(tmp_path / "nothing.lock", {"numpy": "2"}, "3.11.7")
    assert missing["found"] is False and missing["differences"] == []


def test_the_manifest_asks_torch_itself_which_build_it_is():
    import torch

    build = environment.torch_build()
    assert build["version"] == torch.__version__  # its own word: PyPI's CUDA build says +cu130, its metadata not
    assert importlib.metadata.version("torch") in (torch.__version__, torch.__version__.split("+")[0])
    assert build["cpu_only"] is (torch.version.cuda is None and getattr(torch.version, "hip", None) is None)
    assert "torch.version.cuda" in build["how_known"] and build["cpu_kernels"]["capability"]


# --- the project itself: installed editable, with its command ---------------------------------------------------


def project_distribution() -> importlib.metadata.Distribution:
    """The project's dist-info in site-packages (the checkout's own inferlab.egg-info, also on sys.path, aside)."""
    found = [dist for dist in importlib.metadata.distributions(path=[sysconfig.get_paths()["purelib"]])
             if dist.metadata["Name"] == "inferlab"]
    assert len(found) == 1, f"{sys.prefix} has {len(found)} inferlab distributions, not 1: run `make`"
    return found[0]


def test_the_project_is_installed_editable_from_its_checkout_with_one_entry_point(request):
    dist = project_distribution()
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    assert direct_url.get("dir_info", {}).get("editable") is True, direct_url
    assert Path(direct_url["url"].removeprefix("file://")).resolve() == Path(sys.prefix).resolve().parent
    # pytest.ini registers the plugin; an entry point in the pytest11 group as well would load it twice.
    points = {(point.group, point.name): point.value for point in dist.entry_points}
    assert points == {("console_scripts", "inferlab"): "inferlab.cli:run_command_line"}
    assert [getattr(plugin, "__name__", None) for plugin in request.config.pluginmanager.get_plugins()].count(
        "inferlab.plugin") == 1


def test_its_dependencies_are_requirements_in_and_the_lock_satisfies_every_one():
    declared = [line.split("#", 1)[0].strip() for line in (REPO_ROOT / "requirements.in").read_text().splitlines()]
    declared = [Requirement(line) for line in declared if line]
    assert [str(Requirement(line)) for line in project_distribution().requires or []] == list(map(str, declared))
    pins = {canonicalize_name(line.split("==")[0]): line.split("==")[1] for line in LOCK.read_text().splitlines()
            if line and not line.startswith("#")}
    for requirement in declared:
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin and requirement.specifier.contains(pin), requirement


def test_the_installed_command_lists_every_subcommand_and_verifies_a_run_from_another_folder(standin_run):
    from inferlab import cli

    script = Path(sys.executable).parent / "inferlab"
    shown = subprocess.run([str(script), "--help"], capture_output=True, text=True, cwd="/", timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: {cli.PROG} "), shown.stderr
    assert [name for name in cli.COMMANDS if name.replace("_", "-") not in shown.stdout] == []
    verified = subprocess.run([str(script), "verify", str(standin_run)], capture_output=True, text=True, cwd="/",
                              timeout=120)
    assert verified.returncode == 0 and verified.stdout.splitlines()[-1].startswith("verify: OK ("), verified.stderr
