# Every target creates .venv itself when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint proto bench bench-postgres clean browser-deps

install: $(STAMP)

$(STAMP): pyproject.toml testkit/pyproject.toml
	@echo "installing mwms and its dependencies (TensorFlow among them) into $(VENV): 1-2 minutes the first time"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[server,agent,dev]' -e ./testkit
	@echo "installed into $(VENV)"
	touch $(STAMP)

demo: install
	$(BIN)/mwms quickstart

# Two workers, a test module at a time on each (module-scoped clusters stay whole); ports and uids that
# tests name are shifted per worker, and the longest modules go first, in the order tests/conftest.py gives
# (testkit/mwms_testkit/parallel.py; not reordered by test count). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

test: install
	$(BIN)/python -m pytest -ra --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -ra --durations=15 tests/unit tests/integration $(PYTEST_ARGS)

# mypy reaches server/ and worker_agent/ through the links mwms/server and mwms/worker_agent.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy mwms mwms_runtime
	$(BIN)/lint-imports

proto: install
	$(BIN)/python scripts/gen_proto.py

bench: install
	$(BIN)/python bench/run.py; status=$$?; $(BIN)/python bench/sharing.py --db sqlite --db postgres || status=1; \
		$(BIN)/python bench/replicas.py || status=1; $(BIN)/python bench/environments.py || status=1; \
		$(BIN)/python bench/confinement.py || status=1; $(BIN)/python bench/warm_starts.py || status=1; \
		exit $$status

# The same scenarios against a throwaway PostgreSQL 15 server the benchmark starts (initdb, pg_ctl).
bench-postgres: install
	$(BIN)/python bench/run.py --db postgres

# On a GPU machine, as root: sandboxed tasks see exactly their GPUs, at full speed (scripts/gpu_check.py;
# exit 0 passed, 1 failed, 2 skipped: no GPU, not root, no bubblewrap). GPU_CHECK_ARGS="--json --keep".
.PHONY: gpu-check
gpu-check: install
	$(BIN)/python scripts/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
