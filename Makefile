# Two commands for a learner: `make run` and `make test`.
# Both create .venv from requirements.lock when it is missing or the lock changed.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.lock-installed
PY := $(VENV)/bin/python
NOW := $(shell date -u +%Y%m%dT%H%M%SZ)
RUN_DIR ?= runs/$(NOW)
ARGS ?=

.PHONY: run test plan lock clean-venv

$(STAMP): requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	cp requirements.lock $(STAMP)

# The experiment itself. Pass options through ARGS, e.g.
#   make run ARGS="--specimen standin"
run: $(STAMP)
	$(PY) -m pytest experiments --record-dir $(RUN_DIR) $(ARGS)

# Print the schedule without loading a model.
plan: $(STAMP)
	$(PY) -m pytest experiments --plan --record-dir $(RUN_DIR) $(ARGS)

# Everything CI checks: offline analytic tests, the harness's own tests,
# then the whole experiment end to end on the stand-in specimen.
test: $(STAMP)
	$(PY) -m pytest analytic_tests
	$(PY) -m pytest tests
	$(PY) -m pytest experiments --specimen standin --record-dir $(RUN_DIR)-standin
	$(PY) -m inferlab verify $(RUN_DIR)-standin
	$(PY) -m inferlab report $(RUN_DIR)-standin --check

# Re-pin after a deliberate upgrade: keeps the header, and pins torch without the +cpu local tag
# so that the same line resolves to the platform's build elsewhere.
lock:
	{ grep '^#' requirements.lock; $(PY) -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean-venv:
	rm -rf $(VENV)
