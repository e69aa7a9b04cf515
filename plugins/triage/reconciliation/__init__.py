"""Reconciliation: the backstop that finds and repairs what the execution path left behind.

No Airflow imports: every rule takes an engine (or a connection) and plain values, so it runs
the same from ``reconcile_jobs``, a test or a shell. :mod:`.queries` holds the read-only
statements, :mod:`.repairs` the fenced writes, :mod:`.rules` the rules, :mod:`.airflow_view`
the REST client for Airflow's own task states, :mod:`.reporting`, :mod:`.charts` and
:mod:`.render` the report, and :mod:`.runner` one whole run.
"""
