"""How the drill watches Airflow's runs: their states, and waits that end at the drill's deadline
(or as soon as Airflow is lost) with an error naming what they waited for."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from triage_tools.drill.report import say

DAG_ID = "classify_documents"
RECONCILE_DAG_ID = "reconcile_jobs"
FINISHED = frozenset({"success", "failed"})


class RunWatcher:
    """What :class:`~triage_tools.drill.chaos.Drill` asks of Airflow's runs (its REST API
    ``api``, its ``deadline`` in ``time.monotonic()``, and its ``faults``, which say when
    Airflow could not be started again)."""

    api: Any
    deadline: float
    faults: Any

    def runs(self, dag_id: str = DAG_ID) -> dict[str, tuple[str, str]]:
        """``run_id -> (state, day of its data interval)`` of every run of ``dag_id``: the drill's
        own and the one the scheduler creates for the latest interval when the DAG is unpaused."""
        rows = self.api.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100}).get("dag_runs", [])
        return {r["dag_run_id"]: (str(r["state"]), str(r.get("data_interval_start") or "")[:10]) for r in rows}

    def wait_runs(self, run_ids: Sequence[str] | None = None, dag_id: str = DAG_ID) -> dict[str, str]:
        """Wait until ``run_ids`` (default: every run of ``dag_id``) have finished, at most until
        the drill's deadline; the error names the runs still unfinished and their states."""
        last, pending = "", "(Airflow's API did not answer)"
        while True:
            with contextlib.suppress(Exception):
                states = {r: state for r, (state, _) in self.runs(dag_id).items()}
                wanted = {r: states.get(r, "missing") for r in (run_ids if run_ids is not None else states)}
                summary = json.dumps(dict(Counter(wanted.values())))
                if summary != last:
                    say(f"{dag_id} runs: {summary}")
                    last = summary
                pending = json.dumps({r: s for r, s in wanted.items() if s not in FINISHED})
                if all(s in FINISHED for s in wanted.values()):
                    return wanted
            if self.faults.airflow_lost:
                raise RuntimeError(f"Airflow could not be started again; {dag_id} runs unfinished: {pending}")
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"{dag_id} runs still unfinished at the drill's deadline (--timeout): {pending}")
            time.sleep(2.0)

    def run_info(self, run_id: str, dag_id: str = DAG_ID) -> tuple[str, str]:
        """``(state, end_date)`` of one run (its end date tells one finish from the next)."""
        run = self.api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        return str(run.get("state")), str(run.get("end_date") or "")

    def wait_rerun(self, run_id: str, before: tuple[str, str], dag_id: str = DAG_ID) -> str:
        """Wait until a run that was ``before`` (state, end date) when it was cleared has finished
        again, at most until the drill's deadline; its state then."""
        last = before
        while True:
            with contextlib.suppress(Exception):
                last = self.run_info(run_id, dag_id)
                if last[0] in FINISHED and last[1] != before[1]:
                    return last[0]
            if self.faults.airflow_lost or time.monotonic() > self.deadline:
                why = "Airflow could not be started again" if self.faults.airflow_lost else "the drill's deadline"
                raise TimeoutError(
                    f"{dag_id} run {run_id}, cleared when it was {before[0]}, is still {last[0]} at {why}"
                )
            time.sleep(2.0)
