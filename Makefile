# Triage: two commands on a fresh machine (Python 3.11+ and make): `make run` and `make test`.
# Every target honours TRIAGE_DATABASE_URL; unset means the embedded PostgreSQL under .triage/.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PYTHONPATH := $(CURDIR)/plugins$(if $(PYTHONPATH),:$(PYTHONPATH))
export TRIAGE_HOME ?= $(CURDIR)/.triage
DATE   ?=
CONF   ?= {}

.PHONY: help setup test-deps lock migrate run up stop test test-all test-drills test-fast test-smoke smoke-tests bench bench-growth bench-intake chaos distributed lint clean reset-secrets schemas

help:
	@echo "make run [DATE=YYYY-MM-DD] [CONF='{json}'] [VERBOSE=1]  set up, migrate, run classify_documents then reconcile_jobs"
	@echo "make test [TEST_WORKERS=2 E2E_BESIDE=1]    the unit, ledger, airflow and e2e tiers (tests/conftest.py names them)"
	@echo "make test-all [DRILL_WORKERS=2]            make test, then the drills (make test-drills alone: chaos, Celery,"
	@echo "          [SMOKE=0 SMOKE_PYTHON=...]       make run/up, packaging), a smoke subset on CPython 3.13 beside them"
	@echo "make test-fast                             the unit and ledger tiers only (no Airflow): before a small change"
	@echo "make test-deps                             the Debian packages tests need (chromium, redis-server): apt-get as root"
	@echo "make chaos [CHAOS='--documents 20000 --dates 4']  the failure drill; exit 1 on a broken invariant"
	@echo "make distributed [DATE=YYYY-MM-DD] [CONF='{json}']  the day under CeleryExecutor: Redis, 2 Celery workers"
	@echo "make lock                                  refresh constraints.txt (and docker/triage-constraints.txt) with uv"
	@echo "make bench-intake                          POST-to-label latency of intake (1,000 documents over 10 s); needs make up running"
	@echo "make schemas                               write the event schemas (include/schemas/) from the models"
	@echo "make bench-growth [GROWTH_SIZES=100000,1000000,10000000]  cost per document as the ledger grows"
	@echo "make migrate | up | stop | bench | lint"
	@echo "make reset-secrets                         delete Airflow connections/variables another Fernet key encrypted"

# The virtualenv is rebuilt when a requirements file changes; constraints.txt locks the tree.
# Then the checkout itself, editable and without dependencies (pyproject.toml): the `triage`
# command, the product `triage` and the developer tools `triage_tools`.
$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt -c constraints.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

setup: $(STAMP)

# The local lock under Airflow's constraints for the image, for every supported Python, with uv's
# resolver (triage_tools/lock.py; under a minute). AIRFLOW_CONSTRAINTS=FILE names a copy of the base
# image's ${HOME}/constraints.txt; without it the official file is downloaded, and where that fails
# the lock keeps its pins and adds what is new.
lock: $(STAMP)
	$(PY) -m triage_tools.lock $(if $(AIRFLOW_CONSTRAINTS),--airflow-constraints $(AIRFLOW_CONSTRAINTS))

# Debian packages some tests need, which PyPI does not have: chromium (the reconciliation page in a
# browser) and redis-server (the Celery broker of make distributed). Installed here, once, with
# apt-get when missing and root (as CI runs); quick when present. Without them those tests skip,
# saying why, except under CI=true, where they fail: CI must run them.
test-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing="chromium fonts-liberation"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "make test-deps: missing: $$missing (Debian, as root: apt-get install $$missing); the tests that need them skip"; \
		exit 0; \
	fi; \
	echo "make test-deps: apt-get install $$missing"; \
	export DEBIAN_FRONTEND=noninteractive; log=$$(mktemp); \
	apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends $$missing >$$log 2>&1 \
		|| { apt-get update -q && apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends $$missing; } >>$$log 2>&1 \
		|| { tail -n 20 $$log; echo "make test-deps: apt-get failed; the tests that need $$missing skip (fail under CI=true)"; }; \
	rm -f $$log


migrate: $(STAMP)
	$(BIN)/triage migrate

# VERBOSE=1: Airflow's own output on screen, instead of in the log file whose path is printed.
run: $(STAMP)
	$(BIN)/triage run --date '$(DATE)' --conf '$(CONF)'$(if $(filter-out 0,$(VERBOSE)), --verbose)

up: $(STAMP)
	$(BIN)/triage up

stop: $(STAMP)
	$(BIN)/triage stop

# After `make clean` with TRIAGE_DATABASE_URL set, the metadata keeps secrets encrypted with the
# lost key of the old airflow.cfg: delete them (make run writes Triage's again).
reset-secrets: $(STAMP)
	$(BIN)/triage reset-secrets

# The tests in tiers (tests/conftest.py says which tier a test goes to):
#   tests/unit     no database            tests/ledger  a real PostgreSQL (the embedded one)
#   tests/airflow  DAG integrity and forked `airflow dags test` runs
#   tests/e2e      ONE running Airflow (API server, scheduler, DAG processor, triggerer) that
#                  every module shares (tests/e2e/conftest.py)
#   tests/drills   what starts deployments of its own on purpose: the chaos drill, Celery,
#                  make run / make up, Fernet keys, FAB, backup and restore, pip resolutions
# make test runs the first four: unit, ledger and airflow on TEST_WORKERS pytest-xdist workers,
# and beside them the e2e tier in one pytest process of its own (no xdist: one deployment, not one
# per worker), whose output goes to a log shown at the end. The e2e tier mostly waits on its
# deployment, so beside the CPU-bound tiers it costs their wall time less than it takes alone
# (E2E_BESIDE=0: after them). make test-all adds the drills on DRILL_WORKERS workers, with the
# CPython 3.13 smoke beside them. Every worker shares the one embedded server; each migrates a
# template database of its own and clones one per test (tests/conftest.py).
# --dist loadfile keeps a module's tests on one worker: they share module fixtures (an Airflow
# deployment, a private server), made once. (loadgroup would be finer but groups nothing with
# pytest 9.2: pytest-xdist issue 1386.) In collection order (--no-loadscope-reorder; xdist's
# default hands out the files of most tests first): tests/conftest.py puts the long modules first,
# so they start first instead of running alone at the end.
TEST_WORKERS  ?= 2
DRILL_WORKERS ?= 2
E2E_BESIDE    ?= 1
PYTEST_ARGS   ?=
XDIST         := --dist loadfile --no-loadscope-reorder
FAST_TIERS    := tests/unit tests/ledger tests/airflow
E2E_LOG       := $(TRIAGE_HOME)/logs/test-e2e.log

# A phase beside the drills: CPython 3.13 (Debian 13's python3), on a virtualenv of its own
# built as .venv is, runs the smoke subset below, so that every make test-all (and so CI) shows
# Triage installing and running on 3.13 too, not only on .venv's Python: the embedded
# PostgreSQL's package, the migrations and the ledger, the pipeline, the plugin's pages, Airflow
# parsing the DAGs and a real `dags test` run. Beside the drills, whose workers wait on Airflow,
# it costs little wall time; alone it takes ~3.5 min (venv 1.5 min, tests 1.7 min).
# SMOKE_PYTHON is the interpreter (default: pyenv's or PATH's python3.13, found by
# triage_tools.lock.interpreter); SMOKE=0 leaves the phase out; none found: the phase says so and passes, except
# under CI=true. Left out when .venv is 3.13 itself: the whole suite ran there.
SMOKE         ?= 1
SMOKE_VERSION := 3.13
SMOKE_VENV    := .venv-$(SMOKE_VERSION)
SMOKE_WORKERS ?= 2
SMOKE_TESTS   ?= tests/unit tests/ledger/test_embedded.py tests/ledger/test_migrations.py \
	tests/ledger/test_concurrency.py tests/ledger/test_pipeline_classify.py \
	tests/ledger/test_pipeline_llm.py tests/ledger/test_triage_web.py \
	tests/ledger/test_intake_ledger.py tests/airflow/test_dag_integrity.py \
	tests/airflow/test_classify_documents_e2e.py
SMOKE_LOG     := $(TRIAGE_HOME)/logs/test-smoke-$(SMOKE_VERSION).log
# make runs a recipe line that names $$(MAKE) even under -n (to recurse), and the whole of
# `test` is one line: `make -n test` (tests/ledger/test_readme.py) would run the suite.
SUB_MAKE      := $(MAKE) --no-print-directory
# Ports the tests ask for and bind later are drawn per worker class (tests/harness/airflow.py):
# in make test the workers take classes 0..TEST_WORKERS-1 and the e2e process the next; in the
# drills phase the drills' workers take the first classes, the smoke's the ones after.
TEST_PORTS    := TRIAGE_TEST_PORT_CLASSES=$$(($(TEST_WORKERS) + 1))
E2E_PORTS     := $(TEST_PORTS) TRIAGE_TEST_PORT_CLASS_FIRST=$(TEST_WORKERS)
DRILL_PORTS   := TRIAGE_TEST_PORT_CLASSES=$$(($(DRILL_WORKERS) + $(SMOKE_WORKERS)))
# Bytecode written even where PYTHONDONTWRITEBYTECODE is set (as on this machine): every pytest
# process collects every test module, and without pytest's cache of the rewritten modules each
# rewrites them all again (collection 9.5 -> 7 CPU-s a process, five a run; docs/performance.md).
test test-all test-drills test-fast test-smoke smoke-tests: export PYTHONDONTWRITEBYTECODE =
test: $(STAMP) test-deps
	@status=0; e2e=""; mkdir -p $(dir $(E2E_LOG)); \
	if [ "$(E2E_BESIDE)" != 0 ]; then \
		echo "make test: the e2e tier beside the others, on one shared deployment (its output: $(E2E_LOG), shown at the end)"; \
		$(E2E_PORTS) $(PY) -m pytest -p no:xdist $(PYTEST_ARGS) tests/e2e >$(E2E_LOG) 2>&1 & e2e=$$!; \
	fi; \
	echo "make test: the unit, ledger and airflow tiers on $(TEST_WORKERS) workers"; \
	$(TEST_PORTS) $(PY) -m pytest -n $(TEST_WORKERS) $(XDIST) $(PYTEST_ARGS) $(FAST_TIERS) || status=1; \
	if [ -n "$$e2e" ]; then \
		wait $$e2e || status=1; \
		echo "make test: the e2e tier ($(E2E_LOG)):"; cat $(E2E_LOG); \
	else \
		echo "make test: the e2e tier, on one shared deployment"; \
		$(E2E_PORTS) $(PY) -m pytest -p no:xdist $(PYTEST_ARGS) tests/e2e || status=1; \
	fi; \
	if [ $$status != 0 ]; then echo "make test: FAILED (see the tiers above)"; fi; \
	exit $$status

# make test, then the drills (test-drills). Both run even when the first fails.
test-all: $(STAMP) test-deps
	@status=0; \
	$(SUB_MAKE) test || status=1; \
	$(SUB_MAKE) test-drills || status=1; \
	if [ $$status != 0 ]; then echo "make test-all: FAILED (see the phases above)"; fi; \
	exit $$status

# The drills on DRILL_WORKERS workers, longest first (tests/conftest.py), with the CPython 3.13
# smoke beside them (SMOKE above).
test-drills: $(STAMP) test-deps
	@status=0; \
	smoke=""; \
	if [ "$(SMOKE)" != 0 ]; then \
		mkdir -p $(dir $(SMOKE_LOG)); \
		echo "make test-drills: the CPython $(SMOKE_VERSION) smoke beside the drills (its output: $(SMOKE_LOG), shown at the end)"; \
		$(SUB_MAKE) test-smoke TRIAGE_TEST_PORT_CLASS_FIRST=$(DRILL_WORKERS) $(DRILL_PORTS) >$(SMOKE_LOG) 2>&1 & smoke=$$!; \
	fi; \
	echo "make test-drills: the drills on $(DRILL_WORKERS) workers"; \
	$(DRILL_PORTS) $(PY) -m pytest -n $(DRILL_WORKERS) $(XDIST) $(PYTEST_ARGS) tests/drills || status=1; \
	if [ -n "$$smoke" ]; then \
		wait $$smoke || status=1; \
		echo "make test-drills: the CPython $(SMOKE_VERSION) smoke ($(SMOKE_LOG)):"; cat $(SMOKE_LOG); \
	fi; \
	if [ $$status != 0 ]; then echo "make test-drills: FAILED (see the phases above)"; fi; \
	exit $$status

# The smoke phase alone (see SMOKE above). Its own virtualenv is made by this Makefile run again
# with VENV and PYTHON set, so it is built and refreshed exactly as .venv is.
test-smoke: $(STAMP)
	@python="$(SMOKE_PYTHON)"; \
	if [ -z "$$python" ]; then python=$$($(PY) -c 'from triage_tools.lock import interpreter; print(interpreter("$(SMOKE_VERSION)") or "")'); fi; \
	if $(PY) -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "$(SMOKE_VERSION)")'; then \
		echo "make test-smoke: $(VENV) is CPython $(SMOKE_VERSION) already: nothing to add"; exit 0; \
	fi; \
	if [ -z "$$python" ]; then \
		if [ "$$CI" = true ]; then echo "make test-smoke: FAILED: no CPython $(SMOKE_VERSION) here (SMOKE_PYTHON=...)"; exit 1; fi; \
		echo "make test-smoke: no CPython $(SMOKE_VERSION) here: the smoke phase is left out (SMOKE_PYTHON=...)"; exit 0; \
	fi; \
	echo "make test-smoke: $$python, virtualenv $(SMOKE_VENV)"; \
	$(SUB_MAKE) VENV=$(SMOKE_VENV) PYTHON="$$python" smoke-tests

# The tiers without Airflow: unit and ledger (a minute or two; before a small change).
test-fast: $(STAMP) test-deps
	$(PY) -m pytest -n $(TEST_WORKERS) $(XDIST) $(PYTEST_ARGS) tests/unit tests/ledger

# Run by test-smoke with VENV=$(SMOKE_VENV): $(PY) and the PATH are that virtualenv's. The tests
# do not inherit this sub-make's MAKEFLAGS: a test's own `make -n run` would print the smoke's VENV.
smoke-tests: $(STAMP)
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $(PY) -m pytest -n $(SMOKE_WORKERS) --dist loadfile $(PYTEST_ARGS) $(SMOKE_TESTS)

bench: $(STAMP)
	$(PY) -m bench

# Longer than make bench (minutes at 1M jobs, most of an hour at 10M; docs/performance.md): the
# ledger bulk-loaded to each size and a day's work, reconciliation and the review page timed.
GROWTH_SIZES ?= 100000,1000000
bench-growth: $(STAMP)
	BENCH_GROWTH_SIZES=$(GROWTH_SIZES) $(PY) -m bench growth

# Intake's POST-to-label latency against the running `make up` (bench/intake_latency.py): not in
# `make bench`, which needs no deployment; results in bench/results/intake-latency.json.
bench-intake: $(STAMP)
	$(PY) -m bench.intake_latency

# The failure drill on a deployment of its own under $(TRIAGE_HOME)/chaos (.venv/bin/triage chaos -h).
CHAOS ?=
chaos: $(STAMP)
	$(BIN)/triage chaos $(CHAOS)

# classify_documents for DATE under CeleryExecutor on this machine: Redis (apt's redis-server,
# installed when missing and root), two Celery workers, all stopped again (docs/distributed.md).
distributed: $(STAMP)
	$(BIN)/triage distributed --date '$(DATE)' --conf '$(CONF)'

# The event registry: the JSON schema of every published event, generated from the pydantic
# models (docs/events.md); tests fail when a committed file and its model differ.
schemas: $(STAMP)
	$(BIN)/triage schemas

lint: $(STAMP)
	$(BIN)/ruff check plugins dags tests bench triage_tools
	$(BIN)/ruff format --check plugins dags tests bench triage_tools
	$(BIN)/mypy

clean: stop
	rm -rf $(TRIAGE_HOME)
