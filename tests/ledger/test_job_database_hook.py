"""An operator reaches the job database through ``triage_db`` and Airflow's ``PostgresHook``,
as the DAGs do: the JSON form of the connection, over the embedded server's socket directory
(or the TCP server of ``TRIAGE_TEST_DATABASE_URL``), as the least-privilege worker role where
the server trusts its socket."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from triage.database import DatabaseUrl
from triage.operators.base import TriageOperator
from triage.operators.maintenance import ApplyRetentionOperator
from triage.operators.review import ReviewJobsOperator
from triage.roles import maintainer_url, reviewer_url, worker_url


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
            prepare_threshold = conn.connection.driver_connection.prepare_threshold  # type: ignore[union-attr]  # an open connection has its DBAPI one
        assert tuple(where) == (db_url.database, login.user, db_url.is_socket)
        assert jobs == 0, "the migrated ledger of this test's database"
        assert prepare_threshold is None, "the ledger's engine options reach psycopg"
        assert operator.store.engine is operator.engine
    finally:
        operator.dispose()


@pytest.mark.parametrize(
    ("make", "login_of"),
    [
        pytest.param(
            lambda: ReviewJobsOperator(task_id="apply_decision"),
            reviewer_url,
            id="review_jobs-as-the-reviewer",
        ),
        pytest.param(
            lambda: ApplyRetentionOperator(task_id="apply_retention"),
            maintainer_url,
            id="triage_maintenance-as-the-maintainer",
        ),
    ],
)
def test_review_and_retention_log_in_through_their_own_connections(
    db_url: DatabaseUrl,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[], TriageOperator],
    login_of: Callable[[DatabaseUrl], DatabaseUrl],
) -> None:
    """``triage_db_review`` and ``triage_db_maintenance``: the roles the database lets decide and
    remove; ``triage_db`` (the pipeline's) is not even looked up."""
    if not db_url.is_socket:
        pytest.skip("the deployment logins have no password: needs the embedded (trusting) server")
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB_REVIEW", reviewer_url(db_url).airflow_connection_json())
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB_MAINTENANCE", maintainer_url(db_url).airflow_connection_json())
    monkeypatch.delenv("AIRFLOW_CONN_TRIAGE_DB", raising=False)
    operator = make()
    try:
        with operator.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT session_user")).scalar_one() == login_of(db_url).user
    finally:
        operator.dispose()


def test_the_web_service_decides_through_the_review_connection(
    db_url: DatabaseUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pages, the API's reads and every decision go through ``triage_db_review``; intake
    (the pipeline's registrations) through ``triage_db``."""
    from triage.web.service import TriageService

    if not db_url.is_socket:
        pytest.skip("the deployment logins have no password: needs the embedded (trusting) server")
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", worker_url(db_url).airflow_connection_json())
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB_REVIEW", reviewer_url(db_url).airflow_connection_json())
    service = TriageService(taxonomy_names=["billing"])
    try:
        for store, login in ((service.store, worker_url(db_url)), (service.review_store, reviewer_url(db_url))):
            with store.engine.connect() as conn:
                assert conn.execute(sa.text("SELECT session_user")).scalar_one() == login.user
    finally:
        service.store.engine.dispose()
        service.review_store.engine.dispose()
