"""What every Triage operator shares: the job database behind ``triage_db`` (the adapter room's
hook, :mod:`triage.adapters.ledger_db`), the run's batch key and config, and the lease owner name
of this task try (:mod:`triage.adapters.task_context`).

The names an operator module needs of the adapter room are imported here too, so that one import
gives an operator its base and its seams."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from triage.adapters.connections import api_server_url, http_url, variable
from triage.adapters.http_actions import (
    LABEL_ACTION_CONN_ID,
    build_label_action,
    event_sink,
    label_action_connection,
)
from triage.adapters.ledger_db import (
    DEFAULT_CONN_ID,
    MAINTENANCE_CONN_ID,
    REVIEW_CONN_ID,
    engine_from_hook,
    job_database_hook,
)
from triage.adapters.task_context import batch_key, fixed_batch, lease_owner, map_index, owner_prefix, run_prefix

if TYPE_CHECKING:
    import sqlalchemy as sa
    from airflow.providers.postgres.hooks.postgres import PostgresHook
    from airflow.sdk import Context

    from triage.contracts.run_config import ClassifyRunConfig
    from triage.jobs.store import JobStore
    from triage.jobs.vocabulary.states import Step
    from triage.operators.lineage import Lineage
    from triage.pipeline.ownership import Drain

__all__ = [
    "DEFAULT_CONN_ID",
    "LABEL_ACTION_CONN_ID",
    "MAINTENANCE_CONN_ID",
    "REVIEW_CONN_ID",
    "TriageOperator",
    "api_server_url",
    "batch_key",
    "build_label_action",
    "engine_from_hook",
    "event_sink",
    "fixed_batch",
    "http_url",
    "job_database_hook",
    "label_action_connection",
    "lease_owner",
    "map_index",
    "owner_prefix",
    "run_prefix",
    "variable",
]


class TriageOperator(BaseOperator):
    """Base of Triage's operators.

    :param triage_conn_id: the Airflow connection to the job database.
    :param batch: the batch this task works on, whatever its run (``classify_intake``: every
        run takes what intake queued); None, the default: the run's data interval.
    """

    drain_grace_seconds: ClassVar[float] = 3.0
    """After SIGTERM, how long jobs in flight may take to finish before they are given back:
    under the 5 s after which Airflow's supervisor escalates a SIGTERM it sent to SIGKILL."""

    ledger_step: ClassVar[Step | None] = None
    """The step whose jobs this task works on (claims, or registers into): what the failure
    callback gives up when Airflow gives up on the task. None: it holds no jobs."""

    def __init__(self, *, triage_conn_id: str = DEFAULT_CONN_ID, batch: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.triage_conn_id = triage_conn_id
        self.batch = batch

    def get_db_hook(self) -> PostgresHook:
        """The hook of ``triage_conn_id`` (:func:`job_database_hook`)."""
        return job_database_hook(self.triage_conn_id)

    def get_engine(self) -> sa.Engine:
        """The seam tests override: an engine on the job database, made once per task try."""
        return engine_from_hook(self.get_db_hook(), pool_size=3)

    @cached_property
    def engine(self) -> sa.Engine:
        return self.get_engine()

    @cached_property
    def drain(self) -> Drain:
        """Set by :meth:`on_kill`; the step runner stops at it (:mod:`triage.pipeline.ownership`)."""
        from triage.pipeline.ownership import Drain

        return Drain(self.drain_grace_seconds)

    def on_kill(self) -> None:
        """SIGTERM (a Celery shutdown, a pod eviction, a task killed from the UI) or the
        ``execution_timeout``: Airflow's task runner calls this from its signal handler, so it
        only requests the drain; the step gives its unstarted jobs back and stops."""
        self.drain.request()

    @cached_property
    def store(self) -> JobStore:
        from triage.jobs.store import JobStore

        return JobStore(self.engine)

    def run_config(self, context: Context) -> ClassifyRunConfig:
        """The run's params, checked against the model and against what this deployment allows
        (a drill only where ``TRIAGE_ALLOW_DRILL`` is on). Invalid or not allowed: the task
        fails without retry, since a retry would get the same params. ``classifier: auto`` comes
        back concrete (:func:`triage.learning.registry.resolve_classifier`: ``learned`` when the
        registry has a champion, else ``keyword``), read from the job database by each task."""
        from triage import settings
        from triage.contracts.run_config import ClassifyRunConfig, InvalidRunConfig, check_drill
        from triage.learning.registry import resolve_classifier

        try:
            config = ClassifyRunConfig.from_params(context["params"])
            check_drill(config, allowed=settings.drill_allowed())
        except InvalidRunConfig as exc:
            raise AirflowFailException(str(exc)) from None
        if config.classifier == "auto":
            config = config.model_copy(update={"classifier": resolve_classifier("auto", self.engine)})
        return config

    def dispose(self) -> None:
        if "engine" in self.__dict__:
            self.engine.dispose()

    # -- OpenLineage (triage.operators.lineage; docs/lineage.md) ------------------------------

    _triage_lineage: Lineage | None = None

    def record_lineage(self, build: Callable[[], Lineage]) -> None:
        """Keep what this try read and wrote (``build()``, called now) for the OpenLineage
        provider, which asks after the task (:meth:`get_openlineage_facets_on_complete`). An
        error in ``build`` is logged and leaves no lineage: it never fails the task."""
        from triage.operators.lineage import degrade

        self._triage_lineage = degrade(self.task_id, "lineage", build)

    def ledger_lineage(
        self,
        context: Context,
        read: list[str],
        written: list[str],
        done: dict[str, Any],
        *,
        also_read: list[tuple[str, str]] | None = None,
        also_written: list[tuple[str, str]] | None = None,
    ) -> Lineage:
        """The lineage of a step over the ledger: its ``read`` and ``written`` tables, the
        intake asset read on the intake batch, other datasets (``also_read``, ``also_written``:
        a source, the label provider) and the counts of ``done`` (what execute returns)."""
        from triage.contracts.intake import INTAKE_ASSET_URI, INTAKE_BATCH
        from triage.operators import lineage

        key = batch_key(context)
        inputs = [*(also_read or []), *lineage.ledger(self.engine.url, *read)]
        if key == INTAKE_BATCH:  # classify_intake: the documents the intake asset announced
            inputs.insert(0, lineage.asset(INTAKE_ASSET_URI))
        outputs = [*lineage.ledger(self.engine.url, *written), *(also_written or [])]
        return lineage.Lineage(inputs=inputs, outputs=outputs, counts=lineage.counts(done), batch=key)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The provider's hook after a successful try: the datasets read and written and the
        ``triage_jobs`` run facet, or None (no lineage recorded, or an error: logged, never raised)."""
        from triage.operators.lineage import degrade, operator_lineage

        return degrade(self.task_id, "facets", lambda: operator_lineage(self._triage_lineage))
