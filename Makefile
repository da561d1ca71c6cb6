# `make run` serves calibd on the embedded SQLite default; `make test` runs the whole suite.
# Both create .venv on first use and install what they need into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/calibd serve

test: $(STAMP)
	$(BIN)/pytest

# Every benchmark in benchmarks/, then benchmarks/RESULTS.md (about 25 minutes on 2 cores; needs wrk,
# and PostgreSQL for the /feedback one). One benchmark alone: $(BIN)/python benchmarks/<name>.py
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) calibd.db .pytest_cache .hypothesis
