"""Real experiment runs made once per test session and shared by every test that reads them, across xdist workers.

A session fixture runs once per xdist worker; a run made through `made_once` runs once per `pytest tests -n 2`
session: the first worker to ask makes it under a folder every worker of the session shares, guarded by a file
lock (pytest-xdist's "making session-scoped fixtures execute only once"), and the others read what it left.
Without xdist the folder is the session's own base temp, so an earlier session's run is never reused.

Each run happens in a scratch copy of the project (`make_project`), so that whatever it builds or caches lands in
that copy's artifacts/cache and never in the checkout.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest
from filelock import FileLock

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_FOLDER = "shared-runs"
# Top-level files a run hashes into its manifest (the lock, above all: grade's checklist item 2 needs its hash).
PROJECT_FILES = ("requirements.lock", "requirements.in", "Makefile", "predictions.md")
TAIL = 3000  # characters of a failed run's output kept in an assertion message


def make_project(root: Path, conftest_extra: str = "", analytic_tests: bool = False) -> Path:
    """A scratch copy of the experiment under root: experiments/, the specimen specs (artifacts/*.json), the
    plugin's registration (conftest.py, with conftest_extra appended), pytest.ini, the lock and the other top-level
    files a run hashes, and inferlab/ as a link to this checkout's (so the manifest hashes the library as a
    checkout's run does); analytic_tests/ on request."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO_ROOT / "experiments", root / "experiments", ignore=ignore)
    if analytic_tests:
        shutil.copytree(REPO_ROOT / "analytic_tests", root / "analytic_tests", ignore=ignore)
    (root / "artifacts").mkdir()
    for spec in (REPO_ROOT / "artifacts").glob("*.json"):
        shutil.copy(spec, root / "artifacts" / spec.name)
    shutil.copy(REPO_ROOT / "pytest.ini", root / "pytest.ini")
    for name in PROJECT_FILES:
        shutil.copy(REPO_ROOT / name, root / name)
    (root / "inferlab").symlink_to(REPO_ROOT / "inferlab", target_is_directory=True)
    (root / "conftest.py").write_text((REPO_ROOT / "conftest.py").read_text() + conftest_extra)
    return root


def child_env(extra: Optional[dict] = None) -> dict:
    """The environment for a child Python: this checkout's inferlab importable, none of the outer session's
    PYTEST_* variables (an xdist worker's name, the current test), and `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def run_python(args, cwd: Path, env_extra: Optional[dict] = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python ARGS` in a fresh process in cwd, its output captured (no stdin, no terminal)."""
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=child_env(env_extra), capture_output=True,
                          text=True, check=False, stdin=subprocess.DEVNULL, timeout=timeout)


def session_folder(tmp_path_factory) -> Path:
    """A folder shared by every worker of this session (the workers' common parent), or this session's own."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / SHARED_FOLDER
    folder.mkdir(exist_ok=True)
    return folder


def made_once(tmp_path_factory, name: str, make: Callable[[Path], dict]) -> dict:
    """make(folder) once per session under the lock: its JSON result, read back by every later caller.

    A make() that raises leaves no result, so the next caller tries again and sees the same error."""
    return made_once_in(session_folder(tmp_path_factory), name, make)


def made_once_in(shared: Path, name: str, make: Callable[[Path], object]):
    """made_once in the folder `shared` (made_once's is the session's shared folder): make(shared/name) once under
    shared/name.lock, its JSON result kept in shared/name.json."""
    result = shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if not result.is_file():
            folder = shared / name
            if folder.exists():  # a make() that raised half way: start again from nothing
                shutil.rmtree(folder)
            folder.mkdir()
            made = make(folder)
            temporary = result.with_suffix(".tmp")
            temporary.write_text(json.dumps(made))
            os.replace(temporary, result)
    return json.loads(result.read_text())


@dataclass(frozen=True)
class ExperimentRun:
    """A finished `python -m pytest experiments ...` in a scratch project: where it ran, and what it said."""

    project: Path
    run: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        """stdout's lines."""
        return self.stdout.splitlines()

    def fnmatch_lines(self, patterns: list[str]) -> None:
        """pytest's LineMatcher.fnmatch_lines over stdout."""
        pytest.LineMatcher(self.lines).fnmatch_lines(patterns)

    def tail(self) -> str:
        """Where the run is kept (pytest's temporary folder keeps a failed session's), and the end of both streams:
        for an assertion message."""
        return f"the run: {self.run}\n" + self.stdout[-TAIL:] + self.stderr[-TAIL:]

    def records(self) -> list[dict]:
        """The run's records.jsonl."""
        return records(self.run)


def records(run_dir: Path) -> list[dict]:
    """Every record of a run, in order."""
    return [json.loads(line) for line in (Path(run_dir) / "records.jsonl").read_text().splitlines()]


def experiment(folder: Path, *args: str, conftest_extra: str = "", env: Optional[dict] = None,
               prepare: Optional[Callable[[Path], None]] = None) -> ExperimentRun:
    """`python -m pytest experiments ARGS --record-dir run` in a new scratch project folder/project;
    prepare(project) runs first (to pin a variant, say)."""
    project = make_project(Path(folder) / "project", conftest_extra)
    if prepare is not None:
        prepare(project)
    done = run_python(["-m", "pytest", "experiments", *args, "--record-dir", "run"], cwd=project, env_extra=env)
    return ExperimentRun(project, project / "run", done.returncode, done.stdout, done.stderr)


def experiment_in_process(pytester, *args: str, conftest_extra: str = "",
                          prepare: Optional[Callable[[Path], None]] = None) -> ExperimentRun:
    """`pytest experiments ARGS --record-dir run` as an inner session of this process (pytester.runpytest) in a
    scratch project at pytester.path; prepare(project) runs first. No new Python: torch, transformers and
    matplotlib are imported once per worker (tests/conftest.py), which is most of a short run's time.

    Only for a conftest_extra that patches nothing of this process, or undoes its patch at pytest_unconfigure:
    a patch left behind would reach every later test of the worker."""
    project = make_project(pytester.path, conftest_extra)
    if prepare is not None:
        prepare(project)
    result = pytester.runpytest("experiments", *args, "--record-dir", "run")
    return ExperimentRun(project, project / "run", int(result.ret), result.stdout.str(), result.stderr.str())


@contextlib.contextmanager
def inner_session_state(project: Path, env: Optional[dict] = None, sys_path: tuple = ()):
    """What pytester's in-process runs keep apart, for an inner session outside any pytester fixture (a module's or
    the session's shared run): the session runs in `project` (also its HOME, so no user setting reaches it), with
    `env` set and `sys_path` importable; afterwards the working folder, sys.path, sys.modules (the inner session's
    conftest and experiment modules forgotten) and the environment are as they were."""
    cwd, path, modules, environ = os.getcwd(), list(sys.path), dict(sys.modules), dict(os.environ)
    os.environ.pop("PYTEST_ADDOPTS", None)
    os.environ.update({"HOME": str(project), "PY_COLORS": "0", **(env or {})})
    sys.path[:0] = [str(p) for p in sys_path]
    os.chdir(project)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        for name in [name for name in sys.modules if name not in modules]:
            del sys.modules[name]
        sys.modules.update(modules)
        os.environ.clear()
        os.environ.update(environ)


def experiment_here(folder: Path, *args: str, conftest_extra: str = "", env: Optional[dict] = None,
                    prepare: Optional[Callable[[Path], None]] = None, sys_path: tuple = ()) -> ExperimentRun:
    """`pytest experiments ARGS --record-dir run` in a new scratch project folder/project, as an inner session of
    this process (pytest.main, its output captured) where a fixture wider than a test needs one; prepare(project)
    runs first. As experiment_in_process: no new Python, and only for a conftest_extra that patches nothing of
    this process, and an `env` that nothing imported reads once at import (HF_ENDPOINT needs a new process)."""
    project = make_project(Path(folder) / "project", conftest_extra)
    if prepare is not None:
        prepare(project)
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="", write_through=True) for _ in "oe")
    with inner_session_state(project, env, sys_path), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        status = pytest.main(["experiments", *args, "--record-dir", "run"])
    passed_on(status)
    texts = [stream.buffer.getvalue().decode("utf-8", "replace") for stream in (out, err)]
    return ExperimentRun(project, project / "run", int(status), *texts)


def passed_on(status) -> None:
    """An inner session of this process takes a Ctrl-C with its own handler (it must, to keep its records honest);
    no inner session of this suite is interrupted on purpose, so an interrupted one passes the interrupt on: the
    first Ctrl-C stops the whole suite at once, as it stops a make test of two workers. (pytester's in-process runs
    pass it on themselves.)"""
    if int(status) == int(pytest.ExitCode.INTERRUPTED):
        raise KeyboardInterrupt("an inner experiment session was interrupted: the suite stops too")


def experiment_once(tmp_path_factory, name: str, *args: str, conftest_extra: str = "", env: Optional[dict] = None,
                    prepare: Optional[Callable[[Path], None]] = None, here: bool = False) -> ExperimentRun:
    """`experiment(...)` made once per session (see made_once) and shared: never modify its folders. here: made
    as an inner session of the worker that asks first (experiment_here), not in a new Python."""
    def make(folder: Path) -> dict:
        made = (experiment_here if here else experiment)(folder, *args, conftest_extra=conftest_extra, env=env,
                                                         prepare=prepare)
        return {"project": str(made.project), "run": str(made.run), "returncode": made.returncode,
                "stdout": made.stdout, "stderr": made.stderr}

    found = made_once(tmp_path_factory, name, make)
    return ExperimentRun(Path(found["project"]), Path(found["run"]), found["returncode"], found["stdout"],
                         found["stderr"])


def inferlab_command(*args) -> tuple[int, str]:
    """`inferlab ARGS` run in this process (the command line's own main()): (exit status, what it printed)."""
    import contextlib
    import io

    from inferlab.__main__ import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main([str(arg) for arg in args])
    return status, printed.getvalue()
