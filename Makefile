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

.PHONY: help setup lock migrate run up stop test test-fast bench chaos distributed lint clean reset-secrets

help:
	@echo "make run [DATE=YYYY-MM-DD] [CONF='{json}'] [VERBOSE=1]  set up, migrate, run classify_documents then reconcile_jobs"
	@echo "make test                                  the whole test suite"
	@echo "make chaos [CHAOS='--documents 20000 --dates 4']  the failure drill; exit 1 on a broken invariant"
	@echo "make distributed [DATE=YYYY-MM-DD] [CONF='{json}']  the day under CeleryExecutor: Redis, 2 Celery workers"
	@echo "make lock                                  refresh docker/airflow-constraints.txt and constraints.txt"
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

# Airflow's constraints for the image (docker/airflow-constraints.txt: the official file, or a
# stand-in that says so where it cannot be downloaded), then the local lock under them, for every
# supported Python (triage_tools/lock.py; a few minutes: pip resolves without installing).
lock: $(STAMP)
	$(PY) -m triage_tools.lock

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

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

bench: $(STAMP)
	$(PY) -m bench

# The failure drill on a deployment of its own under $(TRIAGE_HOME)/chaos (.venv/bin/triage chaos -h).
CHAOS ?=
chaos: $(STAMP)
	$(BIN)/triage chaos $(CHAOS)

# classify_documents for DATE under CeleryExecutor on this machine: Redis (apt's redis-server,
# installed when missing and root), two Celery workers, all stopped again (docs/distributed.md).
distributed: $(STAMP)
	$(BIN)/triage distributed --date '$(DATE)' --conf '$(CONF)'

lint: $(STAMP)
	$(BIN)/ruff check plugins dags tests bench triage_tools
	$(BIN)/ruff format --check plugins dags tests bench triage_tools
	$(BIN)/mypy

clean: stop
	rm -rf $(TRIAGE_HOME)
