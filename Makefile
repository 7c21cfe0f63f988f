# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# `make test` runs the suite a second time, on the newest Python the dependencies have wheels
# for, in its own environment: the dev extra without torch, whose pinned build is a 3.11 wheel
# on this machine (any other Python would download a CUDA build of several GB), so the tests
# that need torch skip there. NEWEST_PYTHON=/path/to/python picks the interpreter by hand.
NEWEST_VENV := .venv-newest
NEWEST_BIN := $(NEWEST_VENV)/bin
NEWEST_STAMP := $(NEWEST_VENV)/.installed
# Tunix's own environment (google-tunix pins safetensors<0.8): tests/test_tunix.py compares
# suture with Tunix's loader and trainer there.
TUNIX_STAMP := .venv-tunix/.installed
NEWEST_VERSIONS ?= 3.14 3.13 3.12
# The first of NEWEST_VERSIONS that runs. pyenv puts a shim on PATH for each version it has
# but runs only the selected ones, so its versions/ folder is tried too; none: a loud failure.
find_newest = for v in $(or $(NEWEST_PYTHON),$(NEWEST_VERSIONS)); do \
	  for p in $$v python$$v $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v; do \
	    $$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { echo $$p; exit 0; }; \
	  done; \
	done; \
	echo "make: none of $(or $(NEWEST_PYTHON),$(NEWEST_VERSIONS)) is a Python 3.12 or newer that runs here: install one, or set NEWEST_PYTHON" >&2; exit 1
.PHONY: demo test test-newest fuzz lint docs bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The torch extra is a range (torch>=2.13); the suite's environment pins the 2.13.0 CPU
	# build in the same install, so the range asks nothing more (a newer release could be a
	# CUDA build), and pip resolves everything once.
	$(BIN)/python -m pip install --quiet 'torch==2.13.0' -e '.[dev]'
	# pip byte-compiles what it installs, but not an editable source tree: do it here, so that
	# start-up does not recompile suture where PYTHONDONTWRITEBYTECODE is set.
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

$(NEWEST_STAMP): pyproject.toml
	test -x $(NEWEST_BIN)/python || { py=$$($(find_newest)) && $$py -m venv $(NEWEST_VENV); }
	$(NEWEST_BIN)/python -m pip install --quiet --upgrade pip
	$(NEWEST_BIN)/python -m pip install --quiet -e '.[test]'
	$(NEWEST_BIN)/python -m compileall -q src
	touch $(NEWEST_STAMP)

# It needs only a Python to start from, not the project's environment: the three install
# side by side from the start.
$(TUNIX_STAMP): tests/tunix_env.py
	rm -rf .venv-tunix
	$(PYTHON) tests/tunix_env.py
	touch $(TUNIX_STAMP)

demo: $(STAMP)
	$(BIN)/suture demo

# Each suite runs on TEST_WORKERS processes (pytest-xdist; most tests wait on files,
# subprocesses and servers, so two per core keep the cores busy). --dist loadgroup keeps the
# tests of one `xdist_group` mark on one worker, one after another (tests/conftest.py says
# which and why); every worker has its own temporary folders and servers on ports of its own.
# TEST_WORKERS=0 runs a suite in one process, as before.
TEST_WORKERS ?= 2
PYTEST := -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The suite on Python 3.11 with every extra, then on the newest Python (test-newest), each on
# TEST_WORKERS workers. One suite at a time: the tests that measure wall-clock seconds (signals,
# barrier timeouts, matching deadlines) keep a core's worth of headroom. The three environments
# install side by side first.
test:
	$(MAKE) --no-print-directory -j3 $(STAMP) $(NEWEST_STAMP) $(TUNIX_STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/lint-imports --no-cache
	$(BIN)/python --version
	$(BIN)/python $(PYTEST)
	$(MAKE) --no-print-directory test-newest

# Tunix runs in its own Python 3.11 environment either way: its tests run once, above.
NEWEST_PYTEST = SUTURE_TUNIX_RAN="run by make test's first pass, in Tunix's own environment" \
	$(NEWEST_BIN)/python $(PYTEST)
test-newest: $(NEWEST_STAMP)
	$(NEWEST_BIN)/python --version
	$(NEWEST_PYTEST)

# 10,000 hostile inputs per reader and 20 SIGKILLs of a streaming save; counts in docs/reliability.md.
fuzz: $(STAMP)
	SUTURE_FUZZ_EXAMPLES=10000 SUTURE_FUZZ_REPORT=fuzz-report.json $(BIN)/python -m pytest -q -p no:randomly tests/test_fuzz.py
	SUTURE_FUZZ_EXAMPLES=1000 SUTURE_FUZZ_REPORT=fuzz-remote-report.json $(BIN)/python -m pytest -q -p no:randomly tests/test_fuzz_remote.py
	SUTURE_CRASH_RUNS=20 SUTURE_CRASH_REPORT=crash-report.txt $(BIN)/python -m pytest -q tests/test_reliability.py -k "sigkill or two_writers"
	SUTURE_FUZZ_EXAMPLES=1000 SUTURE_FUZZ_REPORT=fuzz-families-report.json $(BIN)/python -m pytest -q -p no:randomly tests/test_fuzz_families.py
	@cat fuzz-report.json fuzz-remote-report.json crash-report.txt fuzz-families-report.json

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
	rm -rf $(VENV) $(NEWEST_VENV) .venv-tunix build src/*.egg-info .pytest_cache
