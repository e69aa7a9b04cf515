"""Airflow's view of the work, as reconciliation asks for it (:func:`triage.reconciliation.
airflow_view.airflow_view`): the runs of a DAG and the task instances in given states, as plain
values. The client that reads them from Airflow's public REST API is the adapter room's
(:class:`triage.adapters.airflow_api.AirflowApi`); a test gives a fake that answers the same two
calls."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class AirflowApiUnavailable(Exception):
    """The API server cannot be reached, or refuses this client."""


@dataclass(frozen=True, slots=True)
class DagRunView:
    run_id: str
    state: str
    batch_key: str | None  # None: a run without a data interval


@dataclass(frozen=True, slots=True)
class TaskInstanceView:
    run_id: str
    task_id: str
    map_index: int
    state: str
    try_number: int


class AirflowStates(Protocol):
    """Airflow's runs and task instances of a DAG updated since a moment; each call raises
    :class:`AirflowApiUnavailable` when Airflow cannot answer (reconciliation then skips its view)."""

    def dag_runs(self, dag_id: str, since: datetime) -> dict[str, DagRunView]: ...

    def task_instances(self, dag_id: str, states: tuple[str, ...], since: datetime) -> list[TaskInstanceView]: ...
