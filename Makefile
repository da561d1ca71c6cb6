# `make run` serves calibd on the embedded SQLite default; `make test` runs the whole suite.
# Both create .venv on first use; `make run` installs calibd with its server (and PostgreSQL driver),
# `make test` adds the test extras.
# Afterwards the CLI is .venv/bin/calibd (or `source .venv/bin/activate`, then calibd).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run test docs bench clean

# setup.py builds the compiled kernels into app/calibration/ (optional: without a C compiler, numpy serves).
$(RUN_STAMP): pyproject.toml setup.py app/calibration/_kernels.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[server,postgres]'
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/calibd serve

test: $(STAMP)
	$(BIN)/pytest

# The documentation site, into site/; --strict fails on a broken link or anchor, or a page missing from the nav.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Every benchmark in benchmarks/, then benchmarks/RESULTS.md (about 25 minutes on 2 cores; needs wrk,
# and PostgreSQL for the /feedback one). One benchmark alone: $(BIN)/python benchmarks/<name>.py
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) calibd.db .pytest_cache .hypothesis build site app/calibration/_kernels*.so
