"""The drill's hand: what it breaks while the runs go on, and the service manager it plays.

:class:`FaultInjector` SIGKILLs task processes (``classify`` while it holds a claim, and on its
last try; ``persist`` right after the label provider applied an effect and before it answers),
restarts PostgreSQL once a share of the documents is done, and restarts Airflow when its
scheduler has died with the database connection (``restart: always``). Every fault it injects goes into the drill's
report with the moment it happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from triage_tools.drill.options import DrillOptions
from triage_tools.drill.report import DrillReport, Fault, say
from triage_tools.processes import group_members

if TYPE_CHECKING:
    from triage_tools.drill.last_try import LastTryKill, LastTryPhase
    from triage_tools.drill.model import FakeModel

DAG_ID = "classify_documents"
LIVE = frozenset({"scheduled", "queued", "running"})
"""Task instance states of a try that has begun or is about to."""


class FaultInjector:
    """The faults of one drill on a running local deployment.

    :param run_ids: the drill's own ``classify_documents`` runs and their dates (claim kills
        take them in order).
    :param started: the drill's start (``time.monotonic()``): faults are timed from it.
    :param stop: set when the drill is over; every thread here ends on it.
    """

    def __init__(
        self,
        options: DrillOptions,
        env: Mapping[str, str],
        api: Any,
        engine: Any,
        home: Path,
        report: DrillReport,
        run_ids: Mapping[str, date],
        started: float,
        stop: threading.Event,
    ) -> None:
        self.options, self.env, self.api, self.engine, self.home = options, env, api, engine, home
        self.report, self.run_ids, self.started, self._stop = report, run_ids, started, stop
        self._action_kills_left = options.action_kills
        self._next_action_kill = 200
        self._lock = threading.Lock()
        self.last_try_kill: LastTryKill | None = None
        self.airflow_lost = False
        """Set when Airflow could not be started again: every wait of the drill ends on it."""

    def fault(self, kind: str, target: str, detail: str) -> None:
        """Record a fault the drill injected (or suffered: an Airflow restart)."""
        fault = Fault(kind, target, detail, round(time.monotonic() - self.started, 1))
        with self._lock:
            self.report.faults.append(fault)
        say(f"fault {kind} {target}: {detail}")

    def _task_runner_pids(self, run_id: str | None, task_id: str) -> list[tuple[int, str]]:
        """The task processes (``airflow worker -- <ti id>``) of running tries of ``task_id``."""
        ids: dict[str, str] = {}
        runs = [run_id] if run_id else ["~"]
        for run in runs:
            path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run}/taskInstances"
            with contextlib.suppress(Exception):
                for ti in self.api.get(path, params={"limit": 100}).get("task_instances", []):
                    if ti.get("task_id") == task_id and ti.get("state") == "running":
                        ids[str(ti["id"])] = f"{ti['dag_run_id']}/{task_id}/{ti.get('map_index', -1)}"
        return _task_processes(ids)

    def _kill(self, kind: str, run_id: str | None, task_id: str, why: str, most: int | None = None) -> bool:
        victims = self._task_runner_pids(run_id, task_id)[:most]
        for pid, name in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.fault(kind, name, f"SIGKILL pid {pid} {why}")
        return bool(victims)

    def on_effect(self, key: str, effects: int) -> None:
        """The provider applied a new effect: maybe kill the caller before it hears back."""
        with self._lock:
            due = self._action_kills_left > 0 and effects >= self._next_action_kill
            if due:
                self._action_kills_left -= 1
                self._next_action_kill = effects + max(self.options.documents // 5, 200)
        if due:
            # One task per kill, as --action-kills counts them, even when persist tasks of two
            # runs are running at once (the provider cannot tell which one asked).
            self._kill("kill_after_action", None, "persist", f"after effect #{effects}, before its answer", most=1)

    def _running_claims(self, run_id: str) -> int:
        import sqlalchemy as sa

        from triage.jobs.schema import jobs
        from triage.jobs.sql.reads.checks import in_state
        from triage.jobs.vocabulary.states import JobStatus, Step

        day = self.run_ids[run_id]
        running = sa.select(sa.func.count()).where(
            in_state(JobStatus.RUNNING),
            jobs.c.step == Step.CLASSIFY.value,
            sa.func.starts_with(jobs.c.batch_key, day.isoformat()),
        )
        with self.engine.connect() as conn:
            return int(conn.execute(running).scalar_one())

    def _completed(self) -> int:
        import sqlalchemy as sa

        from triage.jobs.sql.reads.checks import in_state
        from triage.jobs.vocabulary.states import JobStatus

        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).where(in_state(JobStatus.COMPLETED))).scalar_one())

    def saboteur(self) -> None:
        """Kills classify under a claim (one run after another) and restarts the database once a
        third of the documents are done."""
        from triage_tools import embedded

        claim_targets = list(self.run_ids)[: self.options.claim_kills]
        while self.options.claim_kills > len(claim_targets):
            claim_targets.append(claim_targets[-1] if claim_targets else next(iter(self.run_ids)))
        restarts_left = self.options.db_restarts
        restart_at = [
            self.options.documents * (i + 1) // (self.options.db_restarts + 2) for i in range(self.options.db_restarts)
        ]
        while not self._stop.wait(0.2):
            try:
                if (
                    claim_targets
                    and self._running_claims(claim_targets[0]) > 0
                    and self._kill("kill_during_claim", claim_targets[0], "classify", "while it holds a claim")
                ):
                    claim_targets.pop(0)
                    time.sleep(2.0)
                if restarts_left and self._completed() >= restart_at[0]:
                    began = time.monotonic()
                    embedded.restart(self.home)
                    restarts_left -= 1
                    restart_at.pop(0)
                    self.fault(
                        "postgres_restart",
                        "embedded PostgreSQL",
                        f"pg_ctl restart in {time.monotonic() - began:.1f} s; every connection broken",
                    )
                if not claim_targets and not restarts_left:
                    return
            except Exception as exc:  # noqa: BLE001 - the database may be restarting right now
                say(f"saboteur waits: {type(exc).__name__}")
                time.sleep(0.5)

    def kill_on_last_try(self, phase: LastTryPhase, model: FakeModel) -> None:
        """SIGKILL ``classify`` of ``phase``'s run on its last try while it holds a claim.

        The model is down until a ``classify`` task instance of the run is on its last try
        (``try_number`` past ``max_tries``: Airflow has no retry left for it), then hangs, so
        that try claims the batch and waits on its calls. Once its lease owner holds running
        jobs, its task process is killed, what it held is recorded (:attr:`last_try_kill`) and
        the model is up again, releasing any other call it held. Ends after the kill, when the
        run has finished without one, or when the drill stops.
        """
        from triage_tools.drill.last_try import LastTryKill, held_jobs
        from triage_tools.drill.model import ModelState

        path = f"/api/v2/dags/{DAG_ID}/dagRuns/{phase.run_id}"
        while not self._stop.wait(0.2):
            try:
                tis = [
                    ti
                    for ti in self.api.get(f"{path}/taskInstances", params={"limit": 100}).get("task_instances", [])
                    if ti.get("task_id") == "classify"
                ]
                last = [
                    ti
                    for ti in tis
                    if int(ti.get("try_number") or 0) > int(ti.get("max_tries") or 0) and ti.get("state") in LIVE
                ]
                if last and model.state == ModelState.DOWN:
                    model.set(ModelState.HANGING)
                    say(f"{phase.run_id}: classify on its last try; the model hangs")
                for ti in last:
                    index, tried = ti.get("map_index", -1), int(ti["try_number"])
                    owner = f"{DAG_ID}/{phase.run_id}/classify/{index}/try{tried}"
                    with self.engine.connect() as conn:
                        if ti.get("state") != "running" or not held_jobs(conn, owner):
                            continue
                    name = f"{phase.run_id}/classify/{index}"
                    victims = _task_processes({str(ti["id"]): name})
                    for pid, _ in victims:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    if not victims:
                        continue
                    with self.engine.connect() as conn:
                        held = held_jobs(conn, owner)  # its for good: nobody else takes a live lease
                    self.last_try_kill = LastTryKill(owner, tried, int(ti["max_tries"]), tuple(held), time.monotonic())
                    pids = ", ".join(str(pid) for pid, _ in victims)
                    self.fault(
                        "kill_on_last_try",
                        name,
                        f"SIGKILL pid {pids} on try {tried} of {int(ti['max_tries']) + 1}, holding {len(held)} jobs",
                    )
                    model.set(ModelState.UP)
                    return
                if str(self.api.get(path).get("state")) in ("success", "failed"):
                    say(f"{phase.run_id} finished before classify could be killed on its last try")
                    model.set(ModelState.UP)
                    return
            except Exception as exc:  # noqa: BLE001 - the database or Airflow may be restarting right now
                say(f"last-try killer waits: {type(exc).__name__}")
                time.sleep(0.5)

    def supervisor(self) -> None:
        """What ``restart: always`` does in docker-compose and systemd does on a host: Airflow 3.3's
        scheduler exits when PostgreSQL drops its connection (``AdminShutdown``), and standalone
        does not start it again. When the scheduler process has exited, or the API server has
        reported the scheduler unhealthy for ``grace`` seconds, restart the deployment's Airflow
        (its running tasks die with it). An exit is seen within a poll, as a service manager sees
        it; the API server only calls a scheduler unhealthy once its heartbeat is 30 s old.

        Before the drill has restarted PostgreSQL, an unhealthy scheduler that has not exited is
        a loaded machine's late heartbeat, not a death: restarting Airflow then only killed the
        tries it ran (twice in one small drill at a load average of 15-20)."""
        from triage_tools import local
        from triage_tools.processes import kill_groups

        grace, unhealthy_since = 45.0, None
        while not self._stop.wait(3.0):
            doc = local.health(local.base_url(self.env))
            healthy = bool(doc and (doc.get("scheduler") or {}).get("status") == "healthy")
            exited = self._scheduler_exited()
            restarted_db = any(f.kind == "postgres_restart" for f in self.report.faults)
            if (healthy or not restarted_db) and not exited:
                unhealthy_since = None
                continue
            unhealthy_since = unhealthy_since or time.monotonic()
            if not exited and time.monotonic() - unhealthy_since < grace:
                continue
            pid = local.running_pid(self.env)
            if pid is not None:
                kill_groups([pid])
            if local.up() != 0:
                self.fault("airflow_restart_failed", "airflow standalone", "could not start it again")
                self.airflow_lost = True
                return
            self.api._token = None  # a new API server: ask for a new token
            why = "its process exited" if exited else f"unhealthy for {grace:.0f} s"
            self.fault(
                "airflow_restarted", "airflow standalone", f"scheduler {why} (on the database restart); restarted"
            )
            unhealthy_since = None

    def _scheduler_exited(self) -> bool:
        """Standalone runs, but its ``airflow scheduler`` child does not (exited, or a zombie).
        Its other children have set titles of their own (``airflow worker -- …``, ``airflow
        serve-logs``), so the scheduler is the one whose arguments still end in ``scheduler``."""
        from triage_tools import local

        group = local.running_pid(self.env)
        if group is None:
            return False  # no standalone at all: the health check's grace decides
        for proc in group_members(group):
            with contextlib.suppress(psutil.Error):
                if "scheduler" in proc.cmdline()[-2:]:
                    return False
        return True


def _task_processes(ids: Mapping[str, str]) -> list[tuple[int, str]]:
    """``(pid, name)`` of the task processes (``airflow worker -- <ti id>``) of the task
    instance tries ``ids`` (``ti id -> name``)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        # The task process itself, not the executor's worker that supervises it: the supervisor
        # lives on to report the death, as it would after the kernel's OOM killer.
        if "airflow worker --" not in cmdline or "LocalExecutor" in cmdline:
            continue
        for ti_id, name in ids.items():
            if ti_id in cmdline:
                found.append((proc.pid, name))
    return found
