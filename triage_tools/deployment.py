"""The local deployment's setting: where its job database is, what Airflow needs to run on it,
and making it ready (:func:`prepare`).

The product takes its job database from ``TRIAGE_DATABASE_URL`` (the CLI, the tests) and the
``triage_db`` connection (the DAGs) only. Here the unset default is resolved: the embedded
PostgreSQL is started and its URL exported, before anything of the product runs.

``prepare`` is cheap when nothing changed: a state file under ``AIRFLOW_HOME`` records which
Airflow version migrated which metadata database (by its PostgreSQL oid and alembic revision) and
a digest of the applied ``airflow_settings.yaml``; ``airflow db migrate`` and the settings are
applied again only when one of those differs.

No Airflow import here: Airflow reads its configuration at import time, so everything Airflow
does runs in a child ``python -m airflow`` with the environment set.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from triage.database import AIRFLOW_DATABASE, ENV_DATABASE_URL, TRIAGE_DATABASE, DatabaseUrl, configured_url
from triage.settings import project_root, triage_home
from triage_tools.deploy import fernet, reconcile_user


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
    """On the embedded server, the DAGs log in as ``triage_worker``, ``triage_reviewer`` and
    ``triage_maintainer`` (see :mod:`triage.roles`): make them, once the migrations have made
    the groups they join."""
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
    from triage.roles import maintainer_url, reviewer_url, worker_url

    embedded = is_embedded()
    home = triage_home()
    jobs_db = job_database()
    # Embedded: each connection logs in as the role of its job (see triage.roles): the pipeline,
    # reviewers' decisions, retention. With TRIAGE_DATABASE_URL the connections are taken as
    # given: point each at a member of its role yourself (docker-compose does).
    dags_db = worker_url(jobs_db) if embedded else jobs_db
    review_db = reviewer_url(jobs_db) if embedded else jobs_db
    maintenance_db = maintainer_url(jobs_db) if embedded else jobs_db
    plugins = str(project_root() / "plugins")
    env = {
        "TRIAGE_HOME": str(home),
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": plugins,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_TRIAGE_DB": dags_db.airflow_connection_json(),
        "AIRFLOW_CONN_TRIAGE_DB_REVIEW": review_db.airflow_connection_json(),
        "AIRFLOW_CONN_TRIAGE_DB_MAINTENANCE": maintenance_db.airflow_connection_json(),
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


# ---------------------------------------------------------------------------------------------
# the environment of Airflow's processes

STATE_FILE = "triage-prepare.json"
SCHEDULER_IDLE_SLEEP_SECONDS = "0.25"
"""``[scheduler] scheduler_idle_sleep_time`` of the local deployment (:func:`environment`)."""

TASK_PRELOAD = (
    "airflow.executors.local_executor",
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    "airflow.dag_processing.dagbag",
    "airflow.providers.postgres.hooks.postgres",
    "triage.operators.tasks",
    "triage.contracts.run_config",
    "triage.learning.registry",
    "triage.jobs.store",
    "triage.sources",
    "triage.classifiers",
    "triage.pipeline.retrieve",
    "triage.pipeline.classify_plan",
    "triage.pipeline.one_transaction",
    "triage.pipeline.steps",
    "triage.pipeline.trailing_relay",
    "triage.pipeline.publish",
    "triage.operators.metrics",
    "triage.pipeline.batch_mode",  # classify's handler (~11 ms)
    "triage.alerts",  # publish_events' alert (~9 ms)
    "jinja2.ext",  # classify renders publish_events' event_log for its relay (~3.5 ms)
    "airflow.sdk.execution_time.cache",  # every Variable and Connection lookup (~1 ms)
)
"""What a task process of the local deployment finds imported (``[scheduler]
mp_forkserver_preload``, with ``mp_start_method`` ``forkserver``; :func:`environment`): the
LocalExecutor's workers are forked from a forkserver that imported these once, and each task
process is a fork of a worker, so it no longer imports Airflow's task runner, the DAG file's
``triage`` modules and those its ``execute`` imports (a run's start-up, queued to ``execute``
over its tasks, 1.6-2.7 s before and 1.1-1.7 s after at 2,000 documents: docs/performance.md,
"Task start-up, preloaded"). A name that does not import is
skipped by the forkserver without a word: tests/unit/test_task_preload.py imports each."""

TASK_PRELOAD_SETTINGS = {
    "AIRFLOW__SCHEDULER__MP_START_METHOD": "forkserver",
    "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD": ",".join(TASK_PRELOAD),
}
"""The scheduler's settings that preload :data:`TASK_PRELOAD` (:func:`environment`; the
LocalExecutor's: the Celery deployment gives them back)."""


def _say(message: str) -> None:
    """Progress goes to stderr, so that ``./airflow.sh ... -o json`` stays parseable."""
    print(f"triage: {message}", file=sys.stderr, flush=True)


DEFAULT_API_PORT = 8080
"""Airflow's ``[api] port``; ``AIRFLOW__API__PORT`` moves the API server and every URL below."""


def api_urls(env: Mapping[str, str]) -> dict[str, str]:
    """Where task processes call the API server, derived from its one port
    (``AIRFLOW__API__PORT``) or its exported base URL: Airflow's default Execution API URL names
    ``localhost:8080`` whatever the port, so an API server moved to 8181 left every task calling
    8080 (connection refused, tasks up_for_retry with empty logs). An exported value wins. The
    UI's own ``[api] base_url`` stays unset unless exported, so the UI answers on any host name."""
    port = env.get("AIRFLOW__API__PORT") or str(DEFAULT_API_PORT)
    base = (env.get("AIRFLOW__API__BASE_URL") or f"http://localhost:{port}").rstrip("/")
    return {
        "AIRFLOW__API__PORT": port,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": env.get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL")
        or f"{base}/execution/",
    }


def environment() -> dict[str, str]:
    """``os.environ`` plus this deployment's Airflow settings; starts the embedded PostgreSQL.

    Among them the ``airflow_api`` connection of reconcile_jobs' cross-check and its user
    (:func:`triage_tools.deploy.reconcile_user.local_settings`; the password is generated into
    SimpleAuthManager's password file the first time)."""
    from triage.settings import ENV_ALLOW_DRILL
    from triage_tools.deployment import airflow_environment

    dags_override = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
    env = dict(os.environ)
    env.update(airflow_environment())
    if dags_override:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(dags_override).resolve())
    # `airflow standalone` starts its components as `airflow ...` found on PATH.
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join(p for p in (bin_dir, path) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # A finished task's downstream tasks are queued on the scheduler's next loop, and the
    # scheduler sleeps this long after a loop that found nothing to do (Airflow's default 1 s):
    # each hand-off between two stages waited half of it on average (issue #16; docs/performance.md,
    # "Where the time of a run goes"). An exported value wins.
    env.setdefault("AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME", SCHEDULER_IDLE_SLEEP_SECONDS)
    # Every task process imported Airflow's task runner, the DAG file's modules and what its
    # operator imports in `execute`, again (issue #29). Forked from a forkserver that imported
    # them once, it starts with them (TASK_PRELOAD). The scheduler's section only: the DAG
    # processor still imports the DAG files afresh. The price: a change to plugins/triage
    # reaches tasks when the scheduler restarts (`make stop && make up`). An exported value wins
    # (`AIRFLOW__SCHEDULER__MP_START_METHOD=fork` gives back Airflow's default on Linux).
    for key, value in TASK_PRELOAD_SETTINGS.items():
        env.setdefault(key, value)
    # The local deployment is where drills run (`make run CONF='{"drill": …}'`, `make chaos`);
    # an exported TRIAGE_ALLOW_DRILL=0 still turns them off. docker-compose leaves them off.
    env.setdefault(ENV_ALLOW_DRILL, "1")
    env.update(api_urls(env))
    # reconcile_jobs' cross-check logs in to the API server as a viewer of its own, through the
    # airflow_api connection (triage_tools.deploy.reconcile_user).
    env.update(reconcile_user.local_settings(env))
    return env


def airflow_command() -> list[str]:
    """The Airflow CLI of this interpreter."""
    return [sys.executable, "-m", "airflow"]


def _airflow_home(env: Mapping[str, str]) -> Path:
    return Path(env["AIRFLOW_HOME"])


def _run_airflow(env: Mapping[str, str], args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``airflow ARGS`` quietly; raise with its output if it fails."""
    argv = [*airflow_command(), *args]
    result = subprocess.run(argv, env=dict(env), text=True, capture_output=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise subprocess.CalledProcessError(result.returncode, ["airflow", *args])
    return result


# ---------------------------------------------------------------------------------------------
# prepare


def _metadata_identity(env: Mapping[str, str]) -> dict[str, Any]:
    """Which metadata database this is (oid changes when it is recreated) and its alembic revision."""
    import psycopg

    from triage.database import DatabaseUrl

    url = DatabaseUrl.parse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with psycopg.connect(url.libpq(), autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT d.oid::bigint, current_database() FROM pg_database d WHERE d.datname = current_database()"
        ).fetchone()
        revision = None
        if conn.execute("SELECT to_regclass('public.alembic_version')").fetchone()[0] is not None:  # type: ignore[index]
            found = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = found[0] if found else None
    assert row is not None
    return {
        "database_oid": row[0],
        "database": row[1],
        "server": f"{url.host or 'localhost'}:{url.port or 5432}",
        "revision": revision,
    }


def _settings_digest(env: Mapping[str, str], settings_file: Path) -> str:
    """A digest of what applying ``settings_file`` would write (after placeholders and shadowing)."""
    from triage_tools.deploy.airflow_settings import (
        apply_commands,
        connections_import_json,
        load_airflow_settings,
        without_environment_overrides,
    )

    settings = without_environment_overrides(load_airflow_settings(settings_file, environ=env), env)
    material = json.dumps(
        {
            "connections": connections_import_json(settings),
            "commands": apply_commands(settings, connections_file="c.json", airflow=("airflow",)),
            "fernet_key": fernet.key_fingerprint(env),  # another key: check it opens the metadata first
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def _read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def settings_file() -> Path:
    from triage.settings import project_root

    return Path(os.environ.get("TRIAGE_AIRFLOW_SETTINGS", project_root() / "airflow_settings.yaml"))


def prepare(*, force: bool = False, verbose: bool = False) -> dict[str, str]:
    """Make the local deployment ready to run Airflow; returns its environment.

    1. start the embedded PostgreSQL (or use ``TRIAGE_DATABASE_URL``);
    2. apply the job-table migrations (and, embedded, create the DAGs' login role ``triage_worker``);
    3. ``airflow db migrate`` unless this Airflow version already migrated this metadata DB;
    4. apply ``airflow_settings.yaml`` unless the same content was applied to this metadata DB
       with the same Fernet key, after checking that the key opens the secrets already there.

    :raises triage_tools.deploy.fernet.FernetKeyMismatch: the metadata DB holds secrets encrypted with
        another key (its message is the one line to show).
    """
    from triage.database import DatabaseUrl
    from triage_tools.deployment import is_embedded, migrate

    timings: dict[str, float] = {}
    started = time.monotonic()
    env = environment()  # starts the embedded server; its job database is in the environment
    timings["database"] = time.monotonic() - started

    step = time.monotonic()
    migrate(DatabaseUrl.parse(env["TRIAGE_DATABASE_URL"]), embedded=is_embedded())
    timings["job migrations"] = time.monotonic() - step

    home = _airflow_home(env)
    home.mkdir(parents=True, exist_ok=True)
    state_path = home / STATE_FILE
    state = {} if force else _read_state(state_path)
    airflow_version = metadata.version("apache-airflow")

    step = time.monotonic()
    identity = _metadata_identity(env)
    migrated = (
        state.get("airflow_version") == airflow_version
        and state.get("metadata") == {k: identity[k] for k in ("database_oid", "database", "server")}
        and state.get("revision") is not None
        and state.get("revision") == identity["revision"]
        and (home / "airflow.cfg").exists()
    )
    if not migrated:
        _say(f"airflow db migrate (Airflow {airflow_version})")
        _run_airflow(env, ["db", "migrate"])
        identity = _metadata_identity(env)
        state = {
            "airflow_version": airflow_version,
            "metadata": {k: identity[k] for k in ("database_oid", "database", "server")},
            "revision": identity["revision"],
        }
        state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    timings["airflow db migrate" if not migrated else "airflow db check"] = time.monotonic() - step

    step = time.monotonic()
    file = settings_file()
    digest = _settings_digest(env, file)
    if state.get("settings_digest") != digest:
        # Before Airflow trips over secrets it cannot decrypt (raises FernetKeyMismatch).
        fernet.check(env)
        _say(f"applying {file.name}")
        argv = [
            sys.executable,
            "-m",
            "triage_tools.deploy.airflow_settings",
            str(file.resolve()),
            "--airflow",
            shlex.join(airflow_command()),
        ]
        # From the folder holding triage_tools: `-m` finds this checkout's tools, installed or not.
        tools_root = Path(__file__).resolve().parents[1]
        result = subprocess.run(argv, env=env, cwd=tools_root, text=True, capture_output=True, check=False)
        if result.returncode != 0:
            sys.stderr.write(result.stdout + result.stderr)
            raise subprocess.CalledProcessError(result.returncode, argv)
        state["settings_digest"] = digest
        state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    timings["airflow settings"] = time.monotonic() - step

    total = time.monotonic() - started
    if verbose or total > 5:
        _say("prepared in {:.1f}s ({})".format(total, ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())))
    return env


def reset_secrets() -> int:
    """Delete the connections and variables this deployment's Fernet key cannot open (another
    checkout's, or from before ``make clean``); the next ``prepare`` writes Triage's again."""
    env = environment()
    forgotten = fernet.forget(env)
    state_path = _airflow_home(env) / STATE_FILE
    state = _read_state(state_path)
    if state.pop("settings_digest", None) is not None:
        state_path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    if forgotten:
        print(f"deleted {forgotten.describe()}: another Fernet key had encrypted them")
    else:
        print("this deployment's Fernet key opens every connection and variable: nothing deleted")
    return 0
