# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz lint docs bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# pip byte-compiles what it installs, but not an editable source tree: do it here, so that
	# start-up does not recompile suture where PYTHONDONTWRITEBYTECODE is set.
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/suture demo

test: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/python -m pytest -q

# 10,000 hostile inputs per reader and 20 SIGKILLs of a streaming save; counts in docs/reliability.md.
fuzz: $(STAMP)
	SUTURE_FUZZ_EXAMPLES=10000 SUTURE_FUZZ_REPORT=fuzz-report.json $(BIN)/python -m pytest -q -p no:randomly tests/test_fuzz.py
	SUTURE_CRASH_RUNS=20 SUTURE_CRASH_REPORT=crash-report.txt $(BIN)/python -m pytest -q tests/test_reliability.py -k "sigkill or two_writers"
	@cat fuzz-report.json crash-report.txt

# The user guide (mkdocs.yml), built strictly: a warning (a broken link, a nav entry with
# no page) fails the build; NO_MKDOCS_2_WARNING quiets Material's notice about its own
# end of life, which says nothing about these docs. tests/test_docs.py runs the same build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

# Benchmarks run as modules from the root: bench/inspect.py must not shadow the stdlib.
bench: $(STAMP)
	$(BIN)/python -m bench.inspect
	$(BIN)/python -m bench.partial_load
	$(BIN)/python -m bench.streaming
	$(BIN)/python -m bench.convert

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
