# Two commands for a learner: `make run` and `make test`. Both first build .venv (`make` alone does only that):
# torch from PyTorch's CPU index, then the lock, then the project itself, editable (.venv/bin/inferlab).
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.lock-installed
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check
# PyPI's torch for Linux is a CUDA build of several GB; this index has the CPU build (docs/environment.md).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Empty: each run gets a new folder runs/<UTC time>-<specimen>[-plan], unique even within one second,
# with -failed, -findings, -partial, -partial-failed, -partial-findings or -incomplete added when that is how it
# ended. Set RUN_DIR to choose one.
RUN_DIR ?=
# --record-dir given in ARGS is the folder: then no --runs-dir is added.
WHERE = $(if $(RUN_DIR),--record-dir $(RUN_DIR),$(if $(findstring --record-dir,$(ARGS)),,--runs-dir runs))
ARGS ?=
# The published small files the replica specimen is built from (see inferlab/specimen/build.py); optional.
REFERENCE ?= $(or $(INFERLAB_PYTHIA_REFERENCE),../shared/reference/pythia-14m)
# The same folder for the replica builder, as an absolute path (tests run some commands from other folders).
export INFERLAB_PYTHIA_REFERENCE := $(abspath $(REFERENCE))

.PHONY: run test test-analytic test-harness test-fast test-py313 plan docs lock clean-venv

# Runs again when the lock, the project's description or this file (its install rule) changes.
$(STAMP): requirements.lock requirements.in pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --no-deps --index-url $(TORCH_CPU_INDEX) --timeout 10 --retries 0 $$(grep '^torch==' requirements.lock) || \
	  echo "make: no torch from $(TORCH_CPU_INDEX); the lock's step takes your default index's (for Linux a CUDA build)"
	$(PIP) --quiet -r requirements.lock
	$(PIP) --quiet --no-deps --editable .
	cp requirements.lock $(STAMP)

# The experiment itself. Pass options through ARGS, e.g.
#   make run ARGS="--specimen standin"
run: $(STAMP)
	$(PY) -m pytest experiments $(WHERE) $(ARGS)

# Print the schedule without loading a model (a folder ending in -plan).
plan: $(STAMP)
	$(PY) -m pytest experiments --plan $(WHERE) $(ARGS)

# Everything CI checks, in one pytest session on every core (pytest-xdist; benchmarks/suite_time.py times it):
# the offline analytic tests and the harness's own tests, handed to the workers one test file at a time, the
# longest files first (tests/conftest.py), the two that make the shared runs at once, one on each worker; the
# experiment itself always runs in one process. Among them, the whole experiment end to end on the stand-in (and
# on the replica, where its reference files exist) with the arguments of `pytest experiments --specimen NAME
# --record-dir DIR`, in a worker, then `inferlab verify DIR` and `inferlab report DIR --check`
# (tests/test_experiment_runs.py); that run is shared by every test that reads a real run. The same command in a
# new Python is the course CI script's run and the Gradescope bundle's. Every run goes to pytest's temporary
# folder, never to runs/: runs/ is left as it was found. test-analytic and test-harness run either part alone.
# PYTEST_ARGS adds options to each (the benchmark's --junitxml, say).
# The test targets let Python keep its bytecode cache (__pycache__, which git ignores) even where the environment
# asks it not to (PYTHONDONTWRITEBYTECODE): a test session starts two workers and a dozen experiment Pythons, and
# without the cache each compiles inferlab again and rewrites every test module's assertions (about 5 s per worker).
PYTEST_ARGS ?=
XDIST := -n auto --dist loadfile --no-loadscope-reorder
TEST_PY := PYTHONDONTWRITEBYTECODE= $(PY)
test: $(STAMP)
	$(TEST_PY) -m pytest analytic_tests tests $(XDIST) $(PYTEST_ARGS)

test-analytic: $(STAMP)
	$(TEST_PY) -m pytest analytic_tests $(PYTEST_ARGS)

test-harness: $(STAMP)
	$(TEST_PY) -m pytest tests $(XDIST) $(PYTEST_ARGS)

# For contributors, between edits: the analytic tests and the harness tests that start no other Python (no
# experiment run, no inner pytest process) and are not marked slow; a test that starts one without the
# `process` marker fails here.
test-fast: $(STAMP)
	INFERLAB_FAST_LANE=1 $(TEST_PY) -m pytest analytic_tests tests -m "not process and not slow" -n auto --dist loadfile \
	  -q $(PYTEST_ARGS)

# The lab's own Python before a change lands: `make test` (or PY313_TARGET) on CPython 3.13 in a Debian 13 root that
# tools/debian13-root.sh builds once with debootstrap and reuses (as root; docs/environment.md). It tests this
# checkout's committed HEAD, cloned into the root.
PY313_TARGET ?= test
test-py313:
	tools/debian13-root.sh $(PY313_TARGET)

# Rewrite docs/options.md's generated part from the option definitions (a harness test fails when it is stale).
docs: $(STAMP)
	$(PY) -m inferlab.run.docgen

# Re-pin after a deliberate upgrade: the lock's comments, this Python's version, then pip freeze (the project,
# installed editable, left out), torch without its +cpu label so that the same line finds each platform's build.
lock:
	sed -n '/^# python:/d; /^#/p' requirements.lock > $(VENV)/lock.new
	$(PY) -c 'import platform; print("# python:", platform.python_version())' >> $(VENV)/lock.new
	$(PY) -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' >> $(VENV)/lock.new
	mv $(VENV)/lock.new requirements.lock

clean-venv:
	rm -rf $(VENV)
