"""``make distributed``: one day of ``classify_documents`` under Airflow's CeleryExecutor, here.

    python -m triage_tools.distributed [--date YYYY-MM-DD] [--conf '{"documents": 2000}'] [--workers 2]

What it starts, all on this machine and all stopped again at the end:

- Redis (the Celery broker) from Debian's ``redis-server`` package, installed with ``apt-get``
  when missing and running as root (PyPI has no Redis server), listening on a free loopback
  port with its data under ``$TRIAGE_HOME/redis``;
- ``airflow api-server``, ``scheduler`` and ``dag-processor`` with ``CeleryExecutor``, the
  result backend ``db+postgresql+psycopg://`` on Airflow's metadata database;
- ``airflow celery worker`` × N (default 2), each with its own Celery node name
  (``worker-1@host``) and concurrency 1, reporting that name as the task instances' hostname.

It waits until every component is healthy and both workers answer a Celery ping, triggers a
run through the REST API (the run conf is CONF, the data interval is DATE's day), waits for it
to finish, then prints the batch's jobs by state, which worker ran which task try (from the
task instances' tries in the REST API), how many claims each ``classify`` map index made, and
the drill's invariants (:mod:`triage_tools.drill.invariants`). Exit 1 when the run failed or an
invariant broke. The embedded PostgreSQL is left running, as ``make run`` leaves it.

The metadata database is the deployment's own (``triage_tools.deployment.prepare``): ``make up`` must not
run at the same time (two schedulers on one metadata DB would both schedule the run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from triage_tools.deploy import reconcile_user
from triage_tools.deploy.fernet import FernetKeyMismatch
from triage_tools.processes import ComponentExited, Processes

if TYPE_CHECKING:
    from triage.reconciliation.airflow_view import AirflowApi
    from triage_tools.drill.invariants import Invariant

TOOLS_ROOT = Path(__file__).resolve().parents[1]
"""The folder holding the ``triage_tools`` package."""
DAG_ID = "classify_documents"
REDIS_PACKAGE = "redis-server"
WORKER_NAME_ENV = "TRIAGE_WORKER_NAME"
FINISHED = frozenset({"success", "failed"})
READY_TIMEOUT = 240.0
RUN_TIMEOUT = 900.0


class DistributedError(RuntimeError):
    """The distributed deployment could not be started, or the run did not finish in time."""


def _say(message: str) -> None:
    print(f"triage distributed: {message}", file=sys.stderr, flush=True)


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the Celery workers: the worker's node name, so that the
    task instances say which of two workers on one machine ran them."""
    return os.environ.get(WORKER_NAME_ENV) or socket.getfqdn()


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
    _say(f"installing {REDIS_PACKAGE} with apt-get (the Celery broker; PyPI has no Redis server)")
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
    # Every component must sign and check the Execution API's tokens with the same key.
    env.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(32))
    # reconcile_jobs' airflow_api connection names this API server, not make up's port.
    env[reconcile_user.CONN_ENV] = reconcile_user.api_connection(
        env, reconcile_user.ensure_password(reconcile_user.passwords_file(env))
    )
    return env


def _api_client(env: Mapping[str, str], base_url: str) -> AirflowApi:
    from triage.reconciliation.airflow_view import AirflowApi
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
    from triage.reconciliation.airflow_view import AirflowApiUnavailable
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
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "triage_tools.distributed.worker_hostname",
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

    from triage.reconciliation.airflow_view import AirflowApiUnavailable
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


# ---------------------------------------------------------------------------------------------
# the run


@dataclass(frozen=True, slots=True)
class TaskTry:
    task_id: str
    map_index: int
    try_number: int
    state: str | None
    hostname: str | None
    duration: float | None

    @property
    def name(self) -> str:
        return self.task_id + (f"[{self.map_index}]" if self.map_index >= 0 else "")


@dataclass
class DistributedRun:
    """What :func:`run_distributed` found."""

    run_id: str
    state: str
    batch_key: str
    tries: list[TaskTry]
    claims_by_map_index: dict[int, int]
    invariants: list[Invariant]
    summary: Any  # triage.jobs.batch_summary.BatchSummary
    timings: dict[str, float]
    deployment: str
    workers: list[str]  # the Celery node names, which the workers report as hostname

    @property
    def ok(self) -> bool:
        return self.state == "success" and all(i.holds for i in self.invariants)

    @property
    def hostnames(self) -> set[str]:
        return {t.hostname for t in self.tries if t.hostname}


def _trigger(api: AirflowApi, day: date, conf: Mapping[str, Any]) -> tuple[str, str]:
    from triage_tools.run import batch_key_of, day_run

    run_id = f"distributed__{day.isoformat()}__{datetime.now(UTC):%Y%m%dT%H%M%S}"
    api.send("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", day_run(run_id, day, conf))
    return run_id, batch_key_of(day)


def _wait_for_run(deployment: CeleryDeployment, run_id: str, timeout: float) -> str:
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}"
    deadline = time.monotonic() + timeout
    while True:
        deployment.processes.check()
        state = str(deployment.api.get(path).get("state"))
        if state in FINISHED:
            return state
        if time.monotonic() > deadline:
            raise DistributedError(f"run {run_id} is still {state} after {timeout:.0f}s\n{deployment.processes.logs()}")
        time.sleep(1.0)


def task_tries(api: AirflowApi, run_id: str) -> list[TaskTry]:
    """Every try of every task instance of the run, with the hostname that ran it."""
    base = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances"
    tries: list[TaskTry] = []
    for ti in api.get(base, params={"limit": "100"}).get("task_instances", []):
        map_index = int(ti.get("map_index", -1))
        path = f"{base}/{ti['task_id']}" + (f"/{map_index}" if map_index >= 0 else "") + "/tries"
        for t in api.get(path).get("task_instances", []):
            tries.append(
                TaskTry(
                    ti["task_id"],
                    map_index,
                    int(t.get("try_number") or 0),
                    t.get("state"),
                    t.get("hostname") or None,
                    t.get("duration"),
                )
            )
    return sorted(tries, key=lambda t: (t.task_id != "retrieve", t.task_id, t.map_index, t.try_number))


def _ledger(
    env: Mapping[str, str], run_id: str, batch: str, since: datetime
) -> tuple[Any, dict[int, int], list[Invariant]]:
    import sqlalchemy as sa

    from triage.database import DatabaseUrl, create_engine
    from triage.jobs.batch_summary import batch_summary
    from triage.jobs.schema import job_events
    from triage.jobs.states import JobStatus
    from triage_tools.drill.invariants import check_invariants

    # Claims are logged with the lease owner as actor: dag/run/task/map_index/tryN.
    map_index = sa.cast(sa.func.split_part(job_events.c.actor, "/", 4), sa.Integer).label("map_index")
    claims = (
        sa.select(map_index, sa.func.count())
        .where(
            job_events.c.to_status == JobStatus.RUNNING.value,
            sa.func.starts_with(job_events.c.actor, sa.bindparam("prefix", type_=sa.Text)),
        )
        .group_by(map_index)
        .order_by(map_index)
    )
    engine = create_engine(DatabaseUrl.parse(env["TRIAGE_DATABASE_URL"]), poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            summary = batch_summary(conn, batch, since=since)
            by_index = {int(i): int(n) for i, n in conn.execute(claims, {"prefix": f"{DAG_ID}/{run_id}/classify/"})}
            invariants = check_invariants(conn, [batch])
    finally:
        engine.dispose()
    return summary, by_index, invariants


def run_distributed(
    base_env: Mapping[str, str],
    day: date,
    conf: Mapping[str, Any] | None = None,
    *,
    workers: int = 2,
    concurrency: int = 1,
    timeout: float = RUN_TIMEOUT,
) -> DistributedRun:
    """One run of ``classify_documents`` for ``day`` on a Celery deployment started for it.

    :param base_env: an Airflow environment with a migrated metadata DB and ``triage_db``
        (``triage_tools.deployment.prepare()``, or a test's).
    """
    timings: dict[str, float] = {}
    began = time.monotonic()
    since = datetime.now(UTC)
    with celery_deployment(base_env, workers=workers, concurrency=concurrency) as deployment:
        timings["start"] = deployment.started_in
        dag = deployment.api.get(f"/api/v2/dags/{DAG_ID}")
        was_paused = bool(dag.get("is_paused"))
        try:
            if was_paused:
                deployment.api.send("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
            step = time.monotonic()
            run_id, batch = _trigger(deployment.api, day, conf or {})
            _say(f"triggered {run_id} (batch {batch}); Airflow UI {deployment.base_url} while it runs")
            state = _wait_for_run(deployment, run_id, timeout)
            timings["run"] = time.monotonic() - step
            tries = task_tries(deployment.api, run_id)
        finally:
            if was_paused:  # leave the DAG as found: make up's scheduler must not start runs of its own
                with contextlib.suppress(Exception):
                    deployment.api.send("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": True})
        workers_started = list(deployment.workers)
        described = (
            f"Redis {deployment.redis_version} on {deployment.broker_url}, {workers} Celery workers "
            f"(concurrency {concurrency}): {', '.join(deployment.workers)}"
        )
        step = time.monotonic()
    timings["stop"] = time.monotonic() - step
    summary, claims, invariants = _ledger(base_env, run_id, batch, since)
    timings["total"] = time.monotonic() - began
    return DistributedRun(
        run_id=run_id,
        state=state,
        batch_key=batch,
        tries=tries,
        claims_by_map_index=claims,
        invariants=invariants,
        summary=summary,
        timings=timings,
        deployment=described,
        workers=workers_started,
    )


def format_run(run: DistributedRun) -> str:
    from triage.jobs.batch_summary import format_summary
    from triage_tools.drill.invariants import format_invariants

    lines = [
        f"{DAG_ID} {run.run_id}: {run.state}",
        run.deployment,
        format_summary(run.summary),
        "",
        "task tries (hostname from Airflow's task instances):",
    ]
    lines += [
        f"  {t.name:<16} try {t.try_number}  {t.state or '-':<10} {t.hostname or '-':<32} "
        f"{'' if t.duration is None else f'{t.duration:.1f}s'}"
        for t in run.tries
    ]
    indexes = sorted({t.map_index for t in run.tries if t.task_id == "classify"} | set(run.claims_by_map_index))
    lines.append(
        "jobs claimed per classify map index: "
        + (", ".join(f"[{i}] {run.claims_by_map_index.get(i, 0)}" for i in indexes) or "none")
    )
    lines += [
        "",
        format_invariants(run.invariants),
        "",
        "seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in run.timings.items()),
    ]
    return "\n".join(lines)


DESCRIPTION = """\
One day of classify_documents under Airflow's CeleryExecutor on this machine
(make distributed): Redis (Debian's redis-server, installed with apt-get when
missing and root), the API server, scheduler, DAG processor and N Celery workers,
all stopped again at the end. Prints the batch's jobs by state, which worker ran
which task try, and the drill's invariants; exit code 1 if the run failed or an
invariant broke.

make up must not run at the same time: both would schedule on one metadata DB.
"""


def main(argv: Sequence[str] | None = None, prog: str = "python -m triage_tools.distributed") -> int:
    import logging

    from triage_tools import deployment, local

    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--date", default="", help="the day to process (default: yesterday, UTC)")
    parser.add_argument("--conf", default="{}", help="the run conf of classify_documents, as JSON")
    parser.add_argument("--workers", type=int, default=2, help="Celery workers (default 2)")
    parser.add_argument("--concurrency", type=int, default=1, help="task slots per worker (default 1)")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT, help="seconds to wait for the run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from triage_tools.run import day_and_conf

    try:
        day, conf = day_and_conf(args.date, args.conf)
    except ValueError as exc:
        parser.error(str(exc))
    # SIGTERM unwinds like Ctrl-C, so the components started so far are stopped again.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        env = deployment.prepare()
    except FernetKeyMismatch as exc:
        _say(str(exc))
        return 1
    pid = local.running_pid(env)
    if pid is not None:
        _say(f"make up's Airflow runs (pid {pid}) on the same metadata database; stop it first (make stop)")
        return 1
    try:
        run = run_distributed(env, day, conf, workers=args.workers, concurrency=args.concurrency, timeout=args.timeout)
    except (DistributedError, ComponentExited) as exc:
        _say(str(exc))
        return 1
    print()
    print(format_run(run))
    print(f"logs: {Path(env['TRIAGE_HOME']) / 'logs' / 'distributed'}")
    if not run.ok:
        broken = [i.name for i in run.invariants if not i.holds]
        _say(f"run {run.state}" + (f"; broken invariants: {', '.join(broken)}" if broken else ""))
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
