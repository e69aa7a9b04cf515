"""The CeleryExecutor deployment of ``make distributed``, all on this machine, all stopped again
when :func:`celery_deployment` exits:

- Redis (the Celery broker) from Debian's ``redis-server`` package, installed with ``apt-get``
  when missing and running as root (PyPI has no Redis server), listening on a free loopback
  port with its data under ``$TRIAGE_HOME/redis``;
- ``airflow api-server``, ``scheduler`` and ``dag-processor`` with ``CeleryExecutor``, the
  result backend ``db+postgresql+psycopg://`` on Airflow's metadata database;
- ``airflow celery worker`` × N (default 2), each with its own Celery node name
  (``worker-1@host``) and concurrency 1, reporting that name as the task instances' hostname
  (:func:`worker_hostname`).

Ready means every component healthy, ``classify_documents`` parsed and every worker answering a
Celery ping. What runs on it is :mod:`triage_tools.distributed`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triage_tools.deploy import reconcile_user
from triage_tools.processes import Processes

if TYPE_CHECKING:
    from triage.adapters.airflow_api import AirflowApi

TOOLS_ROOT = Path(__file__).resolve().parents[1]
"""The folder holding the ``triage_tools`` package."""
DAG_ID = "classify_documents"
REDIS_PACKAGE = "redis-server"
WORKER_NAME_ENV = "TRIAGE_WORKER_NAME"
READY_TIMEOUT = 240.0


class DistributedError(RuntimeError):
    """The distributed deployment could not be started, or the run did not finish in time."""


def say(message: str) -> None:
    print(f"triage distributed: {message}", file=sys.stderr, flush=True)


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the Celery workers: the worker's node name, so that the
    task instances say which of two workers on one machine ran them."""
    return os.environ.get(WORKER_NAME_ENV) or socket.getfqdn()


HOSTNAME_CALLABLE = f"{worker_hostname.__module__}.{worker_hostname.__qualname__}"
""":func:`worker_hostname` as the workers' ``[core] hostname_callable`` names it (wherever it moves)."""


# ---------------------------------------------------------------------------------------------
# Redis


def _find_redis() -> str | None:
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.access(p, os.X_OK)), None
    )


def redis_server_binary() -> str:
    """The ``redis-server`` executable; installs Debian's package when missing (root and apt only)."""
    found = _find_redis()
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise DistributedError(
            "redis-server is not installed and cannot be installed here (it needs root and apt-get); "
            f"install the {REDIS_PACKAGE} package (Debian/Ubuntu) or put redis-server on PATH"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install_cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", REDIS_PACKAGE]
    say(f"installing {REDIS_PACKAGE} with apt-get (the Celery broker; PyPI has no Redis server)")
    result = subprocess.run(install_cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:  # a fresh image has no package lists yet
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, check=False)
        result = subprocess.run(install_cmd, env=env, capture_output=True, text=True, check=False)
    found = _find_redis()
    if result.returncode != 0 or not found:
        raise DistributedError(f"apt-get install {REDIS_PACKAGE} failed:\n{(result.stdout + result.stderr)[-2000:]}")
    return found


def _wait_for_redis(url: str, processes: Processes, timeout: float = 30.0) -> str:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1)
    deadline = time.monotonic() + timeout
    while True:
        processes.check()
        with contextlib.suppress(redis.RedisError):
            if client.ping():
                info: dict[str, Any] = client.info("server")  # type: ignore[assignment]  # sync client
                return str(info.get("redis_version"))
        if time.monotonic() > deadline:
            raise DistributedError(f"Redis did not answer within {timeout:.0f}s\n{processes.logs()}")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# the deployment


@dataclass
class CeleryDeployment:
    """What :func:`celery_deployment` yields."""

    env: dict[str, str]
    base_url: str
    broker_url: str
    redis_version: str
    workers: list[str]
    processes: Processes
    api: AirflowApi
    started_in: float = 0.0


def celery_environment(base: Mapping[str, str], *, broker_url: str, api_port: int, concurrency: int) -> dict[str, str]:
    """``base`` (Airflow home, metadata DB, ``triage_db``) with the CeleryExecutor settings."""
    from triage.database import DatabaseUrl
    from triage_tools.deployment import TASK_PRELOAD_SETTINGS
    from triage_tools.processes import side_by_side_env

    env = dict(base)
    # Celery's database backend takes a SQLAlchemy URL behind "db+"; the psycopg driver and the
    # socket directory as ``?host=`` travel unchanged.
    metadata = DatabaseUrl.parse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).airflow_metadata_url()
    env.update(side_by_side_env(api_port))
    env.update(
        {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(concurrency),
            # Only the triggered run: unpausing the DAG must not also start its latest scheduled day.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__API__WORKERS": "1",
        }
    )
    # The task preload is the LocalExecutor's, whose workers run the tasks; here the Celery
    # workers do, and the scheduler keeps Airflow's start method (unless exported otherwise).
    for key, value in TASK_PRELOAD_SETTINGS.items():
        if env.get(key) == value:
            del env[key]
    # Every component must sign and check the Execution API's tokens with the same key.
    env.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(32))
    # reconcile_jobs' airflow_api connection names this API server, not make up's port.
    env[reconcile_user.CONN_ENV] = reconcile_user.api_connection(
        env, reconcile_user.ensure_password(reconcile_user.passwords_file(env))
    )
    return env


def _api_client(env: Mapping[str, str], base_url: str) -> AirflowApi:
    from triage.adapters.airflow_api import AirflowApi
    from triage_tools.local import admin_login

    if env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "").lower() == "true":
        return AirflowApi(base_url, timeout_s=30)
    user, password = admin_login(env)  # the simple auth manager's generated passwords
    return AirflowApi(base_url, username=user, password=password, timeout_s=30)


@contextlib.contextmanager
def celery_deployment(
    base_env: Mapping[str, str], *, workers: int = 2, concurrency: int = 1, timeout: float = READY_TIMEOUT
) -> Iterator[CeleryDeployment]:
    """Redis, the API server, scheduler, DAG processor and ``workers`` Celery workers; stops them all."""
    from triage.adapters.airflow_api import AirflowApiUnavailable
    from triage_tools.deployment import airflow_command
    from triage_tools.processes import free_port as local_free_port

    home = Path(base_env["TRIAGE_HOME"])
    log_dir = home / "logs" / "distributed"
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = Processes(log_dir)
    started = time.monotonic()
    try:
        redis_dir = home / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        port = local_free_port()
        processes.start(
            "redis",
            [
                redis_server_binary(),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(redis_dir),
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            base_env,
        )
        broker_url = f"redis://127.0.0.1:{port}/0"
        redis_version = _wait_for_redis(broker_url, processes)
        env = celery_environment(base_env, broker_url=broker_url, api_port=local_free_port(), concurrency=concurrency)
        for name in ("api-server", "scheduler", "dag-processor"):
            processes.start(name, [*airflow_command(), name], env)
        host = socket.gethostname()
        # The workers import the hostname callable from this checkout's tools, installed or not.
        tools_path = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(TOOLS_ROOT)) if p)
        names = [f"worker-{i}@{host}" for i in range(1, workers + 1)]
        for i, node in enumerate(names, start=1):
            worker_env = {
                **env,
                WORKER_NAME_ENV: node,
                "PYTHONPATH": tools_path,
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": HOSTNAME_CALLABLE,
            }
            processes.start(
                f"worker-{i}",
                [
                    *airflow_command(),
                    "celery",
                    "worker",
                    "--celery-hostname",
                    node,
                    "--concurrency",
                    str(concurrency),
                    "--skip-serve-logs",
                    "--pid",
                    str(log_dir / f"worker-{i}.pid"),
                ],
                worker_env,
            )
        try:
            api = _wait_ready(env, processes, broker_url, names, timeout)
        except AirflowApiUnavailable as exc:
            raise DistributedError(f"{exc}\n{processes.logs()}") from None
        yield CeleryDeployment(
            env=env,
            base_url=env["AIRFLOW__API__BASE_URL"],
            broker_url=broker_url,
            redis_version=redis_version,
            workers=names,
            processes=processes,
            api=api,
            started_in=time.monotonic() - started,
        )
    finally:
        # The scheduler first (it would queue more), then the rest; Redis last (workers ack to it).
        processes.stop(["scheduler"])
        processes.stop([n for n in processes.running if n != "redis"])
        processes.stop(["redis"])


def _wait_ready(
    env: Mapping[str, str], processes: Processes, broker_url: str, workers: Sequence[str], timeout: float
) -> AirflowApi:
    """Wait for healthy metadata DB, scheduler and DAG processor, the DAG parsed, and every worker
    answering a Celery ping; returns a REST client (made once the API server has written its
    generated passwords)."""
    from celery import Celery

    from triage.adapters.airflow_api import AirflowApiUnavailable
    from triage_tools.local import health

    base_url = env["AIRFLOW__API__BASE_URL"]
    deadline = time.monotonic() + timeout
    wanted = ("metadatabase", "scheduler", "dag_processor")
    app = Celery(broker=broker_url)
    pending = set(workers)
    api: AirflowApi | None = None
    try:
        while True:
            processes.check()
            doc = health(base_url)
            healthy = bool(doc) and all(((doc or {}).get(c) or {}).get("status") == "healthy" for c in wanted)
            parsed = False
            if healthy:
                api = api or _api_client(env, base_url)
                try:
                    parsed = bool(api.get(f"/api/v2/dags/{DAG_ID}"))
                except AirflowApiUnavailable as exc:  # 404 until the DAG processor has parsed it
                    if "HTTP 404" not in str(exc):
                        raise
            if pending:
                for reply in app.control.ping(timeout=1.0) or []:
                    pending -= set(reply)
            if api is not None and parsed and not pending:
                return api
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"not ready after {timeout:.0f}s (health {doc}, {DAG_ID} parsed {parsed}, "
                    f"workers not answering {sorted(pending)})\n{processes.logs()}"
                )
            time.sleep(1.0)
    finally:
        app.close()
