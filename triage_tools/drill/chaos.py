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
- a model outage: the drill's model on loopback (:mod:`triage_tools.drill.model`) is down from
  the start, for longer than all of the classify task's retries, so one more date's run fails
  with its jobs parked; ``reconcile_jobs`` resumes it while the model is still down (it fails
  again), and again once the model is back (it succeeds), with no run of the date by hand
  (:mod:`triage_tools.drill.outage`).
- a kill on the last try: one more date whose ``classify`` is SIGKILLed on its final try while
  it holds a claim, so Airflow gives up and no failure callback runs; only reconciliation's
  Airflow view can settle its jobs (:mod:`triage_tools.drill.last_try`, against the same model:
  the outage lasts until that kill).

Afterwards: ``reconcile_jobs`` runs, runs with unfinished jobs are cleared from ``classify``
on (what an operator does after reading the report), and again, until a reconciliation
changes nothing. Then :func:`~triage_tools.drill.invariants.check_invariants` and the provider's
own record decide; the table of faults, outcomes and invariants is printed and the exit code
is 1 if any invariant is broken or the drill could not finish.

Everything lives under ``$TRIAGE_HOME/chaos`` (its own database server, Airflow home, logs),
wiped at the start, so a drill never touches the deployment ``make run`` uses.

This module is the orchestration (trigger, wait, settle, judge); the knobs and the command line
are :mod:`~triage_tools.drill.options`, the faults :mod:`~triage_tools.drill.faults`, the
waits for Airflow's runs :mod:`~triage_tools.drill.runs`, the report
:mod:`~triage_tools.drill.report`, the phases :mod:`~triage_tools.drill.outage` and
:mod:`~triage_tools.drill.last_try`, and the verdict :mod:`~triage_tools.drill.judge` (over
:mod:`~triage_tools.drill.invariants`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from triage_tools.drill.faults import FaultInjector
from triage_tools.drill.options import DrillOptions, parse
from triage_tools.drill.report import DrillReport, say
from triage_tools.drill.runs import DAG_ID, RECONCILE_DAG_ID, RunWatcher

__all__ = ["Drill", "DrillOptions", "DrillReport", "main", "run"]


class Drill(RunWatcher):
    """One drill on a running local deployment (see :func:`run`)."""

    def __init__(
        self,
        options: DrillOptions,
        env: dict[str, str],
        api: Any,
        provider: Any,
        home: Path,
        model: Any = None,
        began: float | None = None,
    ) -> None:
        from triage.database import DatabaseUrl, create_engine
        from triage_tools.drill.last_try import LastTryPhase
        from triage_tools.drill.outage import OutagePhase, OutageRecord

        self.options, self.env, self.api, self.provider, self.home = options, env, api, provider, home
        self.engine = create_engine(DatabaseUrl.parse(env["TRIAGE_DATABASE_URL"]), pool_size=2, pool_pre_ping=True)
        self.report = DrillReport()
        self.started = time.monotonic()
        # --timeout counts from the drill's start, Airflow's start-up included: every wait ends by then.
        self.deadline = (began if began is not None else self.started) + options.timeout_s
        self.run_ids = {f"chaos__{d.isoformat()}": d for d in options.days}
        self.outage = (
            OutagePhase(options.first_date - timedelta(days=1), options.outage_documents, options.seed)
            if options.outage_documents and model is not None
            else None
        )
        self.outage_record = OutageRecord(forced=options.outage_resumes_while_down)
        self.cleared: set[str] = set()  # runs the settling rounds cleared by hand
        self.model = model
        self.last_try = (
            LastTryPhase(
                options.first_date - timedelta(days=2), options.last_try_documents, options.seed, options.lease_seconds
            )
            if options.last_try_documents and model is not None
            else None
        )
        self.first_states: dict[str, str] = {}  # how each run first finished, before any clearing
        self._stop = threading.Event()
        self.faults = FaultInjector(
            options, env, api, self.engine, home, self.report, self.run_ids, self.started, self._stop
        )

    # -- runs --------------------------------------------------------------------------------

    def trigger(self) -> None:
        from triage_tools.run import day_run

        conf = self.options.conf()
        for run_id, day in self.run_ids.items():
            self.api.send(
                "POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {**day_run(run_id, day, conf), "note": "make chaos"}
            )
        say(f"triggered {len(self.run_ids)} runs of {DAG_ID}, {conf['documents']} documents each")
        if self.outage is not None:
            body = day_run(self.outage.outage_run, self.outage.day, self.outage.outage_conf())
            self.api.send("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {**body, "note": "make chaos: model outage"})
            self.faults.fault(
                "model_outage",
                self.outage.outage_run,
                f"the model answers 503 to every call of {self.outage.documents} documents, past every retry",
            )

    def start_last_try(self) -> threading.Thread | None:
        """Trigger the last-try case's run and start the thread that kills it on its last try.

        After the other runs, the model still down (the outage goes on until the kill): on its
        own, no database or Airflow restart can end a try of it (a sibling map index that Airflow's restart killed is failed
        by the scheduler later, and its failure callback, run then, would sweep the killed try's
        expired lease before reconciliation looks)."""
        if self.last_try is None:
            return None
        from triage_tools.run import day_run

        body = day_run(self.last_try.run_id, self.last_try.day, self.last_try.conf())
        self.api.send("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {**body, "note": "make chaos: kill on the last try"})
        say(f"triggered {self.last_try.run_id}: the model is down until classify's last try")
        killer = threading.Thread(
            target=self.faults.kill_on_last_try, args=(self.last_try, self.model), name="chaos-last-try", daemon=True
        )
        killer.start()
        return killer

    def finish_last_try(self, killer: threading.Thread | None) -> None:
        """Wait for the last-try run and its killer, then until the killed try's lease has run
        out: reconciliation then settles its jobs the same way whichever map index was killed
        (its expired lease released, then the Airflow view's repair)."""
        if self.last_try is None or killer is None:
            return
        run_id = self.last_try.run_id
        self.first_states[run_id] = self.wait_runs([run_id])[run_id]
        killer.join(timeout=60)
        kill = self.faults.last_try_kill
        if kill is not None:
            time.sleep(max(0.0, kill.killed_at + self.last_try.lease_seconds + 1.0 - time.monotonic()))
        say(f"{run_id} ended {self.first_states[run_id]}")

    def resume_outage_while_down(self) -> None:
        """``reconcile_jobs`` resumes the failed outage run while the model is still down
        (:func:`triage_tools.drill.outage.resume_while_down`)."""
        if self.outage is not None:
            from triage_tools.drill.outage import resume_while_down

            resume_while_down(self, self.outage, self.outage_record)

    def recover_from_outage(self) -> None:
        """The model is back: ``reconcile_jobs`` resumes the outage run, which must finish every
        job (:func:`triage_tools.drill.outage.heal`); nothing of the date is run by hand."""
        if self.outage is None:
            return
        from triage_tools.drill.model import ModelState
        from triage_tools.drill.outage import heal

        self.model.set(ModelState.UP)
        say(f"the model is back (calls so far by the state they found: {dict(self.model.calls)})")
        heal(self, self.outage, self.outage_record)

    def reconcile(self, run_id: str) -> int:
        """One ``reconcile_jobs`` run through Airflow, ``run_id``; how many repairs it (and any
        scheduled run that finished meanwhile) made."""
        import sqlalchemy as sa

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

        from triage.jobs.schema import jobs
        from triage.jobs.sql.reads.checks import in_state
        from triage.jobs.vocabulary.states import UNFINISHED

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
            self.cleared.add(run_id)
        say(f"cleared {list(run_ids)} from classify on (unfinished jobs after reconciliation)")

    def settle(self) -> None:
        """Reconcile until a round changes nothing; clear the runs that still have open jobs."""
        for round_no in range(1, self.options.settle_rounds + 1):
            self.report.settle_rounds = round_no
            repairs = self.reconcile(f"chaos_reconcile__{round_no}")
            open_jobs = self.unfinished()
            say(f"reconciliation {round_no}: {repairs} repairs, unfinished jobs {sum(open_jobs.values())}")
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
        """The invariants, the outcomes and the provider's counts, into the report."""
        from triage_tools.drill.judge import judge

        judge(self)


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
    from triage.adapters.airflow_api import AirflowApi
    from triage.classifiers.taxonomy import Taxonomy
    from triage_tools import deployment, embedded, local
    from triage_tools.drill.model import FakeModel
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
    # One model for the outage and the last-try case: down from the start, back after the kill.
    with_model = bool(options.last_try_documents or options.outage_documents)
    model = FakeModel(label=Taxonomy.load().labels[0].name) if with_model else None
    with provider, model or contextlib.nullcontext():
        os.environ["AIRFLOW_CONN_TRIAGE_LABEL_ACTION"] = json.dumps(
            {"conn_type": "http", "host": provider.url, "extra": {"timeout": 1.0}}
        )
        if model is not None:
            os.environ["AIRFLOW_CONN_TRIAGE_LLM"] = model.connection()
        try:
            if local.up() != 0:
                raise RuntimeError("airflow standalone did not start")
            env = deployment.environment()
            user, password = local.admin_login(env)  # the drill triggers and clears runs
            api = AirflowApi(local.base_url(env), username=user, password=password, timeout_s=30)
            drill = Drill(options, env, api, provider, home, model, began)
            provider.on_effect = drill.faults.on_effect
            _wait_dag(api, DAG_ID)
            _wait_dag(api, RECONCILE_DAG_ID)
            drill.trigger()
            for dag_id in (DAG_ID, RECONCILE_DAG_ID):
                api.send("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
            saboteur = threading.Thread(target=drill.faults.saboteur, name="chaos-saboteur", daemon=True)
            saboteur.start()
            supervisor = threading.Thread(target=drill.faults.supervisor, name="chaos-supervisor", daemon=True)
            supervisor.start()
            time.sleep(5.0)  # the scheduler creates the unpaused DAG's own latest run
            drill.report.runs = drill.wait_runs()
            drill.first_states = dict(drill.report.runs)
            saboteur.join(timeout=10)
            drill.resume_outage_while_down()
            killer = drill.start_last_try()
            drill.finish_last_try(killer)
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


def main(argv: Sequence[str] | None = None, prog: str = "python -m triage_tools.drill.chaos") -> int:
    options, home_arg = parse(argv, prog)
    from triage.settings import triage_home

    home = (home_arg or triage_home() / "chaos").resolve()
    report = run(options, home)
    print(report.table())
    print(f"report: {home / 'report.json'}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
