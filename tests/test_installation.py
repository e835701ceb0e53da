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
import zipfile
from pathlib import Path

import pytest

from inferlab import installation

REPO_ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = {"pip", "setuptools", "wheel"}  # what `python -m venv` brings; not part of the lab's lock
PROJECT = "inferlab"  # the project's own (editable) install: not pinned by the lock it installs from


def fake_wheel(folder: Path, version: str) -> Path:
    """A tiny pure-Python wheel named torch, so pip can install it without a network or gigabytes."""
    base = version.split("+")[0]
    dist_info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: inferlab-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_lines = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record_lines.append(f"{name},sha256={digest},{len(text.encode())}")
    record_lines.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record_lines) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    assert base in wheel.name
    return wheel


def simple_index(root: Path, wheel: Path) -> str:
    """A PEP 503 index on disk that offers one wheel of torch; its file:// URL."""
    project = root / "simple" / "torch"
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<html><body><a href="{wheel.as_uri()}">{wheel.name}</a></body></html>\n')
    return (root / "simple").as_uri()


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtual environment (with pip) that the installer runs in."""
    folder = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, capture_output=True, timeout=300)
    return folder


def run_installer(venv: Path, lock: Path, cpu_index: str, default_index: str) -> subprocess.CompletedProcess:
    # Only the indexes named here: the machine's pip configuration (its find-links, extra indexes and
    # constraints) is switched off, so the test sees exactly the fallback it sets up.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=default_index, PIP_NO_CACHE_DIR="1",
               PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([str(venv / "bin" / "python"), "-m", "inferlab.installation", "--lock", str(lock),
                           "--cpu-index", cpu_index, "--timeout", "2"], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=600)


@pytest.mark.slow
def test_an_unreachable_cpu_index_falls_back_to_the_default_index_and_says_so(venv, tmp_path):
    default_wheel = fake_wheel(tmp_path / "default-files", "2.13.0")
    default_index = simple_index(tmp_path / "default", default_wheel)
    lock = tmp_path / "requirements.lock"
    lock.write_text("# test lock\ntorch==2.13.0\n")
    done = run_installer(venv, lock, closed_port_url(), default_index)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("gave no torch==2.13.0 for this machine") == 1
    record = json.loads((venv / installation.RECORD_FILE).read_text())
    torch = record["torch"]
    assert torch["route"] == "default_index_fallback" and torch["cpu_index_attempt"]["ok"] is False
    assert torch["installed_version"] == "2.13.0" and torch["download_url"] == default_wheel.as_uri()


@pytest.mark.slow
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
    """Every installed distribution has its exact version in requirements.lock, and every pin is installed."""
    pins = {}
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    installed = {dist.metadata["Name"].lower().replace("_", "-"): dist.version
                 for dist in importlib.metadata.distributions() if dist.metadata["Name"]}
    installed = {name: version.split("+")[0] if name == "torch" else version
                 for name, version in installed.items() if name not in BOOTSTRAP and name != PROJECT}
    assert installed == pins


def test_the_torch_line_is_read_from_the_lock():
    assert installation.torch_requirement("# x\nnumpy==2.4.6\ntorch==2.13.0  # cpu\n") == "torch==2.13.0"
    with pytest.raises(ValueError, match="no 'torch==VERSION' line"):
        installation.torch_requirement("numpy==2.4.6\n")


def test_the_manifest_says_which_torch_build_is_installed():
    from inferlab import environment

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


# --- the lock is checked at the start of a run (issue 26, A5) --------------------------------------------------

LOCK = "# made for a test\n# python: 3.11.7\nnumpy==2.4.6\ntorch==2.13.0\nHuggingface_Hub==0.36.2\nmissing-one==1.0\n"


def test_the_lock_names_the_python_it_was_made_with_as_data():
    locked = installation.read_lock(LOCK)
    assert locked["python"] == "3.11.7"
    assert locked["pins"]["huggingface-hub"] == ("Huggingface_Hub", "0.36.2") and len(locked["pins"]) == 4
    assert installation.read_lock((REPO_ROOT / "requirements.lock").read_text())["python"] == "3.11.7"
    with pytest.raises(ValueError, match=r"line 2: expected NAME==VERSION, actual 'numpy>=2'"):
        installation.read_lock("# x\nnumpy>=2\n")


def test_every_difference_from_the_lock_is_named_with_both_versions(tmp_path):
    from inferlab import environment

    lock = tmp_path / "requirements.lock"
    lock.write_text(LOCK)
    installed = {"numpy": "2.0.0", "torch": "2.13.0+cpu", "huggingface-hub": "0.36.2", "extra-one": "3.1",
                 "pip": "23.2.1", "setuptools": "84.2.1", "inferlab": "0.1.0"}
    check = environment.lock_check(lock, installed, "3.12.1")
    assert check["differences"] == [
        {"name": "extra-one", "locked": None, "installed": "3.1"},
        {"name": "missing-one", "locked": "1.0", "installed": None},
        {"name": "numpy", "locked": "2.4.6", "installed": "2.0.0"},
        {"name": "python", "locked": "3.11.7", "installed": "3.12.1"}]  # torch's +cpu, pip and inferlab are none
    assert (check["pins"], check["python_locked"], check["python_running"]) == (4, "3.11.7", "3.12.1")
    assert environment.lock_check(tmp_path / "absent.lock", installed, "3.12.1")["found"] is False


def test_this_environment_matches_its_lock_and_the_manifest_says_so():
    from inferlab import environment

    check = environment.environment_record(REPO_ROOT)["lock_check"]
    assert check["found"] and check["differences"] == [], check["differences"]


def test_writing_the_lock_pins_this_environment_and_its_python(tmp_path):
    import platform

    lock = tmp_path / "requirements.lock"
    lock.write_text("# a comment kept\n# python: 2.7.0\nold==1\n")
    installation.write_lock(lock)
    text = lock.read_text()
    assert text.startswith("# a comment kept\n# python: " + platform.python_version() + "\n")
    pins = installation.read_lock(text)["pins"]
    assert "old" not in pins and "inferlab" not in pins and "pip" not in pins
    assert pins["torch"][1] == importlib.metadata.version("torch").split("+")[0]
    assert installation.read_lock((REPO_ROOT / "requirements.lock").read_text())["pins"] == pins
