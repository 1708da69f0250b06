# tl-serve: `make serve` sets up and serves the bundled model; `make check` sets up and runs every check.
PY ?= .venv/bin/python

# numba's cache; enginecore/kernels adds one subfolder per content of the kernels
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba
export PYTHONDONTWRITEBYTECODE = 1

# pytest's processes (pytest-xdist), one test file each at a time: most of a cold run is numba
# compiling on one thread, so two halve the run on this project's 2-core machines (bench/README);
# tests marked serial run after them, alone
TEST_WORKERS ?= 2

.PHONY: setup install model testdata gateway fmt lint type test test-all check serve bench

setup: install model testdata

install: .venv/.installed
.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

model: install
	$(PY) deploy/fetch_model.py

# llama.cpp's vocabularies with their test cases and real chat templates (tests/data/README.md)
testdata: install
	$(PY) -m tests.fixtures.llama_cpp_data

# the gateway test runs a real nginx from the distribution's packages
gateway:
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null \
	  || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; }

fmt: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

lint: install
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

type: install
	$(PY) -m mypy

test: setup
	$(PY) -m pytest tests/unit -q -n $(TEST_WORKERS) --dist loadfile

test-all: setup gateway
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(PY) -m pytest -q -m serial

check: setup lint type test-all

serve: setup
	.venv/bin/frontend --config deploy/runtime.toml

bench: setup
	$(PY) -m bench.model
