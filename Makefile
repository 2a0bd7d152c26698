VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean

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

test: lint
	$(VENV)/bin/pytest -q

bench: $(STAMP)
	$(PY) bench/queue_throughput.py
	$(PY) bench/cleanup_throughput.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache expiry-demo.db* expiry-demo.toml
