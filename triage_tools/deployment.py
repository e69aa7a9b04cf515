"""Where the local deployment's job database is, and what Airflow needs to run on it.

The product takes its job database from ``TRIAGE_DATABASE_URL`` (the CLI, the tests) and the
``triage_db`` connection (the DAGs) only. Here the unset default is resolved: the embedded
PostgreSQL is started and its URL exported, before anything of the product runs.
"""

from __future__ import annotations

import contextlib
import os

from triage.database import AIRFLOW_DATABASE, ENV_DATABASE_URL, TRIAGE_DATABASE, DatabaseUrl, configured_url
from triage.settings import project_root, triage_home


def is_embedded() -> bool:
    """No ``TRIAGE_DATABASE_URL``: the job database is the embedded server's ``triage``."""
    return configured_url() is None


def job_database() -> DatabaseUrl:
    """``TRIAGE_DATABASE_URL`` as given, else the embedded server's ``triage`` (started now)."""
    configured = configured_url()
    if configured is not None:
        return configured
    from triage_tools import embedded

    return embedded.start().with_database(TRIAGE_DATABASE)


def export_job_database() -> DatabaseUrl:
    """Resolve :func:`job_database` and export it as ``TRIAGE_DATABASE_URL`` for the product's
    commands (this process and its children). Returns it."""
    url = job_database()
    os.environ[ENV_DATABASE_URL] = url.libpq()
    return url


def ensure_worker_login(url: DatabaseUrl) -> None:
    """On the embedded server, the DAGs log in as ``triage_worker`` (see :mod:`triage.roles`):
    make it, once the migrations have made the ``triage_app`` group it joins."""
    from triage.roles import AppRoleMissing, ensure_worker_role

    with contextlib.suppress(AppRoleMissing):  # below revision 0003; the next upgrade makes it
        ensure_worker_role(url)


def migrate(url: DatabaseUrl, *, embedded: bool) -> None:
    """The product's migrations to head, and the embedded server's worker login."""
    from triage.cli import migrate_job_database

    migrate_job_database(url)
    if embedded:
        ensure_worker_login(url)


def airflow_environment() -> dict[str, str]:
    """What Airflow needs to run on this deployment: its home, its metadata DB, ``triage_db``.

    With ``TRIAGE_DATABASE_URL`` set, Airflow's metadata DB is taken from
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` if given, else the ``airflow`` database on the same
    server; otherwise both live in the embedded server.
    """
    from triage.roles import worker_url

    embedded = is_embedded()
    home = triage_home()
    jobs_db = job_database()
    # Embedded: the DAGs connect as the least-privilege role (rows only; see triage.roles).
    # With TRIAGE_DATABASE_URL the connection is taken as given: point AIRFLOW_CONN_TRIAGE_DB
    # at a member of triage_app yourself (docker-compose does).
    dags_db = worker_url(jobs_db) if embedded else jobs_db
    plugins = str(project_root() / "plugins")
    env = {
        "TRIAGE_HOME": str(home),
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": plugins,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_TRIAGE_DB": dags_db.airflow_connection_json(),
        ENV_DATABASE_URL: jobs_db.libpq(),
        "PYTHONPATH": os.pathsep.join(p for p in (plugins, os.environ.get("PYTHONPATH", "")) if p),
    }
    metadata = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
    if not metadata:
        if not embedded:  # the embedded server made the airflow database already
            from triage_tools.embedded import ensure_databases

            ensure_databases(jobs_db.with_database("postgres"), (AIRFLOW_DATABASE,))
        metadata = jobs_db.with_database(AIRFLOW_DATABASE).airflow_metadata_url()
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = metadata
    return env
