"""Shared fixtures for the harness's own tests."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pytest

from inferlab import specimen
from inferlab.specimen.build import STANDIN, tiny_gpt_neox
from tiny_specimen import tiny_tokenizer


def runs_tests(config) -> bool:
    """False in a pytest-xdist controller: it only hands tests to its workers, so it needs none of their imports."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_configure(config):
    # pytester runs the plugin's own test suites. It is loaded here, for tests/ only and never for
    # --help, so that a learner's `pytest --help` lists inferlab's options and not pytester's.
    if not config.option.help and not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")
    if not config.option.help and runs_tests(config):
        # Before any pytester snapshot of sys.modules: what an in-process inner session would import again (and
        # torch, which cannot be imported twice in one process) is imported once, here (tests/inner_session.py).
        import inner_session

        # (the fast lane starts no inner session: torch alone, which a pytester snapshot must never drop)
        inner_session.preload(*(("torch",) if os.environ.get(FAST_LANE) == "1" else inner_session.MODEL_MODULES))
        inner_session.protocol_threads()


def pytest_sessionfinish(session, exitstatus):
    """A green session leaves little behind: the runs its workers shared go with it (a failed one keeps them, as
    pytest keeps the folders of failed tests)."""
    if exitstatus == 0 and not hasattr(session.config, "workerinput"):
        from shared_runs import SHARED_FOLDER

        shutil.rmtree(session.config._tmp_path_factory.getbasetemp() / SHARED_FOLDER, ignore_errors=True)


def pytest_collection_finish(session):
    """A worker's heap as collection leaves it (torch, transformers, matplotlib, every collected test) lives as long
    as the worker, so it is moved out of the cyclic collector's reach (gc.freeze, as a pre-forking server does).
    Otherwise every full collection walks it: an experiment run as an inner session of this process makes one
    before each timed block (inferlab.measure.usage), about 0.15 s each here, and the collector's own
    generation-2 passes cost the same. What a test creates later is collected as before."""
    if runs_tests(session.config):
        gc.collect()
        gc.freeze()


# Fixtures that run pytest again (pytester) or a whole experiment: a test using one starts another process or
# an inner session, so it is a `process` test, left out of the fast lane (make test-fast) like a marked one.
PROCESS_FIXTURES = frozenset({"pytester", "suite", "standin_run", "replica_run"})


# The test files that take longest (mostly experiment runs: their own, or the session's shared ones), longest first,
# as `make test --durations=0` measured them. `make test` hands a worker the next whole file when it is almost done
# with its last (--dist loadfile --no-loadscope-reorder), in this order: test_experiment_runs.py makes the shared
# stand-in run on one worker (18 s) while the other works through files that need it late or not at all (the struck
# and full-disk runs, then the installation, whose second test reads it), so that no worker waits on the shared
# run's lock; the short files fill the end.
LONGEST_FIRST = ("test_experiment_runs.py", "test_honest_endings.py", "test_installation.py", "test_grade.py",
                 "test_early_stops.py", "test_contention_run.py", "test_plugin.py", "test_evidence_runs.py",
                 "test_machine.py", "test_specimen_hub.py", "test_specimen_check.py", "test_usage.py",
                 "test_report.py", "test_new_user.py", "test_replica_runs.py", "test_failed_trials.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.process)
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: the same order on every worker


FAST_LANE = "INFERLAB_FAST_LANE"  # set by `make test-fast`: a process started by a test is an error there


@pytest.fixture(autouse=True)
def _no_process_in_the_fast_lane(request, monkeypatch):
    """In the fast lane, a test that starts a process without the `process` marker fails, naming the marker."""
    import os
    import subprocess

    if os.environ.get(FAST_LANE) != "1" or request.node.get_closest_marker("process"):
        return

    original = subprocess.Popen.__init__

    def refuse_python(self, args, *rest, **kwargs):
        # a Python (an experiment, pytest, the inferlab command) is what costs seconds; git or lscpu does not
        program = Path(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0])).name
        if program.startswith("python") or program in ("inferlab", "pytest"):
            raise AssertionError(f"{request.node.nodeid} starts a Python process ({args}): mark it "
                                 "@pytest.mark.process, so that make test-fast leaves it out")
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_python)


@pytest.fixture(scope="session")
def standin_spec():
    """The stand-in's spec as pinned in artifacts/standin.json."""
    return specimen.load_spec("standin")


@pytest.fixture(scope="session")
def standin_build(tmp_path_factory):
    """One offline build of the stand-in for the whole session, every worker's: the build() record."""
    from shared_runs import made_once

    return made_once(tmp_path_factory, "standin-build", lambda folder: STANDIN.build(folder / "standin"))


@pytest.fixture(scope="session")
def standin_dir(standin_build):
    """The session's built stand-in directory; shared, so never modify it (use standin_copy)."""
    return Path(standin_build["directory"])


@pytest.fixture(scope="module")
def loaded(standin_dir, standin_spec):
    """The stand-in loaded as a run loads it, once per module that asks."""
    from inferlab.measure import loading  # torch and transformers: never in the xdist controller

    return loading.load_specimen(standin_dir, standin_spec)


@pytest.fixture(scope="module")
def model():
    """The unit tests' tiny GPT-NeoX (inferlab.specimen.build.tiny_gpt_neox, seed 0), once per module."""
    return tiny_gpt_neox(seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    """The unit tests' tiny byte-level BPE tokenizer (tests/tiny_specimen.py), once per module."""
    return tiny_tokenizer()


@pytest.fixture
def project(pytester, monkeypatch):
    """A scratch copy of the experiment (tests, specs, plugin registration) with its own artifact cache."""
    from shared_runs import REPO_ROOT, make_project

    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    make_project(pytester.path)
    return pytester


@pytest.fixture
def standin_copy(standin_dir, tmp_path):
    """A private copy of the built stand-in that a test may damage."""
    return Path(shutil.copytree(standin_dir, tmp_path / "standin-copy"))


# --- a bundle shaped like the hub's listing of pythia-14m (ACQ's loopback-hub tests) -------------------

HUB_README_BYTES = 10_560


def require_reference_dir() -> Path:
    """The published small files of pythia-14m, or a skip that says where they are expected."""
    from inferlab.specimen import build

    try:
        return build.require_reference()
    except build.ReferenceUnavailable as error:
        pytest.skip(f"needs pythia-14m's published small files: {error}")


@pytest.fixture(scope="session")
def replica_listing(tmp_path_factory):
    """Folders holding what the hub lists for pythia-14m: {"six": all six files + README.md, "five": no generation_config.json}.

    The replica specimen (inferlab.specimen.build.REPLICA): the four small files are the published ones byte for byte and
    model.safetensors is the real header holding the recipe's weights (28,143,920 bytes); to these the
    2023 generation's 111-byte generation_config.json is added for "six", and README.md, 10,560 bytes of
    filler listed by the hub and never to be requested.
    """
    from inferlab.specimen.build import REPLICA

    reference = require_reference_dir()
    six = tmp_path_factory.mktemp("replica-listing") / "six"
    REPLICA.build(six)
    shutil.copyfile(reference / "2023-generation" / "generation_config.json", six / "generation_config.json")
    readme = (b"# pythia-14m (filler standing in for the hub's model card)\n" * 200)[:HUB_README_BYTES]
    (six / "README.md").write_bytes(readme)
    five = tmp_path_factory.mktemp("replica-listing-five")
    for path in six.iterdir():
        if path.name != "generation_config.json":
            (five / path.name).symlink_to(path)
    return {"six": six, "five": five}


@pytest.fixture(scope="session")
def replica_listing_spec(replica_listing):
    """pythia-14m's spec with the weight pin moved to the replica's constructed weights (everything else as shipped)."""
    import dataclasses

    weights = replica_listing["six"] / "model.safetensors"
    spec = specimen.load_spec("pythia-14m")
    pin = {"size": weights.stat().st_size, "sha256": specimen.sha256_file(weights)}
    return dataclasses.replace(spec, name="replica-listing", expected={**spec.expected, "model.safetensors": pin})


@pytest.fixture
def download_spec(standin_spec):
    """The stand-in's pins as a non-synthetic specimen, so acquisition must download it."""
    import dataclasses

    return dataclasses.replace(standin_spec, synthetic=False)


@pytest.fixture
def serve():
    """Start HubServers (HubServer's arguments; faults included); all are stopped after the test."""
    from hub_server import HubServer

    servers = []

    def start(directory, spec, **faults):
        server = HubServer(directory, spec.repo_id, spec.revision, **faults).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def suite(pytester, monkeypatch):
    """A pytester dir whose conftest registers the plugin, with inferlab importable in subprocesses, and the
    project's specimen specs; tests write their own throwaway experiments into it."""
    import os

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    pytester.makeconftest('pytest_plugins = ["inferlab.plugin"]\n')
    pytester.mkdir("experiments")
    pytester.mkdir("artifacts")
    for spec in (root / "artifacts").glob("*.json"):
        (pytester.path / "artifacts" / spec.name).write_bytes(spec.read_bytes())
    return pytester


# --- the real runs `make test` checks, made once for the whole session (every xdist worker shares them) ----------


@pytest.fixture(scope="session")
def standin_run(tmp_path_factory):
    """`pytest experiments --specimen standin --predictions my_predictions.md --record-dir D` (answered predictions)
    with the default acquisition, in a scratch copy of the
    project (the stand-in is built into that copy's artifacts/cache), made once per session as an inner session of
    the worker that asks first: D.
    Shared, so never modify it (copy it first)."""
    from grading_helpers import answered_predictions
    from shared_runs import experiment_once

    made = experiment_once(tmp_path_factory, "standin", "--specimen", "standin", "--predictions", "my_predictions.md",
                           here=True, prepare=lambda project: (project / "my_predictions.md").write_text(
                               answered_predictions()))
    assert made.returncode == 0, made.tail()
    return made.run


@pytest.fixture(scope="session")
def replica_run(tmp_path_factory):
    """`--specimen replica` (built from pythia-14m's published small files, skipped without them), made the same way
    for the parts where it differs from the stand-in (REPLICA_PARTS): D."""
    from inferlab.specimen.build import REFERENCE_ENV
    from shared_runs import experiment_once

    reference = require_reference_dir()
    made = experiment_once(tmp_path_factory, "replica", "--specimen", "replica", "-k", REPLICA_PARTS,
                           env={REFERENCE_ENV: str(reference)}, here=True)
    assert made.returncode == 0, made.tail()
    return made.run


# The replica differs from the stand-in in its files (the published small files, the real tokenizer and weight
# layout): its run takes the parts that read them, the specimen's checks and the inputs. Later parts run the same
# code on any specimen; its shapes and tokenless ids go through greedy and timing in test_replica_runs' variant run.
REPLICA_PARTS = "test_10_specimen or test_20_inputs"
