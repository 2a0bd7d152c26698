VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test drills lint bench bench-peers clean

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/expiry demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples tools
	$(VENV)/bin/ruff format --check src tests bench examples tools
	$(VENV)/bin/mypy

# The suite, less the drills: lint, then the tests in TEST_WORKERS processes
# (pytest-xdist), then the few marked serial (they read the whole server's
# load) alone. Every test makes its own databases, servers and ports, so any
# may run beside any other. Four processes on two cores: the tests wait on
# their databases more than they compute (about 34 minutes in one process,
# 12.3 in three, 10.5 in four).
TEST_WORKERS ?= 4

test: lint
	@status=0; \
	if [ "$(TEST_WORKERS)" = 1 ]; then \
	  $(VENV)/bin/pytest -q -m "not drill" --durations=15 || status=1; \
	else \
	  $(VENV)/bin/pytest -q -n $(TEST_WORKERS) -m "not serial and not drill" --durations=15 || status=1; \
	  $(VENV)/bin/pytest -q -m "serial and not drill" || status=1; \
	fi; \
	exit $$status

# The failure drills (tests/drills: they kill and restart real processes and
# servers) and the benchmarks' short forms (tests/bench), in one process: each
# reads the machine's load. About 10 minutes; CI runs it after make test.
drills: $(STAMP)
	$(VENV)/bin/pytest -q -m drill --durations=15

# The queue benchmark with all its peers: Oban-py needs Python >= 3.12, so a venv
# of its own from the first such interpreter found (PYTHON_BENCH to choose).
PYTHON_BENCH ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3 $(HOME)/.pyenv/versions/3.13*/bin/python3) $(shell for p in python3.12 python3.13; do $$p -c "" 2>/dev/null && command -v $$p; done))
BENCH_VENV := .venv-bench

bench-peers: pyproject.toml
	@test -n "$(PYTHON_BENCH)" || { echo "no Python >= 3.12 found: set PYTHON_BENCH"; exit 1; }
	$(PYTHON_BENCH) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench-peers]'
	$(BENCH_VENV)/bin/python bench/queue_throughput.py --jobs 50000 --rounds 3

bench: $(STAMP)
	$(PY) bench/queue_throughput.py
	$(PY) bench/cleanup_throughput.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache expiry-demo.db* expiry-demo.toml
