"""Airflow operators: thin adapters over :mod:`triage.pipeline` and :mod:`triage.jobs`.

Importing this package is cheap (it runs at every DAG parse): the database, the classifiers
and HTTP clients are imported inside ``execute``.
"""

from __future__ import annotations

from triage.operators.classify_documents import (
    ClassifyDocumentsOperator,
    PersistLabelsOperator,
    PublishEventsOperator,
    RetrieveDocumentsOperator,
)

__all__ = [
    "ClassifyDocumentsOperator",
    "PersistLabelsOperator",
    "PublishEventsOperator",
    "RetrieveDocumentsOperator",
]
