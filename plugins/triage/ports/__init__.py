"""What the services ask of the world outside the ledger, as small Protocols and the values they
exchange: the label provider (:mod:`.label_actions`) and Airflow's view of its own task states
(:mod:`.airflow_states`).

The services (``pipeline/``, ``review/``, ``reconciliation/``) and ``web/`` name only these; the
adapter room (:mod:`triage.adapters`) implements them over HTTP and Airflow's connections. No
Airflow and no HTTP client here: a test gives any object that answers the same calls.
"""

from __future__ import annotations
