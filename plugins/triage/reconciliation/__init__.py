"""Reconciliation: the backstop that finds and repairs what the execution path left behind.

No Airflow imports: every rule takes an engine (or a connection) and plain values, so it runs
the same from ``reconcile_jobs``, a test or a shell. The ledger owns every statement: the
rules (:mod:`.rules`) ask its named checks (:mod:`triage.jobs.sql.reads.checks`) on a read-only
connection and repair through the store's named repairs (:mod:`triage.jobs.sql.moves.repairs`).
:mod:`.airflow_view` is the REST client for Airflow's own task states, :mod:`.report_queries`,
:mod:`.reporting`, :mod:`.charts` and :mod:`.render` the report, and :mod:`.runner` one whole
run.
"""
