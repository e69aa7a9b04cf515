"""The failure drill: ``make chaos`` (``python -m triage_tools.drill.chaos``).

Runs ``classify_documents`` for several dates on a local deployment of its own (real
``airflow standalone``: scheduler, API server, DAG processor, LocalExecutor task processes;
the embedded PostgreSQL) with faults injected on every side, then lets reconciliation settle
it and judges the tables:

- classifier faults through the run's ``drill`` param (transient, permanent, inconclusive; a
  share of documents delivered twice);
- a label provider on loopback (:class:`~triage_tools.drill.provider.FakeProvider`) behind the
  ``triage_label_action`` connection, answering some first requests after the client's timeout
  although it applied them (timeouts after success);
- task processes SIGKILLed: ``classify`` while it holds a claim, ``persist`` right after the
  provider applied an effect and before the answer (the action happened, the record did not);
- a PostgreSQL restart mid-run (every connection of every component breaks);
- several workers on one batch (the DAG maps ``classify`` over parallel tasks, when it does);
- a model outage: one more date whose every model call fails for longer than all of the classify
  task's retries, then a run of that date with the model back
  (:mod:`triage_tools.drill.outage`).

Afterwards: ``reconcile_jobs`` runs, runs with unfinished jobs are cleared from ``classify``
on (what an operator does after reading the report), and again, until a reconciliation
changes nothing. Then :func:`~triage_tools.drill.invariants.check_invariants` and the provider's
own record decide; the table of faults, outcomes and invariants is printed and the exit code
is 1 if any invariant is broken or the drill could not finish.

Everything lives under ``$TRIAGE_HOME/chaos`` (its own database server, Airflow home, logs),
wiped at the start, so a drill never touches the deployment ``make run`` uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

DAG_ID = "classify_documents"
RECONCILE_DAG_ID = "reconcile_jobs"
FINISHED = frozenset({"success", "failed"})


def _say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DrillOptions:
    documents: int = 20_000
    dates: int = 4
    first_date: date = date(2026, 10, 1)
    seed: int = 7
    transient_error_rate: float = 0.20
    permanent_error_rate: float = 0.01
    inconclusive_rate: float = 0.03
    duplicate_rate: float = 0.05
    late_answer_rate: float = 0.002
    claim_kills: int = 2
    action_kills: int = 2
    db_restarts: int = 1
    lease_seconds: int = 30
    timeout_s: float = 1800.0
    settle_rounds: int = 6
    outage_documents: int = 200
    """Documents of the outage phase's date (the day before ``first_date``); 0: no outage phase."""

    @property
    def days(self) -> list[date]:
        return [self.first_date + timedelta(days=i) for i in range(self.dates)]

    def conf(self) -> dict[str, Any]:
        return {
            "documents": self.documents // self.dates,
            "lease_seconds": self.lease_seconds,
            "drill": {
                "transient_error_rate": self.transient_error_rate,
                "permanent_error_rate": self.permanent_error_rate,
                "inconclusive_rate": self.inconclusive_rate,
                "duplicate_rate": self.duplicate_rate,
                "seed": self.seed,
            },
        }


@dataclass
class Fault:
    kind: str
    target: str
    detail: str
    at: float


@dataclass
class DrillReport:
    faults: list[Fault] = field(default_factory=list)
    runs: dict[str, str] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    review_reasons: dict[str, int] = field(default_factory=dict)
    task_tries: dict[str, int] = field(default_factory=dict)
    invariants: list[Any] = field(default_factory=list)
    provider: dict[str, int] = field(default_factory=dict)
    settle_rounds: int = 0
    airflow_view: Counter[str] = field(default_factory=Counter)  # reconciliation runs: checked / skipped: why
    seconds: float = 0.0
    error: str | None = None

    @property
    def broken(self) -> list[Any]:
        return [i for i in self.invariants if not i.holds]

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.invariants) and not self.broken

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "error": self.error,
            "seconds": round(self.seconds, 1),
            "runs": self.runs,
            "faults": dict(Counter(f.kind for f in self.faults)),
            "fault_log": [f.__dict__ for f in self.faults],
            "states": self.states,
            "review_reasons": self.review_reasons,
            "task_tries": self.task_tries,
            "provider": self.provider,
            "settle_rounds": self.settle_rounds,
            "airflow_view": dict(self.airflow_view),
            "invariants": [
                {"name": i.name, "description": i.description, "violations": i.violations} for i in self.invariants
            ],
        }

    def table(self) -> str:
        from triage_tools.drill.invariants import format_invariants

        lines = ["", "faults injected", "---------------"]
        kinds = Counter(f.kind for f in self.faults)
        lines += [f"  {kind:<34} {n:>7}" for kind, n in sorted(kinds.items())] or ["  (none)"]
        lines += ["", "outcomes", "--------"]
        lines += [f"  {state:<34} {n:>7}" for state, n in sorted(self.states.items())]
        lines += [f"    manual_review: {reason:<19} {n:>7}" for reason, n in sorted(self.review_reasons.items())]
        lines += ["", "airflow task tries (state: count)", "---------------------------------"]
        lines += [f"  {k:<34} {n:>7}" for k, n in sorted(self.task_tries.items())]
        lines += ["", "label provider", "--------------"]
        lines += [f"  {k:<34} {n:>7}" for k, n in sorted(self.provider.items())]
        lines += [
            "",
            f"runs: {json.dumps(self.runs)}",
            f"settle rounds: {self.settle_rounds}",
            f"reconciliation's Airflow view: {json.dumps(dict(self.airflow_view))}",
            f"drill time: {self.seconds:.0f} s",
            "",
        ]
        if self.invariants:
            lines += [format_invariants(self.invariants), ""]
        held = len(self.invariants) - len(self.broken)
        verdict = "PASSED" if self.ok else "FAILED"
        lines.append(
            f"{verdict}: {held}/{len(self.invariants)} invariants hold" + (f"; {self.error}" if self.error else "")
        )
        return "\n".join(lines)


class Drill:
    """One drill on a running local deployment (see :func:`run`)."""

    def __init__(self, options: DrillOptions, env: dict[str, str], api: Any, provider: Any, home: Path) -> None:
        from triage.database import DatabaseUrl, create_engine
        from triage_tools.drill.outage import OutagePhase

        self.options, self.env, self.api, self.provider, self.home = options, env, api, provider, home
        self.engine = create_engine(DatabaseUrl.parse(env["TRIAGE_DATABASE_URL"]), pool_size=2, pool_pre_ping=True)
        self.report = DrillReport()
        self.started = time.monotonic()
        self.run_ids = {f"chaos__{d.isoformat()}": d for d in options.days}
        self.outage = (
            OutagePhase(options.first_date - timedelta(days=1), options.outage_documents, options.seed)
            if options.outage_documents
            else None
        )
        self._action_kills_left = options.action_kills
        self._next_action_kill = 200
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # -- faults ------------------------------------------------------------------------------

    def _fault(self, kind: str, target: str, detail: str) -> None:
        fault = Fault(kind, target, detail, round(time.monotonic() - self.started, 1))
        with self._lock:
            self.report.faults.append(fault)
        _say(f"fault {kind} {target}: {detail}")

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
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            # The task process itself, not the executor's worker that supervises it: the supervisor
            # lives on to report the death, as it would after the kernel's OOM killer.
            if "airflow worker --" not in cmdline or "LocalExecutor" in cmdline:
                continue
            for ti_id, name in ids.items():
                if ti_id in cmdline:
                    found.append((int(proc.name), name))
        return found

    def _kill(self, kind: str, run_id: str | None, task_id: str, why: str, most: int | None = None) -> bool:
        victims = self._task_runner_pids(run_id, task_id)[:most]
        for pid, name in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self._fault(kind, name, f"SIGKILL pid {pid} {why}")
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

        from triage.jobs.checks import in_state
        from triage.jobs.schema import jobs
        from triage.jobs.states import JobStatus, Step

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

        from triage.jobs.checks import in_state
        from triage.jobs.states import JobStatus

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
                    self._fault(
                        "postgres_restart",
                        "embedded PostgreSQL",
                        f"pg_ctl restart in {time.monotonic() - began:.1f} s; every connection broken",
                    )
                if not claim_targets and not restarts_left:
                    return
            except Exception as exc:  # noqa: BLE001 - the database may be restarting right now
                _say(f"saboteur waits: {type(exc).__name__}")
                time.sleep(0.5)

    def supervisor(self) -> None:
        """What ``restart: always`` does in docker-compose and systemd does on a host: Airflow 3.3's
        scheduler exits when PostgreSQL drops its connection (``AdminShutdown``), and standalone
        does not start it again. When the scheduler process has exited, or the API server has
        reported the scheduler unhealthy for ``grace`` seconds, restart the deployment's Airflow
        (its running tasks die with it). An exit is seen within a poll, as a service manager sees
        it; the API server only calls a scheduler unhealthy once its heartbeat is 30 s old."""
        from triage_tools import local
        from triage_tools.processes import kill_groups

        grace, unhealthy_since = 45.0, None
        while not self._stop.wait(3.0):
            doc = local.health(local.base_url(self.env))
            healthy = bool(doc and (doc.get("scheduler") or {}).get("status") == "healthy")
            exited = self._scheduler_exited()
            if healthy and not exited:
                unhealthy_since = None
                continue
            unhealthy_since = unhealthy_since or time.monotonic()
            if not exited and time.monotonic() - unhealthy_since < grace:
                continue
            pid = local.running_pid(self.env)
            if pid is not None:
                kill_groups([pid])
            if local.up() != 0:
                self._fault("airflow_restart_failed", "airflow standalone", "could not start it again")
                return
            self.api._token = None  # a new API server: ask for a new token
            why = "its process exited" if exited else f"unhealthy for {grace:.0f} s"
            self._fault(
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
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z" and b"scheduler" in argv[-2:]:
                return False
        return True

    # -- runs --------------------------------------------------------------------------------

    def trigger(self) -> None:
        from triage_tools.run import day_run

        conf = self.options.conf()
        for run_id, day in self.run_ids.items():
            self.api.send(
                "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {**day_run(run_id, day, conf), "note": "make chaos"}
            )
        _say(f"triggered {len(self.run_ids)} runs of {DAG_ID}, {conf['documents']} documents each")
        if self.outage is not None:
            body = day_run(self.outage.outage_run, self.outage.day, self.outage.outage_conf())
            self.api.send("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {**body, "note": "make chaos: model outage"})
            self._fault(
                "model_outage",
                self.outage.outage_run,
                f"every model call of {self.outage.documents} documents fails, past every retry",
            )

    def recover_from_outage(self) -> None:
        """The model is back: the next run of the outage's date, which must finish every job."""
        if self.outage is None:
            return
        from triage_tools.run import day_run

        body = day_run(self.outage.recovery_run, self.outage.day, self.outage.recovery_conf())
        # The same data interval (so the same batch) under a logical date of its own: Airflow
        # refuses a second run of the DAG at the outage run's logical date (HTTP 409).
        logical = datetime.fromisoformat(body["logical_date"]) + timedelta(seconds=1)
        body = {**body, "logical_date": logical.isoformat(), "note": "make chaos: the model is back"}
        self.api.send("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", body)
        state = self.wait_runs([self.outage.recovery_run])[self.outage.recovery_run]
        _say(f"the model is back: {self.outage.recovery_run} ended {state}")

    def runs(self, dag_id: str = DAG_ID) -> dict[str, tuple[str, str]]:
        """``run_id -> (state, day of its data interval)`` of every run of ``dag_id``: the drill's
        own and the one the scheduler creates for the latest interval when the DAG is unpaused."""
        rows = self.api.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100}).get("dag_runs", [])
        return {r["dag_run_id"]: (str(r["state"]), str(r.get("data_interval_start") or "")[:10]) for r in rows}

    def wait_runs(self, run_ids: Sequence[str] | None = None, dag_id: str = DAG_ID) -> dict[str, str]:
        """Wait until ``run_ids`` (default: every run of ``dag_id``) have finished."""
        deadline = self.started + self.options.timeout_s
        last = ""
        while True:
            with contextlib.suppress(Exception):
                states = {r: state for r, (state, _) in self.runs(dag_id).items()}
                wanted = {r: states.get(r, "missing") for r in (run_ids if run_ids is not None else states)}
                summary = json.dumps(dict(Counter(wanted.values())))
                if summary != last:
                    _say(f"{dag_id} runs: {summary}")
                    last = summary
                if all(s in FINISHED for s in wanted.values()):
                    return wanted
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id} runs not finished after {self.options.timeout_s:.0f} s: {last}")
            time.sleep(2.0)

    def reconcile(self, round_no: int) -> int:
        """One ``reconcile_jobs`` run through Airflow; how many repairs it made."""
        import sqlalchemy as sa

        run_id = f"chaos_reconcile__{round_no}"
        with self.engine.connect() as conn:
            before = conn.execute(sa.text("SELECT coalesce(max(id), 0) FROM triage.reconciliation_runs")).scalar_one()
        self.api.send(
            "POST",
            f"/api/v2/dags/{RECONCILE_DAG_ID}/dagRuns",
            {"dag_run_id": run_id, "logical_date": None, "conf": {"grace_seconds": 0, "outbox_age_seconds": 0}},
        )
        state = self.wait_runs([run_id], RECONCILE_DAG_ID)[run_id]
        if state != "success":
            raise RuntimeError(f"{RECONCILE_DAG_ID} run {run_id} ended {state}")
        with self.engine.connect() as conn:  # this run's, and a scheduled one's that ran meanwhile
            rows = conn.execute(
                sa.text(
                    "SELECT repairs, summary -> 'totals' -> 'skipped' ->> 'airflow_view' FROM triage.reconciliation_runs"
                    " WHERE finished_at IS NOT NULL AND id > :before"
                ),
                {"before": before},
            ).all()
        # The cross-check logs in as triage_reconcile (the deployment's airflow_api connection).
        self.report.airflow_view.update("checked" if skipped is None else f"skipped: {skipped}" for _, skipped in rows)
        return sum(int(r.get("count", 0)) for repairs, _ in rows for r in repairs or [] if isinstance(r, dict))

    def unfinished(self) -> dict[str, int]:
        import sqlalchemy as sa

        from triage.jobs.checks import in_state
        from triage.jobs.schema import jobs
        from triage.jobs.states import UNFINISHED

        by_batch = sa.select(jobs.c.batch_key, sa.func.count()).where(in_state(*UNFINISHED)).group_by(jobs.c.batch_key)
        with self.engine.connect() as conn:
            rows = conn.execute(by_batch).all()
        return {r[0]: int(r[1]) for r in rows}

    def clear_from_classify(self, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            self.api.send(
                "POST",
                f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
                {
                    "dry_run": False,
                    "dag_run_id": run_id,
                    "task_ids": ["classify"],
                    "include_downstream": True,
                    "only_failed": False,
                    "reset_dag_runs": True,
                },
            )
        _say(f"cleared {list(run_ids)} from classify on (unfinished jobs after reconciliation)")

    def settle(self) -> None:
        """Reconcile until a round changes nothing; clear the runs that still have open jobs."""
        for round_no in range(1, self.options.settle_rounds + 1):
            self.report.settle_rounds = round_no
            repairs = self.reconcile(round_no)
            open_jobs = self.unfinished()
            _say(f"reconciliation {round_no}: {repairs} repairs, unfinished jobs {sum(open_jobs.values())}")
            if not open_jobs and repairs == 0:
                return
            if open_jobs:
                days = {k.split("T", 1)[0] for k in open_jobs}
                runs = [r for r, (_, day) in self.runs().items() if day in days]
                if runs:
                    self.clear_from_classify(runs)
                    time.sleep(3.0)
                self.wait_runs()
        raise RuntimeError(f"reconciliation still changing things after {self.options.settle_rounds} rounds")

    # -- judgement ---------------------------------------------------------------------------

    def judge(self) -> None:
        import sqlalchemy as sa

        from triage.jobs.checks import in_state
        from triage.jobs.schema import document_labels, jobs
        from triage.jobs.states import JobStatus
        from triage_tools.drill.invariants import Invariant, check_invariants

        with self.engine.connect() as conn:
            self.report.states = {
                r[0]: int(r[1])
                for r in conn.execute(sa.text("SELECT status::text, count(*) FROM triage.jobs GROUP BY 1"))
            }
            self.report.review_reasons = {
                r[0]: int(r[1])
                for r in conn.execute(
                    sa.text("SELECT reason, count(*) FROM triage.manual_review WHERE resolved_at IS NULL GROUP BY 1")
                )
            }
            # The jobs whose label is a document's: an older job of an edited document completes
            # without its action once the newer job's label stands (see triage.pipeline.persist).
            labelled_jobs = {
                str(r[0])
                for r in conn.execute(
                    sa.select(document_labels.c.job_id)
                    .join_from(document_labels, jobs, jobs.c.id == document_labels.c.job_id)
                    .where(in_state(JobStatus.COMPLETED))
                )
            }
            invariants = check_invariants(
                conn, None, effects_per_key={k: len(v) for k, v in self.provider.asked.items()}
            )
            if self.outage is not None:
                from triage_tools.drill.outage import outage_invariants

                states = {r: state for r, (state, _) in self.runs().items()}
                invariants += outage_invariants(conn, self.outage, states)
        # The provider's side: one effect per document (a duplicate delivery is one job, so one
        # key), and every document's label reached it (nothing completed without its effect).
        per_document = Counter((b.get("source"), b.get("external_id")) for b in self.provider.effects.values())
        invariants.append(
            Invariant(
                "one_effect_per_document",
                "the provider applied one label per document",
                sum(1 for n in per_document.values() if n > 1),
            )
        )
        applied_jobs = {str(b.get("job_id")) for b in self.provider.effects.values()}
        invariants.append(
            Invariant(
                "completed_has_effect", "every document's label reached the provider", len(labelled_jobs - applied_jobs)
            )
        )
        self.report.invariants = invariants
        self.report.provider = {
            "requests": sum(self.provider.requests.values()),
            "effects": len(self.provider.effects),
            "keys asked more than once": sum(1 for n in self.provider.requests.values() if n > 1),
            "answered after the client's timeout": self.provider.late_answers,
        }
        tries: Counter[str] = Counter()
        for run_id in self.runs():
            with contextlib.suppress(Exception):
                for ti in self.api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").get(
                    "task_instances", []
                ):
                    tries[f"{ti['task_id']}: tries"] += int(ti.get("try_number") or 0)
        self.report.task_tries = dict(tries)


MARKER = ".triage-chaos"
"""Written into every drill home: only a folder that carries it is ever wiped."""


def _prepare_home(home: Path) -> None:
    """A fresh drill home: stop what a previous drill left running, then wipe it. Refuses a
    non-empty folder that no drill made (``--home .`` must not delete a checkout)."""
    from triage_tools import embedded, local
    from triage_tools.processes import kill_groups

    if home.exists() and any(home.iterdir()):
        if not (home / MARKER).exists():
            raise SystemExit(f"chaos: {home} is not empty and not a drill home (no {MARKER}); choose another --home")
        pid = local.running_pid({"TRIAGE_HOME": str(home)})
        if pid is not None:
            kill_groups([pid])
        embedded.stop(home)
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / MARKER).write_text("a failure-drill home: make chaos wipes it at its next start\n", encoding="utf-8")


def run(options: DrillOptions, home: Path) -> DrillReport:
    """The whole drill; the caller prints :meth:`DrillReport.table`."""
    from triage.reconciliation.airflow_view import AirflowApi
    from triage_tools import deployment, embedded, local
    from triage_tools.drill.provider import FakeProvider
    from triage_tools.processes import kill_groups, side_by_side_env

    began = time.monotonic()
    _prepare_home(home)
    os.environ["TRIAGE_HOME"] = str(home)
    os.environ.pop("TRIAGE_DATABASE_URL", None)  # the drill restarts its own server, never yours
    os.environ.update(side_by_side_env())
    # A supervisor that died with the database restart is declared dead after a minute, not five.
    os.environ["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] = "60"
    drill: Drill | None = None
    provider = FakeProvider(late_rate=options.late_answer_rate, late_by_s=1.5, seed=options.seed)
    report = DrillReport()
    with provider:
        os.environ["AIRFLOW_CONN_TRIAGE_LABEL_ACTION"] = json.dumps(
            {"conn_type": "http", "host": provider.url, "extra": {"timeout": 1.0}}
        )
        try:
            if local.up() != 0:
                raise RuntimeError("airflow standalone did not start")
            env = deployment.environment()
            user, password = local.admin_login(env)  # the drill triggers and clears runs
            api = AirflowApi(local.base_url(env), username=user, password=password, timeout_s=30)
            drill = Drill(options, env, api, provider, home)
            provider.on_effect = drill.on_effect
            _wait_dag(api, DAG_ID)
            _wait_dag(api, RECONCILE_DAG_ID)
            drill.trigger()
            for dag_id in (DAG_ID, RECONCILE_DAG_ID):
                api.send("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
            saboteur = threading.Thread(target=drill.saboteur, name="chaos-saboteur", daemon=True)
            saboteur.start()
            supervisor = threading.Thread(target=drill.supervisor, name="chaos-supervisor", daemon=True)
            supervisor.start()
            time.sleep(5.0)  # the scheduler creates the unpaused DAG's own latest run
            drill.report.runs = drill.wait_runs()
            saboteur.join(timeout=10)
            drill.recover_from_outage()
            drill.settle()
            drill._stop.set()
            supervisor.join(timeout=60)
            drill.report.runs = {r: state for r, (state, _) in drill.runs().items()}
            drill.judge()
        except Exception as exc:  # noqa: BLE001 - the report says what went wrong; the exit code fails
            target = drill.report if drill is not None else report
            target.error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                if drill is not None:
                    drill.judge()
        finally:
            if drill is not None:
                drill._stop.set()
                report = drill.report
                drill.engine.dispose()
            pid = local.running_pid({"TRIAGE_HOME": str(home)})
            if pid is not None:
                kill_groups([pid])
            embedded.stop(home)
    report.seconds = time.monotonic() - began
    (home / "report.json").write_text(json.dumps(report.as_dict(), indent=2, default=str), encoding="utf-8")
    return report


def _wait_dag(api: Any, dag_id: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            api.get(f"/api/v2/dags/{dag_id}")
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dag_id} not parsed after {timeout:.0f} s")
        time.sleep(1.0)


DESCRIPTION = """\
The failure drill (make chaos): classify_documents for several dates on a
deployment of its own under $TRIAGE_HOME/chaos (wiped first), with faults on every
side: classifier errors and duplicates, a label provider answering after the
timeout, task processes killed under a claim and right after an external action,
a PostgreSQL restart. Reconciliation then settles it; the invariants are judged.

Exit code 1 if an invariant is broken or the drill could not finish; the report
is written to report.json in the drill's home.
"""


def main(argv: Sequence[str] | None = None, prog: str = "python -m triage_tools.drill.chaos") -> int:
    defaults = DrillOptions()
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # (flag, DrillOptions field, type, metavar, help): one line per knob, every default the options'.
    knobs = (
        ("--documents", "documents", int, "N", "synthetic documents in all (default %(default)s)"),
        ("--dates", "dates", int, "N", "days they are spread over, one run each (default %(default)s)"),
        ("--seed", "seed", int, "N", "seed of the injected faults (default %(default)s)"),
        (
            "--claim-kills",
            "claim_kills",
            int,
            "N",
            "classify tasks killed while they hold a claim (default %(default)s)",
        ),
        (
            "--action-kills",
            "action_kills",
            int,
            "N",
            "persist tasks killed after an external action (default %(default)s)",
        ),
        ("--db-restarts", "db_restarts", int, "N", "PostgreSQL restarts mid-run (default %(default)s)"),
        (
            "--outage-documents",
            "outage_documents",
            int,
            "N",
            "documents of the model-outage date, the day before the first (0: no outage; default %(default)s)",
        ),
        ("--timeout", "timeout_s", float, "SECONDS", "give up after this many seconds (default %(default).0f)"),
    )
    for flag, name, kind, metavar, text in knobs:
        parser.add_argument(flag, dest=name, type=kind, metavar=metavar, default=getattr(defaults, name), help=text)
    parser.add_argument(
        "--home",
        type=Path,
        metavar="DIR",
        default=None,
        help="the drill's home, wiped first (default: $TRIAGE_HOME/chaos)",
    )
    args = parser.parse_args(argv)
    from triage.settings import triage_home

    home = (args.home or triage_home() / "chaos").resolve()
    options = DrillOptions(**{name: getattr(args, name) for _flag, name, *_ in knobs})
    report = run(options, home)
    print(report.table())
    print(f"report: {home / 'report.json'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
