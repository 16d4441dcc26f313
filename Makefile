# Two entry points for a fresh machine (Python 3.11, pip, gcc): `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# test processes (pytest-xdist): the suite is mostly multi-process tests that wait on elections,
# timeouts and each other (two processes keep 2 cores about two-thirds busy), so three run side by
# side on 2 cores; a module stays on one (its fixtures start once)
TEST_WORKERS ?= 3

.PHONY: run test test-soak test-fast lint protos clean bytecode

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## run: a local raftgate (store + proxy) serving the etcd v3 API on 127.0.0.1:2379
run: $(STAMP)
	$(BIN)/raftgate local $(ARGS)

## test: lint (ruff, then the import contracts in pyproject.toml), then the whole test suite but
## its soak variants (`-m soak`: more kill rounds of paths the suite covers once, the quick benchmark)
test: $(STAMP) bytecode
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not soak" $(PYTEST_ARGS)

# The suite starts a store or a proxy about a thousand times; each compiles every module it
# imports unless its bytecode is on disk, which Python does not write where PYTHONDONTWRITEBYTECODE
# is set (as in many CI images): compiled once here (only what changed), ~0.1 s of CPU per start.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 authstore proxy raftgate protos bench tests

## test-soak: only the soak variants (CI runs them after `make test`, in a step of its own with a time bound)
test-soak: $(STAMP) bytecode
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m soak $(PYTEST_ARGS)

## test-fast: the unit tests, the Raft core and a short Raft simulation (no processes; about a minute)
test-fast: $(STAMP)
	RAFTGATE_SIM_STEPS=100000 $(BIN)/pytest -q tests/unit tests/raft tests/test_protos.py -m "not slow" $(PYTEST_ARGS)

## protos: regenerate the Python code from protos/*.proto
protos: $(STAMP)
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) raftgate-data
