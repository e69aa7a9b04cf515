"""``make distributed``: one day of ``classify_documents`` under Airflow's CeleryExecutor, here.

    python -m triage_tools.distributed [--date YYYY-MM-DD] [--conf '{"documents": 2000}'] [--workers 2]

It starts Redis, the Airflow components and N Celery workers on this machine
(:mod:`triage_tools.celery_deployment`, which stops them all again at the end), waits until
every component is healthy and both workers answer a Celery ping, triggers a
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
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from triage_tools.celery_deployment import DAG_ID, CeleryDeployment, DistributedError, celery_deployment, say
from triage_tools.deploy.fernet import FernetKeyMismatch
from triage_tools.processes import ComponentExited

if TYPE_CHECKING:
    from triage.adapters.airflow_api import AirflowApi
    from triage_tools.drill.invariants import Invariant

FINISHED = frozenset({"success", "failed"})
RUN_TIMEOUT = 900.0


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
    summary: Any  # triage.jobs.sql.reads.batch_summary.BatchSummary
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
    from triage.jobs.schema import job_events
    from triage.jobs.sql.reads.batch_summary import batch_summary
    from triage.jobs.vocabulary.states import JobStatus
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
            say(f"triggered {run_id} (batch {batch}); Airflow UI {deployment.base_url} while it runs")
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
    from triage.jobs.sql.reads.batch_summary import format_summary
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
        say(str(exc))
        return 1
    pid = local.running_pid(env)
    if pid is not None:
        say(f"make up's Airflow runs (pid {pid}) on the same metadata database; stop it first (make stop)")
        return 1
    try:
        run = run_distributed(env, day, conf, workers=args.workers, concurrency=args.concurrency, timeout=args.timeout)
    except (DistributedError, ComponentExited) as exc:
        say(str(exc))
        return 1
    print()
    print(format_run(run))
    print(f"logs: {Path(env['TRIAGE_HOME']) / 'logs' / 'distributed'}")
    if not run.ok:
        broken = [i.name for i in run.invariants if not i.holds]
        say(f"run {run.state}" + (f"; broken invariants: {', '.join(broken)}" if broken else ""))
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
