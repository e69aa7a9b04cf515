"""The job database as Airflow reaches it: the postgres provider's ``PostgresHook`` on a
connection, and an engine with the job database's engine options.

Each connection logs in as a role that may do its DAG's job and nothing else (docs/security.md):
``triage_db`` the pipeline's (``triage_app``), ``triage_db_review`` reviewers' decisions
(``triage_review``: ``review_jobs`` and the web service), ``triage_db_maintenance`` retention
(``triage_maintenance``: the ``triage_maintenance`` DAG)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlalchemy as sa
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    from triage.jobs.store import JobStore

DEFAULT_CONN_ID = "triage_db"
"""The pipeline's login (a member of ``triage_app``)."""

REVIEW_CONN_ID = "triage_db_review"
"""The review role's login (a member of ``triage_review``): the only one PostgreSQL lets move jobs
out of ``manual_review``, replay failed ones and write reviewers' labels."""

MAINTENANCE_CONN_ID = "triage_db_maintenance"
"""The maintenance role's login (a member of ``triage_maintenance``): the only one that may run
the retention functions."""


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


def ledger_engine(conn_id: str = DEFAULT_CONN_ID, *, pool_size: int) -> sa.Engine:
    """An engine on the job database of ``conn_id`` keeping ``pool_size`` connections."""
    return engine_from_hook(job_database_hook(conn_id), pool_size=pool_size)


def ledger_store(conn_id: str = DEFAULT_CONN_ID, *, pool_size: int) -> JobStore:
    """The ledger (:class:`~triage.jobs.store.JobStore`) on :func:`ledger_engine`."""
    from triage.jobs.store import JobStore

    return JobStore(ledger_engine(conn_id, pool_size=pool_size))
