"""The embedded PostgreSQL: a real server from the ``pgserver`` pip package.

With no ``TRIAGE_DATABASE_URL``, Triage runs its own PostgreSQL 16 with its data under
``$TRIAGE_HOME/pgdata`` (default: ``.triage/`` in the checkout, ignored by git). It listens on
a Unix socket only. Starting twice reuses the running server (``pgserver`` reads
``postmaster.pid``); :func:`stop` stops it. Two databases live in it: ``triage`` (the job
tables) and ``airflow`` (Airflow's metadata), so the two can never share tables.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import warnings
from pathlib import Path

import psycopg
import psycopg.sql

from triage.database import AIRFLOW_DATABASE, TRIAGE_DATABASE, DatabaseUrl
from triage.settings import triage_home

log = logging.getLogger(__name__)
# pgserver narrates every start and exit at INFO (also from atexit, after pytest closed its
# streams); its warnings and errors are what matter.
logging.getLogger("pgserver").setLevel(logging.WARNING)


def pgdata_dir(home: Path | None = None) -> Path:
    return (home or triage_home()) / "pgdata"


def start(
    home: Path | None = None,
    databases: tuple[str, ...] = (TRIAGE_DATABASE, AIRFLOW_DATABASE),
    settings: dict[str, str] | None = None,
) -> DatabaseUrl:
    """Start (or reuse) the embedded server and make sure ``databases`` exist.

    Returns the server's URL pointing at the ``postgres`` database.
    """
    with warnings.catch_warnings():  # platformdirs warns that XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver

    pgdata = pgdata_dir(home)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    chatter = io.StringIO()  # pgserver prints initdb's and pg_ctl's output; keep it for errors
    try:
        with contextlib.redirect_stdout(chatter):
            server = pgserver.get_server(pgdata, cleanup_mode=None)  # None: outlive this process
    except Exception:
        log.error("embedded PostgreSQL did not start; pgserver said:\n%s", chatter.getvalue())
        raise
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


def running_url(home: Path | None = None) -> DatabaseUrl | None:
    """The URL of the server if it is running, without starting it."""
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata_dir(home))
    if info is None or not info.is_running():
        return None
    return DatabaseUrl(database="postgres", user="postgres", password="", host=str(info.socket_dir), port=info.port)


def stop(home: Path | None = None) -> bool:
    """Stop the server if it runs; True if it was running."""
    if running_url(home) is None:
        return False
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made at import

    user = "pgserver" if os.geteuid() == 0 else None  # pgserver runs the server as this user under root
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata_dir(home), user=user)
    except subprocess.CalledProcessError:
        return running_url(home) is None
    return True


def restart(home: Path | None = None) -> bool:
    """Restart a running server in place (``pg_ctl restart``: same port, socket and data), as an
    operator or a crash-restart would; every open connection breaks. False if it was not running.
    The failure drill (``make chaos``) does this mid-run."""
    if running_url(home) is None:
        return False
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made at import

    user = "pgserver" if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata_dir(home), user=user)
    return running_url(home) is not None
