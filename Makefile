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

clean:
	rm -rf $(VENV) calibd.db .pytest_cache .hypothesis
