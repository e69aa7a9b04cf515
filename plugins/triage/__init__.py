"""Triage: AI classification work on Airflow 3 with a PostgreSQL job ledger.

The domain packages (``jobs``, ``contracts``, ``sources``, ``classifiers``) import no Airflow;
``operators`` and ``callbacks`` adapt them to Airflow.
"""

from __future__ import annotations

__version__ = "0.1.0"
