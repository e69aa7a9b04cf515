#!/usr/bin/env bash
# The Airflow CLI against the local deployment (the embedded PostgreSQL, AIRFLOW_HOME under
# .triage/), e.g. while `make up` runs:
#
#   ./airflow.sh dags list
#   ./airflow.sh backfill create --dag-id classify_documents --from-date 2026-11-01 --to-date 2026-11-07
#
# TRIAGE_PYTHON chooses the interpreter (default: .venv/bin/python, built by `make setup` if
# missing). TRIAGE_DATABASE_URL and TRIAGE_HOME are honoured as by every make target.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${TRIAGE_PYTHON:-$root/.venv/bin/python}"
if [ ! -x "$python" ]; then
  if [ -n "${TRIAGE_PYTHON:-}" ]; then
    echo "airflow.sh: TRIAGE_PYTHON=$python is not an executable interpreter" >&2
    exit 2
  fi
  echo "airflow.sh: $python is missing; running 'make setup' first" >&2
  make -C "$root" setup >&2
fi
export PYTHONPATH="$root/plugins${PYTHONPATH:+:$PYTHONPATH}"
export TRIAGE_HOME="${TRIAGE_HOME:-$root/.triage}"
# `triage airflow ARGS` (triage_tools.local) from this checkout, whether or not the interpreter
# has it installed; the checkout goes on this process's sys.path only, not on Airflow's.
exec "$python" -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); from triage_tools.cli import main; sys.exit(main())' \
  "$root" airflow "$@"
