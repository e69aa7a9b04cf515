"""classify_documents: retrieve → classify → persist → publish events, one data interval a run.

Scheduled daily with real data intervals (a run covers [00:00, 24:00) UTC of its day), catchup
off, backfillable from the CLI; paused when Airflow first sees it (unpause it once the params'
defaults, or the source you trigger it with, are what you want every day). Trigger it from the UI with the typed params form. Per-document
failures never fail a task; a task fails when a dependency is down or retryable work remains,
and Airflow retries it with exponential backoff. When Airflow gives up, the failure callback
moves the unfinished jobs this run holds or moved last at the task's step to manual review
(never another run's of the same date).

``alert`` runs last, once every other task is done, whatever their states (a teardown: it never
decides the run's state): it counts what this run sent to review or failed terminally and
alerts through the ``triage_alerts`` connection (a log line without it) past the thresholds. A
run that has not succeeded by 02:00 UTC after its day gets a deadline alert from the scheduler
(``deadline``: ``triage.operators.alerts.classify_deadline``; not under ``airflow dags test``,
which has no scheduler and, in Airflow 3.3.2, exits 1 after a successful run of a DAG with a
deadline). See
docs/reliability.md, "Alerts".

``classify`` is mapped over as many parallel task instances of the same batch as its work needs:
``size_classify`` counts the batch's open jobs once ``retrieve`` is done and returns
``ceil(jobs / CLASSIFY_JOBS_PER_WORKER)`` map indexes, at least one and at most
``CLASSIFY_MAX_WORKERS`` (Variables ``triage_classify_jobs_per_worker`` and
``triage_classify_max_workers`` override them; ``triage.operators.sizing``). Each claims jobs
with ``FOR UPDATE SKIP LOCKED`` under its own lease owner (the map index is part of it), so
under the CeleryExecutor they classify on different workers at once and split the batch
between them; an instance that finds the batch drained finishes at once. ``retrieve`` is
mapped over ``RETRIEVE_SHARDS`` shards of the source (by external id), so that several
processes read, pack and register documents; its count is a constant (the work is not known
before it is read): the DAG file does no work when it is parsed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from triage.callbacks import on_task_failure
from triage.contracts.run_config import param_schemas
from triage.operators import (
    ClassifyDocumentsOperator,
    PersistLabelsOperator,
    PublishEventsOperator,
    RetrieveDocumentsOperator,
)
from triage.operators.alerts import RunAlertsOperator, classify_deadlines
from triage.operators.retry import OUTAGE_RETRY_POLICY
from triage.operators.sizing import SizeClassifyOperator

RETRIEVE_SHARDS = 2
"""Parallel ``retrieve`` task instances per run, each registering the documents of one shard
(by external id): reading, hashing, packing and registering run in several processes."""

CLASSIFY_JOBS_PER_WORKER = {"keyword": 50_000, "llm": 2_000}
"""Open jobs per ``classify`` task instance, by classifier: a 10-document day gets one, a
100,000-document keyword day two (one per core here), a day of 2,000 model calls one."""

CLASSIFY_MAX_WORKERS = 4
"""At most this many ``classify`` instances a run: the ``llm_api`` pool's 32 slots hold four
instances of 8 at once; more would only queue."""

LLM_POOL, CLASSIFY_POOL_SLOTS = "llm_api", 8
"""Each ``classify`` instance holds 8 slots of the ``llm_api`` pool (airflow_settings.yaml) and
keeps at most that many model calls in flight, so the pool's size bounds the model calls of
every worker together."""

CLASSIFY_BATCH_SIZE, MODEL_TIMEOUT_SECONDS = 1000, 30
"""Jobs per claim (the operator's ``batch_size``) and the model call's timeout (the default of the
``triage_llm`` connection's extra ``timeout``): what a try of ``classify`` may take is derived
from them."""

CLASSIFY_TIMEOUT = timedelta(seconds=2 * -(-CLASSIFY_BATCH_SIZE // CLASSIFY_POOL_SLOTS) * MODEL_TIMEOUT_SECONDS)
"""A ``classify`` try's ``execution_timeout`` (2 h 5 min): two claims (the one recorded while the
next is handled) in which every model call takes its whole timeout, ``CLASSIFY_POOL_SLOTS`` at
a time. Past it Airflow raises ``AirflowTaskTimeout`` in the task (its claim is settled: what
finished is recorded, the rest given back) and retries; the retry continues with the
unfinished jobs. A run that needs longer than this per try (a day of far more than 100,000
documents through the model) raises it."""

PERSIST_BATCH_SIZE, LABEL_ACTION_TIMEOUT_SECONDS = 1000, 10
"""Jobs per ``persist`` claim and the label action's timeout (``triage_label_action`` extra
``timeout``, default 10 s)."""

PERSIST_TIMEOUT = timedelta(seconds=PERSIST_BATCH_SIZE * LABEL_ACTION_TIMEOUT_SECONDS)
"""A ``persist`` try's ``execution_timeout`` (2 h 46 min 40 s): one claim whose every label
action, one after the other, takes its whole timeout."""

with DAG(
    dag_id="classify_documents",
    description="Retrieve documents of a day, classify them, persist labels, publish events",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # Paused when Airflow first sees it, whatever [core] dags_are_paused_at_creation says: its
    # scheduled runs take the params' defaults (1,000 synthetic documents a day), so the first
    # scheduled day waits until someone who chose the input unpauses it (README, "What starts paused").
    is_paused_upon_creation=True,
    max_active_runs=4,
    max_active_tasks=8,
    tags=["triage", "classification"],
    params={name: Param(**schema) for name, schema in param_schemas().items()},
    deadline=classify_deadlines(),  # none under `airflow dags test` (apache/airflow#73428)
    default_args={
        "owner": "triage",
        "retries": 3,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=15),
        "on_failure_callback": on_task_failure,
    },
    doc_md=__doc__,
) as dag:
    retrieve = RetrieveDocumentsOperator.partial(task_id="retrieve", shards=RETRIEVE_SHARDS).expand(
        shard=list(range(RETRIEVE_SHARDS))
    )
    size = SizeClassifyOperator(
        task_id="size_classify", jobs_per_worker=CLASSIFY_JOBS_PER_WORKER, max_workers=CLASSIFY_MAX_WORKERS
    )
    classify = ClassifyDocumentsOperator.partial(
        task_id="classify",
        pool=LLM_POOL,
        pool_slots=CLASSIFY_POOL_SLOTS,
        batch_size=CLASSIFY_BATCH_SIZE,
        execution_timeout=CLASSIFY_TIMEOUT,
        retry_policy=OUTAGE_RETRY_POLICY,
    ).expand(worker=size.output)
    persist = PersistLabelsOperator(task_id="persist", execution_timeout=PERSIST_TIMEOUT)
    publish = PublishEventsOperator(task_id="publish_events")

    # Downstream of every task, not only the last: it must wait for every map index of classify.
    alert = RunAlertsOperator(task_id="alert").as_teardown()

    retrieve >> size >> classify >> persist >> publish
    [retrieve, size, classify, persist, publish] >> alert
