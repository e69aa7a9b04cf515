"""Fixtures of the ledger tier: the fake model server, a payload store, and ``ledger``, a test's
rolled-back transaction.

Two ways to a migrated database, by what the test needs (River's "prefer a test transaction"):

- ``ledger``: one connection inside a transaction that is rolled back after the test, on one
  database the session (the xdist worker) cloned once. The default for a test that needs one
  connection: no database is made or dropped for it. A statement the test expects to fail goes
  in ``with ledger.begin_nested():`` (a savepoint), so the transaction stays usable. Not for
  what a transaction hides: ``now()`` is the transaction's start for the whole test, and no
  other connection sees its rows.
- ``db_url`` / ``engine`` / ``store`` (tests/conftest.py): a database cloned for the test alone,
  for tests where several connections, commits or sessions are the point (claims that race,
  SKIP LOCKED, roles logging in, the product's own ``engine.begin()``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

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
def ledger(ledger_engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction that is rolled back after the test (see the module doc)."""
    with ledger_engine.connect() as conn:
        outer = conn.begin()
        try:
            yield conn
        finally:
            outer.rollback()
