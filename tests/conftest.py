"""Shared fixtures: a real PostgreSQL, and a fresh migrated database per test.

The server is the embedded one (``pgserver``) under ``$TRIAGE_HOME/test`` with durability off
for speed, or the server of ``TRIAGE_TEST_DATABASE_URL``. A template database is migrated
once per session; each test gets its own clone (``CREATE DATABASE … TEMPLATE``), so tests
never see each other's rows and never need cleanup.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from triage import embedded, migrations
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore

FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

# A clone gets the default ACL, not its template's: take TEMPORARY away again, as migration 0005
# did on the template, so that every test runs without it as a deployment does.
REVOKE_TEMP = 'REVOKE TEMPORARY ON DATABASE "{}" FROM PUBLIC'


@pytest.fixture(scope="session")
def pg_server() -> Iterator[DatabaseUrl]:
    """A PostgreSQL server where tests may create databases (URL of its ``postgres`` db).

    The embedded test server is stopped at the end of the session if the session started it.
    """
    given = os.environ.get("TRIAGE_TEST_DATABASE_URL")
    if given:
        yield DatabaseUrl.parse(given).with_database("postgres")
        return
    home = Path(os.environ.get("TRIAGE_TEST_HOME", embedded.triage_home() / "test"))
    was_running = embedded.running_url(home) is not None
    yield embedded.start(home, databases=(), settings=FAST_SETTINGS)
    if not was_running:
        embedded.stop(home)


def _admin(server: DatabaseUrl) -> psycopg.Connection:
    return psycopg.connect(server.libpq(), autocommit=True)


@pytest.fixture(scope="session")
def template_db(pg_server: DatabaseUrl) -> Iterator[str]:
    name = f"triage_template_{os.getpid()}"
    with _admin(pg_server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    migrations.upgrade(pg_server.with_database(name))
    yield name
    with _admin(pg_server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_database(pg_server: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """An empty database (no migrations), dropped afterwards."""
    name = f"triage_test_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.with_database(name)
    with _admin(pg_server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(pg_server: DatabaseUrl, template_db: str) -> Iterator[DatabaseUrl]:
    """A migrated database of this test's own, cloned from the template."""
    name = f"triage_test_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
        conn.execute(REVOKE_TEMP.format(name))
    yield pg_server.with_database(name)
    with _admin(pg_server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def engine(db_url: DatabaseUrl) -> Iterator[sa.Engine]:
    eng = create_engine(db_url, pool_size=8)
    yield eng
    eng.dispose()


@pytest.fixture
def store(engine: sa.Engine) -> JobStore:
    import random

    return JobStore(engine, rng=random.Random(7))
