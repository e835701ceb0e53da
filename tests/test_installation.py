"""The installer: CPU torch first, a recorded fallback to the default index, and a lock that pins everything."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from inferlab.host import installation

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA1_RUN = REPO_ROOT / "tests" / "fixtures" / "schema1-run"
BOOTSTRAP = {"pip", "setuptools", "wheel"}  # what `python -m venv` brings; not part of the lab's lock


def fake_wheel(folder: Path, version: str, name: str = "torch", requires: tuple = ()) -> Path:
    """A tiny pure-Python wheel named torch (or `name`), so pip can install it without a network or gigabytes;
    `requires` are its Requires-Dist lines."""
    base = version.split("+")[0]
    dist_info = f"{name}-{version}.dist-info"
    metadata = "".join(f"Requires-Dist: {line}\n" for line in requires)
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: inferlab-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_lines = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record_lines.append(f"{name},sha256={digest},{len(text.encode())}")
    record_lines.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record_lines) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist_info.split('-')[0]}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    assert base in wheel.name
    return wheel


def simple_index(root: Path, *wheels: Path) -> str:
    """A PEP 503 index on disk that offers these wheels (one project each, named by the wheel); its file:// URL."""
    for wheel in wheels:
        project = root / "simple" / wheel.name.split("-")[0]
        project.mkdir(parents=True)
        (project / "index.html").write_text(f'<html><body><a href="{wheel.as_uri()}">{wheel.name}</a></body>'
                                            '</html>\n')
    return (root / "simple").as_uri()


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtual environment that the installer runs in, with pip. Made --without-pip (ensurepip's copy of
    pip takes seconds to install), then given this environment's pip through a .pth file naming a folder that
    holds pip alone: pip installs into the interpreter running it, so everything else lands in the new venv."""
    import importlib.util

    root = tmp_path_factory.mktemp("venv")
    folder = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True,
                   timeout=300)
    pip_alone = root / "pip-alone"
    pip_alone.mkdir()
    (pip_alone / "pip").symlink_to(Path(importlib.util.find_spec("pip").origin).parent, target_is_directory=True)
    purelib = subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (Path(purelib) / "pip-from-the-test-environment.pth").write_text(f"{pip_alone}\n")
    return folder


def run_installer(venv: Path, lock: Path, cpu_index: str, default_index: str) -> subprocess.CompletedProcess:
    # Only the indexes named here: the machine's pip configuration (its find-links, extra indexes and
    # constraints) is switched off, so the test sees exactly the fallback it sets up.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=default_index, PIP_NO_CACHE_DIR="1",
               PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([str(venv / "bin" / "python"), "-m", "inferlab.host.installation", "--lock", str(lock),
                           "--cpu-index", cpu_index, "--timeout", "2"], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=600)


@pytest.mark.slow
@pytest.mark.process
def test_an_unreachable_cpu_index_falls_back_to_the_default_index_and_says_so(venv, tmp_path):
    # the default index's torch brings one more package, as PyPI's CUDA build brings nvidia-* (the lock's variant)
    default_wheel = fake_wheel(tmp_path / "default-files", "2.13.0", requires=("cudalike==1.0",))
    extra_wheel = fake_wheel(tmp_path / "default-files", "1.0", name="cudalike")
    default_index = simple_index(tmp_path / "default", default_wheel, extra_wheel)
    lock = tmp_path / "requirements.lock"
    lock.write_text("# test lock\n# variant torch-cuda: cudalike==1.0\ntorch==2.13.0\n")
    done = run_installer(venv, lock, closed_port_url(), default_index)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if "gave no torch==2.13.0 for this machine" in line]
    assert len(said) == 1, done.stdout
    assert ("1 package(s) the lock does not pin came with it: cudalike==1.0 (exactly the lock's known variant "
            "'torch-cuda')") in said[0]
    record = json.loads((venv / installation.RECORD_FILE).read_text())
    torch = record["torch"]
    assert "cudalike==1.0" in torch["beyond_the_lock"]
    assert torch["route"] == "default_index_fallback" and torch["cpu_index_attempt"]["ok"] is False
    assert torch["installed_version"] == "2.13.0" and torch["download_url"] == default_wheel.as_uri()


@pytest.mark.slow
@pytest.mark.process
def test_a_reachable_cpu_index_gives_the_cpu_build_and_the_lock_keeps_it(venv, tmp_path):
    cpu_wheel = fake_wheel(tmp_path / "cpu-files", "2.13.0+cpu")
    cpu_index = simple_index(tmp_path / "cpu", cpu_wheel)
    default_index = simple_index(tmp_path / "default", fake_wheel(tmp_path / "default-files", "2.13.0"))
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "torch"], capture_output=True)
    lock = tmp_path / "requirements.lock"
    lock.write_text("torch==2.13.0\n")
    done = run_installer(venv, lock, cpu_index, default_index)
    assert done.returncode == 0, done.stdout + done.stderr
    torch = json.loads((venv / installation.RECORD_FILE).read_text())["torch"]
    assert (torch["route"], torch["installed_version"]) == ("cpu_index_step", "2.13.0+cpu")
    assert torch["download_url"] == cpu_wheel.as_uri() and "gave no" not in done.stdout


def test_the_lock_pins_exactly_what_is_installed():
    """Every installed distribution has its exact version in requirements.lock, and every pin is installed; beyond
    the pins, either nothing or exactly the lock's known variant (PyPI's CUDA torch and every package it brought,
    each at its listed version), and then torch is not the CPU build."""
    pins = {}
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    installed = {dist.metadata["Name"].lower().replace("_", "-"): dist.version
                 for dist in importlib.metadata.distributions() if dist.metadata["Name"]}
    torch_build = installed.get("torch")
    installed = {name: version.split("+")[0] if name == "torch" else version
                 for name, version in installed.items()
                 if name not in BOOTSTRAP and name != installation.PROJECT_DISTRIBUTION}  # the project, editable
    beyond = {name: version for name, version in installed.items() if name not in pins}
    if beyond:
        variants = installation.read_lock((REPO_ROOT / "requirements.lock").read_text())["variants"]
        listed = {name: {key: version for key, (_, version) in variant.items()} for name, variant in variants.items()}
        assert beyond in listed.values(), f"installed beyond the lock, and no variant it lists: {beyond}"
        assert not torch_build.endswith("+cpu"), "the lock's variant is the default index's torch, not the CPU build"
    assert {name: version for name, version in installed.items() if name in pins} == pins


VARIANT_LOCK = """# python: 3.11.7
# variant torch-cuda: nvidia-cublas==13.1.1.3
# variant torch-cuda: triton==3.7.1
numpy==2.4.6
torch==2.13.0
"""
LOCKED_DISTRIBUTIONS = {"numpy": "2.4.6", "torch": "2.13.0+cpu", "pip": "25.1", installation.PROJECT_DISTRIBUTION: "0"}


def test_a_variant_listed_in_the_lock_is_read_apart_from_its_pins():
    locked = installation.read_lock(VARIANT_LOCK)
    assert sorted(locked["pins"]) == ["numpy", "torch"]
    assert locked["variants"] == {"torch-cuda": {"nvidia-cublas": ("nvidia-cublas", "13.1.1.3"),
                                                 "triton": ("triton", "3.7.1")}}
    with pytest.raises(ValueError, match="line 2: expected NAME==VERSION, actual 'nvidia-cublas'"):
        installation.read_lock("# python: 3.11.7\n# variant torch-cuda: nvidia-cublas\n")


def test_make_lock_keeps_the_variant_lines_and_pins_none_of_their_packages():
    frozen = ["numpy==2.4.6", "torch==2.13.0", "triton==3.7.1", "nvidia-cublas==13.1.1.3"]
    text = installation.lock_text(frozen, "3.13.5", VARIANT_LOCK.splitlines())
    assert text == ("# variant torch-cuda: nvidia-cublas==13.1.1.3\n# variant torch-cuda: triton==3.7.1\n"
                    "# python: 3.13.5\nnumpy==2.4.6\ntorch==2.13.0\n")
    assert installation.lock_text(["torch==2.13.0+cpu"], "3.11.7", []) == "# python: 3.11.7\ntorch==2.13.0\n"


@pytest.mark.parametrize("extra, variant, differences", [
    ({}, None, []),
    ({"nvidia-cublas": "13.1.1.3", "triton": "3.7.1"}, "torch-cuda", []),
    ({"nvidia-cublas": "13.1.1.3"}, None, [("nvidia-cublas", None, "13.1.1.3")]),
    ({"nvidia-cublas": "13.1.1.3", "triton": "3.7.2"}, None, [("nvidia-cublas", None, "13.1.1.3"),
                                                              ("triton", None, "3.7.2")]),
    ({"nvidia-cublas": "13.1.1.3", "triton": "3.7.1", "cupy": "14.0"}, None,
     [("cupy", None, "14.0"), ("nvidia-cublas", None, "13.1.1.3"), ("triton", None, "3.7.1")]),
], ids=["the-lock", "the-variant-exactly", "part-of-it", "another-version", "more-than-it"])
def test_the_lock_check_accepts_its_known_variant_only_exactly(tmp_path, extra, variant, differences):
    from inferlab.host import environment

    lock = tmp_path / "requirements.lock"
    lock.write_text(VARIANT_LOCK)
    check = environment.lock_check(lock, {**LOCKED_DISTRIBUTIONS, "torch": "2.13.0", **extra}, "3.11.7")
    assert [(d["name"], d["locked"], d["installed"]) for d in check["differences"]] == differences
    assert (check.get("variant") or {}).get("name") == variant
    line = installation.extra_line(installation.read_lock(VARIANT_LOCK), {**LOCKED_DISTRIBUTIONS, **extra})
    if not extra:
        assert line is None
    else:
        assert line.startswith(f"{len(extra)} package(s) the lock does not pin came with it: ")
        assert ("exactly the lock's known variant 'torch-cuda'" in line) == (variant is not None), line


def test_the_torch_line_is_read_from_the_lock():
    assert installation.torch_requirement("# x\nnumpy==2.4.6\ntorch==2.13.0  # cpu\n") == "torch==2.13.0"
    with pytest.raises(ValueError, match="no 'torch==VERSION' line"):
        installation.torch_requirement("numpy==2.4.6\n")


def test_the_manifest_says_which_torch_build_is_installed():
    from inferlab.host import environment

    import torch  # noqa: F401  # imported, so the build itself is asked

    build = environment.torch_build()
    assert build["version"] == importlib.metadata.version("torch")
    assert build["cpu_only"] is (torch.version.cuda is None and getattr(torch.version, "hip", None) is None)
    assert "torch.version.cuda" in build["how_known"]


def test_the_install_record_is_replaced_whole_never_rewritten_in_place(tmp_path):
    path = tmp_path / installation.RECORD_FILE
    installation.write_record(path, {"torch": {"route": "first"}})
    with open(path, encoding="utf-8") as reader:  # a reader (the manifest) that opened the old record
        installation.write_record(path, {"torch": {"route": "second", "note": "x" * 10000}})
        assert json.loads(reader.read()) == {"torch": {"route": "first"}}  # still whole: a new file took its name
    assert json.loads(path.read_text(encoding="utf-8"))["torch"]["route"] == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == [installation.RECORD_FILE]  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


# --- the project itself: installed editable, with its command ---------------------------------------------------


def project_distribution() -> importlib.metadata.Distribution:
    """The project as this environment installed it: its dist-info in site-packages (the editable build also
    leaves an inferlab.egg-info in the checkout, git-ignored, which the checkout folder on sys.path would find)."""
    found = [dist for dist in importlib.metadata.distributions(path=[sysconfig.get_paths()["purelib"]])
             if dist.metadata["Name"] == installation.PROJECT_DISTRIBUTION]
    if len(found) != 1:
        pytest.fail(f"{sys.prefix} has {len(found)} {installation.PROJECT_DISTRIBUTION} distributions, not 1: run `make` in the "
                    f"project folder, which installs the project editable (inferlab/host/installation.py --editable)")
    return found[0]


def installed_command() -> Path:
    script = Path(sys.executable).parent / "inferlab"
    assert script.is_file(), f"expected the console script {script} (pyproject.toml [project.scripts]); run `make`"
    return script


def test_the_project_is_installed_editable_from_the_checkout_its_environment_belongs_to():
    dist = project_distribution()
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    assert direct_url.get("dir_info", {}).get("editable") is True, direct_url
    checkout = Path(direct_url["url"].removeprefix("file://"))
    assert checkout.resolve() == Path(sys.prefix).resolve().parent, (checkout, sys.prefix)
    import inferlab

    assert Path(inferlab.__file__).resolve().parent == checkout.resolve() / "inferlab"


def test_its_one_entry_point_is_the_command_and_the_plugin_is_registered_once(request):
    """pytest.ini registers the plugin; an entry point in the pytest11 group as well would load it a second time."""
    points = {(point.group, point.name): point.value for point in project_distribution().entry_points}
    assert points == {("console_scripts", "inferlab"): "inferlab.cli:run_command_line"}
    assert not [point for point in importlib.metadata.entry_points(group="pytest11") if "inferlab" in point.value]
    registered = [plugin for plugin in request.config.pluginmanager.get_plugins()
                  if getattr(plugin, "__name__", None) == "inferlab.plugin"]
    assert len(registered) == 1


def test_its_dependencies_are_requirements_in_and_the_lock_satisfies_every_one():
    from packaging.requirements import Requirement

    declared = [line.split("#", 1)[0].strip() for line in (REPO_ROOT / "requirements.in").read_text().splitlines()]
    declared = [line for line in declared if line]
    requires = project_distribution().requires or []
    assert [str(Requirement(line)) for line in requires] == [str(Requirement(line)) for line in declared]
    pins = dict(line.split("==") for line in (REPO_ROOT / "requirements.lock").read_text().splitlines()
                if line and not line.startswith("#"))
    pins = {name.lower().replace("_", "-"): version for name, version in pins.items()}
    for line in declared:
        requirement = Requirement(line)
        pinned = pins.get(requirement.name.lower().replace("_", "-"))
        assert pinned is not None and requirement.specifier.contains(pinned), (line, pinned)


@pytest.mark.process
@pytest.mark.process
def test_the_installed_command_lists_every_subcommand_and_verifies_a_run_from_the_root_folder(standin_run):
    from inferlab import cli

    script = installed_command()
    shown = subprocess.run([str(script), "--help"], capture_output=True, text=True, cwd="/", timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"usage: {cli.PROG} ")
    missing = [module.NAME for module in cli.command_modules() if module.NAME not in shown.stdout]
    assert not missing, f"inferlab --help lists no {missing}"
    verified = subprocess.run([str(script), "verify", str(standin_run)], capture_output=True, text=True, cwd="/",
                              timeout=120)
    assert verified.returncode == 0 and verified.stdout.splitlines()[-1].startswith("verify: OK ("), verified.stderr
