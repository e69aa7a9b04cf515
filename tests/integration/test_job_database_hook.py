"""An operator reaches the job database through ``triage_db`` and Airflow's ``PostgresHook``,
as the DAGs do: the JSON form of the connection, over the embedded server's socket directory
(or the TCP server of ``TRIAGE_TEST_DATABASE_URL``), as the least-privilege worker role where
the server trusts its socket."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from triage.database import DatabaseUrl
from triage.operators.base import TriageOperator
from triage.roles import worker_url


def test_an_operators_engine_reaches_the_job_database(db_url: DatabaseUrl, monkeypatch: pytest.MonkeyPatch) -> None:
    login = worker_url(db_url) if db_url.is_socket else db_url  # the worker role exists on the test server
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", login.airflow_connection_json())
    operator = TriageOperator(task_id="classify")
    try:
        with operator.engine.connect() as conn:
            where = conn.execute(
                sa.text("SELECT current_database(), current_user, inet_server_addr() IS NULL AS over_a_socket")
            ).one()
            jobs = conn.execute(sa.text("SELECT count(*) FROM triage.jobs")).scalar_one()
            prepare_threshold = conn.connection.driver_connection.prepare_threshold  # type: ignore[union-attr]
        assert tuple(where) == (db_url.database, login.user, db_url.is_socket)
        assert jobs == 0, "the migrated ledger of this test's database"
        assert prepare_threshold is None, "the ledger's engine options reach psycopg"
        assert operator.store.engine is operator.engine
    finally:
        operator.dispose()
