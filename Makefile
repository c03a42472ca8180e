# The few commands everyone runs. `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint format clean k8s-bin k8s-up test-k8s bench bench-quick profile

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)  ## the resources example on a local cluster
	$(BIN)/apportion demo

test: $(STAMP) k8s-bin  ## lint, then the whole test suite (Kubernetes tests included)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

k8s-bin:  ## build (or reuse) the test Kubernetes binaries: 6-14 min cold, instant when cached
	bash tests/k8s/build.sh

k8s-up: $(STAMP) k8s-bin  ## a local Kubernetes cluster with fake GPU nodes, until Ctrl-C
	$(BIN)/python -m tests.k8s up

test-k8s: $(STAMP) k8s-bin  ## only the Kubernetes tests
	$(BIN)/python -m pytest -m k8s tests/k8s

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Benchmarks against dask.distributed and Ray live in their own venv (big dependencies).
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml benchmarks/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/pip install --quiet -e . -r benchmarks/requirements.txt
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)  ## apportion vs dask.distributed vs Ray; results in benchmarks/results
	$(BENCH_VENV)/bin/python -m benchmarks.run $(BENCH_ARGS)

bench-quick: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m benchmarks.run --quick $(BENCH_ARGS)

profile: $(BENCH_STAMP)  ## py-spy / pyinstrument profiles of apportion's processes
	$(BENCH_VENV)/bin/python -m benchmarks.profile

clean:
	rm -rf $(VENV) $(BENCH_VENV) build *.egg-info .pytest_cache .ruff_cache
