"""Shared fixtures: a real PostgreSQL, and a fresh migrated database per test.

The server is the embedded one (``pgserver``) under ``$TRIAGE_HOME/test`` with durability off
for speed, or the server of ``TRIAGE_TEST_DATABASE_URL``. A template database is migrated
once per session; each test gets its own clone (``CREATE DATABASE … TEMPLATE``), so tests
never see each other's rows and never need cleanup.

Tests that start a PostgreSQL of their own or keep an Airflow home take their folder from
``server_homes`` / ``server_home``, never from ``tmp_path``: under root, pgserver runs the
server as the unprivileged user ``pgserver``, and every pytest run resets its user's tmp root
(``/tmp/pytest-of-root``) to 0700 when it starts, so a concurrent run would lock that user out of
its own data (``pg_ctl restart``: "Permission denied").
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from triage import migrations
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage_tools import embedded

FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

# A clone gets the default ACL, not its template's: take TEMPORARY away again, as migration 0005
# did on the template, so that every test runs without it as a deployment does.
REVOKE_TEMP = 'REVOKE TEMPORARY ON DATABASE "{}" FROM PUBLIC'


def _test_home() -> Path:
    """The test server's home: ``$TRIAGE_TEST_HOME``, else ``.triage/test`` (ignored by git)."""
    return Path(os.environ.get("TRIAGE_TEST_HOME", embedded.triage_home() / "test"))


# Folders the server's user (another user than the test's under root) must reach: it needs
# search permission on every ancestor, and nothing but us ever changes these.
SERVER_HOME_MODE = 0o755


class ServerHomes:
    """Folders for a PostgreSQL data directory or an Airflow home, under ``<test home>/scratch``:
    outside pytest's tmp root, readable and searchable by the server's user, removed after use."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def make(self, name: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(SERVER_HOME_MODE)
        path = Path(tempfile.mkdtemp(prefix=f"{name[:24]}-", dir=self.root))  # made 0700
        path.chmod(SERVER_HOME_MODE)
        return path

    def remove(self, path: Path) -> None:
        """Stop an embedded PostgreSQL a test left running in ``path`` (``pgdata`` in it or in a
        folder of it, as a drill home under it), then delete the folder (the server's files are
        another user's; root may delete them)."""
        for pid_file in [*path.glob("pgdata/postmaster.pid"), *path.glob("*/pgdata/postmaster.pid")]:
            embedded.stop(pid_file.parent.parent)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def server_homes() -> ServerHomes:
    """Make folders for servers and Airflow homes with ``.make(name)``; ``.remove(path)`` after."""
    return ServerHomes(_test_home() / "scratch")


@pytest.fixture
def server_home(server_homes: ServerHomes, request: pytest.FixtureRequest) -> Iterator[Path]:
    """An empty folder of this test's own for a PostgreSQL or an Airflow home (see the module doc)."""
    path = server_homes.make(request.node.name)
    yield path
    server_homes.remove(path)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[DatabaseUrl]:
    """A PostgreSQL server where tests may create databases (URL of its ``postgres`` db).

    The embedded test server is stopped at the end of the session if the session started it.
    """
    given = os.environ.get("TRIAGE_TEST_DATABASE_URL")
    if given:
        yield DatabaseUrl.parse(given).with_database("postgres")
        return
    home = _test_home()
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
