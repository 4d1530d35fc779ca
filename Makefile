# bucketq — every target installs what it needs: the venv, the Python packages, the Maven jars.
# Tests, the demo and the benchmarks start their own test server (mongo-java-server) when
# BUCKETQ_MONGODB_URI is unset, and stop it by PID afterwards.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help venv jars browser lint docs test test-loaded test-pythons unit demo demo-cluster devserver devserver-stop bench bench-quick stress stress-quick soak clean

help:
	@echo "make demo          run the main job end to end (produce, consume, Spark) on the embedded test server"
	@echo "make demo-cluster  the same, with the Spark job under spark-submit on a standalone Spark cluster"
	@echo "make test          install everything, then every tier side by side (lint and docs, 3.11, 3.12, 3.13); all report"
	@echo "make test-loaded   make test with two CPU-bound processes beside it: no test may depend on an idle machine"
	@echo "make browser       install Debian's chromium and chromium-driver (the dashboard's browser test), as root"
	@echo "make docs          the documentation site (mkdocs.yml), strict: a broken link, anchor or API name fails it"
	@echo "make lint          ruff, mypy (bucketq and the Spark jobs), the generated sync store, no tracker numbers in what users read"
	@echo "make test-pythons  all but the Spark and browser tests on Python 3.12 and 3.13 (own venvs in .cache/venvs)"
	@echo "make unit          the tests that need no server (-m unit), in parallel: no JVM, no jars"
	@echo "make devserver     start a background test server; prints BUCKETQ_MONGODB_URI=<uri>"
	@echo "make devserver-stop"
	@echo "make bench | bench-quick    throughput: bucketq vs keuss vs naive vs floor"
	@echo "make stress | stress-quick  crash and fault harness"
	@echo "make soak          MINUTES (60) of mixed work under faults, then the history checker (SEED= replays)"

# The editable install of two package roots (bucketq, spark/bucketq_spark) makes setuptools print a boxed notice
# about same-named folders, as a Python warning that pip -q still shows: that one warning is ignored.
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation"
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(EDITABLE_QUIET) $(PY) -m pip install -q -c constraints.txt -e ".[test,spark,bench,docs]"
	touch $(STAMP)

venv: $(STAMP)

jars: $(STAMP)
	$(PY) -m devtools.jars testserver > /dev/null
	$(PY) -m devtools.jars spark > /dev/null

# The dashboard's browser test (tests/test_web_browser.py) drives Debian's Chromium through its chromedriver:
# both come from apt, never from a download at run time. Installed only when missing; apt needs root.
CHROMIUM := /usr/bin/chromium
CHROMEDRIVER := /usr/bin/chromedriver
browser:
	@if [ ! -x $(CHROMIUM) ] || [ ! -x $(CHROMEDRIVER) ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "make browser: installing chromium needs root (apt-get)" >&2; exit 1; fi; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
	fi

lint: venv
	$(PY) -m ruff check bucketq spark tests bench devtools examples
	$(PY) -m mypy
	$(PY) -m devtools.unasync --check
	$(PY) -m devtools.tracker_refs
	$(PY) -m bench.pages --check

# The documentation site, built strict into .cache/site (git-ignored): mkdocs.yml turns a link to a missing page, a
# missing anchor and a page left out of the nav into warnings, and strict mode fails on any warning; an API
# reference name that does not resolve fails it too. NO_MKDOCS_2_WARNING silences mkdocs-material's notice.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# The tiers (devtools/tiers.py): lint; the whole suite on the venv's Python (3.11), as unit, Spark and server tiers;
# on 3.12 and 3.13 the unit tests, and all the rest but the Spark and browser tests. They run side by side (the
# CPU-bound lint and unit tiers in turn), each pytest with a test server of its own; every tier
# runs whatever another's outcome, its output goes to .cache/tiers/<tier>.log and is printed when it ends, and the
# last lines give each tier's result, then the sums. PYTEST_ARGS go to every pytest tier.
# Bytecode (the suite's own modules, and what its subprocesses import) is cached under .cache/pycache even where
# PYTHONDONTWRITEBYTECODE is set: each of the tests' CLI, worker and stress processes otherwise compiles bucketq.
BYTECODE_ENV := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/.cache/pycache
test: venv jars browser
	$(PY) -m devtools.tiers --pytest-args "$(PYTEST_ARGS)"

test-pythons: venv jars
	$(PY) -m devtools.tiers --pytest-args "$(PYTEST_ARGS)" 3.12 3.13

# make test beside two busy loops (one per core), stopped by their PIDs however make test ends (failed, Ctrl-C).
test-loaded:
	@python3 -c "while True: pass" & one=$$!; python3 -c "while True: pass" & two=$$!; \
	trap 'kill $$one $$two 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	echo "make test-loaded: two CPU-bound processes beside make test (PIDs $$one $$two)"; \
	$(MAKE) --no-print-directory test

# Every test that needs no server, no JVM and is not slow: tests/conftest.py marks them "unit", the selection
# make test-pythons runs too. The tests on the in-memory database skip their idle waits (leases, delays, timeouts:
# tests/fast_clock.py), so the tier is CPU-bound: two workers on two cores (each collects the whole suite, 2.5 s of
# CPU; a third or fourth cost more CPU than its overlap saved). The property tests run a tenth of their examples
# (Hypothesis profile "unit", tests/conftest.py; make test runs them all). Neither anyio's pytest plugin nor
# Hypothesis's entry points (trio's, the only one) are needed: each imported trio in every worker. Bytecode (and
# pytest's rewritten test modules) is cached under .cache/pycache even where PYTHONDONTWRITEBYTECODE is set: each
# worker otherwise recompiles every module, which took a third of the tier's time. The first run fills the cache
# once, in one process, before the workers start.
UNIT_ENV := $(BYTECODE_ENV) BUCKETQ_HYPOTHESIS_PROFILE=unit HYPOTHESIS_NO_PLUGINS=1
UNIT_MARKS := unit
unit: venv
	@test -d .cache/pycache || $(UNIT_ENV) $(PY) -m pytest -m "$(UNIT_MARKS)" -q --collect-only > /dev/null
	$(UNIT_ENV) $(PY) -m pytest -p no:anyio -m "$(UNIT_MARKS)" -n 2 --dist worksteal -q $(PYTEST_ARGS)

demo: venv jars
	$(PY) -m examples.demo $(DEMO_ARGS)

demo-cluster: venv jars
	$(PY) -m examples.demo --cluster $(DEMO_ARGS)

devserver: venv
	@$(PY) -m devtools.testserver start

devserver-stop: venv
	@$(PY) -m devtools.testserver stop

# Each run rewrites bench/results/latest.json, then the docs' figures from it (docs/benchmarks.md's results,
# docs/SCALING.md's capacity model, the chart): make lint fails while they differ from what the file gives.
bench: venv jars
	$(PY) -m bench $(BENCH_ARGS)
	$(PY) -m bench.pages
	$(PY) -m bench.fleet

bench-quick: venv jars
	$(PY) -m bench --quick $(BENCH_ARGS)
	$(PY) -m bench.pages

stress: venv jars
	$(PY) -m tests.stress $(STRESS_ARGS)

stress-quick: venv jars
	$(PY) -m tests.stress --quick $(STRESS_ARGS)

# The soak run (tests/soak/runner.py): every role at once under a seeded fault schedule, then the checker.
MINUTES ?= 60
SEED ?=
soak: venv jars
	$(PY) -m tests.soak --minutes $(MINUTES) $(if $(SEED),--seed $(SEED)) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .cache .pytest_cache .hypothesis bench/.node
