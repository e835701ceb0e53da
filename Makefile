# Two commands for a learner: `make run` and `make test`. Both first build .venv (`make` alone does only that):
# torch from PyTorch's CPU index, then the lock, then the project itself, editable (.venv/bin/inferlab).
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.lock-installed
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check
# PyPI's torch for Linux is a CUDA build of several GB; this index has the CPU build (docs/environment.md).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Empty: each run gets a new folder runs/<UTC time>-<specimen>, its name saying how it ended; or choose one.
RUN_DIR ?=
WHERE = $(if $(RUN_DIR),--record-dir $(RUN_DIR),$(if $(findstring --record-dir,$(ARGS)),,--runs-dir runs))
ARGS ?=
# Optional: pythia-14m's published small files, which the replica specimen is built from (absolute for tests).
REFERENCE ?= $(or $(INFERLAB_PYTHIA_REFERENCE),../shared/reference/pythia-14m)
export INFERLAB_PYTHIA_REFERENCE := $(abspath $(REFERENCE))

.PHONY: run test test-analytic test-harness test-fast test-py313 plan lock clean-venv

# Runs again when the lock, the project's description or this file (its install rule) changes.
$(STAMP): requirements.lock requirements.in pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --no-deps --index-url $(TORCH_CPU_INDEX) --timeout 10 --retries 0 $$(grep '^torch==' requirements.lock) || \
	  echo "make: no torch from $(TORCH_CPU_INDEX); the lock's step takes your default index's (for Linux a CUDA build)"
	$(PIP) --quiet -r requirements.lock
	$(PIP) --quiet --no-deps --editable .
	cp requirements.lock $(STAMP)

# The experiment itself, e.g. make run ARGS="--specimen standin".
run: $(STAMP)
	$(PY) -m pytest experiments $(WHERE) $(ARGS)

# Print the schedule without loading a model (a folder ending in -plan).
plan: $(STAMP)
	$(PY) -m pytest experiments --plan $(WHERE) $(ARGS)

# Everything CI checks, in one pytest session on every core, one test file per worker at a time: the analytic
# tests and the harness's tests, among them whole stand-in runs verified and reported
# (tests/test_experiment_runs.py), all in pytest's temporary folder. test-analytic and test-harness run one part.
# The bytecode cache stays on (PYTHONDONTWRITEBYTECODE would cost each worker about 5 s of recompiling).
PYTEST_ARGS ?=
XDIST := -n auto --dist loadfile --no-loadscope-reorder
TEST_PY := PYTHONDONTWRITEBYTECODE= $(PY)
test: $(STAMP)
	$(TEST_PY) -m pytest analytic_tests tests $(XDIST) $(PYTEST_ARGS)

test-analytic: $(STAMP)
	$(TEST_PY) -m pytest analytic_tests $(PYTEST_ARGS)

test-harness: $(STAMP)
	$(TEST_PY) -m pytest tests $(XDIST) $(PYTEST_ARGS)

# Between edits: the tests that start no other Python and are not slow (one that does, unmarked `process`, fails).
test-fast: $(STAMP)
	INFERLAB_FAST_LANE=1 $(TEST_PY) -m pytest analytic_tests tests -m "not process and not slow" -n auto --dist loadfile \
	  -q $(PYTEST_ARGS)

# The lab's own Python: `make test` on CPython 3.13, in a Debian 13 root, on the committed HEAD (as root).
PY313_TARGET ?= test
test-py313:
	tools/debian13-root.sh $(PY313_TARGET)

# Re-pin after a deliberate upgrade: the lock's comments, this Python, pip freeze (the editable project and what a
# venv brings left out, as on every Python: 3.12+'s pip freeze lists setuptools) with torch's +cpu dropped, so that
# its line also finds each platform's own build.
lock:
	sed -n '/^# python:/d; /^#/p' requirements.lock > $(VENV)/lock.new
	$(PY) -c 'import platform; print("# python:", platform.python_version())' >> $(VENV)/lock.new
	$(PY) -m pip freeze --exclude-editable --exclude setuptools --exclude wheel | \
	  sed 's/^torch==\(.*\)+cpu$$/torch==\1/' >> $(VENV)/lock.new
	mv $(VENV)/lock.new requirements.lock

clean-venv:
	rm -rf $(VENV)
