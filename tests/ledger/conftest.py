"""Fixtures of the ledger tier: the fake model server, a payload store, and the test's database.

Two ways to a migrated database, by what the test needs (River's "prefer a test transaction"):

- A rolled-back transaction, the default: ``ledger`` is one connection inside a transaction that
  is rolled back after the test, on one database the session (the xdist worker) cloned once, and
  ``engine`` / ``store`` run on that same connection, each of their transactions a savepoint of
  it (:func:`savepoint_engine`): the product's ``engine.begin()`` commits by releasing its
  savepoint (deferred constraints checked then, as at a commit) and rolls back to it. No
  database is made or dropped for the test. A statement the test expects to fail goes in
  ``with ledger.begin_nested():`` (a savepoint), so the transaction stays usable. Not for what
  one transaction hides: ``now()`` is the transaction's start for the whole test, no other
  connection sees its rows, the outbox relay never takes its own transaction's events, a lock
  never blocks, and a ``READ ONLY`` or ``AUTOCOMMIT`` connection is an ordinary one.
- A database cloned for the test alone (``db_url``, tests/conftest.py), where several
  connections, commits or sessions are the point (claims that race in threads, SKIP LOCKED,
  roles logging in, the relay, processes): mark the test ``@pytest.mark.own_database`` (or the
  module, ``pytestmark``), and ``engine`` / ``store`` are on its clone. A test that asks for
  ``db_url`` itself (to log in as a role, to hand a URL to a process) gets the clone too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, fixed_label
from triage.database import DatabaseUrl, create_engine
from triage.payloads import PayloadStore


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """The fake model server on loopback, answering ``billing`` at 0.92 until told otherwise."""
    with FakeOpenAIServer(responder=fixed_label("billing", 0.92)) as fake:
        yield fake


@pytest.fixture
def payloads(tmp_path: Path) -> PayloadStore:
    return PayloadStore(tmp_path / "payloads")


@pytest.fixture(scope="session")
def ledger_engine(pg_server: DatabaseUrl, template_db: str) -> Iterator[sa.Engine]:
    """An engine of this session's database for rolled-back tests, cloned once from the template."""
    from tests.conftest import REVOKE_TEMP

    name = f"triage_rollback_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.libpq(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
        admin.execute(REVOKE_TEMP.format(name))
    engine = create_engine(pg_server.with_database(name), pool_size=1)
    yield engine
    engine.dispose()
    with psycopg.connect(pg_server.libpq(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def rolled_back(ledger_engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction that is rolled back after the test (see the module doc)."""
    with ledger_engine.connect() as conn:
        outer = conn.begin()
        try:
            yield conn
        finally:
            outer.rollback()


@pytest.fixture
def ledger(rolled_back: sa.Connection) -> sa.Connection:
    """The test's rolled-back transaction, for SQL the test runs itself (``rolled_back``, which
    ``engine`` takes too: a module may name a fixture of its own ``ledger``)."""
    return rolled_back


# SAVEPOINT names by depth: a transaction of the engine inside another one of its own (the same
# connection: it has one) is a savepoint inside the first.
_SAVEPOINT = "triage_test_{}"


def savepoint_engine(ledger: sa.Connection) -> sa.Engine:
    """An engine whose one connection is ``ledger``'s and whose transactions are savepoints of
    the test's transaction (see the module doc).

    SQLAlchemy leaves a transaction's begin, commit and rollback to its dialect; this engine's
    dialect (its own instance) issues ``SAVEPOINT``, ``RELEASE SAVEPOINT`` and ``ROLLBACK TO
    SAVEPOINT`` instead. At a release, ``SET CONSTRAINTS ALL IMMEDIATE`` first checks what a
    commit would (the one deferrable constraint, one champion model, is initially deferred, so
    ``ALL DEFERRED`` restores it), and ``triage.actor``, the setting a transaction sets for the
    trigger with ``SET LOCAL``, ends with it as it would at a commit. Closing the pool closes
    nothing: the connection is the ``ledger`` fixture's.
    """
    dbapi = ledger.connection.dbapi_connection
    assert dbapi is not None
    engine = sa.create_engine(ledger.engine.url, poolclass=sa.pool.StaticPool, creator=lambda: dbapi)
    dialect: Any = engine.dialect  # its methods replaced on this instance only
    open_savepoints: list[str] = []
    autocommit = False  # AUTOCOMMIT: each statement is final as it runs, no savepoint

    def run(dbapi_connection: Any, *statements: str) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for statement in statements:
                cursor.execute(statement)
        finally:
            cursor.close()

    def do_begin(dbapi_connection: Any) -> None:
        if not autocommit:
            open_savepoints.append(_SAVEPOINT.format(len(open_savepoints)))
            run(dbapi_connection, f"SAVEPOINT {open_savepoints[-1]}")

    def do_commit(dbapi_connection: Any) -> None:
        if autocommit or not open_savepoints:
            return
        run(
            dbapi_connection,
            "SET CONSTRAINTS ALL IMMEDIATE",
            "SET CONSTRAINTS ALL DEFERRED",
            f"RELEASE SAVEPOINT {open_savepoints[-1]}",
            "SELECT set_config('triage.actor', '', true)",
        )
        open_savepoints.pop()  # after the release: a failed check leaves it for the rollback

    def do_rollback(dbapi_connection: Any) -> None:
        if autocommit or not open_savepoints:
            return  # the pool's reset of a connection whose transaction ended
        name = open_savepoints.pop()
        run(dbapi_connection, f"ROLLBACK TO SAVEPOINT {name}", f"RELEASE SAVEPOINT {name}")

    def set_isolation_level(dbapi_connection: Any, level: str) -> None:
        nonlocal autocommit
        autocommit = level == "AUTOCOMMIT"

    dialect.do_begin, dialect.do_commit, dialect.do_rollback = do_begin, do_commit, do_rollback
    dialect.set_isolation_level = set_isolation_level
    dialect.set_readonly = dialect.set_deferrable = lambda dbapi_connection, value: None
    dialect.do_close = lambda dbapi_connection: None
    return engine


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    """The test's engine: on the ``ledger`` transaction (:func:`savepoint_engine`), or on a
    database cloned for the test when it is marked ``own_database`` or asks for ``db_url``."""
    if request.node.get_closest_marker("own_database") or "db_url" in request.fixturenames:
        own = create_engine(request.getfixturevalue("db_url"), pool_size=8)
        yield own
        own.dispose()
    else:
        yield savepoint_engine(request.getfixturevalue("rolled_back"))
