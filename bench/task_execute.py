"""Each task's fixed cost inside ``execute`` (issue #29): what ``retrieve``, ``size_classify``,
``classify`` and ``publish_events`` spend in their operator's ``execute`` on a small day, where
the work itself is a few milliseconds.

A probe process imports :data:`triage_tools.deployment.TASK_PRELOAD` and parses
``dags/classify_documents.py``, as ``make up``'s forkserver and a task process do, then forks one
child per task (a task process is a fork of a preloaded parent) and times the operator's
``execute`` in it: wall and CPU, on a scratch ledger reached through the ``triage_db``
connection (``AIRFLOW_CONN_TRIAGE_DB``, so the engine is made and connected as in a task). The
Task SDK has no supervisor here: a Variable or Connection lookup reads the environment instead
of asking the API server. Each round runs today's code and the baseline, alternating which goes
first; the baseline is :func:`triage.pipeline.heap.freeze_long_lived` as it was (a full
``gc.collect()`` before ``gc.freeze()``). Every run is a day of its own.

``BENCH_EXECUTE_DOCUMENTS`` sets the day (default 100), ``BENCH_EXECUTE_ROUNDS`` the rounds (6).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import Figure, scratch_database

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("retrieve", "size_classify", "classify", "publish_events")


def run() -> list[Figure]:
    documents = int(os.environ.get("BENCH_EXECUTE_DOCUMENTS", "100"))
    rounds = int(os.environ.get("BENCH_EXECUTE_ROUNDS", "6"))
    rows: list[dict[str, Any]] = []
    with scratch_database() as url:
        env = {
            **os.environ,
            "AIRFLOW_CONN_TRIAGE_DB": url.airflow_connection_json(),
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "plugins"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        for i in range(rounds):
            for baseline in (True, False) if i % 2 == 0 else (False, True):
                probe = subprocess.run(
                    [sys.executable, "-m", "bench.task_execute", str(documents), "1" if baseline else "0"],
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=300,
                )
                rows += [json.loads(line) for line in probe.stdout.splitlines() if line.startswith("{")]
    figures = []
    for task in TASKS:
        today = [r for r in rows if r["task"] == task and not r["baseline"]]
        before = [r for r in rows if r["task"] == task and r["baseline"]]
        figures.append(
            Figure(
                f"{task} execute, {documents} documents",
                "ms",
                1000 * statistics.median(r["wall"] for r in today),
                "with a full gc.collect first",
                1000 * statistics.median(r["wall"] for r in before),
                higher_is_better=False,
                details={
                    "cpu_ms": round(1000 * statistics.median(r["cpu"] for r in today), 1),
                    "baseline_cpu_ms": round(1000 * statistics.median(r["cpu"] for r in before), 1),
                    "rounds": rounds,
                },
            )
        )
    return figures


def _probe(documents: int, baseline: bool) -> None:
    """The probe process: preload, then one forked child per task; one JSON line per task."""
    import importlib
    import random
    import uuid

    from triage_tools.deployment import TASK_PRELOAD

    for name in TASK_PRELOAD:
        importlib.import_module(name)
    sys.path.insert(0, str(ROOT / "dags"))
    importlib.import_module("classify_documents")  # the task process parses its DAG file

    from airflow.sdk import DAG

    from triage.operators import RetrieveDocumentsOperator
    from triage.operators.classify_documents import ClassifyDocumentsOperator
    from triage.operators.tasks import classification_tasks

    if baseline:
        import functools
        import gc

        from triage.pipeline import one_transaction, retrieve

        @functools.cache
        def collect_then_freeze() -> None:
            gc.collect()
            gc.freeze()

        retrieve.freeze_long_lived = collect_then_freeze
        one_transaction.freeze_long_lived = collect_then_freeze

    base = f"{os.environ.get('TMPDIR', '/tmp')}/triage-bench-execute-{uuid.uuid4().hex[:8]}"
    os.environ.update(TRIAGE_PAYLOAD_BASE=base, TRIAGE_EVENT_LOG=f"{base}/events.jsonl")
    with DAG(dag_id="bench_execute", schedule=None, start_date=datetime(2026, 1, 1)):
        retrieve_task = RetrieveDocumentsOperator(task_id="retrieve", shard=0, shards=1)
        tasks = classification_tasks(retrieve_task)
        # One instance of the mapped classify, unmapped, with its downstream publish_events (its
        # trailing relay sends through that task's sink).
        classify = ClassifyDocumentsOperator(task_id="classify_worker", worker=0, pool_slots=8)
        classify >> tasks["publish_events"]
    operators = {
        "retrieve": retrieve_task,
        "size_classify": tasks["size_classify"],
        "classify": classify,
        "publish_events": tasks["publish_events"],
    }
    day = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=random.randrange(10_000))
    run_id = f"manual__{uuid.uuid4().hex}"
    for name in TASKS:
        pid = os.fork()
        if pid:
            _, status = os.waitpid(pid, 0)
            if status:
                raise SystemExit(f"{name}: the probe's child failed")
            continue
        try:
            print(
                json.dumps(
                    {"baseline": baseline}
                    | _timed(name, operators[name], _context(name, operators[name], documents, day, run_id))
                )
            )
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001 - the forked child must never return into the parent's loop
            import traceback

            traceback.print_exc()
            os._exit(1)
        os._exit(0)


def _context(name: str, task: Any, documents: int, day: datetime, run_id: str) -> dict[str, Any]:
    """What the operators read of a task's context; XComs are kept on the ``ti`` (``pushed``)."""
    pushed: dict[str, Any] = {}

    def xcom_push(key: str, value: Any) -> None:
        pushed[key] = value

    ti = types.SimpleNamespace(
        dag_id="bench_execute", run_id=run_id, task_id=name, map_index=0, try_number=1, xcom_push=xcom_push
    )
    return {
        "params": {"documents": documents, "classifier": "keyword"},
        "data_interval_start": day,
        "data_interval_end": day + timedelta(days=1),
        "ti": ti,
        "task": task,
        "run_id": run_id,
    }


def _timed(name: str, task: Any, context: dict[str, Any]) -> dict[str, Any]:
    """``task.execute(context)``'s wall and CPU seconds; ``publish_events`` ends by skipping the
    alert teardown (``DownstreamTasksSkipped``, its happy path); any other error fails the bench."""
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.suppress(DownstreamTasksSkipped):
        task.execute(context)
    return {"task": name, "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


if __name__ == "__main__":
    _probe(int(sys.argv[1]), sys.argv[2] == "1")
