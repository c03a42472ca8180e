# The few commands everyone runs. `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-compiled lint format clean k8s-bin k8s-up test-k8s bench bench-quick bench-spill bench-tenants profile \
	system-deps typecheck image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)  ## the resources example on a local cluster
	$(BIN)/apportion demo

test: $(STAMP) k8s-bin system-deps image  ## lint, types, the whole test suite (Kubernetes tests included), the compiled build
	$(BIN)/ruff check .
	MYPY=$(BIN)/mypy tools/typecheck.sh
	$(BIN)/python -m pytest
	$(MAKE) --no-print-directory test-compiled

system-deps:  ## the system packages the tests need (tests/system-deps/*.sh); nothing when present
	@for script in tests/system-deps/*.sh; do [ -e "$$script" ] || continue; bash "$$script" || exit 1; done

k8s-bin:  ## build (or reuse) the test Kubernetes binaries: 6-14 min cold, instant when cached
	bash tests/k8s/build.sh

image:  ## the apportion image (podman, or docker), cached by a hash of its inputs
	bash tests/k8s/image/build.sh

k8s-up: $(STAMP) k8s-bin image  ## a local Kubernetes cluster with fake GPU nodes, until Ctrl-C
	$(BIN)/python -m tests.k8s up

# APPORTION_K8S_PODS=processes runs pods as local processes instead of containers (faster,
# no image build needed): for inner-loop development.
test-k8s: $(STAMP) k8s-bin $(if $(filter processes,$(APPORTION_K8S_PODS)),,image)  ## only the Kubernetes tests
	$(BIN)/python -m pytest -m k8s tests/k8s

typecheck: $(STAMP)  ## mypy over the whole package, laid out as it is imported
	MYPY=$(BIN)/mypy tools/typecheck.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The compiled build (setup.py): the scheduler's state machine compiled with mypyc, installed
# from a wheel (never editable). Its venvs reinstall whenever the package's sources change.
PACKAGE_SOURCES := setup.py pyproject.toml \
	$(shell find apportion scheduler worker k8s_operator -name '*.py' -not -path '*/__pycache__/*')
# The build needs mypy; installed into the venv itself, so pip builds without isolation.
BUILD_REQS      := "setuptools>=77" wheel mypy
COMPILED_VENV   := .venv-compiled
COMPILED_STAMP  := $(COMPILED_VENV)/.installed
# The scheduler's pure unit tests, a few on real processes, and the check that they really
# ran the compiled modules.
COMPILED_TESTS  := compiled/test_compiled_build.py unit/test_resources.py \
	unit/test_scheduler_state.py unit/test_scheduler_random.py unit/test_placement.py \
	unit/test_perf_placement.py unit/test_retire.py unit/test_validation.py \
	unit/test_scheduler_reservations.py unit/test_scheduler_no_starvation.py \
	unit/test_scheduler_recovery.py unit/test_worker_restrictions.py unit/test_secession.py \
	unit/test_set_resources.py unit/test_small_results.py \
	integration/test_resources.py integration/test_worker_loss.py \
	integration/test_large_data.py integration/test_scheduler_restart.py \
	integration/test_worker_placement.py integration/test_tasks_submit_tasks.py

$(COMPILED_STAMP): $(PACKAGE_SOURCES)
	$(PYTHON) -m venv $(COMPILED_VENV)
	$(COMPILED_VENV)/bin/pip install --quiet --upgrade pip $(BUILD_REQS)
	APPORTION_COMPILE=1 $(COMPILED_VENV)/bin/pip install --quiet --no-build-isolation '.[test]'
	touch $(COMPILED_STAMP)

# pytest puts the directory above the tests/ package first on sys.path; at the repository
# root that would import the source tree's apportion/ instead of the compiled install. So
# the tests run from a copy of tests/ in an empty temporary directory (which is also the
# working directory of the processes they start), with the README and docs/ whose examples
# tests run.
test-compiled: $(COMPILED_STAMP)  ## the scheduler's tests against the mypyc-compiled build
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cp -R tests README.md docs "$$tmp/" && \
	cd "$$tmp" && APPORTION_EXPECT_COMPILED=1 $(CURDIR)/$(COMPILED_VENV)/bin/python -m pytest \
		-c $(CURDIR)/pyproject.toml --rootdir . -p no:cacheprovider \
		$(addprefix tests/,$(COMPILED_TESTS))

# Benchmarks against dask.distributed and Ray live in their own venv (big dependencies),
# with apportion compiled as above.
BENCH_VENV  := .venv-bench
# Every system runs on this interpreter: the distribution's python3 where there is one (built
# with optimizations and libpython linked in, like the official Docker images' Python), else
# $(PYTHON). A pyenv default build (--enable-shared, no PGO/LTO) runs every system here
# about 15% slower (callgrind: 15% more instructions per scheduler placement).
BENCH_PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, venv; assert sys.version_info >= (3, 10)' \
	2>/dev/null && echo /usr/bin/python3 || echo $(PYTHON))
BENCH_STAMP := $(BENCH_VENV)/.installed
# They run from a directory holding only a link to benchmarks/: `python -m` puts the working
# directory first on sys.path, and at the repository root that would import the source
# tree's apportion/ instead of the compiled install. (Relative paths in BENCH_ARGS are
# relative to that directory: give --out as an absolute path.)
BENCH_PATH  := $(BENCH_VENV)/path
BENCH_RUN   := cd $(BENCH_PATH) && $(CURDIR)/$(BENCH_VENV)/bin/python -m

$(BENCH_STAMP): $(PACKAGE_SOURCES) benchmarks/requirements.txt
	$(BENCH_PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip $(BUILD_REQS)
	$(BENCH_VENV)/bin/pip install --quiet -r benchmarks/requirements.txt
	APPORTION_COMPILE=1 $(BENCH_VENV)/bin/pip install --quiet --no-build-isolation .
	mkdir -p $(BENCH_PATH) && ln -sfn $(CURDIR)/benchmarks $(BENCH_PATH)/benchmarks
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)  ## apportion vs dask.distributed vs Ray; results in benchmarks/results
	$(BENCH_RUN) benchmarks.run $(BENCH_ARGS)
	$(BENCH_RUN) benchmarks.tenants
	$(BENCH_RUN) benchmarks.spill
	$(BENCH_RUN) benchmarks.map_million $(MAP_ARGS)

bench-tenants: $(BENCH_STAMP)  ## two tenants' GPU backlogs by weight, a quota (docs/sharing.md)
	$(BENCH_RUN) benchmarks.tenants $(TENANTS_ARGS)

bench-quick: $(BENCH_STAMP)
	$(BENCH_RUN) benchmarks.run --quick $(BENCH_ARGS)

bench-spill: $(BENCH_STAMP)  ## results larger than memory: apportion vs dask vs Ray, 2 workers at 1 GiB
	$(BENCH_RUN) benchmarks.spill $(BENCH_ARGS)

profile: $(BENCH_STAMP)  ## py-spy / pyinstrument profiles of apportion's processes
	$(BENCH_RUN) benchmarks.profile

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(COMPILED_VENV) build *.egg-info .pytest_cache .ruff_cache
