"""``triage_db`` through Airflow's ``PostgresHook``: the URL it builds from each form of the
connection, and the engine options Triage adds (no database: an engine connects lazily; the
connection is taken from ``AIRFLOW_CONN_TRIAGE_DB``, as a deployment gives it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from airflow.providers.common.sql.hooks import sql as sql_hooks
from pytest_mock import MockerFixture

from triage.adapters.ledger_db import engine_from_hook, job_database_hook
from triage.database import DatabaseUrl
from triage.operators.base import TriageOperator

SOCKET_DIR = "/srv/triage/pg-socket"


def use_connection(monkeypatch: pytest.MonkeyPatch, conn: dict[str, Any] | str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", conn if isinstance(conn, str) else json.dumps(conn))


def test_the_json_form_keeps_a_socket_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    url = DatabaseUrl(database="triage_x", user="triage_worker", host=SOCKET_DIR, port=5433)
    use_connection(monkeypatch, url.airflow_connection_json())  # what the local deployment exports
    built = job_database_hook("triage_db").sqlalchemy_url
    assert built.drivername == "postgresql+psycopg", "psycopg 3: the driver the ledger's engine options are for"
    assert (built.host, built.port, built.database, built.username) == (SOCKET_DIR, 5433, "triage_x", "triage_worker")
    assert built.password is None


def test_a_tcp_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(
        monkeypatch,
        {
            "conn_type": "postgres",
            "host": "postgres",
            "port": 5432,
            "schema": "triage",
            "login": "triage_app",
            "password": "p@ss:word/",
        },
    )
    built = job_database_hook("triage_db").sqlalchemy_url
    assert (built.host, built.port, built.database) == ("postgres", 5432, "triage")
    assert (built.username, built.password) == ("triage_app", "p@ss:word/")


def test_a_connection_without_a_database_means_triage(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(monkeypatch, {"conn_type": "postgres", "host": SOCKET_DIR})
    assert job_database_hook("triage_db").sqlalchemy_url.database == "triage"


def test_extra_sqlalchemy_query_reaches_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(
        monkeypatch,
        {
            "conn_type": "postgres",
            "host": "db",
            "schema": "triage",
            "extra": {"sqlalchemy_query": {"sslmode": "require"}},
        },
    )
    assert dict(job_database_hook("triage_db").sqlalchemy_url.query) == {"sslmode": "require"}


def test_an_operators_engine_is_made_once_with_the_ledgers_options(
    monkeypatch: pytest.MonkeyPatch, mocker: MockerFixture
) -> None:
    use_connection(monkeypatch, DatabaseUrl(database="triage", host=SOCKET_DIR).airflow_connection_json())
    create_engine = mocker.spy(sql_hooks, "create_engine")  # what the hook's get_sqlalchemy_engine calls
    operator = TriageOperator(task_id="t")
    try:
        engine = operator.engine
        assert engine is operator.engine, "one engine (and pool) per task try"
        create_engine.assert_called_once()
        options = create_engine.call_args.kwargs
        assert options["url"].host == SOCKET_DIR
        assert (options["pool_size"], options["pool_pre_ping"]) == (3, True)
        assert options["connect_args"] == {"prepare_threshold": None}, "no server-side prepared statements"
        assert isinstance(engine.pool, sa.QueuePool)
        assert engine.pool.size() == 3
    finally:
        operator.dispose()


def test_a_callers_options_add_to_the_ledgers_own(monkeypatch: pytest.MonkeyPatch, mocker: MockerFixture) -> None:
    use_connection(monkeypatch, DatabaseUrl(database="triage", host=SOCKET_DIR).airflow_connection_json())
    create_engine = mocker.spy(sql_hooks, "create_engine")
    engine = engine_from_hook(job_database_hook("triage_db"), pool_size=1, connect_args={"connect_timeout": 5})
    engine.dispose()
    options = create_engine.call_args.kwargs
    assert options["pool_size"] == 1
    assert options["connect_args"] == {"connect_timeout": 5, "prepare_threshold": None}
