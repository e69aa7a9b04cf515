"""What every Triage operator shares: the job database behind ``triage_db`` (through Airflow's
``PostgresHook``), the run's batch key and config, and the lease owner name of this task try.

Each connection logs in as a role that may do its DAG's job and nothing else (docs/security.md):
``triage_db`` the pipeline's (``triage_app``), ``triage_db_review`` reviewers' decisions
(``triage_review``: ``review_jobs`` and the web service), ``triage_db_maintenance`` retention
(``triage_maintenance``: the ``triage_maintenance`` DAG)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook, BaseOperator, Variable, conf
from airflow.sdk.exceptions import AirflowFailException

if TYPE_CHECKING:
    import sqlalchemy as sa
    from airflow.providers.postgres.hooks.postgres import PostgresHook
    from airflow.sdk import Context

    from triage.contracts.run_config import ClassifyRunConfig
    from triage.jobs.store import JobStore
    from triage.jobs.vocabulary.states import Step
    from triage.operators.lineage import Lineage
    from triage.pipeline.actions import WebhookLabelAction
    from triage.pipeline.ownership import Drain
    from triage.pipeline.publish import EventSink

DEFAULT_CONN_ID = "triage_db"
"""The pipeline's login (a member of ``triage_app``)."""

REVIEW_CONN_ID = "triage_db_review"
"""The review role's login (a member of ``triage_review``): the only one PostgreSQL lets move jobs
out of ``manual_review``, replay failed ones and write reviewers' labels."""

MAINTENANCE_CONN_ID = "triage_db_maintenance"
"""The maintenance role's login (a member of ``triage_maintenance``): the only one that may run
the retention functions."""

LABEL_ACTION_CONN_ID = "triage_label_action"
"""An HTTP connection whose host is the URL each label is POSTed to (with its idempotency key
and order): a model's accepted label before its job completes, a reviewer's after the decision.
Unset means no external action."""


def job_database_hook(conn_id: str) -> PostgresHook:
    """The job database's connection as Airflow's PostgreSQL hook.

    The hook builds the SQLAlchemy URL: driver ``postgresql+psycopg`` (psycopg 3 with SQLAlchemy
    2), ``host`` as it is, so a socket directory works (in the JSON form of the connection: a
    URI's ``?host=DIR`` lands in extra, which the hook's URL ignores), extra ``sqlalchemy_query``
    as the URL's query (``{"sslmode": "require"}``). A connection that names no database (no
    ``schema``) means ``triage``.
    """
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    from triage.database import TRIAGE_DATABASE

    hook = PostgresHook(postgres_conn_id=conn_id)
    if not hook.connection.schema:
        hook.database = TRIAGE_DATABASE
    return hook


def engine_from_hook(hook: PostgresHook, **kwargs: Any) -> sa.Engine:
    """An engine on the hook's database with the job database's engine options
    (:func:`triage.database.engine_options`); ``kwargs`` add to them (the pool size)."""
    from triage.database import engine_options

    return hook.get_sqlalchemy_engine(engine_kwargs=engine_options(**kwargs))


def api_server_url() -> str:
    """Airflow's API server where no connection names it (alert links, reconcile_jobs'
    cross-check): ``[api] base_url``, else localhost at ``[api] port`` (Airflow's default 8080).
    A server moved with ``AIRFLOW__API__PORT`` is then found on its port, not on 8080."""
    base = str(conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return base or f"http://localhost:{conf.getint('api', 'port', fallback=8080)}"


def http_url(conn: Any, *, default_path: str = "", default_port: int | None = None) -> str:
    """The URL an HTTP-style connection names, in every form Airflow gives one.

    A whole URL in ``host`` (the JSON form) is taken exactly as it is (a trailing ``/`` may
    matter to the endpoint). Otherwise: the scheme is
    ``schema`` when that is ``http``/``https``, else ``https`` for an ``https`` connection type,
    else extra ``scheme``, else ``http``; then host and port; the path is ``schema`` when that
    is not a scheme (the URI form ``http://h:8000/labels`` puts it there), else extra ``path``,
    else ``default_path``.
    """
    host = conn.host or ""
    if "://" in host:
        return str(host)
    host = host.rstrip("/")
    extra = conn.extra_dejson or {}
    schema = conn.schema or ""
    if schema in ("http", "https"):
        scheme, path = schema, extra.get("path", default_path)
    else:
        scheme = "https" if conn.conn_type == "https" else str(extra.get("scheme", "http"))
        path = schema or extra.get("path", default_path)
    port = conn.port or default_port
    return f"{scheme}://{host}{f':{port}' if port else ''}" + (f"/{str(path).lstrip('/')}" if path else "")


def fixed_batch(task: Any) -> str | None:
    """The batch a task was given (``batch=``), also on a mapped task not yet unmapped (the
    failure callback may get one); None: the run's data interval names it."""
    found = getattr(task, "batch", None)
    if found is None:
        found = (getattr(task, "partial_kwargs", None) or {}).get("batch")
    return str(found) if found else None


def batch_key(context: Context) -> str:
    """The task's batch (``classify_intake``'s tasks: ``intake``), else the DAG run's data
    interval: the unit of work that retries, callbacks and reports name."""
    fixed = fixed_batch(context.get("task"))
    if fixed is not None:
        return fixed
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        raise AirflowFailException("this run has no data interval; classify_documents needs one to know its documents")
    from triage.jobs.vocabulary.models import batch_key_for

    return batch_key_for(start, end)


def map_index(context: Context) -> int:
    """The task instance's map index; -1 when it is not mapped (the SDK may also say None)."""
    index = getattr(context["ti"], "map_index", None)
    return -1 if index is None else int(index)


def run_prefix(context: Context) -> str:
    """``dag/run/``: the leases, and the logged moves, of every task of this DAG run start with it."""
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}/"


def owner_prefix(context: Context) -> str:
    """``dag/run/task/map_index/``: leases of every try of this task start with it.

    Unambiguous as long as run ids hold no ``/`` (Airflow's default ``allowed_run_id_pattern``
    refuses it); the trailing ``/`` keeps map index 1 apart from 10.
    """
    return f"{run_prefix(context)}{context['ti'].task_id}/{map_index(context)}/"


def lease_owner(context: Context) -> str:
    return f"{owner_prefix(context)}try{context['ti'].try_number}"


def variable(name: str) -> str | None:
    """An Airflow Variable, or None when it is not set."""
    value = Variable.get(name, default=None)
    return str(value) if value not in (None, "") else None


def event_sink(webhook_conn_id: str | None, event_log: str | None) -> EventSink:
    """Where events go: the webhook of an HTTP connection when one is named, else the JSON-lines
    event log (``event_log``, then Variable ``triage_event_sink``, then the deployment's default)."""
    from triage import settings
    from triage.pipeline.publish import JsonlEventSink, WebhookEventSink

    if webhook_conn_id:
        conn = BaseHook.get_connection(webhook_conn_id)
        return WebhookEventSink(http_url(conn), headers=(conn.extra_dejson or {}).get("headers"))
    return JsonlEventSink(settings.event_log(event_log or variable("triage_event_sink")))


def label_action_connection(conn_id: str | None) -> Any:
    """The label action's connection, or None when it is not configured."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    if not conn_id:
        return None
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def build_label_action(conn_id: str | None) -> WebhookLabelAction | None:
    """The label action of the connection (extra ``timeout`` in seconds, ``headers``), or None
    when it is not configured. A timeout that is not a number fails the task without retry."""
    from triage.pipeline.actions import WebhookLabelAction

    conn = label_action_connection(conn_id)
    if conn is None:
        return None
    extra = conn.extra_dejson or {}
    try:
        timeout = float(extra.get("timeout", 10.0))
    except (TypeError, ValueError):
        raise AirflowFailException(
            f"the {conn_id} connection's extra timeout is not a number; fix it, then clear this task"
        ) from None
    return WebhookLabelAction(http_url(conn), timeout_s=timeout, headers=extra.get("headers"))


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
