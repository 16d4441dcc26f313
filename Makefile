# Two entry points for a fresh machine (Python 3.11, pip, gcc): `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## run: a local raftgate (store + proxy) serving the etcd v3 API on 127.0.0.1:2379
run: $(STAMP)
	$(BIN)/raftgate local $(ARGS)

## test: lint (ruff, then the import contracts in pyproject.toml), then the whole test suite
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/pytest -q $(PYTEST_ARGS)

## protos: regenerate the Python code from protos/*.proto
protos: $(STAMP)
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) raftgate-data
