"""The test tiers, and the shared fixtures: a real PostgreSQL, and a fresh migrated database per test.

Where a new test goes (the tiers mirror the code; ``tests/unit/test_tiers.py`` fails on a test
module outside them):

- ``tests/unit``: pure logic, no database and no Airflow process: parsers, policies, contracts,
  rendering, fakes over ``httpx.MockTransport`` or a loopback fake (``tests/fakes``).
- ``tests/ledger``: anything that runs SQL, on the real PostgreSQL below (``ledger``, ``store``,
  ``engine``, ``db_url``): the state machine, claims, the pipeline's stages, reconciliation,
  review, the web app over a real ledger; in a rolled-back transaction unless the test needs a
  database of its own (``own_database``, tests/ledger/conftest.py). Airflow may be imported,
  never run as a process.
- ``tests/airflow``: the DAG files through Airflow itself without a running deployment: DAG
  integrity, and ``airflow dags test`` runs forked from one warm process (``deployment``).
- ``tests/e2e``: what needs a scheduler and an API server: the one deployment of the tier
  (``e2e``, tests/e2e/conftest.py), shared by every module; a test keeps apart by logical dates,
  run ids and batch keys of its own.
- ``tests/drills``: what starts deployments or other long-lived processes of its own on purpose
  (the chaos drill, Celery, ``make run``/``make up``, Fernet keys, FAB, backup and restore) or
  resolves the requirements with pip: ``make test-all`` (CI) runs them, ``make test`` does not.

Helpers every tier may use live in ``tests/harness`` (Airflow processes, the headless browser)
and ``tests/fakes`` (one fake per external service).

The server is the embedded one (``pgserver``) under ``$TRIAGE_HOME/test`` with durability off
for speed, or the server of ``TRIAGE_TEST_DATABASE_URL``. A template database is migrated
once per session; a test that asks for ``db_url`` (and, outside the ledger tier, ``engine`` or
``store``) gets its own clone (``CREATE DATABASE … TEMPLATE``), so tests never see each other's
rows and never need cleanup.

``make test`` runs pytest-xdist workers side by side: every worker is a session of its own with
its own template (named after its pid) and its own clones, and they all share the one embedded
server (see :class:`SharedServer` for who starts and who stops it).

Tests that start a PostgreSQL of their own or keep an Airflow home take their folder from
``server_homes`` / ``server_home``, never from ``tmp_path``: under root, pgserver runs the
server as the unprivileged user ``pgserver``, and every pytest run resets its user's tmp root
(``/tmp/pytest-of-root``) to 0700 when it starts, so a concurrent run would lock that user out of
its own data (``pg_ctl restart``: "Permission denied").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

from triage import migrations
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.roles import ensure_worker_role
from triage_tools import embedded

# The Airflow fixtures (``deployment``, ``airflow_metadata_template``) for the airflow, e2e and drills tiers.
pytest_plugins = ("tests.harness.deployment",)

TIERS = ("unit", "ledger", "airflow", "e2e", "drills")
"""The folders of tests/ that hold test modules (the module doc says what goes where)."""

# Hypothesis's default 200 ms deadline per example is a timed assertion: on a shared 2-core
# machine at load 15 one example of test_documents took longer and failed a green change. Speed is
# measured in `make bench`; here only correctness counts.
settings.register_profile("triage", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("triage")

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


class SharedServer:
    """The embedded test server, shared by every process that tests this checkout at once: the
    xdist workers of one run, and any other pytest run beside it. Two files in its home say
    who may do what, with ``flock`` (the kernel drops a process's locks when it ends, however
    it ends):

    - ``server.lock``, held exclusively while the server is started or stopped and while a
      template is migrated (migrations create cluster-wide roles);
    - ``server.users``, held shared by every process that uses the server, for its lifetime.

    Other locks of the server's own take other names (``locked("airflow-template.lock")``: the
    one Airflow metadata template that every process clones, ``tests/harness/deployment.py``).

    The run that found the server stopped stops it at its very end (``pytest_sessionfinish`` of
    the xdist controller, after its workers exited, or of a serial run), and only if it can take
    ``server.users`` exclusively: a worker still finishing or another run keeps it up.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self._users: int | None = None  # this process's descriptor of server.users

    def _open(self, name: str) -> int:
        self.home.mkdir(parents=True, exist_ok=True)
        return os.open(self.home / name, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children

    @contextlib.contextmanager
    def locked(self, name: str = "server.lock") -> Iterator[None]:
        """Exclusive: one process at a time starts, stops or changes the cluster's roles (or,
        with another ``name``, does what that lock guards)."""
        fd = self._open(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def use(self) -> None:
        """Say that this process uses the server, until it ends."""
        if self._users is None:
            self._users = self._open("server.users")
            fcntl.flock(self._users, fcntl.LOCK_SH)

    def start(self) -> DatabaseUrl:
        self.use()
        with self.locked():
            return embedded.start(self.home, databases=(), settings=FAST_SETTINGS)

    def is_running(self) -> bool:
        return embedded.running_url(self.home) is not None

    def stop_if_unused(self) -> bool:
        """Stop the server unless another process uses it; True if it was stopped."""
        with self.locked():
            fd = self._users if self._users is not None else self._open("server.users")
            self._users = None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # drops our shared lock either way
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                return embedded.stop(self.home)
            finally:
                os.close(fd)


_SERVER = SharedServer(_test_home())
_STOP_AT_END = pytest.StashKey[bool]()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The controller (or a serial run) notes whether it will be the run that starts the server."""
    config = session.config
    if not os.environ.get("TRIAGE_TEST_DATABASE_URL") and not _is_xdist_worker(config):
        _SERVER.use()
        config.stash[_STOP_AT_END] = not _SERVER.is_running()


@pytest.hookimpl(trylast=True)  # after xdist's own sessionfinish has ended its workers
def pytest_sessionfinish(session: pytest.Session) -> None:
    if session.config.stash.get(_STOP_AT_END, False):
        _SERVER.stop_if_unused()


# Modules that each run other programs for a minute or more (Airflow, pip's resolver), longest
# first: pytest-xdist (--dist loadfile, in collection order: make test) hands them out at the
# start and fills in with the many short modules, instead of leaving one to run alone at the end
# while the other workers are done. A folder names all its modules. The drills by the wall seconds
# of a clean-clone run (the modules not named come after them).
LONG_MODULES_FIRST = (
    "tests/drills/test_chaos.py",  # 470
    "tests/drills/test_make_run.py",  # 170
    "tests/drills/test_make_up.py",  # 135
    "tests/drills/test_resolution.py",  # 120: nine pip resolutions
    "tests/drills/test_distributed.py",  # 110
    "tests/drills/test_fernet_key.py",  # 90
    "tests/drills/test_reconcile_user_fab.py",  # 80
    "tests/airflow/",
)


def _rank(item: pytest.Item) -> int:
    module = item.nodeid.split("::", 1)[0]
    return next((i for i, first in enumerate(LONG_MODULES_FIRST) if module.startswith(first)), len(LONG_MODULES_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of :data:`LONG_MODULES_FIRST` first, in its order; the order within each group
    stays the collection's."""
    items.sort(key=_rank)  # stable


@pytest.fixture(scope="session")
def pg_server() -> DatabaseUrl:
    """A PostgreSQL server where tests may create databases (URL of its ``postgres`` db).

    The embedded test server is started on first use (by whichever worker comes first) and
    stopped at the end of the run that started it (:class:`SharedServer`).
    """
    given = os.environ.get("TRIAGE_TEST_DATABASE_URL")
    if given:
        return DatabaseUrl.parse(given).with_database("postgres")
    return _SERVER.start()


@pytest.fixture(scope="session")
def shared_server(pg_server: DatabaseUrl) -> SharedServer:
    """The test server's locks (:class:`SharedServer`), for what one process makes for all: the
    lock files live in the test home, with ``TRIAGE_TEST_DATABASE_URL``'s server as well."""
    return _SERVER


def _admin(server: DatabaseUrl) -> psycopg.Connection:
    return psycopg.connect(server.libpq(), autocommit=True)


@pytest.fixture(scope="session")
def template_db(pg_server: DatabaseUrl) -> Iterator[str]:
    """This session's (this worker's) migrated template. Migrated under the server lock, one
    worker at a time: migrations and the worker role change cluster-wide roles, and two
    workers doing that at once would race (the first run on a fresh server creates them).
    ``triage_worker`` is made here, once, so that tests only ever find it."""
    name = f"triage_template_{os.getpid()}"
    with _SERVER.locked():
        with _admin(pg_server) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        migrations.upgrade(pg_server.with_database(name))
        if pg_server.is_socket:  # the role logs in without a password: trusting servers only
            ensure_worker_role(pg_server)
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
