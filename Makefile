# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install the project with torch pinned (constraints.txt)
# to the locally available CPU build, so no CUDA wheels are pulled in.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# test processes (pytest-xdist): each test runs on one torch thread, so one process per core; an idle
# process takes tests queued for the other (worksteal), so one long test at the end does not leave a core idle;
# the slowest tests are printed at the end, to keep the default run within its 5 minutes
TEST_WORKERS ?= 2
TEST_FLAGS := -n $(TEST_WORKERS) --dist worksteal --durations=15

.PHONY: demo test test-slow lint docs bench peers clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) experiments/demo.py

test: $(STAMP)
	$(PY) -m pytest $(TEST_FLAGS)

test-slow: $(STAMP)
	$(PY) -m pytest $(TEST_FLAGS) -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check zoo experiments tests

docs: $(STAMP)
	$(PY) -m mkdocs build --strict

peers: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,peers,references]"

bench: $(STAMP)
	$(PY) -m zoo.bench --attention vanilla --lengths 256,512,1024

clean-venv:
	rm -rf $(VENV)
